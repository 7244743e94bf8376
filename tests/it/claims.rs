//! A claim is a HOT update (migration 0016): it writes a running job's state, node, attempt and
//! times, none of which an index names, so it writes no index entry. A running job is found
//! through its lane's list (`forge.job_lanes.running`, written by the claim) or, when it was made
//! running some other way, through the busy index (`phase = 'busy'`); `forge.jobs_running`
//! reads both, and rescue, reconciliation and the queue figures read it. (A claimed job's
//! rescue after a SIGKILL: `jobs_process`.)

use forge::jobs::{JobState, NewJob};
use forge::{LockNamespace, Node};
use forge_testkit::wait_until;
use sqlx::{Connection, PgPool};

use crate::jobs::{
    Behave, INCARNATION, RUNS_TABLE_SQL, inserted, job_config, plain, setup, step_as, step_holding,
    wait_for_lock_waiter, wait_state,
};
use crate::support::*;

/// `(n_tup_upd, n_tup_hot_upd)` of `forge.jobs_live` once the statistics show at least `n`
/// updates (backends report theirs within about a second of going idle).
async fn updates_of_jobs_live(pool: &PgPool, n: i64) -> (i64, i64) {
    wait_until(
        &format!("{n} updates of forge.jobs_live in pg_stat_user_tables"),
        SOON * 3,
        std::time::Duration::from_millis(100),
        || async {
            let (upd, hot): (i64, i64) = sqlx::query_as(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
                  WHERE relid = 'forge.jobs_live'::regclass",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            (upd >= n).then_some((upd, hot))
        },
    )
    .await
    .unwrap()
}

/// `n` plain jobs tagged `<tag> <i>`, enqueued directly (no node); their ids in order.
async fn enqueue_plain(pool: &PgPool, tag: &str, n: usize) -> Vec<i64> {
    let jobs = forge::jobs::Jobs::new(pool.clone(), &LockNamespace::default());
    let mut ids = Vec::new();
    for i in 0..n {
        let new = NewJob::new(plain, Behave::tag(format!("{tag} {i}")));
        ids.push(inserted(jobs.enqueue_job(new).await.unwrap()).0);
    }
    ids
}

/// The phase of job `id` (migration 0016).
async fn phase(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT phase FROM forge.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The list of lane `default` of node `node`, sorted.
async fn listed(pool: &PgPool, node: &str) -> Vec<i64> {
    let mut listed: Vec<i64> = sqlx::query_scalar(
        "SELECT running FROM forge.job_lanes WHERE node_id = $1 AND lane = 'default'",
    )
    .bind(node)
    .fetch_one(pool)
    .await
    .unwrap();
    listed.sort();
    listed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_writes_no_index_entry_and_the_lane_lists_the_job_while_it_runs() {
    let (db, pool) = setup().await;
    let node = Node::builder(job_config(db.url(), "a"))
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts");
    let mut ids = Vec::new();
    for i in 0..3 {
        let behave = Behave {
            sleep_ms: 600_000,
            ..Behave::tag(format!("long {i}"))
        };
        ids.push(inserted(
            node.jobs()
                .enqueue_job(NewJob::new(plain, behave))
                .await
                .unwrap(),
        ));
    }
    for &id in &ids {
        wait_state(&pool, id, JobState::Running).await;
    }
    let ids: Vec<i64> = ids.iter().map(|id| id.0).collect();

    let phases: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT state, phase, node_id FROM forge.jobs WHERE id = ANY ($1) ORDER BY id",
    )
    .bind(&ids)
    .fetch_all(&pool)
    .await
    .unwrap();
    let claimed = (
        "running".to_owned(),
        "ready".to_owned(),
        Some("a".to_owned()),
    );
    assert_eq!(phases, vec![claimed; 3], "state, phase and node of {ids:?}");
    let listed = listed(&pool, "a").await;
    assert!(
        ids.iter().all(|id| listed.contains(id)),
        "the lane lists {listed:?}, not all of {ids:?}"
    );
    let running: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM forge.jobs_running('forge', 'a') ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(running, ids);

    // The three claims were the table's only updates, and each was HOT.
    let (updates, hot) = updates_of_jobs_live(&pool, 3).await;
    assert_eq!(
        (updates, hot),
        (3, 3),
        "updates of forge.jobs_live, and how many were HOT"
    );

    // The running jobs count as running in the queue figures, not as available.
    let figures: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, n FROM forge.jobs_figures('forge') WHERE queue = 'default' ORDER BY state",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(figures, vec![("running".to_owned(), 3)]);
    node.shutdown().await;
}

/// A claim whose caller does not say what it holds (`p_held` NULL: an older node, a direct call)
/// keeps of the lane's list the jobs still running on its node, and adds its claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_the_held_jobs_keeps_the_listed_jobs_still_running() {
    let (_db, pool) = setup().await;
    let ids = enqueue_plain(&pool, "direct", 3).await;
    step_as(pool.clone(), "x", 2, Vec::new(), true).await;
    assert_eq!(listed(&pool, "x").await, ids[..2]);
    // The first completed in this round trip, the third claimed: the second stays listed.
    step_as(pool.clone(), "x", 1, vec![(ids[0], 1, "completed")], true).await;
    assert_eq!(listed(&pool, "x").await, ids[1..]);
}

/// A lane's list of a worker holding hundreds of jobs leaves its row: it is stored with lz4
/// (migration 0019), or uncompressed out of line where the server has no lz4 - never with pglz,
/// PostgreSQL's default, whose compression cost each claim 0.5 to 1 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lane_list_is_stored_with_lz4_or_uncompressed_never_with_pglz() {
    let (_db, pool) = setup().await;
    enqueue_plain(&pool, "long", 2).await;
    let held: Vec<i64> = (1_000_000..1_001_000).collect();
    let claimed = step_holding(pool.clone(), "x", 2, Vec::new(), true, Some(&held)).await;
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    assert_eq!(listed(&pool, "x").await.len(), 1002);
    let storage: String = sqlx::query_scalar(
        "SELECT attstorage::text FROM pg_attribute
          WHERE attrelid = 'forge.job_lanes'::regclass AND attname = 'running'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&pool)
        .await
        .unwrap();
    if version < 140_000 {
        // PostgreSQL 13 has neither lz4 nor pg_column_compression: stored out of line.
        assert_eq!(storage, "e", "the list is stored uncompressed out of line");
        return;
    }
    let compression: Option<String> = sqlx::query_scalar(
        "SELECT pg_column_compression(running) FROM forge.job_lanes
          WHERE node_id = 'x' AND lane = 'default'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    match compression.as_deref() {
        Some("lz4") => {}
        None => assert_eq!(storage, "e", "an uncompressed list is stored out of line"),
        other => panic!("the lane's list is compressed with {other:?}, not lz4"),
    }
}

/// An orphan of the lane (running on its node, not held by its worker: a claim whose reply was
/// lost) that the reconciliation cannot lock, because another transaction holds it, stays
/// listed through the claims that follow, which name only what the worker holds, until a
/// reconciliation settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_the_reconciliation_could_not_lock_stays_listed_through_the_claims() {
    let (_db, pool) = setup().await;
    let ids = enqueue_plain(&pool, "orphan", 2).await;
    step_as(pool.clone(), "x", 1, Vec::new(), true).await;
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM forge.jobs_live WHERE id = $1 FOR UPDATE")
        .bind(ids[0])
        .execute(&mut *holder)
        .await
        .unwrap();
    let answer: Vec<(Option<i64>, String)> = sqlx::query_as(
        "SELECT id, status FROM forge.jobs_reconcile('forge', 'x', 'default', NULL, NULL, $1,
                                                     '{}', '{}', 20, 1000)",
    )
    .bind(INCARNATION)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        answer.contains(&(Some(ids[0]), "unsettled".to_owned())),
        "{answer:?}"
    );
    // The worker holds nothing; its claim takes the second job and keeps the first listed.
    step_holding(pool.clone(), "x", 1, Vec::new(), true, Some(&[])).await;
    assert_eq!(listed(&pool, "x").await, ids);
    let running: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM forge.jobs_running('forge', 'x') ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(running, ids);
    holder.rollback().await.unwrap();
}

