//! One cron's ticks in one tenure: the pause and the overlap rules, claims (retried), the
//! gate, manual runs, and the runs in progress.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use forge_core::Leadership;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::super::ledger::{self, Claim, ClaimRequest};
use super::super::{CronJob, Overlap, TickState};
use super::SharedBoard;
use super::batch::{Batchers, ask};
use super::outcomes::{CronMetrics, retrying, run_tick};

/// The runs of one cron in one tenure.
pub(super) struct Runs {
    pub(super) cron: CronJob,
    pub(super) metrics: Arc<CronMetrics>,
    pub(super) leadership: Leadership,
    pub(super) board: SharedBoard,
    /// The tenure's batchers.
    pub(super) batchers: Batchers,
    /// `[cron] claim_ahead`.
    pub(super) claim_ahead: TimeDelta,
    /// The newest manual tick this loop handled (its request may still show on the board
    /// until the board is refreshed).
    pub(super) last_manual: Option<DateTime<Utc>>,
    /// Runs of ticks fired on time: the overlap policy is about these.
    pub(super) on_time: JoinSet<()>,
    /// Runs of backlog ticks (caught up, rerun, or reached while behind).
    pub(super) backlog: JoinSet<()>,
}

/// Whether a run may start now, after the overlap rules.
enum Slot {
    /// Run it; `backlog`: it started late (it waited for the backlog), so a run still going
    /// when the next tick is due is not an overlap.
    Run { backlog: bool },
    /// Record it as skipped, with why.
    Skip(&'static str),
}

/// Why a tick is skipped under `overlap = "skip"`.
const STILL_GOING: &str = "the previous run was still going (overlap = skip)";

impl Runs {
    async fn wait_backlog(&mut self) {
        while self.backlog.join_next().await.is_some() {}
    }

    async fn wait_all(&mut self) {
        self.wait_backlog().await;
        while self.on_time.join_next().await.is_some() {}
    }

    /// On a handoff, lets runs in progress finish (the election bounds this with
    /// `drain_timeout`); on a loss they are aborted when this is dropped.
    pub(super) async fn drain(mut self) {
        self.wait_all().await;
    }

    /// Applies the pause and the overlap rules before a tick runs.
    async fn slot(&mut self, backlog: bool) -> Slot {
        if self.board.borrow().paused.contains(&self.cron.name) {
            return Slot::Skip("paused");
        }
        if self.cron.overlap_policy() == Overlap::Allow {
            return Slot::Run { backlog };
        }
        if backlog {
            self.wait_all().await;
            return Slot::Run { backlog };
        }
        // A backlog run still going is not an overlap: wait for it; this tick then starts
        // late, and counts as backlog too.
        while self.backlog.try_join_next().is_some() {}
        if !self.backlog.is_empty() {
            self.wait_all().await;
            return Slot::Run { backlog: true };
        }
        while self.on_time.try_join_next().is_some() {}
        if self.on_time.is_empty() {
            return Slot::Run { backlog: false };
        }
        match self.cron.overlap_policy() {
            Overlap::Skip => Slot::Skip(STILL_GOING),
            _ => {
                while self.on_time.join_next().await.is_some() {}
                Slot::Run { backlog: false }
            }
        }
    }

    /// Claims and runs the ticks the catch-up policy kept, one after another. Returns false
    /// when this tenure can no longer act.
    pub(super) async fn catch_up(&mut self, ticks: Vec<DateTime<Utc>>) -> bool {
        for tick in ticks {
            if !self.fire(tick, true).await {
                return false;
            }
        }
        true
    }

