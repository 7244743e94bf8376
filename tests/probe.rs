//! The probe node: a FORGE node whose leader-only work is observable from outside, for
//! multi-process tests and benchmarks of the election.
//!
//! Under every role it leads, the probe performs a unit of leader-only work every
//! `FORGE_PROBE_WORK_MS` milliseconds (default 50): it checks
//! [`Leadership::is_valid`](forge::Leadership::is_valid), prints a `WORK` line with the
//! wall-clock time, and inserts a row into `forge_probe_work` inside a fenced transaction.
//! Every transition is printed on stdout as one line:
//!
//! ```text
//! FORGE-PROBE READY node=a t=1700000000000000
//! FORGE-PROBE LEADER role=scheduler epoch=3 node=a t=...
//! FORGE-PROBE WORK role=scheduler epoch=3 node=a t=...
//! FORGE-PROBE FENCED role=scheduler epoch=3 node=a t=...   (PostgreSQL refused a write)
//! FORGE-PROBE ENDED role=scheduler epoch=3 node=a t=...    (the leader task stopped)
//! FORGE-PROBE STOPPED node=a t=...
//! ```
//!
//! `t` is microseconds since the Unix epoch, so lines of processes on one machine compare.
//!
//! With `FORGE_PROBE_CRON` set to a cron expression, the probe also runs a cron named
//! `probe_tick` (role `scheduler`, `catch_up = all`, or as `FORGE_PROBE_CATCH_UP` says:
//! `skip`, `latest` or `all`) whose handler inserts
//! `(scheduled_at, attempt, node, epoch)` into `forge_probe_ticks` and completes the tick in
//! the same fenced transaction, and prints `FORGE-PROBE TICK scheduled=<unix micros> attempt=<n> epoch=<e> node=... t=...`.
//!
//! With `FORGE_PROBE_APP_LISTEN` set to an address, the probe serves an application route,
//! `GET /leader-only`, behind [`LeaderOnly`](forge::admin::LeaderOnly) for the `scheduler`
//! role: on the leader it answers `<node> <epoch>` and prints `FORGE-PROBE SERVED role=scheduler
//! epoch=<e> node=... t=...`; elsewhere the layer answers 503 and the handler does not run (for
//! the load-balancer tests: serve `[admin] listen` too, for the leader probe).

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use forge::crons::{CatchUp, CronJob};
use forge::{Config, CronContext, CronError, Leadership, Node, Role, Schedule};

/// The table the probe writes to.
pub const PROBE_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS forge_probe_work (
    id    bigserial   PRIMARY KEY,
    role  text        NOT NULL,
    epoch bigint      NOT NULL,
    node  text        NOT NULL,
    at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS forge_probe_ticks (
    id           bigserial   PRIMARY KEY,
    scheduled_at timestamptz NOT NULL,
    attempt      integer     NOT NULL,
    node         text        NOT NULL,
    epoch        bigint      NOT NULL,
    fired_at     timestamptz NOT NULL,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
)";

/// One parsed `FORGE-PROBE` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeLine {
    /// `READY`, `LEADER`, `WORK`, `FENCED`, `ENDED` or `STOPPED`.
    pub event: String,
    /// The role, for role events.
    pub role: Option<String>,
    /// The epoch, for role events.
    pub epoch: Option<i64>,
    /// The node id.
    pub node: String,
    /// Microseconds since the Unix epoch.
    pub t: i64,
}

impl ProbeLine {
    /// Parses a probe line; `None` for any other output.
    pub fn parse(line: &str) -> Option<ProbeLine> {
        let mut words = line.strip_prefix("FORGE-PROBE ")?.split_whitespace();
        let event = words.next()?.to_owned();
        let (mut role, mut epoch, mut node, mut t) = (None, None, None, None);
        for word in words {
            match word.split_once('=')? {
                ("role", v) => role = Some(v.to_owned()),
                ("epoch", v) => epoch = v.parse().ok(),
                ("node", v) => node = Some(v.to_owned()),
                ("t", v) => t = v.parse().ok(),
                _ => {}
            }
        }
        Some(ProbeLine {
            event,
            role,
            epoch,
            node: node?,
            t: t?,
        })
    }
}

/// Microseconds since the Unix epoch.
pub fn unix_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

fn emit(event: &str, fields: &str, node: &str) {
    emit_at(event, fields, node, unix_micros());
}

