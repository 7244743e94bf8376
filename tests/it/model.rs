//! The cluster model: membership states (drifted, down, forgotten) seen from outside, the
//! read models, the built-in roles' duties (pruning by the log compactor, rollups by whichever
//! node leads the metrics aggregator), cron pause, a custom namespace's transactional
//! enqueue, application migrations under concurrent starts, and the SQL CHECK lists.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use forge::crons::{CatchUp, CronJob, TickState};
use forge::inspect::{
    EventFilter, EventKind, JobFilter, NodeState, PageRequest, TenureEnd, WorkKind,
};
use forge::jobs::{JobState, NewJob};
use forge::{Config, CronContext, FenceToken, LockNamespace, Node, Role, Schedule};
use forge_testkit::wait_until;
use sqlx::{PgPool, Row};

use crate::jobs::{
    Behave, RUNS_TABLE_SQL, inserted, job_config, mailer, metric, plain, report, setup, wait_state,
};
use crate::support::*;

/// A config that campaigns for every built-in role, with quick duties.
fn all_roles(url: &str, node: &str) -> Config {
    let mut config = job_config(url, node);
    config.node.roles = Some(Role::BUILTIN.iter().map(|r| r.name().to_owned()).collect());
    config.node.campaign_without_work = true;
    config.cluster.compaction_interval = Duration::from_millis(500);
    config.metrics.rollup_interval = Duration::from_secs(1);
    config
}

