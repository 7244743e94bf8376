//! Liveness under stalls: a frozen transaction, a stalled write or a step-down never strands
//! work or a role. Rescue skips rows another transaction holds and a down node's sessions are
//! ended; pool transactions left idle end after a lease; a claim that commits after its worker
//! gave up is settled by the reconciliation, a claim that reaches the server after it takes
//! nothing, a claimant frozen inside its claim holds up no other claim, and a claim whose reply
//! was lost costs no attempt;
//! a successor ends the stuck fenced transactions of a frozen leader; an interrupted tick
//! whose take-over fails is taken over later; `catch_up = "all"` runs ticks that came due
//! during a long run; a node whose node session cannot be reopened but whose pool works stays
//! a member, and a node cut off from PostgreSQL stops its attempts before they can be rescued.
//! The node's pool hands out no connection inside a transaction that a `BEGIN` cut short left
//! behind (a `begin()` cancelled mid-flight, a handler's dropped by its job's timeout), FORGE's
//! own `BEGIN`s cannot be cut short at all, and a half-open pool session gives its slot back
//! within seconds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::crons::{CatchUp, CronJob};
use forge::jobs::{Job, JobId, JobOptions, JobState};
use forge::{CronContext, JobContext, JobError, Node, Role, RoleState, Schedule};
use forge_testkit::{Filter, PgProxy, PgServer, wait_until};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::time::Instant;

use crate::jobs::{Behave, job_config, plain, setup, stall_commits, wait_state};
use crate::support::*;

/// Keeps a fault in place for `d`. (The length of the fault is the experiment.)
async fn fault_window(d: Duration) {
    tokio::time::sleep(d).await;
}

async fn jobs_node(config: forge::Config) -> Node {
    Node::builder(config)
        .auto_register(false)
        .job(plain)
        .job(Span)
        .job(CutBegin)
        .start()
        .await
        .expect("node starts")
}

/// A job of a node that is not running: `node` marked down, the job running there.
async fn ghost_job(pool: &PgPool, node: &str, down: bool) -> JobId {
    sqlx::query(
        "INSERT INTO forge.nodes (namespace, node_id, started_at, heartbeat_at, down_at, down_reason)
         VALUES ('forge', $1, now() - interval '1 hour', now() - interval '1 hour',
                 CASE WHEN $2 THEN now() END, CASE WHEN $2 THEN 'test' END)
         ON CONFLICT DO NOTHING",
    )
    .bind(node)
    .bind(down)
    .execute(pool)
    .await
    .unwrap();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, attempt,
                                 node_id, attempted_at, started_at)
         VALUES ('forge', 'default', 'plain', jsonb_build_object('tag', $1::text), 'running',
                 now(), 1, $1, now(), now())
         RETURNING id",
    )
    .bind(node)
    .fetch_one(pool)
    .await
    .unwrap();
    JobId(id)
}