/// The rescue pass reads only the lists that may name a lost job (`forge.jobs_running`'s
/// `p_maybe_lost`): a role lane's (its leadership may have ended) and those of nodes that are
/// not live members - not a live node's queue lanes, whose jobs are not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rescue_pass_reads_the_lists_of_roles_and_of_nodes_not_live_only() {
    let (_db, pool) = setup().await;
    let ids = enqueue_plain(&pool, "lanes", 3).await;
    step_as(pool.clone(), "live", 1, Vec::new(), true).await;
    step_as(pool.clone(), "gone", 1, Vec::new(), true).await;
    // The third runs on the live node under a role lane, as a role worker's claim lists it.
    sqlx::query(
        "UPDATE forge.nodes SET down_at = now(), down_reason = 'killed' WHERE node_id = 'gone'",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE forge.jobs_live SET state = 'running', phase = 'ready', node_id = 'live',
                attempt = 1 WHERE id = $1",
    )
    .bind(ids[2])
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO forge.job_lanes (namespace, node_id, lane, incarnation, generation, taken_at,
                                      running)
         VALUES ('forge', 'live', '@reports', $1, 1, now(), ARRAY[$2::bigint])",
    )
    .bind(INCARNATION)
    .bind(ids[2])
    .execute(&pool)
    .await
    .unwrap();
    let running = |maybe_lost: bool| {
        let pool = pool.clone();
        async move {
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT id FROM forge.jobs_running('forge', NULL, $1) ORDER BY id",
            )
            .bind(maybe_lost)
            .fetch_all(&pool)
            .await
            .unwrap();
            ids
        }
    };
    assert_eq!(running(false).await, ids, "every running job");
    assert_eq!(
        running(true).await,
        ids[1..],
        "the jobs of the node marked down and of the role's lane, not the live node's queue's"
    );
}