async fn node_state(pool: &PgPool, node: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT CASE WHEN stopped_at IS NOT NULL THEN 'stopped' WHEN down_at IS NOT NULL THEN 'down'
                     WHEN drifted_at IS NOT NULL THEN 'drifted' ELSE 'active' END
           FROM forge.nodes WHERE node_id = $1",
    )
    .bind(node)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn wait_node_state(pool: &PgPool, node: &str, state: Option<&str>, within: Duration) {
    wait_until(
        &format!("node {node} to be {state:?}"),
        within,
        Duration::from_millis(50),
        || async { (node_state(pool, node).await.as_deref() == state).then_some(()) },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_drifts_a_killed_one_goes_down_and_is_forgotten() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("membership");
    std::fs::write(
        dir.0.join("forge.toml"),
        format!(
            "{}\n[cluster]\ncompaction_interval = \"500ms\"\n",
            config_toml(db.url())
        )
        .replace(
            "down_after = \"3s\"",
            "down_after = \"3s\"\nforget_after = \"4s\"",
        ),
    )
    .unwrap();
    let mut watcher = Probe::start(&db, &dir.0, "watcher", &["scheduler", "log_compactor"]).await;
    let mut frozen = Probe::start(&db, &dir.0, "frozen", &[]).await;
    let mut killed = Probe::start(&db, &dir.0, "killed", &[]).await;
    for node in ["watcher", "frozen", "killed"] {
        wait_node_state(&pool, node, Some("active"), SOON).await;
    }
    // SIGSTOP: no heartbeat for drift_after (1.5 s): drifted; after SIGCONT, active again.
    frozen.process.pause().unwrap();
    wait_node_state(&pool, "frozen", Some("drifted"), SOON).await;
    frozen.process.resume().unwrap();
    wait_node_state(&pool, "frozen", Some("active"), SOON).await;
    // SIGKILL: its node session ends while PostgreSQL stays up: down within about a
    // heartbeat interval, then forgotten after forget_after.
    killed.process.kill().unwrap();
    wait_node_state(&pool, "killed", Some("down"), SOON).await;
    let (reason,): (String,) = sqlx::query_as(
        "SELECT detail->>'reason' FROM forge.events WHERE kind = 'node_down' AND node_id = 'killed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(reason, "session_ended");
    wait_node_state(&pool, "killed", None, SOON).await;
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT kind FROM forge.events WHERE node_id IN ('frozen', 'killed') ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for expected in [
        "node_joined",
        "node_drifted",
        "node_recovered",
        "node_down",
        "node_forgotten",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "{expected} in {kinds:?}"
        );
    }
    frozen.process.terminate().unwrap();
    frozen.process.wait_exit(SOON).await.unwrap();
    wait_node_state(&pool, "frozen", Some("stopped"), SOON).await;
    watcher.process.terminate().unwrap();
    watcher.process.wait_exit(SOON).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_compactor_prunes_the_ledger_by_retention_and_keeps_each_crons_newest_tick() {
    let (db, pool) = setup().await;
    // Finished ticks of two crons over the last 30 days, of a third 10 to 20 days ago, and an
    // old event.
    sqlx::raw_sql(
        "INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, tenure, node_id, state, claimed_at, finished_at)
         SELECT 'forge', c, now() - n * interval '1 day', 'scheduler', 1, 1, 'gone', 'succeeded',
                now() - n * interval '1 day', now() - n * interval '1 day'
           FROM unnest(ARRAY['a', 'b']) AS c, generate_series(1, 30) AS n
         UNION ALL
         SELECT 'forge', 'c', now() - n * interval '1 day', 'scheduler', 1, 1, 'gone', 'succeeded',
                now() - n * interval '1 day', now() - n * interval '1 day'
           FROM generate_series(10, 20) AS n;
         INSERT INTO forge.events (namespace, kind, node_id, at)
         VALUES ('forge', 'node_joined', 'ancient', now() - interval '400 days');",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut config = all_roles(db.url(), "a");
    config.cron.ledger_retention = Duration::from_secs(3 * 24 * 3600);
    config.cluster.history_retention = Duration::from_secs(365 * 24 * 3600);
    let node = Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .unwrap();
    wait_until(
        "the ledger to be pruned",
        SOON,
        Duration::from_millis(50),
        || async {
            let left: Vec<(String, i64)> = sqlx::query_as(
                "SELECT cron, count(*) FROM forge.cron_ticks GROUP BY cron ORDER BY cron",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            // Ticks finished 1 and 2 days ago stay (retention 3 days); of c, only its newest,
            // where the next leader resumes.
            let expected = [("a", 2), ("b", 2), ("c", 1)].map(|(c, n)| (c.to_owned(), n));
            (left == expected).then_some(())
        },
    )
    .await
    .unwrap();
    let ancient: i64 =
        sqlx::query_scalar("SELECT count(*) FROM forge.events WHERE node_id = 'ancient'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(ancient, 0, "events older than history_retention are pruned");
    let pruned = node.render_metrics();
    assert!(
        pruned.contains("forge_compactor_pruned_total{table=\"cron_ticks\"} 66"),
        "{pruned}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_compactor_prunes_stats_and_jobs_by_their_own_retention_in_one_pass_of_many_batches()
 {
    let (db, pool) = setup().await;
    // Series points 10 days old (25,000: three batches of 10,000) and an hour old; finished
    // jobs 3 days old (12,002 completed or cancelled: two batches) and an hour old; dead jobs
    // 10 and 3 days old.
    sqlx::raw_sql(
        "INSERT INTO forge.stats (namespace, at, series, label, value)
         SELECT 'forge', now() - interval '10 days' - n * interval '1 second', 'jobs_completed', 'old', 1
           FROM generate_series(1, 25000) AS n
         UNION ALL
         SELECT 'forge', now() - interval '1 hour' - n * interval '1 second', 'jobs_completed', 'recent', 1
           FROM generate_series(1, 5) AS n;
         INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, created_at,
                                 finished_at, unique_key)
         SELECT 'forge', 'default', 'gone', '{}', s, now() - a, now() - a, now() - a, tag
           FROM (SELECT 'completed' AS s, interval '3 days' AS a, 'finished_old' AS tag
                   FROM generate_series(1, 12000)
                 UNION ALL SELECT 'cancelled', interval '3 days', 'finished_old' FROM generate_series(1, 2)
                 UNION ALL SELECT 'completed', interval '1 hour', 'finished_recent' FROM generate_series(1, 4)
                 UNION ALL SELECT 'dead', interval '10 days', 'dead_old' FROM generate_series(1, 7)
                 UNION ALL SELECT 'dead', interval '3 days', 'dead_recent' FROM generate_series(1, 6)) AS j;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut config = all_roles(db.url(), "a");
    config.metrics.rollup_retention = Duration::from_secs(2 * 24 * 3600);
    config.jobs.completed_retention = Duration::from_secs(24 * 3600);
    config.jobs.dead_retention = Duration::from_secs(5 * 24 * 3600);
    // One pass only (the first, a few seconds into the tenure): what a pass leaves stays.
    config.cluster.compaction_interval = Duration::from_secs(3600);
    let node = Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .unwrap();
    let left = || async {
        let stats: Vec<(String, i64)> = sqlx::query_as(
            "SELECT label, count(*) FROM forge.stats WHERE label IN ('old', 'recent')
              GROUP BY label ORDER BY label",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let jobs: Vec<(String, i64)> = sqlx::query_as(
            "SELECT unique_key, count(*) FROM forge.jobs GROUP BY unique_key ORDER BY unique_key",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        (stats, jobs)
    };
    let expected = (
        vec![("recent".to_owned(), 5)],
        vec![
            ("dead_recent".to_owned(), 6),
            ("finished_recent".to_owned(), 4),
        ],
    );
    let counters = || {
        let text = node.render_metrics();
        ["stats", "jobs_finished", "jobs_dead"].map(|table| {
            metric(
                &text,
                &format!("forge_compactor_pruned_total{{table=\"{table}\"}}"),
            )
        })
    };
    forge_testkit::wait_for(
        "the compactor's first pass to prune everything due",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let (rows, pruned) = (left().await, counters());
            if rows == expected && pruned == [Some(25_000.0), Some(12_002.0), Some(7.0)] {
                Ok(())
            } else {
                Err(format!(
                    "left {rows:?}, pruned (stats, jobs_finished, jobs_dead) {pruned:?}"
                ))
            }
        },
    )
    .await
    .unwrap();
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_compactor_cannot_prune() {
    let (db, pool) = setup().await;
    sqlx::raw_sql(
        "INSERT INTO forge.stats (namespace, at, series, label, value)
         SELECT 'forge', now() - n * interval '1 day', 'jobs_completed', 'default', 1
           FROM generate_series(10, 12) AS n",
    )
    .execute(&pool)
    .await
    .unwrap();
    let config = |node: &str| {
        let mut config = all_roles(db.url(), node);
        // The nodes' own compactors keep the points: only the calls below may prune them.
        config.metrics.rollup_retention = Duration::from_secs(365 * 24 * 3600);
        config
    };
    let tenure = |pool: PgPool| async move {
        let (epoch, tenure): (i64, i64) = sqlx::query_as(
            "SELECT epoch, tenure FROM forge.leaders WHERE namespace = 'forge' AND role = 'log_compactor'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        FenceToken {
            namespace: "forge".to_owned(),
            role: Role::LOG_COMPACTOR.name().to_owned(),
            epoch,
            tenure,
        }
    };
    let prune = |token: FenceToken, pool: PgPool| async move {
        // Everything, whatever its age.
        token
            .bind(sqlx::query(
                "SELECT forge.prune_stats($1, $2, $3, $4, 0, 10000)",
            ))
            .fetch_one(&pool)
            .await
            .map(|row| row.get::<i64, _>(0))
            .map_err(|err| token.map_error(err))
    };
    let points = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM forge.stats WHERE label = 'default'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // The node and the tenure of the compactor it leads.
    let lead = |id: &'static str| {
        let (config, pool) = (config(id), pool.clone());
        async move {
            let node = Node::builder(config)
                .auto_register(false)
                .start()
                .await
                .unwrap();
            wait_single_leader(&[&node], &Role::LOG_COMPACTOR).await;
            (node, tenure(pool).await)
        }
    };
    let (a, deposed) = lead("a").await;
    a.shutdown().await;
    let (b, current) = lead("b").await;
    assert!(
        current.epoch > deposed.epoch,
        "{current:?} after {deposed:?}"
    );

    // a's tenure is over: its prune is refused (SQLSTATE FG001) and deletes nothing.
    let raw = deposed
        .bind(sqlx::query(
            "SELECT forge.prune_stats($1, $2, $3, $4, 0, 10000)",
        ))
        .fetch_one(&pool)
        .await
        .unwrap_err();
    assert!(forge::Error::is_fence_refusal(&raw), "{raw}");
    match prune(deposed.clone(), pool.clone()).await {
        Err(forge::Error::Fenced { role, epoch }) => {
            assert_eq!(role, Role::LOG_COMPACTOR);
            assert_eq!(epoch.0, deposed.epoch);
        }
        other => panic!("a deposed tenure's prune: {other:?}"),
    }
    assert_eq!(points().await, 3);
    // The same call under b's tenure prunes them.
    assert_eq!(prune(current, pool.clone()).await.unwrap(), 3);
    assert_eq!(points().await, 0);
    b.shutdown().await;
}

/// `forge.jobs_figures` counts from the indexes alone, with each state a constant where its
/// index cannot return it: its rows must be exactly those of a plain GROUP BY over the table,
/// for every unfinished state, role and non-role jobs, several queues and kinds, and never
/// another namespace's or a finished job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_figures_match_a_count_of_the_table() {
    let (_db, pool) = setup().await;
    sqlx::raw_sql(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, role, run_at, node_id,
                                 attempted_at, finished_at)
         SELECT ns, 'q' || (i % 3), 'k' || (i % 2), '{}', st,
                CASE WHEN st = 'available' AND i % 4 = 0 THEN 'scheduler' END,
                now() - make_interval(secs => i), 'n1',
                CASE WHEN st <> 'available' AND st <> 'scheduled' THEN now() END,
                CASE WHEN st IN ('completed', 'dead', 'cancelled') THEN now() END
           FROM unnest(ARRAY['forge', 'elsewhere']) ns,
                unnest(ARRAY['available', 'scheduled', 'retryable', 'running', 'completed',
                             'dead', 'cancelled']) st,
                generate_series(1, 25) i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let figures: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT queue, kind, state, n FROM forge.jobs_figures('forge') ORDER BY 1, 2, 3",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let counted: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT queue, kind, state, count(*) FROM forge.jobs
          WHERE namespace = 'forge' AND state NOT IN ('completed', 'cancelled')
          GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(figures, counted);
    let states: std::collections::BTreeSet<&str> =
        figures.iter().map(|(_, _, s, _)| s.as_str()).collect();
    assert_eq!(
        states.into_iter().collect::<Vec<_>>(),
        ["available", "dead", "retryable", "running", "scheduled"]
    );
    // The oldest due job of each queue: the function's age and the table's run_at agree
    // within the time between the two reads.
    let ages: Vec<(String, f64, f64)> = sqlx::query_as(
        "SELECT f.queue, max(f.oldest_age_s),
                (SELECT extract(epoch FROM clock_timestamp() - min(j.run_at))::float8
                   FROM forge.jobs j
                  WHERE j.namespace = 'forge' AND j.state = 'available' AND j.queue = f.queue)
           FROM forge.jobs_figures('forge') f WHERE f.state = 'available'
          GROUP BY f.queue ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(ages.len(), 3, "{ages:?}");
    for (queue, age, table) in ages {
        assert!((age - table).abs() < 1.0, "{queue}: {age} against {table}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregator_leader_alone_exports_the_oldest_job_age_and_the_dead_jobs() {
    let (db, pool) = setup().await;
    // In queues no node works: available for 90 s and 30 s in `idle`, dead in `idle` and
    // `other`.
    let inserted = std::time::Instant::now();
    sqlx::raw_sql(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, finished_at)
         VALUES ('forge', 'idle', 'unknown_here', '{}', 'available', now() - interval '90 seconds', NULL),
                ('forge', 'idle', 'unknown_here', '{}', 'available', now() - interval '30 seconds', NULL),
                ('forge', 'idle', 'unknown_here', '{}', 'dead', now(), now()),
                ('forge', 'idle', 'unknown_here', '{}', 'dead', now(), now()),
                ('forge', 'idle', 'unknown_here', '{}', 'dead', now(), now()),
                ('forge', 'other', 'unknown_here', '{}', 'dead', now(), now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let start = |id: &'static str| {
        Node::builder(all_roles(db.url(), id))
            .auto_register(false)
            .start()
    };
    let a = start("a").await.unwrap();
    let b = start("b").await.unwrap();
    let nodes = [&a, &b];
    let (leader, _) = wait_single_leader(&nodes, &Role::METRICS_AGGREGATOR).await;
    let (leader, follower) = (nodes[leader], nodes[1 - leader]);
    let text = wait_until(
        "the leader's queue figures",
        SOON,
        Duration::from_millis(50),
        || {
            let text = leader.render_metrics();
            let dead = metric(&text, r#"forge_job_dead_jobs{queue="idle"}"#);
            async move { (dead == Some(3.0)).then_some(text) }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        metric(&text, r#"forge_job_dead_jobs{queue="other"}"#),
        Some(1.0),
        "{text}"
    );
    // The oldest due job of `idle` has waited 90 s, plus the time since the insert.
    let age = metric(&text, r#"forge_job_oldest_age_seconds{queue="idle"}"#).unwrap();
    let bound = 90.0 + inserted.elapsed().as_secs_f64() + 1.0;
    assert!((90.0..bound).contains(&age), "{age} not in 90..{bound}");
    assert_eq!(
        metric(&text, r#"forge_job_oldest_age_seconds{queue="other"}"#),
        Some(0.0),
        "nothing waits in `other`: {text}"
    );
    // The other node reports none of the cluster's figures.
    let other = follower.render_metrics();
    for series in [
        r#"forge_job_dead_jobs{queue="idle"}"#,
        r#"forge_job_oldest_age_seconds{queue="idle"}"#,
    ] {
        assert!(
            metric(&other, series).unwrap_or(0.0) == 0.0,
            "{series} on the follower: {other}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollups_come_from_whichever_node_leads_the_metrics_aggregator() {
    let (db, pool) = setup().await;
    let start = |id: &'static str| {
        Node::builder(all_roles(db.url(), id))
            .auto_register(false)
            .job(plain)
            .start()
    };
    let a = start("a").await.unwrap();
    wait_single_leader(&[&a], &Role::METRICS_AGGREGATOR).await;
    let b = start("b").await.unwrap();
    let completed = |pool: PgPool| async move {
        sqlx::query_scalar::<_, Option<f64>>(
            "SELECT sum(value) FROM forge.stats WHERE series = 'jobs_completed' AND label = 'default'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
        .unwrap_or(0.0)
    };
    let jobs = client(&pool);
    jobs.enqueue_many((0..20).map(|i| NewJob::new(plain, Behave::tag(format!("a{i}")))))
        .await
        .unwrap();
    wait_until("a's rollups", SOON, Duration::from_millis(100), || async {
        (completed(pool.clone()).await >= 20.0).then_some(())
    })
    .await
    .unwrap();
    let by_a: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.stats")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(by_a > 0);
    // a goes; b leads the aggregator and rolls up what happens next.
    a.shutdown().await;
    wait_single_leader(&[&b], &Role::METRICS_AGGREGATOR).await;
    jobs.enqueue_many((0..10).map(|i| NewJob::new(plain, Behave::tag(format!("b{i}")))))
        .await
        .unwrap();
    wait_until("b's rollups", SOON, Duration::from_millis(100), || async {
        (completed(pool.clone()).await >= 30.0).then_some(())
    })
    .await
    .unwrap();
    // Counted once each, across the change of aggregator.
    assert_eq!(completed(pool.clone()).await, 30.0);
    // The series are readable, and b reports the cluster's figures.
    let points = b
        .cluster()
        .series(
            &["jobs_completed", "queue_depth"],
            Utc::now() - TimeDelta::hours(1),
        )
        .await
        .unwrap();
    assert!(
        points.iter().any(|p| p.series == "jobs_completed"),
        "{points:?}"
    );
    // An interval in which no counter moved writes no row of a counter, only its `rollups`
    // mark (a missing point of a counter series is a 0 there): two rollups after the jobs, the
    // counted series have not grown, the marks have.
    let counted_rows = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM forge.stats
              WHERE series NOT IN ('queue_depth', 'oldest_job_age_seconds', 'dead_jobs', 'rollups')",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let marks = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM forge.stats WHERE series = 'rollups'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let rolled = |pool: PgPool| async move {
        sqlx::query_scalar::<_, Option<DateTime<Utc>>>("SELECT max(at) FROM forge.stats_cursor")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let rollup_after = |since: DateTime<Utc>| {
        let pool = pool.clone();
        wait_until(
            "a rollup with nothing to count",
            SOON,
            Duration::from_millis(100),
            move || {
                let pool = pool.clone();
                async move { rolled(pool).await.filter(|at| *at > since) }
            },
        )
    };
    // (One rollup first, for a heartbeat that was still under way.)
    rollup_after(Utc::now() + TimeDelta::seconds(1))
        .await
        .unwrap();
    let before = counted_rows(pool.clone()).await;
    let marked = marks(pool.clone()).await;
    rollup_after(Utc::now() + TimeDelta::seconds(2))
        .await
        .unwrap();
    assert_eq!(counted_rows(pool.clone()).await, before);
    assert!(
        marks(pool.clone()).await > marked,
        "each rollup marks its interval"
    );
    let text = b.render_metrics();
    assert!(
        text.contains("forge_cluster_nodes{state=\"active\"} 1"),
        "{text}"
    );
    // a, and the node that applied the migrations in setup().
    assert!(
        text.contains("forge_cluster_nodes{state=\"stopped\"} 2"),
        "{text}"
    );
    b.shutdown().await;
}

/// The cluster series count cron runs by role, not by cron: a node's tally (what each heartbeat
/// merges into `forge.nodes`) has the same keys for two crons as for one, and 10,000 crons cost
/// the database a constant per heartbeat. Prometheus keeps the per-cron figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_series_count_cron_runs_by_role_whatever_the_number_of_crons() {
    let (db, pool) = setup().await;
    let cron = |name: &'static str| {
        CronJob::new(
            name,
            Schedule::parse("* * * * * *").unwrap(),
            |_: CronContext| async move { Ok::<_, forge::CronError>(()) },
        )
    };
    let mut config = config(db.url(), "a");
    config.node.roles = Some(vec!["scheduler".into()]);
    let node = Node::builder(config)
        .auto_register(false)
        .cron(cron("first_of_two"))
        .cron(cron("second_of_two"))
        .start()
        .await
        .unwrap();
    // Both crons ran at least twice, and a heartbeat carried the counts.
    let tally = wait_until(
        "a tally with both crons' runs",
        SOON,
        Duration::from_millis(50),
        || async {
            let tally: serde_json::Value =
                sqlx::query_scalar("SELECT tally FROM forge.nodes WHERE node_id = 'a'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            let runs = tally
                .get("cron_runs|scheduler")
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0);
            (runs >= 4.0).then_some(tally)
        },
    )
    .await
    .unwrap();
    let keys: Vec<&str> = tally
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("cron_"))
        .collect();
    assert_eq!(
        keys,
        [
            "cron_duration_seconds_sum|scheduler",
            "cron_lag_seconds_sum|scheduler",
            "cron_runs|scheduler"
        ],
        "{tally}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cron_is_skipped_by_whichever_node_leads_until_resumed() {
    let (db, pool) = setup().await;
    sqlx::query("CREATE TABLE beats (at timestamptz, node text)")
        .execute(&pool)
        .await
        .unwrap();
    let cron = || {
        CronJob::new(
            "beat",
            Schedule::parse("* * * * * *").unwrap(),
            |ctx: CronContext| async move {
                sqlx::query("INSERT INTO beats VALUES ($1, $2)")
                    .bind(ctx.scheduled_at())
                    .bind(ctx.node_id())
                    .execute(ctx.pool())
                    .await?;
                Ok::<_, forge::CronError>(())
            },
        )
        .catch_up(CatchUp::All)
    };
    let node = |id: &'static str| {
        let mut config = config(db.url(), id);
        config.node.roles = Some(vec!["scheduler".into()]);
        Node::builder(config)
            .auto_register(false)
            .cron(cron())
            .start()
    };
    let a = node("a").await.unwrap();
    let b = node("b").await.unwrap();
    let beats = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM beats")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    wait_until("beats", SOON, Duration::from_millis(20), || async {
        (beats(pool.clone()).await >= 1).then_some(())
    })
    .await
    .unwrap();
    assert!(a.workload().pause_cron("beat", "test").await.unwrap());
    assert!(
        !a.workload()
            .pause_cron("no_such_cron", "test")
            .await
            .unwrap()
    );
    let paused_at = Utc::now();
    // Paused: ticks are recorded as skipped, on a and, after a handoff, on b.
    let leader = if a.leadership(&Role::SCHEDULER).is_some() {
        a.clone()
    } else {
        b.clone()
    };
    let other = if leader.id() == a.id() { &b } else { &a };
    wait_until("paused ticks", SOON, Duration::from_millis(20), || async {
        let skipped: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM forge.cron_ticks WHERE cron = 'beat' AND state = 'skipped' AND error = 'paused'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        (skipped >= 2).then_some(())
    })
    .await
    .unwrap();
    leader.shutdown().await;
    wait_single_leader(&[other], &Role::SCHEDULER).await;
    let handed = Utc::now();
    wait_until(
        "paused ticks on the new leader",
        SOON,
        Duration::from_millis(20),
        || async {
            let skipped: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge.cron_ticks WHERE cron = 'beat' AND state = 'skipped'
                AND node_id = $1 AND scheduled_at > $2",
            )
            .bind(other.id())
            .bind(handed)
            .fetch_one(&pool)
            .await
            .unwrap();
            (skipped >= 1).then_some(())
        },
    )
    .await
    .unwrap();
    let ran_while_paused: i64 =
        sqlx::query_scalar("SELECT count(*) FROM beats WHERE at > $1 + interval '1 s'")
            .bind(paused_at)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(ran_while_paused, 0);
    let view = other.workload().cron("beat").await.unwrap().unwrap();
    assert!(
        view.paused_at.is_some() && view.paused_by.as_deref() == Some("test"),
        "{view:?}"
    );
    assert_eq!(
        view.last.as_ref().map(|t| t.state),
        Some(TickState::Skipped)
    );
    // Resumed: it runs again.
    assert!(other.workload().resume_cron("beat", "test").await.unwrap());
    let resumed = Utc::now();
    wait_until(
        "beats after the resume",
        SOON,
        Duration::from_millis(20),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM beats WHERE at > $1")
                .bind(resumed)
                .fetch_one(&pool)
                .await
                .unwrap();
            (n >= 1).then_some(())
        },
    )
    .await
    .unwrap();
    other.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_enqueued_in_a_transaction_run_in_a_custom_namespace() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    sqlx::raw_sql(RUNS_TABLE_SQL).execute(&pool).await.unwrap();
    let mut config = job_config(db.url(), "tenant-node");
    config.cluster.lock_namespace = "tenant_a".into();
    let node = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .unwrap();
    // Through the node's client, inside the caller's transaction.
    let mut tx = node.pool().begin().await.unwrap();
    let in_tx = node
        .jobs()
        .enqueue_in(&mut *tx, plain, Behave::tag("in tx"))
        .await
        .unwrap()
        .id();
    tx.commit().await.unwrap();
    // Through a client of a process that is no node, naming the namespace.
    let web = forge::jobs::Jobs::new(pool.clone(), &LockNamespace::new("tenant_a").unwrap());
    let mut tx = pool.begin().await.unwrap();
    let from_web = web
        .enqueue_in(&mut *tx, plain, Behave::tag("from a web process"))
        .await
        .unwrap()
        .id();
    tx.commit().await.unwrap();
    for id in [in_tx, from_web] {
        let job = wait_state(&pool, id, JobState::Completed).await;
        assert_eq!(job.namespace, "tenant_a");
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_starting_together_apply_the_applications_migrations_once() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("app-migrations");
    std::fs::write(
        dir.0.join("1_orders.sql"),
        "CREATE TABLE orders (id bigserial PRIMARY KEY, total numeric NOT NULL);",
    )
    .unwrap();
    std::fs::write(
        dir.0.join("2_order_totals.sql"),
        "CREATE TABLE order_totals (at timestamptz PRIMARY KEY, total numeric NOT NULL);",
    )
    .unwrap();
    let starts = ["m1", "m2", "m3"].map(|id| {
        let url = db.url().to_owned();
        let path = dir.0.clone();
        tokio::spawn(async move {
            let migrator = sqlx::migrate::Migrator::new(path).await.unwrap();
            // The cron uses the application's table from its first tick.
            let totals = CronJob::new(
                "totals",
                Schedule::parse("* * * * * *").unwrap(),
                |ctx: CronContext| async move {
                    let mut tx = ctx.fenced_transaction().await?;
                    sqlx::query(
                        "INSERT INTO order_totals SELECT $1, coalesce(sum(total), 0) FROM orders",
                    )
                    .bind(ctx.scheduled_at())
                    .execute(&mut *tx)
                    .await?;
                    ctx.complete(&mut tx).await?;
                    tx.commit().await?;
                    Ok::<_, forge::CronError>(())
                },
            );
            let mut config = config(&url, id);
            config.node.roles = Some(vec!["scheduler".into()]);
            Node::builder(config)
                .auto_register(false)
                .migrations(migrator)
                .cron(totals)
                .start()
                .await
        })
    });
    let mut nodes = Vec::new();
    for start in starts {
        nodes.push(start.await.unwrap().expect("every node starts"));
    }
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(applied, [1, 2]);
    wait_until(
        "the cron to use the application's table",
        SOON,
        Duration::from_millis(20),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM order_totals")
                .fetch_one(&pool)
                .await
                .unwrap();
            (n >= 1).then_some(())
        },
    )
    .await
    .unwrap();
    let failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.cron_ticks WHERE cron = 'totals' AND state = 'failed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(failed, 0);
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_models_describe_leaders_history_events_nodes_jobs_and_queues() {
    let (db, _pool) = setup().await;
    let a = Node::builder(all_roles(db.url(), "a"))
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .unwrap();
    wait_single_leader(&[&a], &Role::SCHEDULER).await;
    let b = Node::builder(all_roles(db.url(), "b"))
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .unwrap();
    a.shutdown().await;
    let cluster = b.cluster();
    let leaders = wait_until(
        "b to lead every role",
        SOON,
        Duration::from_millis(10),
        || async {
            let leaders = cluster.leaders().await.unwrap();
            leaders
                .iter()
                .all(|l| l.node_id == "b" && l.is_led())
                .then_some(leaders)
        },
    )
    .await
    .unwrap();
    assert_eq!(leaders.len(), 3, "{leaders:?}");
    let history = cluster
        .history(Some(&Role::SCHEDULER), PageRequest::first(10))
        .await
        .unwrap();
    assert_eq!(history.items.len(), 2, "{history:?}");
    assert_eq!(history.items[0].end, TenureEnd::Current);
    assert_eq!(history.items[1].end, TenureEnd::Released);
    assert!(!history.items[0].failover);
    assert!(
        history.items[0].gap_ms.is_some_and(|gap| gap >= 0.0),
        "{history:?}"
    );
    let page = cluster
        .events(&EventFilter::default(), PageRequest::first(2))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
    let rest = cluster
        .events(
            &EventFilter::default(),
            PageRequest {
                limit: 500,
                before: page.next,
            },
        )
        .await
        .unwrap();
    assert!(rest.items.iter().all(|e| e.id < page.items[1].id));
    let joined = cluster
        .events(
            &EventFilter {
                kinds: vec![EventKind::NodeJoined],
                ..EventFilter::default()
            },
            PageRequest::first(10),
        )
        .await
        .unwrap();
    assert!(joined.items.iter().all(|e| e.kind == EventKind::NodeJoined));
    let nodes = cluster.nodes().await.unwrap();
    let state = |id: &str| nodes.iter().find(|n| n.node_id == id).map(|n| n.state);
    assert_eq!(state("a"), Some(NodeState::Stopped));
    assert_eq!(state("b"), Some(NodeState::Active));
    let b_view = nodes.iter().find(|n| n.node_id == "b").unwrap();
    assert_eq!(b_view.queues["default"], 16);
    assert!(b_view.pid.is_some() && b_view.hostname.is_some());

    // Jobs: filter on arguments, pagination, queue figures.
    let jobs = b.jobs();
    jobs.enqueue_many(
        (0..5).map(|i| NewJob::new(plain, Behave::tag(format!("t{i}"))).queue("parked")),
    )
    .await
    .unwrap();
    let work = b.workload();
    let found = work
        .jobs(
            &JobFilter {
                args: Some(serde_json::json!({"tag": "t3"})),
                ..JobFilter::default()
            },
            PageRequest::default(),
        )
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    let first = work
        .jobs(&JobFilter::default(), PageRequest::first(3))
        .await
        .unwrap();
    let second = work
        .jobs(
            &JobFilter::default(),
            PageRequest {
                limit: 3,
                before: first.next,
            },
        )
        .await
        .unwrap();
    assert_eq!((first.items.len(), second.items.len()), (3, 2));
    assert!(second.next.is_none());
    let queues = work.queues().await.unwrap();
    let parked = queues.iter().find(|q| q.queue == "parked").unwrap();
    assert_eq!(parked.available, 5);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_exchanged_with_sql_match_the_check_lists() {
    let (_db, pool) = setup().await;
    let check = |table: &'static str, column: &'static str| {
        let pool = pool.clone();
        async move { forge::sql_check_values(&pool, table, column).await.unwrap() }
    };
    let names = |all: &[&str]| all.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        check("forge.cron_ticks", "state").await,
        names(
            &TickState::ALL
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
        )
    );
    // (forge.jobs is partitioned by state: the values its partitions admit, in their order.)
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        sorted(check("forge.jobs", "state").await),
        sorted(names(
            &JobState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>()
        ))
    );
    assert_eq!(
        check("forge.events", "kind").await,
        names(
            &EventKind::ALL
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
        )
    );
}

/// `forge::migrate!` embeds the application's migrations at compile time in a crate that
/// depends on `forge` only (no sqlx macros): the same versions, descriptions, types and
/// checksums as sqlx reading the folder at run time (so a database migrated either way
/// accepts the other), applied by the node before its work starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forge_migrate_embeds_the_applications_migrations() {
    let embedded = forge::migrate!("app_migrations");
    let read = sqlx::migrate::Migrator::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("app_migrations"),
    )
    .await
    .unwrap();
    let describe = |migrator: &sqlx::migrate::Migrator| {
        migrator
            .iter()
            .map(|m| {
                (
                    m.version,
                    m.description.to_string(),
                    format!("{:?}", m.migration_type),
                    m.checksum.to_vec(),
                    m.no_tx,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(describe(&embedded), describe(&read));
    assert_eq!(
        embedded.iter().map(|m| m.version).collect::<Vec<_>>(),
        [1, 2]
    );

    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let mut config = config(db.url(), "embedded");
    config.node.roles = Some(vec!["scheduler".into()]);
    let node = Node::builder(config)
        .auto_register(false)
        .migrations(forge::migrate!("app_migrations"))
        .start()
        .await
        .unwrap();
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(applied, [1, 2]);
    sqlx::query("INSERT INTO orders (total) VALUES (1)")
        .execute(&pool)
        .await
        .unwrap();
    node.shutdown().await;
}

/// Work with nowhere to run - jobs waiting in a queue that no live node works, a role that a
/// live node has work for and none campaigns for - is a problem of the cluster's status, saying
/// what to do, and `forge_work_unserved` = 1 on the aggregator's leader; once a node serves it,
/// the status is healthy and the gauges 0. A role's jobs count through their role, whatever
/// their queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_with_nowhere_to_run_is_a_problem_of_the_status_and_a_gauge_of_the_aggregator() {
    let (db, pool) = setup().await;
    // `hides` leads the built-in roles and works no queue, though its binary has a leader task
    // on billing and a job type on mailers. It keeps the aggregator (no spreading).
    let mut hides = all_roles(db.url(), "hides");
    hides.node.queues = Some(vec![]);
    hides.cluster.spread = false;
    let a = billing_and_mailers_node(hides).await;
    wait_single_leader(&[&a], &Role::METRICS_AGGREGATOR).await;
    let mailed = inserted(
        client(&pool)
            .enqueue(mailer, Behave::tag("waits"))
            .await
            .unwrap(),
    );
    // A role's job on a queue no node works: nobody has work for its role (`reports`).
    client(&pool)
        .enqueue_job(NewJob::new(report, Behave::tag("role job")).queue("nowhere"))
        .await
        .unwrap();

    let cluster = a.cluster();
    let status = wait_until(
        "the status to report the queue and the role",
        SOON,
        Duration::from_millis(50),
        || async {
            let status = cluster.status().await.unwrap();
            (status.unserved.len() == 2).then_some(status)
        },
    )
    .await
    .unwrap();
    let unserved: Vec<(WorkKind, &str, &[String])> = status
        .unserved
        .iter()
        .map(|u| (u.work, u.name.as_str(), u.nodes.as_slice()))
        .collect();
    assert_eq!(
        unserved,
        [
            (WorkKind::Queue, "mailers", &[][..]),
            (WorkKind::Role, "billing", &["hides".to_owned()][..])
        ]
    );
    assert!(!status.healthy);
    assert_eq!(status.problems.len(), 2, "{:?}", status.problems);
    let said = |start: &str, remedy: &str| {
        status
            .problems
            .iter()
            .any(|p| p.starts_with(start) && p.contains(remedy))
    };
    assert!(
        said(
            "queue mailers has jobs waiting and no live node works it: ",
            "add mailers to their [node] queues"
        ),
        "{:?}",
        status.problems
    );
    assert!(
        said(
            "role billing has work on hides and no live node campaigns for it: ",
            "add billing to [node] roles (FORGE_ROLES)"
        ),
        "{:?}",
        status.problems
    );
    let gauge = |text: &str, work: &str, name: &str| {
        metric(
            text,
            &format!(r#"forge_work_unserved{{work="{work}",name="{name}"}}"#),
        )
    };
    let text = wait_until(
        "the aggregator's leader to report both",
        SOON,
        Duration::from_millis(50),
        || {
            let text = a.render_metrics();
            let both = gauge(&text, "queue", "mailers") == Some(1.0)
                && gauge(&text, "role", "billing") == Some(1.0);
            async move { both.then_some(text) }
        },
    )
    .await
    .unwrap();
    assert_eq!(gauge(&text, "queue", "nowhere"), None, "{text}");

    // A node with the default configuration serves both.
    let mut serves = config(db.url(), "serves");
    serves.cluster.spread = false;
    let b = billing_and_mailers_node(serves).await;
    assert!(
        b.roles().contains(&Role::new("billing").unwrap()),
        "{:?}",
        b.roles()
    );
    let job = wait_state(&pool, mailed, JobState::Completed).await;
    assert_eq!(job.node_id.as_deref(), Some("serves"));
    wait_until(
        "a healthy status",
        SOON,
        Duration::from_millis(50),
        || async {
            let status = cluster.status().await.unwrap();
            (status.healthy && status.unserved.is_empty()).then_some(())
        },
    )
    .await
    .unwrap();
    wait_until(
        "the gauges to say served",
        SOON,
        Duration::from_millis(50),
        || {
            let text = a.render_metrics();
            let served = gauge(&text, "queue", "mailers") == Some(0.0)
                && gauge(&text, "role", "billing") == Some(0.0);
            async move { served.then_some(()) }
        },
    )
    .await
    .unwrap();
    b.shutdown().await;
    a.shutdown().await;
}
