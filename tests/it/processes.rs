//! Node processes that really get killed, frozen and stopped, and a PostgreSQL crash.

use std::collections::BTreeMap;
use std::time::Duration;

use forge_testkit::{PgServer, wait_until};
use forge_tests::probe::ProbeLine;
use sqlx::PgPool;

use crate::support::*;

const ALL: [&str; 3] = ["scheduler", "metrics_aggregator", "log_compactor"];

/// Waits until every role has an unreleased leader satisfying `pred`, and returns them.
async fn leaders_where(
    pool: &PgPool,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&str, &str, i64) -> bool,
) -> BTreeMap<String, (String, i64)> {
    wait_until(what, timeout, Duration::from_millis(5), || async {
        let leaders = current_leaders(pool).await;
        (leaders.len() == ALL.len()
            && leaders
                .iter()
                .all(|(role, (node, epoch))| pred(role, node, *epoch)))
        .then_some(leaders)
    })
    .await
    .unwrap()
}

/// Invariant 1, from both sides: the probes' WORK lines (decisions taken as a valid leader)
/// and the fenced rows PostgreSQL accepted never overlap between epochs of a role.
async fn assert_no_overlap(pool: &PgPool, probes: &[&Probe], role: &str) {
    let mut by_epoch: BTreeMap<i64, (String, i64, i64)> = BTreeMap::new();
    for line in probes.iter().flat_map(|p| p.lines()) {
        let ProbeLine {
            event,
            role: Some(r),
            epoch: Some(epoch),
            node,
            t,
        } = line
        else {
            continue;
        };
        if event != "WORK" || r != role {
            continue;
        }
        let entry = by_epoch.entry(epoch).or_insert((node.clone(), t, t));
        assert_eq!(entry.0, node, "epoch {epoch} of {role} worked on two nodes");
        entry.1 = entry.1.min(t);
        entry.2 = entry.2.max(t);
    }
    assert!(
        !by_epoch.is_empty(),
        "no leader-only work of {role} was seen"
    );
    let spans: Vec<_> = by_epoch.iter().collect();
    for pair in spans.windows(2) {
        let ((e1, (n1, _, last1)), (e2, (n2, first2, _))) = (pair[0], pair[1]);
        assert!(
            last1 < first2,
            "{role}: epoch {e1} on {n1} still worked at {last1} after epoch {e2} on {n2} started at {first2}"
        );
    }
    let rows: Vec<(i64, f64, f64)> = sqlx::query_as(
        "SELECT epoch, extract(epoch FROM min(at))::float8, extract(epoch FROM max(at))::float8
           FROM forge_probe_work WHERE role = $1 GROUP BY epoch ORDER BY epoch",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap();
    for pair in rows.windows(2) {
        assert!(
            pair[0].2 < pair[1].1,
            "{role}: a fenced write of epoch {} landed after epoch {} began: {rows:?}",
            pair[0].0,
            pair[1].0
        );
    }
}

async fn three_probes(db: &forge_testkit::TestDatabase, dir: &ScratchDir) -> Vec<Probe> {
    let mut probes = Vec::new();
    for id in ["p1", "p2", "p3"] {
        probes.push(Probe::start(db, &dir.0, id, &ALL).await);
    }
    probes
}

fn index_of(probes: &[Probe], id: &str) -> usize {
    probes.iter().position(|p| p.id == id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_leader_process_is_replaced() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("sigkill");
    let mut probes = three_probes(&db, &dir).await;
    let before = leaders_where(&pool, "three leaders", SOON, |_, _, _| true).await;
    let victim = before["scheduler"].0.clone();
    let index = index_of(&probes, &victim);
    probes[index].process.kill().unwrap();

    let after = leaders_where(
        &pool,
        "the killed leader's roles to move",
        SOON,
        |role, node, epoch| {
            let (old_node, old_epoch) = &before[role];
            if old_node == &victim {
                node != victim && epoch == old_epoch + 1
            } else {
                epoch == *old_epoch
            }
        },
    )
    .await;
    for role in ALL {
        if before[role].0 == victim {
            let history = events(&pool, role).await;
            let last = history.last().unwrap();
            assert_eq!(
                (last.0, last.2.as_str(), last.3),
                (after[role].1, "elected", true),
                "{history:?}"
            );
        }
    }
    // Let the new leaders work a little, then check for overlap.
    let refs: Vec<&Probe> = probes.iter().collect();
    wait_until(
        "work under the new scheduler epoch",
        SOON,
        Duration::from_millis(10),
        || async {
            refs.iter()
                .flat_map(|p| p.lines())
                .any(|l| {
                    l.event == "WORK"
                        && l.epoch == Some(after["scheduler"].1)
                        && l.role.as_deref() == Some("scheduler")
                })
                .then_some(())
        },
    )
    .await
    .unwrap();
    for role in ALL {
        assert_no_overlap(&pool, &refs, role).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigtermed_leader_process_hands_over_gracefully() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("sigterm");
    let mut probes = three_probes(&db, &dir).await;
    let before = leaders_where(&pool, "three leaders", SOON, |_, _, _| true).await;
    let victim = before["scheduler"].0.clone();
    let index = index_of(&probes, &victim);
    probes[index].process.terminate().unwrap();
    let status = probes[index].process.wait_exit(SOON).await.unwrap();
    assert!(status.success(), "graceful exit: {status:?}");

    leaders_where(
        &pool,
        "the stopped leader's roles to move",
        SOON,
        |role, node, epoch| {
            let (old_node, old_epoch) = &before[role];
            if old_node == &victim {
                node != victim && epoch == old_epoch + 1
            } else {
                epoch == *old_epoch
            }
        },
    )
    .await;
    let history = events(&pool, "scheduler").await;
    let tail: Vec<(&str, bool)> = history
        .iter()
        .rev()
        .take(2)
        .map(|e| (e.2.as_str(), e.3))
        .collect();
    assert_eq!(
        tail,
        [("elected", false), ("released", false)],
        "{history:?}"
    );
    let lines = probes[index].lines();
    assert!(
        lines
            .iter()
            .any(|l| l.event == "ENDED" && l.role.as_deref() == Some("scheduler"))
    );
    assert_eq!(lines.last().map(|l| l.event.as_str()), Some("STOPPED"));
    let refs: Vec<&Probe> = probes.iter().collect();
    for role in ALL {
        assert_no_overlap(&pool, &refs, role).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_replaced_within_its_lease_and_stays_fenced_after_it_resumes() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("sigstop");
    let probes = three_probes(&db, &dir).await;
    let before = leaders_where(&pool, "three leaders", SOON, |_, _, _| true).await;
    let victim = before["scheduler"].0.clone();
    let index = index_of(&probes, &victim);
    probes[index].process.pause().unwrap();

    // PostgreSQL ends the silent session after the lease; a follower takes over.
    let after = leaders_where(
        &pool,
        "the frozen leader's roles to move",
        LEASE + SOON,
        |role, node, epoch| {
            let (old_node, old_epoch) = &before[role];
            if old_node == &victim {
                node != victim && epoch > *old_epoch
            } else {
                epoch == *old_epoch
            }
        },
    )
    .await;
    probes[index].process.resume().unwrap();
    // The resumed process notices its deadline passed and ends its leader work.
    for role in ALL.iter().filter(|role| before[**role].0 == victim) {
        let epoch = before[*role].1;
        let probe = &probes[index];
        wait_until(
            "the old tenure to end",
            SOON,
            Duration::from_millis(10),
            || async {
                probe
                    .lines()
                    .iter()
                    .any(|l| {
                        l.event == "ENDED"
                            && l.role.as_deref() == Some(role)
                            && l.epoch == Some(epoch)
                    })
                    .then_some(())
            },
        )
        .await
        .unwrap();
    }
    let refs: Vec<&Probe> = probes.iter().collect();
    wait_until(
        "work under the new scheduler epoch",
        SOON,
        Duration::from_millis(10),
        || async {
            refs.iter()
                .flat_map(|p| p.lines())
                .any(|l| l.event == "WORK" && l.epoch == Some(after["scheduler"].1))
                .then_some(())
        },
    )
    .await
    .unwrap();
    for role in ALL {
        assert_no_overlap(&pool, &refs, role).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_crash_drops_every_leadership_and_epochs_keep_increasing() {
    let server = PgServer::start().unwrap();
    let db = server.create_database().await.unwrap();
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("pgcrash");
    let probes = [
        Probe::start(&db, &dir.0, "p1", &ALL).await,
        Probe::start(&db, &dir.0, "p2", &ALL).await,
    ];
    let before = leaders_where(&pool, "leaders", SOON, |_, _, _| true).await;

    // Crash (immediate shutdown, then crash recovery on start).
    tokio::task::block_in_place(|| server.restart_immediate()).unwrap();

    // Every tenure ended: each leader's probe reports the end of its leader work.
    let refs: Vec<&Probe> = probes.iter().collect();
    for (role, (node, epoch)) in &before {
        let probe = refs.iter().find(|p| &p.id == node).unwrap();
        wait_until(
            "the old tenure to end",
            SOON,
            Duration::from_millis(10),
            || async {
                probe
                    .lines()
                    .iter()
                    .any(|l| {
                        l.event == "ENDED"
                            && l.role.as_deref() == Some(role)
                            && l.epoch == Some(*epoch)
                    })
                    .then_some(())
            },
        )
        .await
        .unwrap();
    }
    // Then leadership is re-established with higher epochs: the epoch survived the crash.
    leaders_where(&pool, "leaders after the crash", SOON, |role, _, epoch| {
        epoch > before[role].1
    })
    .await;
    for role in ALL {
        assert_no_overlap(&pool, &refs, role).await;
    }
}

/// How long the cron chaos test runs: at least a minute where CI (or FORGE_SLOW_TESTS) asks
/// for the slow suite, a shorter round of each fault otherwise.
fn chaos_duration() -> Duration {
    let slow = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
        || std::env::var("FORGE_SLOW_TESTS").is_ok_and(|v| v == "1");
    if slow {
        Duration::from_secs(65)
    } else {
        Duration::from_secs(15)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_second_cron_runs_every_tick_once_while_its_leaders_are_killed_stopped_and_frozen() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("cronchaos");
    let start = |id: String| {
        let (db, dir) = (&db, &dir);
        async move { Probe::start_with_cron(db, &dir.0, &id, &["scheduler"], "* * * * * *").await }
    };
    let mut probes = Vec::new();
    for i in 0..3 {
        probes.push(start(format!("c{i}")).await);
    }
    let mut next_id = 3;
    let began = tokio::time::Instant::now();
    let duration = chaos_duration();
    let mut faults = Vec::new();
    let mut round = 0;
    while began.elapsed() < duration {
        // The current leader, and proof that ticks are being run.
        let (leader, epoch) = wait_until("a live scheduler leader", LEASE + SOON, Duration::from_millis(20), || async {
            let row: Option<(String, i64)> = sqlx::query_as(
                "SELECT node_id, epoch FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
            )
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten();
            row.filter(|(node, _)| probes.iter().any(|p: &Probe| &p.id == node && p.process.try_status().is_none()))
        })
        .await
        .unwrap();
        let since = chrono::Utc::now();
        wait_until(
            "a tick run by this leader",
            SOON,
            Duration::from_millis(20),
            || async {
                let ran: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM forge_probe_ticks WHERE epoch = $1 AND fired_at >= $2",
                )
                .bind(epoch)
                .bind(since)
                .fetch_one(&pool)
                .await
                .unwrap_or_default();
                (ran > 0).then_some(())
            },
        )
        .await
        .unwrap();
        let index = index_of(&probes, &leader);
        match round % 3 {
            0 => {
                probes[index].process.kill().unwrap();
                probes.remove(index);
                faults.push("SIGKILL");
            }
            1 => {
                probes[index].process.terminate().unwrap();
                let status = probes[index].process.wait_exit(SOON).await.unwrap();
                assert!(status.success(), "graceful stop: {status:?}");
                probes.remove(index);
                faults.push("SIGTERM");
            }
            _ => {
                probes[index].process.pause().unwrap();
                wait_until("another leader while the old one is frozen", LEASE + SOON, Duration::from_millis(20), || async {
                    let epoch_now: Option<i64> = sqlx::query_scalar(
                        "SELECT epoch FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
                    )
                    .fetch_optional(&pool)
                    .await
                    .ok()
                    .flatten();
                    epoch_now.filter(|e| *e > epoch).map(|_| ())
                })
                .await
                .unwrap();
                probes[index].process.resume().unwrap();
                faults.push("SIGSTOP");
            }
        }
        if probes.len() < 3 {
            probes.push(start(format!("c{next_id}")).await);
            next_id += 1;
        }
        round += 1;
    }
    for probe in &probes {
        probe.process.terminate().unwrap();
    }
    for probe in &mut probes {
        probe.process.wait_exit(SOON).await.unwrap();
    }

    // The ledger: one row per second from the first tick to the last, all succeeded.
    let ledger: Vec<(chrono::DateTime<chrono::Utc>, String, i32)> = sqlx::query_as(
        "SELECT scheduled_at, state, attempt FROM forge.cron_ticks WHERE cron = 'probe_tick' ORDER BY scheduled_at",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        ledger.len() as u64 >= duration.as_secs() - 5,
        "{} ticks in {duration:?}",
        ledger.len()
    );
    for pair in ledger.windows(2) {
        assert_eq!(
            pair[1].0 - pair[0].0,
            chrono::TimeDelta::seconds(1),
            "a tick is missing after {} (faults: {faults:?})",
            pair[0].0
        );
    }
    let unfinished: Vec<_> = ledger.iter().filter(|t| t.1 != "succeeded").collect();
    assert!(unfinished.is_empty(), "ticks not succeeded: {unfinished:?}");
    // The side effects (fenced writes of the handler): every tick ran; a tick ran more than
    // once only as a rerun of a run cut short by a kill, with a new attempt number.
    let effects: Vec<(chrono::DateTime<chrono::Utc>, i32)> =
        sqlx::query_as("SELECT scheduled_at, attempt FROM forge_probe_ticks ORDER BY 1, 2")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (at, state_attempt) in ledger.iter().map(|t| (t.0, t.2)) {
        let attempts: Vec<i32> = effects.iter().filter(|e| e.0 == at).map(|e| e.1).collect();
        assert!(!attempts.is_empty(), "tick {at} never ran");
        let mut unique = attempts.clone();
        unique.dedup();
        assert_eq!(unique, attempts, "tick {at} ran twice in one attempt");
        assert!(
            attempts.iter().all(|a| *a <= state_attempt),
            "tick {at}: {attempts:?} vs ledger attempt {state_attempt}"
        );
    }
    eprintln!(
        "cron chaos: {} ticks, faults {faults:?}, {} reruns",
        ledger.len(),
        ledger.iter().filter(|t| t.2 > 1).count()
    );
}
