//! The claim faults of issue 31: a claimant frozen while its claim's large answer is on its
//! way, and one node's pool requests delayed past the statement bound. (A node killed during a
//! write stall is the write stall's variant, in `stalls.rs`.)

use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::LockNamespace;
use forge::jobs::{Jobs, NewJob};
use forge_testkit::Filter;
use tokio::time::Instant;

use super::faults::{SETTLE, Snapshot};
use super::{Harness, Phase};
use crate::node::{BigArgs, soak_big_job};
use crate::options::FaultKind;
use crate::{ADMIN_TIMEOUT, STATEMENT_BOUND};

/// Large jobs enqueued for a frozen claimant, and each one's payload: a claim of a worker's
/// 8 slots answers about 16 MB, more than the socket buffers between the server and the node
/// (the server's send buffer, the proxy's two sockets, the node's receive buffer) hold.
const BIG_BATCH: usize = 24;
const BIG_PAYLOAD: usize = 2 << 20;
/// How long the frozen claimant's requests take to reach the server while the large jobs are
/// enqueued: it is SIGSTOPped after it sent its claim of them, before the claim arrives. The
/// other nodes' requests sent meanwhile take twice as long, so that its claim comes first.
const CLAIM_DELAY: Duration = Duration::from_millis(600);
/// How often the delay is applied again, to catch the node's new pool connections.
const DELAY_EVERY: Duration = Duration::from_millis(500);

/// A node SIGSTOPped while the server sends it a large claim's answer.
pub(in crate::harness) struct LargeClaim {
    slot: usize,
    /// The backend stuck sending the claim's answer (`None`: none was seen).
    pid: Option<i32>,
    /// SIGKILL at `until` (restart after 1 s) instead of SIGCONT.
    kill: bool,
    since: Instant,
    since_utc: DateTime<Utc>,
    until: Instant,
    thawed: Option<(Instant, DateTime<Utc>)>,
    before: Snapshot,
}

/// One node's pool requests held by its proxy for `hold` until `until`.
pub(in crate::harness) struct Delayed {
    slot: usize,
    hold: Duration,
    since: Instant,
    until: Instant,
    next_apply: Instant,
    /// The most connections delayed at once.
    most: usize,
    ended_at: Option<Instant>,
    before: Snapshot,
}