fn emit_at(event: &str, fields: &str, node: &str, t: i64) {
    let line = if fields.is_empty() {
        format!("FORGE-PROBE {event} node={node} t={t}\n")
    } else {
        format!("FORGE-PROBE {event} {fields} node={node} t={t}\n")
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

/// Prints `ENDED` when the leader task stops, however it stops (returns or is dropped on
/// loss).
struct EndGuard {
    fields: String,
    node: String,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        emit("ENDED", &self.fields, &self.node);
    }
}

async fn probe_work(leadership: Leadership, every: Duration) {
    let node = leadership.node_id().to_string();
    let fields = format!("role={} epoch={}", leadership.role(), leadership.epoch());
    emit("LEADER", &fields, &node);
    let _guard = EndGuard {
        fields: fields.clone(),
        node: node.clone(),
    };
    loop {
        // `t` is taken before the validity check: a WORK line says "at t this node decided,
        // as a valid leader, to do leader-only work", even if it is frozen right after.
        let t = unix_micros();
        if !leadership.is_valid() || leadership.is_draining() {
            return;
        }
        emit_at("WORK", &fields, &node, t);
        let written = async {
            let mut tx = leadership.fenced_transaction().await?;
            sqlx::query("INSERT INTO forge_probe_work (role, epoch, node) VALUES ($1, $2, $3)")
                .bind(leadership.role().name())
                .bind(leadership.epoch().0)
                .bind(&node)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, forge::Error>(())
        }
        .await;
        if let Err(forge::Error::Fenced { .. }) = written {
            emit("FENCED", &fields, &node);
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = leadership.stopping() => return,
        }
    }
}

/// The probe cron's handler: record the run and complete the tick in one fenced transaction
/// (exactly once, even when the reply to the commit is lost).
async fn probe_tick(ctx: CronContext) -> Result<(), CronError> {
    let node = ctx.leadership().node_id().to_string();
    let mut tx = ctx.fenced_transaction().await?;
    sqlx::query(
        "INSERT INTO forge_probe_ticks (scheduled_at, attempt, node, epoch, fired_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(ctx.scheduled_at())
    .bind(ctx.attempt() as i32)
    .bind(&node)
    .bind(ctx.epoch().0)
    .bind(ctx.fired_at())
    .execute(&mut *tx)
    .await?;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    emit(
        "TICK",
        &format!(
            "scheduled={} attempt={} epoch={}",
            ctx.scheduled_at().timestamp_micros(),
            ctx.attempt(),
            ctx.epoch()
        ),
        &node,
    );
    Ok(())
}

/// Runs a probe node with `config` (its `[node] roles` decide what it leads; unset, the
/// built-in roles) until SIGTERM or ctrl-c. Creates `forge_probe_work` if needed.
pub async fn run(config: Config) -> ExitCode {
    let every = std::env::var("FORGE_PROBE_WORK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_millis(50));
    let roles = match config.roles() {
        Ok(roles) => roles.unwrap_or_else(|| Role::BUILTIN.to_vec()),
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(err) = create_table(&config).await {
        eprintln!("error: cannot create forge_probe_work: {err}");
        return ExitCode::FAILURE;
    }
    let mut builder = Node::builder(config).auto_register(false);
    if let Ok(expression) = std::env::var("FORGE_PROBE_CRON") {
        let catch_up = match std::env::var("FORGE_PROBE_CATCH_UP").as_deref() {
            Err(_) | Ok("all") => CatchUp::All,
            Ok("latest") => CatchUp::Latest,
            Ok("skip") => CatchUp::Skip,
            Ok(other) => {
                eprintln!("error: FORGE_PROBE_CATCH_UP: `{other}` is not skip, latest or all");
                return ExitCode::FAILURE;
            }
        };
        match Schedule::parse(&expression) {
            Ok(schedule) => {
                builder = builder
                    .cron(CronJob::new("probe_tick", schedule, probe_tick).catch_up(catch_up));
            }
            Err(err) => {
                eprintln!("error: FORGE_PROBE_CRON: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    for role in roles {
        builder = builder.leader_task(role, "probe", move |leadership| {
            probe_work(leadership, every)
        });
    }
    let node = match builder.start().await {
        Ok(node) => node,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let id = node.id().to_string();
    if let Ok(listen) = std::env::var("FORGE_PROBE_APP_LISTEN")
        && let Err(err) = serve_app(&node, &listen).await
    {
        eprintln!("error: FORGE_PROBE_APP_LISTEN {listen}: {err}");
        return ExitCode::FAILURE;
    }
    emit("READY", "", &id);
    let stopped = node.run_until_signal().await;
    emit("STOPPED", "", &id);
    match stopped {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Serves `GET /leader-only` behind `LeaderOnly` for the scheduler role on `listen`.
async fn serve_app(node: &Node, listen: &str) -> std::io::Result<()> {
    use forge::admin::axum::{Router, routing::get};
    use forge::admin::{Leader, LeaderOnly};

    let app: Router = Router::new()
        .route(
            "/leader-only",
            get(|Leader(leadership): Leader| async move {
                let node = leadership.node_id().to_string();
                emit(
                    "SERVED",
                    &format!("role=scheduler epoch={}", leadership.epoch()),
                    &node,
                );
                format!("{node} {}", leadership.epoch())
            }),
        )
        .layer(LeaderOnly::new(node.clone(), forge::Role::SCHEDULER));
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tokio::spawn(async move { forge::admin::axum::serve(listener, app).await });
    Ok(())
}

/// For binaries that re-execute themselves as probe nodes (the benchmarks): with arguments
/// `--node <forge.toml>`, runs a probe node from that file and returns its exit code;
/// otherwise `None`.
pub async fn run_if_node_mode(args: &[String]) -> Option<ExitCode> {
    if args.get(1).map(String::as_str) != Some("--node") {
        return None;
    }
    let path = args.get(2).cloned().unwrap_or_default();
    Some(match Config::load(&path) {
        Ok(config) => run(config).await,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    })
}

/// Creates `forge_probe_work`; several probes may start at once, so the CREATE is serialized.
async fn create_table(config: &Config) -> Result<(), Box<dyn std::error::Error>> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(config.database_url()?).await?;
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(4242)")
        .execute(&mut *tx)
        .await?;
    // No NOTICE "relation ... already exists, skipping" in the node's log at each start.
    sqlx::raw_sql("SET LOCAL client_min_messages = warning")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(PROBE_TABLE_SQL).execute(&mut *tx).await?;
    tx.commit().await?;
    conn.close().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let line = ProbeLine::parse("FORGE-PROBE WORK role=scheduler epoch=3 node=a t=17").unwrap();
        assert_eq!(line.event, "WORK");
        assert_eq!(line.role.as_deref(), Some("scheduler"));
        assert_eq!(line.epoch, Some(3));
        assert_eq!(line.node, "a");
        assert_eq!(line.t, 17);
        assert_eq!(ProbeLine::parse("READY"), None);
        assert!(ProbeLine::parse("FORGE-PROBE READY node=x t=5").is_some());
    }
}
