//! Cluster-wide limits of a job kind (`forge.kind_limits`): a global concurrency and a rate,
//! optionally per rate key, checked in every claim of the kind's jobs whichever queue they sit
//! in. Measured as in `limits.rs`, from the handlers' own rows and the claims' instants: the
//! overlap of a kind's attempts spread over two queues never exceeds its limit, on node
//! processes SIGKILLed and restarted; no window of the rate's length holds more claims of a
//! rate key than the rate; an operator's change takes effect at the next claim and outlives a
//! node's start until reset; bad limits are refused at registration.

use std::time::Duration;

use forge::inspect::Workload;
use forge::jobs::{Job, JobOptions, NewJob, QueueLimits, Rate};
use forge::{Config, JobContext, JobError, LockNamespace, Node};
use forge_testkit::wait_until;
use sqlx::PgPool;

use crate::jobs::{Behave, capped, job_config, rated, setup};
use crate::limits::{max_claims_of, max_overlap_of};
use crate::support::*;

/// The two queues the limited kinds' jobs are spread over.
const QUEUES: [&str; 2] = ["default", "other"];

/// A node working both queues, 4 at once each, with the `capped` and `rated` job types.
async fn start(url: &str, id: &str) -> Node {
    let mut config: Config = job_config(url, id);
    config.jobs.queues = QUEUES.iter().map(|q| (q.to_string(), 4.into())).collect();
    config.node.queues = Some(QUEUES.iter().map(|q| q.to_string()).collect());
    Node::builder(config)
        .auto_register(false)
        .job(capped)
        .job(rated)
        .start()
        .await
        .expect("node starts")
}

fn workload(pool: &PgPool) -> Workload {
    Workload::new(pool.clone(), LockNamespace::default())
}

/// Enqueues `n` jobs of `job` that sleep `sleep_ms`, tagged `tag`, alternately in each queue.
async fn enqueue<J: Job<Args = Behave> + Copy>(
    pool: &PgPool,
    job: J,
    n: usize,
    sleep_ms: u64,
    tag: &str,
) {
    let jobs = client(pool);
    for i in 0..n {
        let args = Behave {
            sleep_ms,
            ..Behave::tag(tag)
        };
        jobs.enqueue_job(NewJob::new(job, args).queue(QUEUES[i % 2]))
            .await
            .unwrap();
    }
}

/// Waits until at least `n` jobs of `kind` completed.
async fn completed(pool: &PgPool, kind: &str, n: i64) {
    completed_within(pool, kind, n, Duration::from_secs(120)).await
}

/// Waits `within` at most until at least `n` jobs of `kind` completed.
async fn completed_within(pool: &PgPool, kind: &str, n: i64, within: Duration) {
    wait_until(
        &format!("{n} {kind} jobs to complete"),
        within,
        Duration::from_millis(10),
        || async {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge.jobs WHERE kind = $1 AND state = 'completed'",
            )
            .bind(kind)
            .fetch_one(pool)
            .await
            .unwrap();
            (done >= n).then_some(())
        },
    )
    .await
    .unwrap();
}