impl Harness {
    /// Enqueues large jobs while one node's pool requests take [`CLAIM_DELAY`] to reach the
    /// server, and SIGSTOPs that node before its claim of them arrives: the server then sends
    /// the claim's large answer to a stopped client. Frozen for longer than the statement
    /// bound, then SIGCONT or SIGKILL.
    pub(super) async fn freeze_large_claim(&mut self) -> Option<String> {
        if (0..self.slots.len()).filter(|i| self.eligible(*i)).count() < 2 {
            return None;
        }
        // Not the scheduler leader: the per-second ticks keep enqueueing jobs for the other
        // nodes to claim meanwhile, so a pause of their claims is theirs.
        let leader = self.scheduler_leader().await;
        let candidates: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.eligible(*i) && leader.as_deref() != Some(self.slots[*i].id.as_str()))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let i = candidates[self.rng.below(candidates.len())];
        let note = "";
        let before = self.snapshot().await?;
        let id = self.slots[i].id.clone();
        let pool =
            |slot: &super::Slot| Filter::application_prefix(format!("forge:pool:{}", slot.id));
        for (j, slot) in self.slots.iter().enumerate() {
            let delay = if j == i { CLAIM_DELAY } else { CLAIM_DELAY * 2 };
            slot.proxy.delay(pool(slot), delay);
        }
        let payload = "x".repeat(BIG_PAYLOAD);
        let batch: Vec<NewJob> = (0..BIG_BATCH)
            .map(|_| {
                NewJob::new(
                    soak_big_job,
                    BigArgs {
                        payload: payload.clone(),
                    },
                )
            })
            .collect();
        let jobs = Jobs::new(self.admin.clone(), &LockNamespace::default());
        let enqueued = matches!(
            tokio::time::timeout(ADMIN_TIMEOUT * 4, jobs.enqueue_many(batch)).await,
            Ok(Ok(_))
        );
        let committed = Instant::now();
        if !enqueued {
            for slot in &self.slots {
                slot.proxy.delay(pool(slot), Duration::ZERO);
            }
            self.note("frozen large claim: enqueueing the large jobs failed");
            return None;
        }
        // The node heard the jobs' notification and sent its claim, which the proxy holds.
        tokio::time::sleep(CLAIM_DELAY / 2).await;
        let hold = STATEMENT_BOUND + self.rng.secs(1.0, 3.0);
        let kill = self.rng.chance(0.5);
        let until = Instant::now() + hold;
        // A killed claimant stays stopped until the kill; a thawed one is resumed by the
        // supervisor at `until`.
        let resume_at = if kill {
            until + Duration::from_secs(3600)
        } else {
            until
        };
        let frozen = self.freeze_slot(i, resume_at);
        // Bytes held already keep their times; later ones go at once.
        for slot in &self.slots {
            slot.proxy.delay(pool(slot), Duration::ZERO);
        }
        if let Err(err) = frozen {
            self.note(format!("frozen large claim: SIGSTOP failed ({err})"));
            return None;
        }
        // Its claim reaches the server from CLAIM_DELAY after the commit on.
        tokio::time::sleep_until(committed + CLAIM_DELAY).await;
        let mut pid = None;
        while pid.is_none() && Instant::now() < committed + CLAIM_DELAY * 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            pid = self.claim_in_flight(&id).await;
        }
        // The other nodes' claims are measured from when the requests they sent while the jobs
        // were enqueued have landed.
        let since = Instant::now();
        let since_utc = Utc::now();
        self.large_claim = Some(LargeClaim {
            slot: i,
            pid,
            kill,
            since,
            since_utc,
            until,
            thawed: None,
            before,
        });
        Some(format!(
            "{BIG_BATCH} jobs of {} KiB each enqueued while {id}{note}'s pool requests take {} ms to reach the server; SIGSTOP {id} {} ms later, before its claim arrives ({}), for {:.1} s (statement bound {} s), then {}",
            BIG_PAYLOAD / 1024,
            CLAIM_DELAY.as_millis(),
            (CLAIM_DELAY / 2).as_millis(),
            match pid {
                Some(pid) => format!(
                    "backend {pid} then sends it a claim's answer, stuck in the server's send"
                ),
                None => "NO claim's answer of it was stuck in the server's send".to_owned(),
            },
            hold.as_secs_f64(),
            STATEMENT_BOUND.as_secs(),
            if kill {
                "SIGKILL (restart after 1 s)"
            } else {
                "SIGCONT"
            }
        ))
    }

    /// A pool backend of node `id` sending a claim's answer its client does not read.
    async fn claim_in_flight(&self, id: &str) -> Option<i32> {
        tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity
                  WHERE application_name = $1 AND wait_event = 'ClientWrite'
                    AND query LIKE '%jobs_step%'
                  LIMIT 1",
            )
            .bind(format!("forge:pool:{id}"))
            .fetch_optional(&self.admin),
        )
        .await
        .ok()?
        .ok()?
    }

    /// Whether backend `pid` is still sending (`ClientWrite`).
    async fn sending(&self, pid: Option<i32>) -> bool {
        let Some(pid) = pid else {
            return false;
        };
        matches!(
            tokio::time::timeout(
                ADMIN_TIMEOUT,
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                     WHERE pid = $1 AND wait_event = 'ClientWrite')",
                )
                .bind(pid)
                .fetch_one(&self.admin),
            )
            .await,
            Ok(Ok(true))
        )
    }

    pub(super) async fn tend_large_claim(&mut self) {
        let Some(claim) = &self.large_claim else {
            return;
        };
        let now = Instant::now();
        let (i, pid) = (claim.slot, claim.pid);
        let id = self.slots[i].id.clone();
        match claim.thawed {
            None if now >= claim.until => {
                let sending = if self.sending(pid).await {
                    "still sending its answer"
                } else {
                    "not sending"
                };
                if claim.kill {
                    self.kill_slot(i, Duration::from_secs(1)).await;
                    self.note(format!(
                        "SIGKILL {id} after its frozen claim (the backend {sending}); restart in 1 s"
                    ));
                } else {
                    self.note(format!(
                        "thawing {id} after its frozen claim (the backend {sending})"
                    ));
                }
                if let Some(claim) = &mut self.large_claim {
                    claim.thawed = Some((now, Utc::now()));
                }
            }
            Some((at, _)) if now >= at + SETTLE => {
                let Some(claim) = self.large_claim.take() else {
                    return;
                };
                let text = self.large_claim_outcome(&claim, &id).await;
                self.outcome(FaultKind::FrozenLargeClaim, text);
            }
            _ => {}
        }
    }

    /// How long other nodes' claims of the large jobs' queue paused while `claim`'s node was
    /// frozen: the longest time between two of their claims (or the freeze's ends) in it.
    async fn large_claim_outcome(&self, claim: &LargeClaim, id: &str) -> String {
        let (to_instant, to_utc) = claim.thawed.unwrap_or((Instant::now(), Utc::now()));
        let frozen = (to_instant - claim.since).as_secs_f64();
        let claims: Vec<DateTime<Utc>> = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar(
                "SELECT m.at FROM soak_job_moves m JOIN forge.jobs j ON j.id = m.job_id
                  WHERE m.state = 'running' AND m.node IS DISTINCT FROM $1
                    AND j.queue = 'default' AND m.at BETWEEN $2 AND $3
                  ORDER BY m.at",
            )
            .bind(id)
            .bind(claim.since_utc)
            .bind(to_utc)
            .fetch_all(&self.admin),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
        let mut edges = vec![claim.since_utc];
        edges.extend(claims.iter().copied());
        edges.push(to_utc);
        let longest = edges
            .windows(2)
            .map(|w| (w[1] - w[0]).num_milliseconds() as f64 / 1000.0)
            .fold(0.0, f64::max);
        let what = self.outcome_since(&claim.before).await;
        format!(
            "{id} frozen with a large claim's answer {} (then {}); in the {frozen:.1} s from {} ms after the jobs' commit until the thaw, other nodes claimed {} jobs of queue default, their longest pause {longest:.2} s; {what}",
            if claim.pid.is_some() {
                "stuck in flight"
            } else {
                "NOT seen stuck"
            },
            if claim.kill { "SIGKILL" } else { "SIGCONT" },
            (CLAIM_DELAY * 2).as_millis(),
            claims.len()
        )
    }

    /// Delays what one node's pool connections send to the server by more than the statement
    /// bound, for 12-20 s: its requests reach the server after its workers gave up on them.
    pub(super) async fn delay_requests(&mut self) -> Option<String> {
        let (i, note) = self.pick_node(true).await?;
        let before = self.snapshot().await?;
        let hold = STATEMENT_BOUND + self.rng.secs(1.0, 3.0);
        let window = self.rng.secs(12.0, 20.0);
        let filter = Filter::application_prefix(format!("forge:pool:{}", self.slots[i].id));
        let delayed = self.slots[i].proxy.delay(filter, hold);
        let now = Instant::now();
        self.delayed = Some(Delayed {
            slot: i,
            hold,
            since: now,
            until: now + window,
            next_apply: now + DELAY_EVERY,
            most: delayed,
            ended_at: None,
            before,
        });
        Some(format!(
            "requests of {}{note}'s pool connections reach the server {:.1} s late (statement bound {} s; {delayed} open now, new ones delayed every {} ms) for {:.1} s; answers on time",
            self.slots[i].id,
            hold.as_secs_f64(),
            STATEMENT_BOUND.as_secs(),
            DELAY_EVERY.as_millis(),
            window.as_secs_f64()
        ))
    }

    pub(super) async fn tend_delayed(&mut self) {
        let Some(delayed) = &mut self.delayed else {
            return;
        };
        let now = Instant::now();
        let i = delayed.slot;
        let filter = Filter::application_prefix(format!("forge:pool:{}", self.slots[i].id));
        match delayed.ended_at {
            None if now >= delayed.until => {
                self.slots[i].proxy.delay(filter, Duration::ZERO);
                delayed.ended_at = Some(now);
                let (hold, took) = (delayed.hold, delayed.since.elapsed());
                self.note(format!(
                    "{}'s pool requests are on time again (delayed {:.1} s for {:.1} s)",
                    self.slots[i].id,
                    hold.as_secs_f64(),
                    took.as_secs_f64()
                ));
            }
            None if now >= delayed.next_apply => {
                delayed.next_apply = now + DELAY_EVERY;
                // A restarted node's connections go through the same proxy: delayed too.
                if matches!(self.slots[i].phase, Phase::Running { .. }) {
                    let n = self.slots[i].proxy.delay(filter, delayed.hold);
                    delayed.most = delayed.most.max(n);
                }
            }
            Some(ended) if now >= ended + SETTLE => {
                let Some(delayed) = self.delayed.take() else {
                    return;
                };
                let what = self.outcome_since(&delayed.before).await;
                let id = self.slots[i].id.clone();
                self.outcome(
                    FaultKind::DelayedRequests,
                    format!(
                        "{id}'s pool requests {:.1} s late for {:.1} s (up to {} connections at once): {what}",
                        delayed.hold.as_secs_f64(),
                        (ended - delayed.since).as_secs_f64(),
                        delayed.most
                    ),
                );
            }
            _ => {}
        }
    }

    /// After the faults: no claimant frozen, no request delayed.
    pub(super) async fn heal_claims(&mut self) {
        if let Some(claim) = &mut self.large_claim {
            claim.kill = false;
            claim.until = Instant::now();
            if let Phase::Paused { resume_at, .. } = &mut self.slots[claim.slot].phase {
                *resume_at = Instant::now();
            }
        }
        self.tend_large_claim().await;
        if let Some(claim) = self.large_claim.take() {
            let id = self.slots[claim.slot].id.clone();
            let text = self.large_claim_outcome(&claim, &id).await;
            self.outcome(FaultKind::FrozenLargeClaim, text);
        }
        if let Some(delayed) = &mut self.delayed {
            delayed.until = Instant::now();
        }
        self.tend_delayed().await;
        if let Some(delayed) = &mut self.delayed {
            delayed.ended_at = delayed.ended_at.map(|_| Instant::now() - SETTLE);
        }
        self.tend_delayed().await;
    }
}