/// A connection named `application_name` that holds the row lock of job `id` in an open
/// transaction (a frozen process's transaction, as the server sees it).
async fn hold_job_row(url: &str, application_name: &str, id: JobId) -> PgConnection {
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let mut conn = PgConnection::connect_with(&options.application_name(application_name))
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT 1 FROM forge.jobs WHERE id = {} FOR UPDATE",
        id.0
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_row_another_transaction_holds_does_not_stop_the_rescue_of_the_others() {
    let (db, pool) = setup().await;
    let held = ghost_job(&pool, "ghost-1", true).await;
    let free = ghost_job(&pool, "ghost-2", true).await;
    // Not a session of the ghost's: the rescue cannot end it, only step around it.
    let holder = hold_job_row(db.url(), "someone else", held).await;
    let node = jobs_node(job_config(db.url(), "a")).await;
    let job = wait_state(&pool, free, JobState::Completed).await;
    assert_eq!((job.attempt, job.node_id.as_deref()), (2, Some("a")));
    let still = client(&pool).get(held).await.unwrap().unwrap();
    assert_eq!(
        (still.state, still.node_id.as_deref()),
        (JobState::Running, Some("ghost-1")),
        "a row held by another transaction waits for it"
    );
    holder.close().await.unwrap();
    let job = wait_state(&pool, held, JobState::Completed).await;
    assert_eq!((job.attempt, job.node_id.as_deref()), (2, Some("a")));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_marked_down_has_its_sessions_ended_so_that_its_row_locks_go() {
    let (db, pool) = setup().await;
    // A frozen node: no heartbeat for an hour, and its pool session inside a transaction that
    // holds its running job's row.
    let id = ghost_job(&pool, "frozen", false).await;
    let mut frozen_pool = hold_job_row(db.url(), "forge:pool:frozen", id).await;
    let node = jobs_node(job_config(db.url(), "a")).await;
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!((job.attempt, job.node_id.as_deref()), (2, Some("a")));
    assert!(
        job.errors[0].error.contains("no heartbeat"),
        "{:?}",
        job.errors
    );
    let down: serde_json::Value = sqlx::query_scalar(
        "SELECT detail FROM forge.events WHERE kind = 'node_down' AND node_id = 'frozen'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        down["ended_sessions"],
        serde_json::json!(["forge:pool:frozen"]),
        "{down}"
    );
    let after = sqlx::query("SELECT 1").execute(&mut frozen_pool).await;
    assert!(after.is_err(), "the frozen node's session was ended");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_transaction_left_idle_is_ended_after_a_lease() {
    let (db, pool) = setup().await;
    let node = jobs_node(job_config(db.url(), "a")).await;
    let mut tx = node.pool().begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    // The transaction stays open, idle, as a frozen process would leave it.
    wait_until(
        "the server to end the idle transaction's session",
        SOON,
        Duration::from_millis(50),
        || async {
            let alive: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                    .bind(pid)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (!alive).then_some(())
        },
    )
    .await
    .unwrap();
    assert!(sqlx::query("SELECT 1").execute(&mut *tx).await.is_err());
    drop(tx);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_commits_after_its_worker_gave_up_on_it_is_settled() {
    let (db, pool) = setup().await;
    let node = jobs_node(job_config(db.url(), "a")).await;
    // The claim's commit waits on the server past the worker's bound (5 s), as a commit
    // waiting for a stalled synchronous standby would.
    let stall = stall_commits(db.url(), "stalled").await;
    let id = node
        .jobs()
        .enqueue(plain, Behave::tag("stalled"))
        .await
        .unwrap()
        .id();
    stall.wait_until_waiting(&pool, "forge:pool:a").await;
    fault_window(Duration::from_millis(6500)).await;
    // Released: a claim the worker gave up on must not take the job now and strand it.
    stall.release().await;
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.node_id.as_deref(), Some("a"));
    assert!(
        job.errors.iter().all(|e| e.reason == "rescued"),
        "{:?}",
        job.errors
    );
    node.shutdown().await;
}

/// A claimant frozen in the middle of a claim holds the queue's claim lock until it is marked
/// down (its answer larger than the socket buffers, say; here a session that took the lock and
/// does nothing): the other nodes' claims of that queue go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimant_frozen_inside_its_claim_stops_no_other_claim() {
    let (db, pool) = setup().await;
    let node = jobs_node(job_config(db.url(), "a")).await;
    let mut frozen = PgConnection::connect(db.url()).await.unwrap();
    sqlx::raw_sql(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext('forge.jobs_claim'), hashtext('forge default'))",
    )
    .execute(&mut frozen)
    .await
    .unwrap();
    let id = node
        .jobs()
        .enqueue(plain, Behave::tag("behind a frozen claim"))
        .await
        .unwrap()
        .id();
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!((job.attempt, job.node_id.as_deref()), (1, Some("a")));
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
            AND classid = hashtext('forge.jobs_claim')::oid",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(held, 1, "the frozen claimant still holds the claim lock");
    drop(frozen);
    node.shutdown().await;
}

/// A claim whose request reaches the server after its worker gave up on it (the round trip's
/// bound) and reconciled on another connection - a request retransmitted late - takes
/// nothing: here it would take the job enqueued meanwhile, which the worker (its two slots
/// busy) would never learn of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_reaches_the_server_after_its_worker_reconciled_takes_nothing() {
    let (db, pool) = setup().await;
    let server = PgServer::shared().unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let mut config = job_config(&proxy.url_for(server, db.name()), "b");
    config.jobs.queues = [("default".to_owned(), 2.into())].into_iter().collect();
    let b = jobs_node(config).await;
    // One slot busy throughout; b keeps the connections of its lanes while it works.
    span_running(&b, "late: holding", 20_000).await;
    // What b's connections send from now on reaches the server 15 s late: the next claim. b
    // gives up on it after 5 s, reconciles on a new connection and claims that job itself.
    let late = Duration::from_secs(15);
    assert!(proxy.delay(Filter::application_prefix("forge:pool:b"), late) > 0);
    let sent = Instant::now();
    let first = b
        .jobs()
        .enqueue(
            Span,
            SpanArgs {
                tag: "late: first".into(),
                sleep_ms: 20_000,
            },
        )
        .await
        .unwrap()
        .id();
    wait_until(
        "b to run the first job after reconciling",
        late,
        Duration::from_millis(10),
        || async { spans("late: first").first().map(|_| ()) },
    )
    .await
    .unwrap();
    assert!(
        sent.elapsed() < late,
        "b reconciled after the late claim landed"
    );
    let job = client(&pool).get(first).await.unwrap().unwrap();
    assert_eq!(job.attempt, 1, "{job:?}");
    // Both slots busy: only the late claim could take a job enqueued now.
    let second = b
        .jobs()
        .enqueue(
            Span,
            SpanArgs {
                tag: "late: second".into(),
                sleep_ms: 0,
            },
        )
        .await
        .unwrap()
        .id();
    let job = forge_testkit::wait_for(
        "the second job to complete once a slot frees",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || async {
            match client(&pool).get(second).await {
                Ok(Some(job)) if job.state == JobState::Completed => Ok(job),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (job.attempt, job.errors.len()),
        (1, 0),
        "the late claim took nothing: {job:?}"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_was_lost_does_not_cost_an_attempt() {
    let (db, pool) = setup().await;
    let node = jobs_node(job_config(db.url(), "a")).await;
    wait_until(
        "node a to lead the scheduler",
        SOON,
        Duration::from_millis(10),
        || async {
            matches!(
                node.role_state(&Role::SCHEDULER),
                Some(RoleState::Leader { .. })
            )
            .then_some(())
        },
    )
    .await
    .unwrap();
    // The node's start-up is over: its previous run's jobs rescued, then its worker started and
    // took its lane. (A job planted before that rescue would be one of a previous run's.)
    wait_until(
        "node a's worker to take its lane",
        SOON,
        Duration::from_millis(10),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT 1::int8 FROM forge.job_lanes WHERE node_id = 'a' AND lane = 'default'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap();
    // A job claimed by a's worker (one attempt allowed) whose reply never reached it.
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, attempt,
                                 max_attempts, node_id, attempted_at, started_at)
         VALUES ('forge', 'default', 'plain', '{\"tag\": \"lost reply\"}', 'running', now(), 1, 1,
                 'a', now(), now())
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    // The worker reconciles when its node session comes back.
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'forge:node:a'")
        .execute(&pool)
        .await
        .unwrap();
    let job = wait_state(&pool, JobId(id), JobState::Completed).await;
    assert_eq!((job.attempt, job.max_attempts), (2, Some(2)), "{job:?}");
    assert!(
        job.errors[0].error.contains("never ran"),
        "{:?}",
        job.errors
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_ends_a_stuck_fenced_transaction_of_the_leader_it_replaces() {
    let (db, pool) = setup().await;
    let a = start_node(db.url(), "a", &[Role::SCHEDULER]).await;
    let b = start_node(db.url(), "b", &[Role::SCHEDULER]).await;
    let (leader, epoch) = wait_single_leader(&[&a, &b], &Role::SCHEDULER).await;
    let (old, new) = if leader == 0 { (&a, &b) } else { (&b, &a) };
    wait_standby(&pool, "scheduler").await;
    // A fenced transaction of the leader's tenure that does not end: stuck in a statement.
    let tenure: i64 =
        sqlx::query_scalar("SELECT tenure FROM forge.leaders WHERE role = 'scheduler'")
            .fetch_one(&pool)
            .await
            .unwrap();
    let mut stuck = PgConnection::connect(db.url()).await.unwrap();
    let stuck_task = tokio::spawn(async move {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "BEGIN; SELECT forge.fence_holds('forge', 'scheduler', {epoch}, {tenure}); SELECT pg_sleep(3600)"
        )))
        .execute(&mut stuck)
        .await
    });
    wait_until(
        "the stuck fenced transaction",
        SOON,
        Duration::from_millis(10),
        || async {
            let sleeping: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'
                             AND query LIKE '%fence_holds%')",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            sleeping.then_some(())
        },
    )
    .await
    .unwrap();
    // The leader's lock session ends (as a frozen leader's does at its lease).
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1",
    )
    .bind(format!("forge:scheduler:{}", old.id()))
    .execute(&pool)
    .await
    .unwrap();
    let next = wait_until(
        "the standby to lead",
        SOON,
        Duration::from_millis(10),
        || async {
            match new.role_state(&Role::SCHEDULER) {
                Some(RoleState::Leader { epoch: e, .. }) if e.0 > epoch => Some(e.0),
                _ => None,
            }
        },
    )
    .await
    .unwrap();
    assert!(next > epoch);
    let ended = tokio::time::timeout(SOON, stuck_task)
        .await
        .unwrap()
        .unwrap();
    assert!(ended.is_err(), "the stuck transaction's session was ended");
    let fenced: serde_json::Value = sqlx::query_scalar(
        "SELECT detail FROM forge.events WHERE kind = 'leader_fenced' AND role = 'scheduler'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        fenced["terminated_pids"].as_array().map(Vec::len),
        Some(1),
        "{fenced}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_tick_whose_take_over_fails_is_taken_over_later() {
    let (db, pool) = setup().await;
    sqlx::raw_sql("CREATE TABLE yearly_runs (scheduled_at timestamptz, attempt integer)")
        .execute(&pool)
        .await
        .unwrap();
    // A tick a dead tenure left running, and its row held by another transaction for a while
    // (a slow disk, a long operator query): the first take-overs fail.
    let tick: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, node_id, attempt,
                                       state, tenure)
         VALUES ('forge', 'yearly', date_trunc('second', now()) - interval '1 minute', 'scheduler',
                 0, 'ghost', 1, 'running', 12345)
         RETURNING scheduled_at",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let mut holder = PgConnection::connect(db.url()).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT 1 FROM forge.cron_ticks WHERE cron = 'yearly' FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let mut config = config(db.url(), "a");
    config.node.roles = Some(vec!["scheduler".into()]);
    let yearly = CronJob::new(
        "yearly",
        Schedule::parse("0 0 1 1 *").unwrap(),
        |ctx: CronContext| async move {
            sqlx::query("INSERT INTO yearly_runs VALUES ($1, $2)")
                .bind(ctx.scheduled_at())
                .bind(ctx.attempt() as i32)
                .execute(ctx.pool())
                .await
                .map(|_| ())
        },
    );
    let node = Node::builder(config)
        .auto_register(false)
        .cron(yearly)
        .start()
        .await
        .unwrap();
    fault_window(Duration::from_millis(1500)).await;
    holder.close().await.unwrap();
    let run: (DateTime<Utc>, i32) = wait_until(
        "the interrupted tick to be rerun",
        SOON,
        Duration::from_millis(20),
        || async {
            sqlx::query_as("SELECT scheduled_at, attempt FROM yearly_runs")
                .fetch_optional(&pool)
                .await
                .unwrap()
        },
    )
    .await
    .unwrap();
    assert_eq!(run, (tick, 2));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_all_runs_every_tick_that_came_due_during_a_long_run() {
    let (db, pool) = setup().await;
    let mut config = config(db.url(), "a");
    config.node.roles = Some(vec!["scheduler".into()]);
    let first = Arc::new(AtomicBool::new(true));
    let every_second = CronJob::new(
        "every_second",
        Schedule::parse("* * * * * *").unwrap(),
        move |_ctx: CronContext| {
            let slow = first.swap(false, Ordering::SeqCst);
            async move {
                if slow {
                    // A stall: the handler waits on something for 3.5 s.
                    tokio::time::sleep(Duration::from_millis(3500)).await;
                }
            }
        },
    )
    .catch_up(CatchUp::All);
    let node = Node::builder(config)
        .auto_register(false)
        .cron(every_second)
        .start()
        .await
        .unwrap();
    // Until ticks due well after the stall have run.
    let ticks: Vec<(DateTime<Utc>, String)> = wait_until(
        "ticks after the stall",
        SOON,
        Duration::from_millis(50),
        || async {
            let ticks: Vec<(DateTime<Utc>, String)> = sqlx::query_as(
                "SELECT scheduled_at, state FROM forge.cron_ticks WHERE cron = 'every_second'
                  ORDER BY scheduled_at",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            let succeeded = ticks.iter().filter(|(_, s)| s == "succeeded").count();
            (succeeded >= 7).then_some(ticks)
        },
    )
    .await
    .unwrap();
    let skipped: Vec<_> = ticks.iter().filter(|(_, s)| s == "skipped").collect();
    assert_eq!(skipped, Vec::<&(DateTime<Utc>, String)>::new(), "{ticks:?}");
    for pair in ticks.windows(2) {
        assert_eq!(
            (pair[1].0 - pair[0].0).num_seconds(),
            1,
            "every second has its tick: {ticks:?}"
        );
    }
    node.shutdown().await;
}

/// The running spans of [`Span`] attempts, by tag: (node, attempt, started, ended).
type Spans = BTreeMap<String, Vec<(String, u32, Instant, Option<Instant>)>>;
static SPANS: Mutex<Spans> = Mutex::new(BTreeMap::new());

/// Records when it ran in this process (both nodes of a test are in it), until its attempt
/// ends or is stopped.
#[derive(Clone, Copy, Debug)]
struct Span;

struct SpanGuard(String, usize);

impl Drop for SpanGuard {
    fn drop(&mut self) {
        let mut spans = SPANS.lock().unwrap();
        if let Some(span) = spans.get_mut(&self.0).and_then(|v| v.get_mut(self.1)) {
            span.3 = Some(Instant::now());
        }
    }
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct SpanArgs {
    tag: String,
    /// How long the first attempt takes (later ones end at once).
    sleep_ms: u64,
}

impl Job for Span {
    type Args = SpanArgs;
    const KIND: &'static str = "span";

    fn options(&self) -> JobOptions {
        JobOptions::new()
    }

    async fn run(&self, ctx: JobContext, args: SpanArgs) -> Result<(), JobError> {
        let at = {
            let mut spans = SPANS.lock().unwrap();
            let spans = spans.entry(args.tag.clone()).or_default();
            spans.push((
                ctx.node_id().to_string(),
                ctx.attempt(),
                Instant::now(),
                None,
            ));
            spans.len() - 1
        };
        let _guard = SpanGuard(args.tag, at);
        if ctx.attempt() == 1 {
            tokio::time::sleep(Duration::from_millis(args.sleep_ms)).await;
        }
        Ok(())
    }
}

fn spans(tag: &str) -> Vec<(String, u32, Instant, Option<Instant>)> {
    SPANS.lock().unwrap().get(tag).cloned().unwrap_or_default()
}

/// Node `a` (the scheduler's leader, no queue) on the server directly; node `b` (the default
/// queue, no role) through a proxy.
async fn b_behind_a_proxy() -> (forge_testkit::TestDatabase, PgPool, PgProxy, Node, Node) {
    let (db, pool) = setup().await;
    let server = PgServer::shared().unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let mut a_config = job_config(db.url(), "a");
    a_config.node.queues = Some(vec![]);
    let a = jobs_node(a_config).await;
    wait_until(
        "a to lead the scheduler",
        SOON,
        Duration::from_millis(10),
        || async {
            matches!(
                a.role_state(&Role::SCHEDULER),
                Some(RoleState::Leader { .. })
            )
            .then_some(())
        },
    )
    .await
    .unwrap();
    let mut b_config = job_config(&proxy.url_for(server, db.name()), "b");
    b_config.node.roles = Some(vec![]);
    let b = jobs_node(b_config).await;
    (db, pool, proxy, a, b)
}

/// Enqueues a [`Span`] job on `node` and waits until `node` runs it.
async fn span_running(node: &Node, tag: &str, sleep_ms: u64) -> JobId {
    let id = node
        .jobs()
        .enqueue(
            Span,
            SpanArgs {
                tag: tag.into(),
                sleep_ms,
            },
        )
        .await
        .unwrap()
        .id();
    wait_until(
        &format!("{} to run {tag}", node.id()),
        SOON,
        Duration::from_millis(10),
        || async { spans(tag).first().map(|_| ()) },
    )
    .await
    .unwrap();
    assert_eq!(spans(tag)[0].0, node.id().as_str());
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_node_session_cannot_reopen_but_whose_pool_works_stays_a_member() {
    let (_db, pool, proxy, a, b) = b_behind_a_proxy().await;
    let id = span_running(&b, "member", 6000).await;
    // b's node session is cut (the server sees it end at once) and cannot be reopened (as
    // when the server's connections are full); its pool still works.
    let node_session = Filter::application_prefix("forge:node:b");
    proxy.blackhole(node_session.clone());
    assert_eq!(proxy.sever(&node_session), 1);
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(
        (job.attempt, job.node_id.as_deref()),
        (1, Some("b")),
        "{job:?}"
    );
    let down: i64 =
        sqlx::query_scalar("SELECT count(*) FROM forge.events WHERE kind = 'node_down'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(down, 0, "b was never marked down");
    assert_eq!(spans("member").len(), 1, "{:?}", spans("member"));
    proxy.heal(&node_session);
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_stops_its_attempts_before_they_can_be_rescued() {
    let (db, pool, proxy, a, b) = b_behind_a_proxy().await;
    let id = span_running(&b, "cut off", 15_000).await;
    // A node that can run the job once it is rescued.
    let mut c_config = job_config(db.url(), "c");
    c_config.node.roles = Some(vec![]);
    let c = jobs_node(c_config).await;
    // b is cut off from PostgreSQL: every flow silent, nothing reaches the server.
    let everything = Filter::application_prefix("forge:");
    proxy.blackhole(everything.clone());
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.node_id.as_deref(), Some("c"), "{job:?}");
    let spans = spans("cut off");
    assert_eq!(spans.len(), 2, "{spans:?}");
    let (b_span, c_span) = (&spans[0], &spans[1]);
    assert_eq!((b_span.0.as_str(), c_span.0.as_str()), ("b", "c"));
    let b_stopped = b_span.3.expect("b's attempt was stopped");
    assert!(
        b_stopped <= c_span.2,
        "b's attempt ran on for {:?} after c's began",
        b_stopped - c_span.2
    );
    proxy.heal(&everything);
    c.shutdown().await;
    b.shutdown().await;
    a.shutdown().await;
}

/// A node on `url` that works no queue and leads no role, with a pool of `connections`: its pool
/// serves the test alone.
async fn pool_node(url: &str, id: &str, connections: u32) -> Node {
    let mut config = config(url, id);
    config.node.roles = Some(vec![]);
    config.node.queues = Some(vec![]);
    config.database.max_connections = connections;
    jobs_node(config).await
}

/// Fails unless `conn` runs autocommit statements each in its own transaction: two statements,
/// two transaction ids. Inside a transaction left behind they share one.
async fn assert_autocommit(conn: &mut PgConnection, context: &str) {
    let mut xid = async || {
        sqlx::query_scalar::<_, i64>("SELECT txid_current()")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    };
    let (first, second) = (xid().await, xid().await);
    assert_ne!(
        first, second,
        "{context}: autocommit statements ran inside a transaction left behind"
    );
}

async fn backend_pid(conn: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_cancelled_in_flight_leaves_no_transaction_behind() {
    // A begin() on the node's pool whose future is dropped while its BEGIN travels (a handler's
    // timeout, a lost leadership): the next user of the pool must not inherit the transaction.
    let db = fresh_db().await;
    let node = pool_node(db.url(), "a", 1).await;
    let pool = node.pool();
    let mut cancelled = 0;
    for i in 0..300u64 {
        let cut = Duration::from_micros((i % 30) * 20);
        if tokio::time::timeout(cut, pool.begin()).await.is_err() {
            cancelled += 1;
        }
        let mut conn = pool.acquire().await.unwrap();
        assert_autocommit(&mut conn, &format!("after {cancelled} cancelled begins")).await;
    }
    assert!(cancelled > 0, "no begin was cut short");
    node.shutdown().await;
}

/// Begins transactions on the node's pool, one after another, until its timeout drops it:
/// sooner or later while a `BEGIN` travels.
#[derive(Clone, Copy, Debug)]
struct CutBegin;

impl Job for CutBegin {
    type Args = ();
    const KIND: &'static str = "cut_begin";

    fn options(&self) -> JobOptions {
        JobOptions::new()
            .timeout(Duration::from_millis(20))
            .max_attempts(1)
    }

    async fn run(&self, ctx: JobContext, _: ()) -> Result<(), JobError> {
        loop {
            // Dropped at once: rolled back by sqlx on the connection's next use.
            let _ = ctx.pool().begin().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_begin_cut_by_its_timeout_leaves_no_transaction_behind() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    config.jobs.queues = [("default".to_owned(), 1.into())].into_iter().collect();
    let node = jobs_node(config).await;
    for round in 1..=30 {
        let id = node.jobs().enqueue(CutBegin, ()).await.unwrap().id();
        let job = wait_state(&pool, id, JobState::Dead).await;
        assert!(
            job.errors[0].error.contains("timed out"),
            "{:?}",
            job.errors
        );
        // Every connection the pool holds idle now, each asked twice.
        let mut held = Vec::new();
        for _ in 0..node.pool().num_idle() {
            held.push(node.pool().acquire().await.unwrap());
        }
        for conn in &mut held {
            assert_autocommit(conn, &format!("after {round} jobs cut by their timeout")).await;
        }
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_pool_session_gives_its_slot_back_within_seconds() {
    let db = fresh_db().await;
    let server = PgServer::shared().unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let node = pool_node(&proxy.url_for(server, db.name()), "a", 1).await;
    let pool = node.pool();
    let mut conn = pool.acquire().await.unwrap();
    let flows: Vec<u64> = proxy
        .connections()
        .into_iter()
        .filter(|c| c.application_name == "forge:pool:a")
        .map(|c| c.id)
        .collect();
    assert_eq!(flows.len(), 1, "the pool's one session: {flows:?}");
    // The session goes half-open mid-statement: the statement is abandoned by a timeout, and
    // its connection goes back to the pool without an answer.
    proxy.blackhole(Filter::Connection(flows[0]));
    let answered = tokio::time::timeout(
        Duration::from_millis(500),
        sqlx::query("SELECT 1").execute(&mut *conn),
    )
    .await;
    assert!(answered.is_err(), "a black-holed statement was answered");
    drop(conn);
    // The pool's only slot comes back within seconds: its next acquire is served (by a new
    // session) within the acquire timeout (5 s), not after TCP gives up.
    let began = Instant::now();
    let mut next = pool
        .acquire()
        .await
        .expect("the pool serves an acquire after a half-open session");
    assert_autocommit(&mut next, "a new session").await;
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "the slot came back after {:?}",
        began.elapsed()
    );
    drop(next);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_dropped_while_it_begins_keeps_its_connection() {
    // FORGE's own BEGINs (fenced transactions, status reads, operators' writes) run on a task
    // of their own: a caller dropped mid-BEGIN costs no connection, and leaves no transaction.
    let db = fresh_db().await;
    let mut config = config(db.url(), "a");
    config.node.roles = Some(vec!["scheduler".into()]);
    config.node.queues = Some(vec![]);
    config.database.max_connections = 1;
    let node = jobs_node(config).await;
    wait_single_leader(&[&node], &Role::SCHEDULER).await;
    let leadership = node.leadership(&Role::SCHEDULER).unwrap();
    let first = backend_pid(&mut node.pool().acquire().await.unwrap()).await;
    let mut cancelled = 0;
    for i in 0..300u64 {
        let cut = Duration::from_micros((i % 30) * 20);
        if tokio::time::timeout(cut, leadership.fenced_transaction())
            .await
            .is_err()
        {
            cancelled += 1;
        }
        let mut conn = node.pool().acquire().await.unwrap();
        let context = format!("after {cancelled} cancelled fenced transactions");
        assert_autocommit(&mut conn, &context).await;
        assert_eq!(
            backend_pid(&mut conn).await,
            first,
            "{context}: the connection was replaced"
        );
    }
    assert!(cancelled > 0, "no fenced transaction was cut short");
    node.shutdown().await;
}
