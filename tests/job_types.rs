//! Job types shared by the job tests (`tests/it/jobs*.rs`) and the `forge-job-node` process.
//!
//! Every type runs [`behave`]: it records the attempt in `job_runs` (one row per job and
//! attempt, primary key (job_id, attempt)), then does what its [`Behave`] arguments say, and
//! stamps `finished_at` when its handler returns normally.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use forge::jobs::{Backoff, Job, JobOptions};
use forge::{JobContext, JobError};

/// The table the jobs record their attempts in.
pub(crate) const RUNS_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS job_runs (
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    node        text        NOT NULL,
    kind        text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    PRIMARY KEY (job_id, attempt)
)";

/// What a test job does.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Behave {
    /// Fail attempts 1..=fail_attempts.
    #[serde(default)]
    pub(crate) fail_attempts: u32,
    /// Fail with `JobError::discard` (on the failing attempts).
    #[serde(default)]
    pub(crate) discard: bool,
    /// Panic instead of returning an error (on the failing attempts).
    #[serde(default)]
    pub(crate) panic: bool,
    /// Fail with `JobError::retry_after` this many ms.
    #[serde(default)]
    pub(crate) retry_after_ms: Option<u64>,
    /// Sleep this long before finishing.
    #[serde(default)]
    pub(crate) sleep_ms: u64,
    /// Sleep only when running on this node.
    #[serde(default)]
    pub(crate) sleep_on_node: Option<String>,
    /// Sleep only on attempts 1..=sleep_attempts (0: on every attempt).
    #[serde(default)]
    pub(crate) sleep_attempts: u32,
    /// Hold a connection of the node's pool while sleeping.
    #[serde(default)]
    pub(crate) hold_connection: bool,
    /// A label, so that otherwise equal arguments differ.
    #[serde(default)]
    pub(crate) tag: String,
}

impl Behave {
    pub(crate) fn tag(tag: impl Into<String>) -> Behave {
        Behave {
            tag: tag.into(),
            ..Behave::default()
        }
    }
}

/// Runs one attempt as `b` says.
pub(crate) async fn behave(ctx: JobContext, b: Behave) -> Result<(), JobError> {
    sqlx::query("INSERT INTO job_runs (job_id, attempt, node, kind) VALUES ($1, $2, $3, $4)")
        .bind(ctx.id().0)
        .bind(ctx.attempt() as i32)
        .bind(ctx.node_id().as_str())
        .bind(ctx.kind())
        .execute(ctx.pool())
        .await?;
    let sleeps = b
        .sleep_on_node
        .as_deref()
        .is_none_or(|node| node == ctx.node_id().as_str())
        && (b.sleep_attempts == 0 || ctx.attempt() <= b.sleep_attempts);
    let held = if b.hold_connection {
        Some(ctx.pool().acquire().await?)
    } else {
        None
    };
    if b.sleep_ms > 0 && sleeps {
        tokio::time::sleep(Duration::from_millis(b.sleep_ms)).await;
    }
    drop(held);
    if ctx.attempt() <= b.fail_attempts {
        if b.panic {
            panic!("test panic on attempt {}", ctx.attempt());
        }
        if b.discard {
            return Err(JobError::discard(format!(
                "discarded on attempt {}",
                ctx.attempt()
            )));
        }
        if let Some(ms) = b.retry_after_ms {
            return Err(JobError::retry_after(
                format!("retry after {ms}ms"),
                Duration::from_millis(ms),
            ));
        }
        return Err(JobError::retry(format!("failed attempt {}", ctx.attempt())));
    }
    sqlx::query(
        "UPDATE job_runs SET finished_at = clock_timestamp() WHERE job_id = $1 AND attempt = $2",
    )
    .bind(ctx.id().0)
    .bind(ctx.attempt() as i32)
    .execute(ctx.pool())
    .await?;
    Ok(())
}