    /// Claims and runs one tick. Returns false when this tenure can no longer act.
    pub(super) async fn fire(&mut self, tick: DateTime<Utc>, backlog: bool) -> bool {
        if !self.leadership.is_valid() || self.leadership.is_draining() {
            return false;
        }
        let mut slot = self.slot(backlog).await;
        if matches!(slot, Slot::Skip(STILL_GOING)) && tick > self.batchers.clock.now() {
            // Before the instant (claiming ahead) the run going may yet end in time: decide at
            // the instant, as overlap = "skip" promises.
            if !self.until(tick).await {
                return false;
            }
            slot = self.slot(backlog).await;
        }
        let (state, note) = match slot {
            Slot::Run { .. } => (TickState::Running, None),
            Slot::Skip(why) => (TickState::Skipped, Some(why)),
        };
        let retried = match self.claim(tick, state, note, false).await {
            Some((true, retried)) => retried,
            Some((false, _)) => return true,
            None => return false,
        };
        match slot {
            Slot::Skip(why) => {
                self.metrics.runs(TickState::Skipped).increment(1);
                // In the ledger, the metrics and the dashboard: a paused cron is not a line a tick.
                debug!(target: "forge::cron", cron = %self.cron.name, %tick, why, "tick skipped");
            }
            // A run whose claim had to be retried starts late through no fault of its
            // handler: if it is still going when the next tick is due, that is not an
            // overlap either.
            Slot::Run { backlog } => {
                if !self.start_when_due(tick).await {
                    return false;
                }
                self.spawn_run(tick, 1, backlog || retried)
            }
        }
        true
    }

    /// Sleeps until the database's clock reaches `at`, unless the leadership winds down first
    /// (then false).
    async fn until(&self, at: DateTime<Utc>) -> bool {
        tokio::select! {
            biased;
            _ = self.leadership.stopping() => false,
            _ = self.batchers.clock.sleep_until(at) => true,
        }
    }

