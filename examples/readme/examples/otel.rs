//! FORGE's spans exported with `tracing-opentelemetry` (the guide's "Operations", "Tracing"): a span per job
//! attempt and per cron run, and the election's transitions in a span per role. This example
//! prints the spans on stdout (`opentelemetry-stdout`); a service sends them to its collector
//! with `opentelemetry-otlp` instead.
//!
//! ```text
//! DATABASE_URL=postgres://localhost/app cargo run -p forge-readme --example otel
//! ```

use forge::{Config, CronContext, CronError, Node};
use opentelemetry::trace::TracerProvider as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// A cron to see spans of: every ten seconds.
#[forge::cron("*/10 * * * * *", name = "otel_example")]
async fn every_ten_seconds(ctx: CronContext) -> Result<(), CronError> {
    tracing::info!(
        late_ms = (ctx.fired_at() - ctx.scheduled_at()).num_milliseconds(),
        "tick"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> forge::Result<()> {
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(tracing_subscriber::fmt::layer())
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("my-service")))
        .init();

    let node = Node::builder(Config::from_env()?).start().await?;
    node.run_until_signal().await?;
    let _ = provider.shutdown(); // flushes the spans still buffered
    Ok(())
}