/// `forge.jobs_rescue` locks the rows it takes back, then writes the versions it locked (by tid).
/// A row another transaction holds is skipped and reported `locked` when the caller asks (the
/// scheduler's pass); otherwise the rescue waits for it, and then writes the version that
/// transaction left if the job still runs this attempt, and leaves the job alone if it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_writes_the_versions_it_locked_and_skips_or_waits_for_held_rows() {
    let (_db, pool) = setup().await;
    let ids = enqueue_plain(&pool, "held", 3).await;
    let claimed = step_as(pool.clone(), "gone", 3, Vec::new(), true).await;
    assert_eq!(claimed.iter().filter(|r| r.1).count(), 3, "{claimed:?}");
    // Two transactions hold a job each: one writes its start (it still runs), one ends it.
    let mut still_running = pool.begin().await.unwrap();
    sqlx::query("UPDATE forge.jobs_live SET started_at = clock_timestamp() WHERE id = $1")
        .bind(ids[0])
        .execute(&mut *still_running)
        .await
        .unwrap();
    let mut ended = pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE forge.jobs_live SET state = 'dead', phase = 'dead', finished_at = clock_timestamp()
          WHERE id = $1",
    )
    .bind(ids[1])
    .execute(&mut *ended)
    .await
    .unwrap();
    let rescue = |skip_locked: bool| {
        let pool = pool.clone();
        let ids = ids.clone();
        async move {
            let mut rows: Vec<(i64, String)> = sqlx::query_as(
                "SELECT id, state FROM forge.jobs_rescue($1, ARRAY[1, 1, 1],
                        ARRAY['node gone is down', 'node gone is down', 'node gone is down'],
                        ARRAY[true, true, true], 25, $2)",
            )
            .bind(&ids)
            .bind(skip_locked)
            .fetch_all(&pool)
            .await
            .unwrap();
            rows.sort();
            rows
        }
    };

    assert_eq!(
        rescue(true).await,
        [
            (ids[0], "locked".to_string()),
            (ids[1], "locked".to_string()),
            (ids[2], "available".to_string()),
        ],
        "the held rows are reported, the free one is rescued"
    );

    let waiting = tokio::spawn(rescue(false));
    wait_for_lock_waiter(
        &pool,
        "the rescue to wait for the held rows",
        "query LIKE $1",
        "%jobs_rescue%",
    )
    .await;
    still_running.commit().await.unwrap();
    ended.commit().await.unwrap();
    assert_eq!(
        waiting.await.unwrap(),
        [(ids[0], "available".to_string())],
        "the job that still ran is rescued, the one that ended is left alone"
    );
    let rows: Vec<(i64, String, bool, String)> = sqlx::query_as(
        "SELECT id, state, started_at IS NOT NULL, errors::text FROM forge.jobs
          WHERE id = ANY ($1) ORDER BY id",
    )
    .bind(&ids[..2])
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2),
        ("available", true),
        "{rows:?}"
    );
    assert!(
        rows[0].3.contains("node gone is down"),
        "rescued from the version the other transaction left (its start kept): {rows:?}"
    );
    assert_eq!(rows[1].1, "dead", "{rows:?}");
    assert!(!rows[1].3.contains("node gone is down"), "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_made_running_by_hand_is_busy_and_rescue_finds_it() {
    let (db, pool) = setup().await;
    let jobs = forge::jobs::Jobs::new(pool.clone(), &LockNamespace::default());
    let id = inserted(
        jobs.enqueue_job(
            NewJob::new(plain, Behave::tag("by hand")).delay(std::time::Duration::from_secs(3600)),
        )
        .await
        .unwrap(),
    );
    // Running on a node that is not a member, written by hand from `scheduled`: in no lane's
    // list, so the trigger makes it busy.
    sqlx::query(
        "UPDATE forge.jobs SET state = 'running', node_id = 'ghost', attempt = 1,
                attempted_at = clock_timestamp(), started_at = clock_timestamp()
          WHERE id = $1",
    )
    .bind(id.0)
    .execute(&pool)
    .await
    .unwrap();
    let phase = phase(&pool, id.0).await;
    assert_eq!(phase, "busy");

    let node = Node::builder(job_config(db.url(), "a"))
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts");
    let done = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(done.attempt, 2, "{done:?}");
    assert!(
        done.errors
            .iter()
            .any(|e| e.error.contains("node ghost is not a member")),
        "rescued as a non-member's job: {done:?}"
    );
    node.shutdown().await;
}

