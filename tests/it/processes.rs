//! Node processes that really get killed, frozen and stopped, and a PostgreSQL crash.

use std::collections::BTreeMap;
use std::time::Duration;

use forge_testkit::probe::ProbeLine;
use forge_testkit::{PgServer, wait_until};
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