macro_rules! behaving_job {
    ($(#[$meta:meta])* $name:ident, $options:expr) => {
        $(#[$meta])*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $name;

        impl Job for $name {
            type Args = Behave;
            const KIND: &'static str = stringify!($name);

            fn options(&self) -> JobOptions {
                $options
            }

            fn run(
                &self,
                ctx: JobContext,
                args: Behave,
            ) -> impl Future<Output = Result<(), JobError>> + Send {
                behave(ctx, args)
            }
        }
    };
}

behaving_job!(
    /// Default options.
    plain,
    JobOptions::new()
);
behaving_job!(
    /// 3 attempts, exponential backoff from 200 ms.
    retrying,
    JobOptions::new()
        .max_attempts(3)
        .backoff(Backoff::exponential(Duration::from_millis(200)))
);
behaving_job!(
    /// 2 attempts, 50 ms apart, 300 ms timeout.
    timing_out,
    JobOptions::new()
        .max_attempts(2)
        .backoff(Backoff::fixed(Duration::from_millis(50)))
        .timeout(Duration::from_millis(300))
);
behaving_job!(
    /// 5 attempts, 20 ms apart.
    quick_retry,
    JobOptions::new()
        .max_attempts(5)
        .backoff(Backoff::fixed(Duration::from_millis(20)))
);
behaving_job!(
    /// Unique by its arguments.
    unique_by_args,
    JobOptions::new().unique(true)
);
behaving_job!(
    /// Runs only on the leader of role `reports`.
    report,
    JobOptions::new().role("reports")
);
behaving_job!(
    /// In the `mailers` queue.
    mailer,
    JobOptions::new().queue("mailers")
);

/// What a [`poison`] job does.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Poison {
    /// Abort the process running it, as a stack overflow, an out-of-memory kill or
    /// `panic = "abort"` would.
    #[serde(default)]
    pub(crate) abort: bool,
    /// On attempt 1, sleep this long before finishing.
    #[serde(default)]
    pub(crate) sleep_ms: u64,
}

/// A job that touches no database, so that its attempts take far less than a round trip (its
/// worker claims ahead of its slots): it returns at once, sleeps, or aborts its process.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct poison;

impl Job for poison {
    type Args = Poison;
    const KIND: &'static str = "poison";

    async fn run(&self, ctx: JobContext, args: Poison) -> Result<(), JobError> {
        if args.abort {
            std::process::abort();
        }
        if ctx.attempt() == 1 && args.sleep_ms > 0 {
            tokio::time::sleep(Duration::from_millis(args.sleep_ms)).await;
        }
        Ok(())
    }
}

/// The table [`effect`] writes its effects in: no unique key, so that a repeated effect
/// shows as a second row.
pub(crate) const EFFECTS_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS job_effects (
    job_id  bigint      NOT NULL,
    attempt integer     NOT NULL,
    node    text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)";

/// What an [`effect`] job does.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Effect {
    /// Complete the job in the effect's transaction (exactly once), or just commit the
    /// effect (at least once).
    pub(crate) transactional: bool,
    /// After the commit, on attempt 1, wait this long before returning (the node can be
    /// killed meanwhile).
    pub(crate) hang_ms: u64,
    /// After the commit, write and complete again in a second transaction, as a handler would
    /// that retries after an error from COMMIT that had in fact committed; committed only if
    /// the completion is accepted.
    #[serde(default)]
    pub(crate) again: bool,
    /// A label.
    pub(crate) tag: String,
}

/// A job with an effect: a row in `job_effects`.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct effect;

impl Job for effect {
    type Args = Effect;
    const KIND: &'static str = "effect";

    async fn run(&self, ctx: JobContext, args: Effect) -> Result<(), JobError> {
        let write = || async {
            let mut tx = ctx.pool().begin().await?;
            sqlx::query("INSERT INTO job_effects (job_id, attempt, node) VALUES ($1, $2, $3)")
                .bind(ctx.id())
                .bind(ctx.attempt() as i32)
                .bind(ctx.node_id())
                .execute(&mut *tx)
                .await?;
            Ok::<_, JobError>(tx)
        };
        let mut tx = write().await?;
        if args.transactional {
            ctx.complete(&mut tx)
                .await
                .map_err(|err| JobError::retry(err.to_string()))?;
        }
        tx.commit().await?;
        if args.again {
            let mut tx = write().await?;
            if ctx.complete(&mut tx).await.is_ok() {
                tx.commit().await?;
            }
        }
        if ctx.attempt() == 1 && args.hang_ms > 0 {
            tokio::time::sleep(Duration::from_millis(args.hang_ms)).await;
        }
        Ok(())
    }
}