/// The phase of every state an operator's SQL can write, from every state and from a claimed
/// job: the trigger of `forge.jobs_phase` sets it (its `WHEN` tests the consistent pairs), and
/// leaves a claimed job's `ready` alone. So a hand-written change neither hides a job from the
/// claims and the queue figures nor puts one there that no claim may take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_written_by_hand_gets_its_phase() {
    let (_db, pool) = setup().await;
    let states = [
        "pending",
        "available",
        "scheduled",
        "running",
        "retryable",
        "dead",
        "cancelled",
    ];
    fn phase_of(state: &str) -> &str {
        match state {
            "available" => "ready",
            "running" => "busy",
            other => other,
        }
    }
    // Each start: a state inserted by hand (its phase left to the default), or a job as a
    // claim leaves it (running, its phase written 'ready').
    let mut starts: Vec<(&str, &str)> = states.iter().map(|&s| (s, phase_of(s))).collect();
    starts.push(("running", "ready"));
    let mut got = Vec::new();
    let mut expected = Vec::new();
    for &(from, from_phase) in &starts {
        for &to in &states {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at)
                 VALUES ('forge', 'by-hand', 'plain', '{}', $1, clock_timestamp()) RETURNING id",
            )
            .bind(from)
            .fetch_one(&pool)
            .await
            .unwrap();
            sqlx::query("UPDATE forge.jobs_live SET phase = $2 WHERE id = $1 AND phase <> $2")
                .bind(id)
                .bind(from_phase)
                .execute(&pool)
                .await
                .unwrap();
            let start = phase(&pool, id).await;
            assert_eq!(
                start, from_phase,
                "the start ({from}, {from_phase}) of job {id}"
            );
            sqlx::query("UPDATE forge.jobs SET state = $2 WHERE id = $1")
                .bind(id)
                .bind(to)
                .execute(&pool)
                .await
                .unwrap();
            let phase = phase(&pool, id).await;
            got.push(format!("{from}/{from_phase} -> {to}: {phase}"));
            // Running from a phase 'ready' keeps it (a claim's; by hand from available, the
            // one change the trigger cannot tell from a claim: see migration 0016).
            let want = if to == "running" && from_phase == "ready" {
                "ready"
            } else {
                phase_of(to)
            };
            expected.push(format!("{from}/{from_phase} -> {to}: {want}"));
        }
    }
    assert_eq!(got, expected);

    // A phase written by hand that is not its state's is put back.
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, phase)
         VALUES ('forge', 'by-hand', 'plain', '{}', 'dead', clock_timestamp(), 'ready')
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE forge.jobs SET phase = 'busy' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let phase = phase(&pool, id).await;
    assert_eq!(phase, "dead");
}