/// The kind's stored limits: (global concurrency, set by).
async fn stored(pool: &PgPool, kind: &str) -> Option<(Option<i32>, Option<String>)> {
    sqlx::query_as("SELECT global_concurrency, set_by FROM forge.kind_limits WHERE kind = $1")
        .bind(kind)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// Waits until `capped`'s stored limits are `expected` (a node writes the code's at start,
/// after `start` returns).
async fn stored_becomes(pool: &PgPool, expected: Option<(Option<i32>, Option<String>)>) {
    wait_until(
        "capped's stored limits",
        SOON,
        Duration::from_millis(10),
        || async { (stored(pool, "capped").await == expected).then_some(()) },
    )
    .await
    .unwrap();
}

/// How many queues the completed jobs of `kind` ran in.
async fn queues_run(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT queue) FROM forge.jobs WHERE kind = $1 AND state = 'completed'",
    )
    .bind(kind)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kinds_global_limit_holds_across_queues_while_nodes_are_killed_and_restarted() {
    // Three node processes, two queues of 4 each: 24 slots for a kind limited to 3. Killed
    // nodes hold their attempts' slots until rescued.
    let (db, pool) = setup().await;
    let dir = ScratchDir::new("kind-limits");
    let path = dir.0.join("forge.toml");
    std::fs::write(
        &path,
        format!(
            "{}\n[node]\nroles = [\"scheduler\"]\n\n[jobs]\nmaintenance_interval = \"500ms\"\ndrain_timeout = \"2s\"\n\n[jobs.queues.default]\nconcurrency = 4\n\n[jobs.queues.other]\nconcurrency = 4\n",
            config_toml(db.url())
        ),
    )
    .unwrap();
    let spawn = crate::jobs::process::spawn_job_node;
    let mut n1 = spawn(&path, "n1").await;
    let n2 = spawn(&path, "n2").await;
    let mut n3 = spawn(&path, "n3").await;
    // The code's limit is the kind's.
    stored_becomes(&pool, Some((Some(3), None))).await;
    enqueue(&pool, capped, 120, 60, "k").await;
    completed(&pool, "capped", 20).await;
    n1.kill().unwrap();
    completed(&pool, "capped", 45).await;
    let n1 = spawn(&path, "n1").await;
    completed(&pool, "capped", 75).await;
    n3.kill().unwrap();
    completed(&pool, "capped", 120).await;
    assert_eq!(queues_run(&pool, "capped").await, 2);
    let overlap = max_overlap_of(&pool, "capped", None).await;
    assert_eq!(
        overlap, 3,
        "at most 3 at once over both queues, and reached"
    );
    drop((n1, n2, n3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kinds_rate_holds_per_key_across_queues_in_any_window() {
    let (db, pool) = setup().await;
    let nodes = [start(db.url(), "n1").await, start(db.url(), "n2").await];
    // Per tag: "a" and "b" each 4 a second, side by side, in both queues.
    enqueue(&pool, rated, 10, 0, "a").await;
    enqueue(&pool, rated, 10, 0, "b").await;
    completed(&pool, "rated", 20).await;
    let window = Duration::from_secs(1);
    assert_eq!(max_claims_of(&pool, "rated", window, true).await, 4);
    // Both keys went on at once: 8 claims in some window.
    assert_eq!(max_claims_of(&pool, "rated", window, false).await, 8);
    assert_eq!(queues_run(&pool, "rated").await, 2);
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operators_kind_limit_takes_effect_at_once_and_outlives_a_start_until_reset() {
    let (db, pool) = setup().await;
    let n1 = start(db.url(), "n1").await;
    let w = workload(&pool);
    let one = QueueLimits::new(Some(1), None, None).unwrap();
    w.set_kind_limits("capped", &one, "test").await.unwrap();
    enqueue(&pool, capped, 30, 150, "c").await;
    // While the jobs wait, the kind's view says it is at its limit.
    let view = wait_until(
        "the kind's view to say it is at its global limit",
        SOON,
        Duration::from_millis(5),
        || async {
            let kinds = w.kind_limits().await.unwrap();
            kinds
                .into_iter()
                .find(|k| k.kind == "capped" && k.at_global_limit)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (view.limited_running, view.set_by.as_deref()),
        (1, Some("test"))
    );
    // A node's start leaves the operator's value alone (it writes it before it runs a job).
    let n2 = start(db.url(), "n2").await;
    wait_until(
        "n2 to run a job",
        SOON,
        Duration::from_millis(10),
        || async {
            let ran: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM job_runs WHERE node = 'n2')")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            ran.then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        stored(&pool, "capped").await,
        Some((Some(1), Some("test".into())))
    );
    completed(&pool, "capped", 3).await;
    assert_eq!(
        max_overlap_of(&pool, "capped", None).await,
        1,
        "one at a time under 1"
    );
    let raised: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let five = QueueLimits::new(Some(5), None, None).unwrap();
    w.set_kind_limits("capped", &five, "test").await.unwrap();
    completed(&pool, "capped", 30).await;
    let after = max_overlap_of(&pool, "capped", Some(raised)).await;
    assert_eq!(after, 5, "the raised limit holds and is reached at once");
    // Reset: unlimited until a node starts and writes the code's value again.
    assert!(w.reset_kind_limits("capped", "test").await.unwrap());
    assert_eq!(stored(&pool, "capped").await, None);
    let n3 = start(db.url(), "n3").await;
    stored_becomes(&pool, Some((Some(3), None))).await;
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.events
          WHERE kind = 'admin_action' AND detail ->> 'by' = 'test'
            AND detail ->> 'action' IN ('limit_kind', 'reset_kind_limits')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(audited, 3);
    for node in [n1, n2, n3] {
        node.shutdown().await;
    }
}

/// A job type with the options it is given, to see what registration says of them.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy)]
struct limited_badly(fn() -> JobOptions);

impl Job for limited_badly {
    type Args = ();
    const KIND: &'static str = "limited_badly";

    fn options(&self) -> JobOptions {
        (self.0)()
    }

    async fn run(&self, _ctx: JobContext, _args: ()) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test]
async fn bad_kind_limits_are_refused_at_registration_with_what_is_wrong() {
    let (db, pool) = setup().await;
    // Each case: the kind's options, and what the refusal says.
    type Case = (fn() -> JobOptions, &'static str);
    let cases: [Case; 3] = [
        (|| JobOptions::new().global_concurrency(0), "between 1 and"),
        (
            || JobOptions::new().rate_key("customer_id"),
            "rate_key needs a rate",
        ),
        (
            || JobOptions::new().role("reports").global_concurrency(2),
            "runs on the leader of role `reports`",
        ),
    ];
    for (options, expected) in cases {
        let err = Node::builder(job_config(db.url(), "n1"))
            .auto_register(false)
            .job(limited_badly(options))
            .start()
            .await
            .err()
            .expect("refused");
        let message = err.to_string();
        assert!(message.contains("job kind `limited_badly`"), "{message}");
        assert!(message.contains(expected), "{message}");
    }
    // An operator's limits are checked too.
    let err = workload(&pool)
        .set_kind_limits("Bad Kind", &QueueLimits::default(), "test")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Bad Kind"), "{err}");
    let err = "100 a minute".parse::<Rate>().unwrap_err();
    assert!(err.contains("such as \"100/1m\""), "{err}");
}

/// `forge jobs limit` sets a kind's limits (shown by `forge jobs limits`), refuses bad values
/// with what is wrong, and gives them back to the code with `--reset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_shows_and_resets_a_kinds_limits() {
    use crate::cli::forge;
    let db = fresh_db().await;
    let url = db.url();
    assert_eq!(forge(url, &["migrate", "up"]).await.code, 0);
    let args = ["jobs", "limit", "sync", "--global", "2", "--rate", "10/1s"];
    let run = forge(url, &args).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("global 2, rate 10/1s"),
        "{}",
        run.stdout
    );
    let listed = forge(url, &["jobs", "limits", "--json"]).await;
    let kinds: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(kinds["kinds"][0]["kind"], "sync");
    assert_eq!(kinds["kinds"][0]["limits"]["global_concurrency"], 2);
    assert_eq!(kinds["kinds"][0]["limits"]["rate"], "10/1s");
    let table = forge(url, &["jobs", "limits"]).await;
    assert!(
        table.stdout.contains("sync") && table.stdout.contains("global 2"),
        "{}",
        table.stdout
    );
    let run = forge(url, &["jobs", "limit", "sync", "--rate", "10 a second"]).await;
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("100/1m"), "{}", run.stderr);
    let run = forge(url, &["jobs", "limit", "sync", "--reset"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let listed = forge(url, &["jobs", "limits", "--json"]).await;
    let kinds: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(kinds, serde_json::json!({ "kinds": [] }));
}

/// `forge_job_kind_limited` says when a kind's available jobs wait on its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregator_reports_a_kind_held_back_by_its_limit() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "n1");
    config.node.roles = Some(vec!["scheduler".into(), "metrics_aggregator".into()]);
    config.jobs.maintenance_interval = Duration::from_millis(200);
    let node = Node::builder(config)
        .auto_register(false)
        .job(capped)
        .start()
        .await
        .unwrap();
    let held = r#"forge_job_kind_limited{kind="capped",limit="global"}"#;
    let w = workload(&pool);
    let one = QueueLimits::new(Some(1), None, None).unwrap();
    w.set_kind_limits("capped", &one, "test").await.unwrap();
    let jobs = client(&pool);
    for _ in 0..3 {
        let args = Behave {
            sleep_ms: 60_000,
            ..Behave::tag("m")
        };
        jobs.enqueue(capped, args).await.unwrap();
    }
    let reported = |value: f64| {
        let node = &node;
        async move {
            let text = node.render_metrics();
            (crate::jobs::metric(&text, held) == Some(value)).then_some(())
        }
    };
    wait_until(
        "the kind reported as held back",
        SOON,
        Duration::from_millis(50),
        || reported(1.0),
    )
    .await
    .unwrap();
    // Raised above the jobs waiting: none is held back any more.
    let five = QueueLimits::new(Some(5), None, None).unwrap();
    w.set_kind_limits("capped", &five, "test").await.unwrap();
    wait_until(
        "the kind reported as free",
        SOON,
        Duration::from_millis(50),
        || reported(0.0),
    )
    .await
    .unwrap();
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_rate_keys_backlog_does_not_hold_back_the_jobs_behind_it() {
    // 200 jobs of key "a" (4 a second) at the head of one queue, then 4 of key "b": the claims
    // pass over "a"'s jobs while its window is spent, so "b"'s run in the first second or so,
    // not after "a"'s backlog (50 s).
    let (db, pool) = setup().await;
    let node = start(db.url(), "n1").await;
    workload(&pool)
        .pause_queue("default", "test", false)
        .await
        .unwrap();
    let jobs = client(&pool);
    let behave = |tag: &str| NewJob::new(rated, Behave::tag(tag)).queue("default");
    jobs.enqueue_many((0..200).map(|_| behave("a")))
        .await
        .unwrap();
    jobs.enqueue_many((0..4).map(|_| behave("b")))
        .await
        .unwrap();
    workload(&pool)
        .resume_queue("default", "test")
        .await
        .unwrap();
    wait_until(
        "the 4 jobs of key b to complete",
        Duration::from_secs(60),
        Duration::from_millis(10),
        || async {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge.jobs
                  WHERE kind = 'rated' AND args ->> 'tag' = 'b' AND state = 'completed'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (done == 4).then_some(())
        },
    )
    .await
    .unwrap();
    let a_done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.jobs
          WHERE kind = 'rated' AND args ->> 'tag' = 'a' AND state <> 'available'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        a_done < 40,
        "key b's jobs waited behind {a_done} claims of key a's backlog"
    );
    assert_eq!(
        max_claims_of(&pool, "rated", Duration::from_secs(1), true).await,
        4
    );
    node.shutdown().await;
}

/// A claimant frozen while it holds a kind's limit lock (SIGSTOP, a VM pause) holds back only
/// that kind: the queue's claims pass over the kind's jobs, even a backlog of them at the head of
/// the queue that fills every claim, and take the jobs of other kinds behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_of_a_kinds_limit_lock_holds_back_only_that_kinds_jobs() {
    let (db, pool) = setup().await;
    let mut config: Config = job_config(db.url(), "n1");
    config.jobs.queues = [("default".to_string(), 4.into())].into();
    let node = Node::builder(config)
        .auto_register(false)
        .job(capped)
        .job(crate::jobs::plain)
        .start()
        .await
        .expect("node starts");
    workload(&pool)
        .pause_queue("default", "test", false)
        .await
        .unwrap();
    let jobs = client(&pool);
    // More capped jobs at the head than any claim of this worker takes (4 slots, at most 128
    // ahead).
    jobs.enqueue_many((0..300).map(|_| NewJob::new(capped, Behave::tag("k")).queue("default")))
        .await
        .unwrap();
    jobs.enqueue_many(
        (0..4).map(|_| NewJob::new(crate::jobs::plain, Behave::tag("p")).queue("default")),
    )
    .await
    .unwrap();
    let mut frozen = pool.begin().await.unwrap();
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtext('forge.kind_limit'), hashtext('forge capped'))",
    )
    .execute(&mut *frozen)
    .await
    .unwrap();
    workload(&pool)
        .resume_queue("default", "test")
        .await
        .unwrap();
    // (Behind the capped jobs, while their kind's lock is held.)
    completed_within(&pool, "plain", 4, SOON).await;
    let capped_taken: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.jobs WHERE kind = 'capped' AND state <> 'available'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        capped_taken, 0,
        "capped jobs were claimed while its lock was held"
    );
    // The kind's claims go on once the lock is free.
    frozen.rollback().await.unwrap();
    completed(&pool, "capped", 6).await;
    node.shutdown().await;
}

/// forge.toml's `[jobs.kinds.<kind>]` replaces the limits a kind declares in code, and is refused
/// for a kind that runs on a role's leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forge_tomls_kind_limits_replace_the_codes_and_a_roles_kind_refuses_them() {
    let (db, pool) = setup().await;
    let mut config: Config = job_config(db.url(), "n1");
    config.jobs.kinds.insert(
        "capped".into(),
        QueueLimits::new(Some(1), None, None).unwrap().into(),
    );
    let node = Node::builder(config)
        .auto_register(false)
        .job(capped)
        .start()
        .await
        .expect("node starts");
    // The code says 3; forge.toml 1.
    stored_becomes(&pool, Some((Some(1), None))).await;
    node.shutdown().await;

    let mut config: Config = job_config(db.url(), "n2");
    config
        .jobs
        .kinds
        .insert("report".into(), QueueLimits::default().into());
    let err = Node::builder(config)
        .auto_register(false)
        .job(crate::jobs::report)
        .start()
        .await
        .err()
        .expect("a role's kind with forge.toml limits is refused");
    let message = err.to_string();
    assert!(
        message.contains("[jobs.kinds.report]") && message.contains("role"),
        "{message}"
    );
}