/// The table `flow_step` records its starts in (one row per attempt, stamped by the database's
/// clock) - the order of a workflow's steps as they ran.
pub(crate) const FLOW_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS flow_runs (
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    node       text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    seq        bigserial,
    PRIMARY KEY (job_id, attempt)
);
CREATE TABLE IF NOT EXISTS flow_gates (name text PRIMARY KEY)";

/// What a workflow step does.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Step {
    /// Its name, returned as its output (with the number of its parents' outputs it read).
    pub(crate) tag: String,
    /// Sleep this long before returning.
    #[serde(default)]
    pub(crate) sleep_ms: u64,
    /// Wait until a row with this name is in `flow_gates` (polling, up to 60 s).
    #[serde(default)]
    pub(crate) gate: Option<String>,
    /// Fail with `JobError::discard` (dead-letter at once).
    #[serde(default)]
    pub(crate) discard: bool,
    /// Output this many bytes of text instead of the step's output.
    #[serde(default)]
    pub(crate) output_bytes: usize,
    /// Set the output `{"in_tx": tag}` with `set_output`, complete the job in a transaction
    /// that also writes the gate `effect:<tag>`, and return `null` (which keeps that output).
    #[serde(default)]
    pub(crate) complete_in_tx: bool,
}

/// The output of a `flow_step`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct StepOutput {
    pub(crate) tag: String,
    /// How many of its parents' outputs it read.
    pub(crate) parent_outputs: usize,
}

/// A workflow step: records its start in `flow_runs`, reads its parents' outputs, waits as
/// told, and returns its output (the `#[job]` macro's `Result<T, E>` path).
#[forge::job(queue = "flow")]
pub(crate) async fn flow_step(ctx: JobContext, step: Step) -> Result<serde_json::Value, JobError> {
    sqlx::query("INSERT INTO flow_runs (job_id, attempt, node) VALUES ($1, $2, $3)")
        .bind(ctx.id().0)
        .bind(ctx.attempt() as i32)
        .bind(ctx.node_id().as_str())
        .execute(ctx.pool())
        .await?;
    let parent_outputs = ctx.parent_outputs().await.map_err(JobError::retry)?.len();
    if let Some(gate) = &step.gate {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let open: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM flow_gates WHERE name = $1)")
                    .bind(gate)
                    .fetch_one(ctx.pool())
                    .await?;
            if open {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(JobError::retry(format!("the gate {gate} stayed shut")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if step.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(step.sleep_ms)).await;
    }
    if step.discard {
        return Err(JobError::discard(format!("step {} gives up", step.tag)));
    }
    if step.complete_in_tx {
        ctx.set_output(&serde_json::json!({ "in_tx": step.tag }))?;
        let mut tx = ctx.pool().begin().await?;
        sqlx::query("INSERT INTO flow_gates (name) VALUES ($1)")
            .bind(format!("effect:{}", step.tag))
            .execute(&mut *tx)
            .await?;
        ctx.complete(&mut tx).await?;
        tx.commit().await?;
        return Ok(serde_json::Value::Null);
    }
    if step.output_bytes > 0 {
        return Ok(serde_json::Value::String("x".repeat(step.output_bytes)));
    }
    Ok(serde_json::to_value(StepOutput {
        tag: step.tag,
        parent_outputs,
    })?)
}

behaving_job!(
    /// At most 3 attempts at once on all nodes together, in whichever queue (a kind's limit;
    /// `tests/it/kind_limits.rs`; the attribute's form is checked in `tests/ui`).
    capped,
    JobOptions::new().global_concurrency(3)
);
behaving_job!(
    /// At most 4 claims a second per `tag` on all nodes together (a kind's rate).
    rated,
    JobOptions::new()
        .rate("4/1s".parse().expect("a rate"))
        .rate_key("tag")
);
