//! Operators' actions through the read models (what the admin API and the CLI call): leader
//! step-down through the database, "trigger now" on a cron, retry / cancel / delete of jobs one
//! by one and in bulk by filter, queue pause and resume; each recorded in the audit trail.

use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::crons::CronJob;
use forge::inspect::Workload;
use forge::inspect::{Change, EventFilter, EventKind, JobFilter, PageRequest, StepDown};
use forge::jobs::{JobState, NewJob};
use forge::{CronContext, Epoch, LockNamespace, Node, Role, RoleState, Schedule};
use forge_testkit::wait_until;
use sqlx::PgPool;

use crate::jobs::{Behave, job_config, plain, setup, wait_state};
use crate::support::*;

/// The audit trail: (action, subject, by) of each `admin_action` event, oldest first.
async fn audit_trail(node: &Node) -> Vec<(String, String, String)> {
    let filter = EventFilter {
        kinds: vec![EventKind::AdminAction],
        ..EventFilter::default()
    };
    let page = node
        .cluster()
        .events(&filter, PageRequest::first(100))
        .await
        .unwrap();
    let field = |d: &serde_json::Value, k: &str| d[k].as_str().unwrap_or_default().to_owned();
    page.items
        .iter()
        .rev()
        .map(|e| {
            (
                field(&e.detail, "action"),
                field(&e.detail, "subject"),
                field(&e.detail, "by"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_asked_to_step_down_hands_over_to_a_follower() {
    let (db, pool) = setup().await;
    let start = |id: &'static str| {
        let mut config = config(db.url(), id);
        config.node.roles = Some(vec!["scheduler".into()]);
        config.node.campaign_without_work = true;
        Node::builder(config).auto_register(false).start()
    };
    let a = start("a").await.unwrap();
    let b = start("b").await.unwrap();
    let (leader, epoch) = wait_single_leader(&[&a, &b], &Role::SCHEDULER).await;
    let (old, new) = if leader == 0 { (&a, &b) } else { (&b, &a) };

    // Asked from the follower, once it waits inside the lock (without a standby the request
    // is refused): the request travels through the database.
    wait_standby(&pool, "scheduler").await;
    let asked = new
        .cluster()
        .step_down(&Role::SCHEDULER, "test operator", false)
        .await
        .unwrap();
    assert_eq!(
        asked,
        StepDown::Asked {
            epoch: Epoch(epoch),
            node_id: old.id().to_string(),
            standbys: 1
        }
    );
    let next = wait_until(
        "the follower to lead",
        SOON,
        Duration::from_millis(10),
        || async {
            match new.role_state(&Role::SCHEDULER) {
                Some(RoleState::Leader { epoch, .. }) => Some(epoch.0),
                _ => None,
            }
        },
    )
    .await
    .unwrap();
    assert!(next > epoch);
    assert_eq!(
        wait_single_leader(&[&a, &b], &Role::SCHEDULER).await.1,
        next
    );
    // A graceful handoff, not a failover.
    let released = new
        .cluster()
        .events(
            &EventFilter {
                kinds: vec![EventKind::LeaderReleased],
                ..EventFilter::default()
            },
            PageRequest::first(10),
        )
        .await
        .unwrap();
    assert!(
        released
            .items
            .iter()
            .any(|e| e.node_id.as_deref() == Some(old.id().as_str())
                && e.epoch.map(|x| x.0) == Some(epoch)),
        "{released:?}"
    );
    assert_eq!(
        audit_trail(new).await,
        [(
            "step_down".to_owned(),
            "scheduler".to_owned(),
            "test operator".to_owned()
        )]
    );
    // A role nobody leads: nothing to ask.
    let none = new
        .cluster()
        .step_down(&Role::new("nobody").unwrap(), "test operator", true)
        .await
        .unwrap();
    assert_eq!(none, StepDown::NoLeader);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_down_without_a_standby_is_refused_and_a_forced_one_leaves_no_gap() {
    let (db, pool) = setup().await;
    let alone = start_node(db.url(), "alone", &[Role::SCHEDULER]).await;
    let (_, epoch) = wait_single_leader(&[&alone], &Role::SCHEDULER).await;

    // The only eligible node: stepping down would leave the scheduler without a leader.
    let refused = alone
        .cluster()
        .step_down(&Role::SCHEDULER, "test operator", false)
        .await
        .unwrap();
    assert_eq!(
        refused,
        StepDown::NoStandby {
            epoch: Epoch(epoch),
            node_id: "alone".into()
        }
    );
    assert!(
        audit_trail(&alone).await.is_empty(),
        "a refusal changes nothing"
    );

    // Forced: the node hands over and campaigns again at once, so it leads again with the
    // next epoch after a handoff's gap (it used to stay out for two check_intervals plus
    // lock_timeout: 2 s with these timings).
    let asked = alone
        .cluster()
        .step_down(&Role::SCHEDULER, "test operator", true)
        .await
        .unwrap();
    assert_eq!(
        asked,
        StepDown::Asked {
            epoch: Epoch(epoch),
            node_id: "alone".into(),
            standbys: 0
        }
    );
    let next = wait_until(
        "the node to lead again",
        SOON,
        Duration::from_millis(5),
        || async {
            match alone.role_state(&Role::SCHEDULER) {
                Some(RoleState::Leader { epoch: e, .. }) if e.0 > epoch => Some(e.0),
                _ => None,
            }
        },
    )
    .await
    .unwrap();
    let gap_ms: f64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM e.at - r.at) * 1000)::float8 FROM forge.events e, forge.events r
          WHERE e.kind = 'leader_elected' AND e.epoch = $1 AND e.role = 'scheduler'
            AND r.kind = 'leader_released' AND r.epoch = $2 AND r.role = 'scheduler'",
    )
    .bind(next)
    .bind(epoch)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        gap_ms < 1000.0,
        "the scheduler had no leader for {gap_ms} ms after a forced step-down"
    );
    alone.shutdown().await;
}

/// Manual ticks of `cron`: (scheduled_at, node, state).
async fn manual_ticks(pool: &PgPool, cron: &str) -> Vec<(DateTime<Utc>, String, String)> {
    sqlx::query_as(
        "SELECT scheduled_at, node_id, state FROM forge.cron_ticks
          WHERE cron = $1 AND manual ORDER BY scheduled_at",
    )
    .bind(cron)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_triggered_cron_runs_once_on_its_leader_even_when_asked_without_one() {
    let (db, pool) = setup().await;
    sqlx::query("CREATE TABLE yearly_runs (at timestamptz, node text)")
        .execute(&pool)
        .await
        .unwrap();
    // Once a year: every run in this test is a manual one.
    let start = |id: &'static str| {
        let mut config = config(db.url(), id);
        config.node.roles = Some(vec!["scheduler".into()]);
        Node::builder(config)
            .auto_register(false)
            .cron(CronJob::new(
                "yearly",
                Schedule::parse("0 0 0 1 1 *").unwrap(),
                |ctx: CronContext| async move {
                    let mut tx = ctx.fenced_transaction().await?;
                    sqlx::query("INSERT INTO yearly_runs VALUES ($1, $2)")
                        .bind(ctx.scheduled_at())
                        .bind(ctx.node_id())
                        .execute(&mut *tx)
                        .await?;
                    ctx.complete(&mut tx).await?;
                    tx.commit().await?;
                    Ok::<_, forge::CronError>(())
                },
            ))
            .start()
    };
    let a = start("a").await.unwrap();
    wait_single_leader(&[&a], &Role::SCHEDULER).await;
    // Asked from outside any node.
    let workload = Workload::new(pool.clone(), LockNamespace::default());
    assert_eq!(
        workload.trigger_cron("no_such_cron", "t").await.unwrap(),
        None
    );
    // Paused or not, a trigger runs once.
    assert!(workload.pause_cron("yearly", "t").await.unwrap());
    let first = workload.trigger_cron("yearly", "t").await.unwrap().unwrap();
    let ran = |n: usize| {
        let pool = pool.clone();
        move || {
            let pool = pool.clone();
            async move {
                let ticks = manual_ticks(&pool, "yearly").await;
                (ticks.len() >= n && ticks.iter().all(|t| t.2 == "succeeded")).then_some(ticks)
            }
        }
    };
    let ticks = wait_until("the manual tick", SOON, Duration::from_millis(20), ran(1))
        .await
        .unwrap();
    assert_eq!(ticks.len(), 1);
    assert_eq!((ticks[0].0, ticks[0].1.as_str()), (first, "a"));
    let view = workload.cron("yearly").await.unwrap().unwrap();
    assert_eq!(view.trigger_requested_at, None, "the request is answered");
    assert!(view.last.as_ref().is_some_and(|t| t.manual), "{view:?}");

    // Asked while no node leads: the next leader runs it.
    a.shutdown().await;
    let second = workload.trigger_cron("yearly", "t").await.unwrap().unwrap();
    assert!(second > first);
    let b = start("b").await.unwrap();
    let ticks = wait_until(
        "the manual tick on the next leader",
        SOON,
        Duration::from_millis(20),
        ran(2),
    )
    .await
    .unwrap();
    assert_eq!(ticks.len(), 2, "{ticks:?}");
    assert_eq!((ticks[1].0, ticks[1].1.as_str()), (second, "b"));
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM yearly_runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 2, "each trigger ran once");
    let trail = audit_trail(&b).await;
    let actions: Vec<&str> = trail.iter().map(|(a, _, _)| a.as_str()).collect();
    assert_eq!(actions, ["pause_cron", "trigger_cron", "trigger_cron"]);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_retried_cancelled_and_deleted_one_by_one_and_by_filter() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    config.jobs.queues = [("default".to_owned(), 4.into())].into_iter().collect();
    let node = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .unwrap();
    let workload = node.workload();
    let jobs = node.jobs();
    // A job that dies at once (one attempt, failing), retried by the operator: it completes.
    let dying = jobs
        .enqueue_job(
            NewJob::new(
                plain,
                Behave {
                    fail_attempts: 1,
                    ..Behave::tag("dying")
                },
            )
            .max_attempts(1),
        )
        .await
        .unwrap()
        .id();
    wait_state(&pool, dying, JobState::Dead).await;
    assert_eq!(
        workload.retry_job(dying, "op").await.unwrap(),
        Change::Applied
    );
    let retried = wait_state(&pool, dying, JobState::Completed).await;
    assert_eq!(retried.attempt, 2);

    // A running job: not deleted, cancelled (its node stops it).
    let long = jobs
        .enqueue(
            plain,
            Behave {
                sleep_ms: 60_000,
                ..Behave::tag("long")
            },
        )
        .await
        .unwrap()
        .id();
    wait_state(&pool, long, JobState::Running).await;
    assert!(matches!(
        workload.delete_job(long, "op").await.unwrap(),
        Change::Refused(_)
    ));
    assert_eq!(
        workload.cancel_job(long, "op").await.unwrap(),
        Change::Applied
    );
    wait_state(&pool, long, JobState::Cancelled).await;
    assert!(matches!(
        workload.cancel_job(long, "op").await.unwrap(),
        Change::Refused(_)
    ));
    assert_eq!(
        workload.delete_job(long, "op").await.unwrap(),
        Change::Applied
    );
    assert!(workload.job(long).await.unwrap().is_none());
    assert_eq!(
        workload.delete_job(long, "op").await.unwrap(),
        Change::NotFound
    );

    // By filter: 30 jobs of one tag scheduled far ahead, cancelled, retried, deleted.
    let later = Utc::now() + chrono::TimeDelta::hours(1);
    let batch: Vec<NewJob> = (0..30)
        .map(|i| {
            NewJob::new(
                plain,
                Behave {
                    tag: "bulk".into(),
                    sleep_ms: i,
                    ..Behave::default()
                },
            )
            .run_at(later)
        })
        .collect();
    jobs.enqueue_many(batch).await.unwrap();
    let filter = JobFilter {
        args: Some(serde_json::json!({ "tag": "bulk" })),
        ..JobFilter::default()
    };
    assert_eq!(workload.cancel_jobs(&filter, "op").await.unwrap(), 30);
    let cancelled = JobFilter {
        states: vec![JobState::Cancelled],
        ..filter.clone()
    };
    let page = workload
        .jobs(&cancelled, PageRequest::first(100))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 30);
    assert_eq!(workload.retry_jobs(&cancelled, "op").await.unwrap(), 30);
    wait_until(
        "the retried jobs to complete",
        SOON,
        Duration::from_millis(20),
        || async {
            let done = workload
                .jobs(
                    &JobFilter {
                        states: vec![JobState::Completed],
                        ..filter.clone()
                    },
                    PageRequest::first(100),
                )
                .await
                .unwrap();
            (done.items.len() == 30).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(workload.delete_jobs(&filter, "op").await.unwrap(), 30);
    assert!(
        workload
            .jobs(&filter, PageRequest::first(10))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let trail = audit_trail(&node).await;
    let actions: Vec<&str> = trail.iter().map(|(a, _, _)| a.as_str()).collect();
    assert_eq!(
        actions,
        [
            "retry_job",
            "cancel_job",
            "delete_job",
            "cancel_jobs",
            "retry_jobs",
            "delete_jobs"
        ]
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_is_not_claimed_until_resumed() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    config.node.queues = Some(vec!["default".into(), "other".into()]);
    config.jobs.queues = [
        ("default".to_owned(), 4.into()),
        ("other".to_owned(), 4.into()),
    ]
    .into_iter()
    .collect();
    let node = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .unwrap();
    let workload = node.workload();
    assert_eq!(
        workload.pause_queue("default", "op", false).await.unwrap(),
        Some(false)
    );
    assert_eq!(
        workload.pause_queue("default", "op", false).await.unwrap(),
        Some(true),
        "already paused"
    );
    assert!(
        workload
            .pause_queue("bad queue!", "op", false)
            .await
            .is_err()
    );
    let held = node
        .jobs()
        .enqueue(plain, Behave::tag("held"))
        .await
        .unwrap()
        .id();
    // A job enqueued after it on a working queue completes; the paused one still waits.
    let passing = node
        .jobs()
        .enqueue_job(NewJob::new(plain, Behave::tag("passing")).queue("other"))
        .await
        .unwrap()
        .id();
    wait_state(&pool, passing, JobState::Completed).await;
    assert_eq!(
        workload.job(held).await.unwrap().unwrap().state,
        JobState::Available
    );
    let queues = workload.queues().await.unwrap();
    let default = queues.iter().find(|q| q.queue == "default").unwrap();
    assert!(default.paused && default.available == 1, "{default:?}");
    assert_eq!(
        workload.resume_queue("default", "op").await.unwrap(),
        Some(true)
    );
    assert_eq!(
        workload.resume_queue("default", "op").await.unwrap(),
        Some(false),
        "not paused"
    );
    wait_state(&pool, held, JobState::Completed).await;
    let trail = audit_trail(&node).await;
    let actions: Vec<&str> = trail.iter().map(|(a, _, _)| a.as_str()).collect();
    assert_eq!(actions, ["pause_queue", "resume_queue"]);
    node.shutdown().await;
}

/// The `admin_action` events of `action`, oldest first: (count, batch) of each.
async fn bulk_events(pool: &PgPool, action: &str) -> Vec<(i64, i64)> {
    sqlx::query_as(
        "SELECT (detail->>'count')::bigint, (detail->>'batch')::bigint FROM forge.events
          WHERE kind = 'admin_action' AND detail->>'action' = $1 AND detail->>'by' = 'op'
          ORDER BY id",
    )
    .bind(action)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// How many jobs of the `bulk` queue are in each state.
async fn bulk_states(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT state, count(*) FROM forge.jobs WHERE queue = 'bulk' GROUP BY state ORDER BY state",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_action_records_each_batch_with_its_count_in_the_batch_transaction() {
    let (_db, pool) = setup().await;
    // No node: the retried jobs stay available for the test to count.
    let workload = Workload::new(pool.clone(), LockNamespace::default());
    // 2,500 dead jobs (three batches of at most 1,000); job 1,500 (in the second batch) cannot
    // be made available while a trigger refuses it.
    sqlx::query(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, attempt,
                                 max_attempts, finished_at)
         SELECT 'forge', 'bulk', 'bulk_probe', jsonb_build_object('n', n, 'poison', n = 1500),
                'dead', now(), 1, 1, now()
           FROM generate_series(1, 2500) AS n",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(
        "CREATE FUNCTION public.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'job % refused by the test', NEW.id; END $$;
         CREATE TRIGGER refuse_poison BEFORE UPDATE ON forge.jobs FOR EACH ROW
           WHEN (NEW.args @> '{\"poison\": true}' AND NEW.state = 'available')
           EXECUTE FUNCTION public.refuse_poison();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let filter = JobFilter {
        states: vec![JobState::Dead],
        queue: Some("bulk".to_owned()),
        ..JobFilter::default()
    };

    // Failing part-way: the first batch is committed with its audit event, the second rolled
    // back with its own; nothing changed is missing from the trail.
    let err = workload.retry_jobs(&filter, "op").await.unwrap_err();
    assert!(err.to_string().contains("refused by the test"), "{err}");
    assert_eq!(
        bulk_states(&pool).await,
        [("available".to_owned(), 1000), ("dead".to_owned(), 1500)]
    );
    assert_eq!(bulk_events(&pool, "retry_jobs").await, [(1000, 1)]);

    // Without the trigger, the rest: two more batches, each on record with its count.
    sqlx::raw_sql("DROP TRIGGER refuse_poison ON forge.jobs")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(workload.retry_jobs(&filter, "op").await.unwrap(), 1500);
    assert_eq!(
        bulk_states(&pool).await,
        [("available".to_owned(), 2500)],
        "every job was retried"
    );
    let with_room: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.jobs WHERE queue = 'bulk' AND max_attempts > attempt",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(with_room, 2500, "each retried job has room for an attempt");
    let events = bulk_events(&pool, "retry_jobs").await;
    assert_eq!(events, [(1000, 1), (1000, 1), (500, 2)]);
    assert_eq!(events.iter().map(|(count, _)| count).sum::<i64>(), 2500);
    let filter_shown: serde_json::Value = sqlx::query_scalar(
        "SELECT detail->'filter' FROM forge.events
          WHERE kind = 'admin_action' AND detail->>'action' = 'retry_jobs' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(filter_shown["queue"], "bulk", "{filter_shown}");
    assert_eq!(filter_shown["states"], serde_json::json!(["dead"]));

    // Deleting them all: three batches again; an action matching nothing is on record too.
    assert_eq!(
        workload.delete_jobs(&filter_all(), "op").await.unwrap(),
        2500
    );
    assert_eq!(
        bulk_events(&pool, "delete_jobs").await,
        [(1000, 1), (1000, 2), (500, 3)]
    );
    assert!(bulk_states(&pool).await.is_empty());
    assert_eq!(workload.cancel_jobs(&filter_all(), "op").await.unwrap(), 0);
    assert_eq!(bulk_events(&pool, "cancel_jobs").await, [(0, 1)]);
}

/// Every job of the `bulk` queue.
fn filter_all() -> JobFilter {
    JobFilter {
        queue: Some("bulk".to_owned()),
        ..JobFilter::default()
    }
}