/// Migration 0016 on a database at 0015 with jobs in every state: each gets its phase, and a
/// job running then (in no lane's list) is busy, so rescue still finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_phase_migration_gives_each_job_its_phase_and_running_jobs_stay_found() {
    let db = fresh_db().await;
    let mut conn = db.connect().await.unwrap();
    migrate_until(&mut conn, 15).await;
    let states = [
        "available",
        "scheduled",
        "running",
        "retryable",
        "completed",
        "dead",
        "cancelled",
    ];
    for state in states {
        sqlx::query(
            "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, attempt, node_id,
                                     finished_at)
             VALUES ('forge', 'default', 'plain', '{\"tag\": \"at 0015\"}', $1, clock_timestamp(),
                     CASE WHEN $1 = 'available' THEN 0 ELSE 1 END,
                     CASE WHEN $1 = 'available' THEN NULL ELSE 'gone' END,
                     CASE WHEN $1 IN ('completed', 'dead', 'cancelled')
                          THEN clock_timestamp() END)",
        )
        .bind(state)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    conn.close().await.unwrap();
    // The table the test jobs record their runs in (`jobs::setup` makes it likewise).
    let pool = db.pool().await.unwrap();
    sqlx::raw_sql(RUNS_TABLE_SQL).execute(&pool).await.unwrap();

    // Migrated by a node that works nothing (no roles, no queues): nothing is rescued yet.
    let mut idle = job_config(db.url(), "migrator");
    idle.node.roles = Some(Vec::new());
    idle.node.queues = Some(Vec::new());
    Node::builder(idle)
        .auto_register(false)
        .start()
        .await
        .expect("node starts and migrates")
        .shutdown()
        .await;
    let phases: Vec<(String, String)> = sqlx::query_as(
        "SELECT state, phase FROM forge.jobs WHERE args ->> 'tag' = 'at 0015' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected: Vec<(String, String)> = states
        .iter()
        .map(|&state| {
            let phase = match state {
                "available" => "ready",
                "running" => "busy",
                other => other,
            };
            (state.to_owned(), phase.to_owned())
        })
        .collect();
    assert_eq!(phases, expected);

    // The running one, in no lane's list, is found and rescued, then runs.
    let running: i64 = sqlx::query_scalar(
        "SELECT id FROM forge.jobs WHERE args ->> 'tag' = 'at 0015' AND state = 'running'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let node = Node::builder(job_config(db.url(), "a"))
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts");
    let done = wait_state(&pool, forge::jobs::JobId(running), JobState::Completed).await;
    assert!(
        done.errors.iter().any(|e| e.error.contains("node gone")),
        "the job running at the migration was rescued: {done:?}"
    );
    node.shutdown().await;
}