    /// Waits for a claimed tick's instant and then for the gate: the database's clock at or
    /// past the instant while this tenure is still the current one. True: start the run. False:
    /// this tenure will not start it (a handover began first: the claim is deleted; or the
    /// leadership is over: the next leader takes the claim back if its tenure began before the
    /// instant, see `migrations/functions/tick_gate.sql`).
    async fn start_when_due(&self, tick: DateTime<Utc>) -> bool {
        if self.claim_ahead.is_zero() {
            // Claimed at or after the instant by the database's clock: no gate needed.
            return true;
        }
        let mut pause = Duration::from_millis(50);
        let bound = self.leadership.lease_duration();
        loop {
            if !self.until(tick).await {
                self.unclaim(tick).await;
                return false;
            }
            if self.batchers.gate_passed.covers(tick).is_some() {
                return true;
            }
            let gate = tokio::time::timeout(bound, ask(&self.batchers.gater, tick)).await;
            match gate {
                Ok(Ok(Some(now))) if now >= tick => return true,
                Ok(Ok(Some(now))) => {
                    let wait = (tick - now).to_std().unwrap_or_default();
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, wait_ms = wait.as_millis() as u64,
                           "the database says the tick is not due yet (the estimate of its clock ran ahead)");
                    if !self.pause(wait.max(Duration::from_millis(1))).await {
                        self.unclaim(tick).await;
                        return false;
                    }
                    continue;
                }
                Ok(Ok(None)) => {
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, epoch = %self.leadership.epoch(),
                           "the gate refused a claimed tick while this node still leads; checking again");
                }
                Ok(Err(err)) => retrying(
                    &self.cron,
                    tick,
                    Some(&err),
                    "cannot pass a claimed tick's gate yet",
                ),
                Err(_) => retrying(
                    &self.cron,
                    tick,
                    None,
                    "a claimed tick's gate got no answer in time",
                ),
            }
            if !self.leadership.is_valid() || !self.pause(pause).await {
                return false;
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Deletes the claim of a tick this tenure will not start because it hands over before the
    /// instant. Best effort: if it fails, the next leader takes the claim back when its tenure
    /// begins before the instant, and otherwise handles the tick per the `interrupted` policy.
    async fn unclaim(&self, tick: DateTime<Utc>) {
        if !self.leadership.is_valid() {
            return;
        }
        let bound = self.leadership.lease_duration();
        match tokio::time::timeout(
            bound,
            ledger::unclaim(&self.leadership, &self.cron.name, tick),
        )
        .await
        {
            Ok(Ok(_)) => {
                debug!(target: "forge::cron", cron = %self.cron.name, %tick, "handing over before a claimed tick's instant: claim deleted")
            }
            Ok(Err(err)) => {
                warn!(target: "forge::cron", cron = %self.cron.name, %tick, error = %err,
                      "handing over before a claimed tick's instant, and cannot delete the claim; the next leader takes it back if it leads by the instant, else applies the `interrupted` policy")
            }
            Err(_) => {
                warn!(target: "forge::cron", cron = %self.cron.name, %tick,
                      "handing over before a claimed tick's instant, and deleting the claim got no answer in time; the next leader takes it back if it leads by the instant, else applies the `interrupted` policy")
            }
        }
    }

    /// A manual run asked for ("trigger now") and not handled yet: its tick's instant.
    pub(super) fn pending_trigger(&self) -> Option<DateTime<Utc>> {
        let at = *self.board.borrow().triggers.get(&self.cron.name)?;
        (self.last_manual.is_none_or(|last| at > last)).then_some(at)
    }

    /// Claims and runs a manual tick at `at`: after the runs in progress unless overlap is
    /// allowed, paused or not (an operator asked for it). Returns false when this tenure can
    /// no longer act.
    pub(super) async fn fire_manual(&mut self, at: DateTime<Utc>) -> bool {
        self.last_manual = Some(at);
        if !self.leadership.is_valid() || self.leadership.is_draining() {
            return false;
        }
        if self.cron.overlap_policy() != Overlap::Allow {
            self.wait_all().await;
        }
        match self.claim(at, TickState::Running, None, true).await {
            Some((true, _)) => {
                info!(target: "forge::cron", cron = %self.cron.name, tick = %at, "running a manual tick (trigger now)");
                self.spawn_run(at, 1, true);
                true
            }
            Some((false, _)) => true,
            None => false,
        }
    }

    /// Claims a tick, retrying failures. `Some((true, retried))`: this tenure holds it, after
    /// failed tries or not; `Some((false, _))`: another tenure does; `None`: this leadership
    /// is over.
    async fn claim(
        &self,
        tick: DateTime<Utc>,
        state: TickState,
        note: Option<&'static str>,
        manual: bool,
    ) -> Option<(bool, bool)> {
        let mut pause = Duration::from_millis(50);
        let mut retried = false;
        let bound = self.leadership.lease_duration();
        loop {
            if !self.leadership.is_valid() || self.leadership.is_draining() {
                return None;
            }
            let claimed =
                tokio::time::timeout(bound, self.claim_once(tick, state, note, manual)).await;
            match claimed {
                Ok(Ok(Claim::Claimed)) => return Some((true, retried)),
                Ok(Ok(Claim::Taken)) => {
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, "tick already claimed");
                    return Some((false, retried));
                }
                Ok(Ok(Claim::Early(wait))) => {
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, wait_ms = wait.as_millis() as u64,
                           "the database says the tick is not due yet (the estimate of its clock ran ahead)");
                    if !self.pause(wait).await {
                        return None;
                    }
                    continue;
                }
                Ok(Ok(Claim::Fenced)) => {
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, epoch = %self.leadership.epoch(),
                           "the fence refused a claim while this node still leads; checking again");
                }
                Ok(Err(err)) => retrying(&self.cron, tick, Some(&err), "cannot claim a tick yet"),
                Err(_) => retrying(&self.cron, tick, None, "a claim got no answer in time"),
            }
            retried = true;
            if !self.pause(pause).await {
                return None;
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// One try: a manual tick directly, a scheduled one through the tenure's claimer.
    async fn claim_once(
        &self,
        tick: DateTime<Utc>,
        state: TickState,
        note: Option<&'static str>,
        manual: bool,
    ) -> Result<Claim, String> {
        if manual {
            return ledger::claim(&self.cron, &self.leadership, tick, state, note, true)
                .await
                .map_err(|err| err.to_string());
        }
        let request = ClaimRequest {
            cron: self.cron.name.clone(),
            tick,
            state,
            note,
        };
        ask(&self.batchers.claimer, request).await
    }

    /// Sleeps, unless the leadership winds down first (then false).
    async fn pause(&self, pause: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(pause) => true,
            _ = self.leadership.stopping() => false,
        }
    }

    fn spawn_run(&mut self, tick: DateTime<Utc>, attempt: u32, backlog: bool) {
        let cron = self.cron.clone();
        let metrics = self.metrics.clone();
        let leadership = self.leadership.clone();
        let batchers = self.batchers.clone();
        let run =
            async move { run_tick(cron, metrics, leadership, &batchers, tick, attempt).await };
        if backlog {
            self.backlog.spawn(run);
        } else {
            self.on_time.spawn(run);
        }
    }
}
