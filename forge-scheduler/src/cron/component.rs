//! The crons as a node component: one supervisor (a leader task) per role with crons, and a
//! service that records the node's crons in `forge.crons`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use forge_core::{Assembly, Component, ListenerEvent, NodeContext, Result, Role};
use forge_rules::{Name, check_duration, check_name};
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};

use super::stored::{EnqueueTick, report_shadowed};
use super::supervisor::{Settings, SharedBoard, supervise};
use super::{CronJob, TickState, ledger};
use crate::config::{CronConfig, invalid};
use crate::metrics::{CRON_DURATION, CRON_LAG, CRON_METRICS, CRON_MISSED, CRON_RUNS};

/// The crons of a node, as a [`Component`]. The `forge` facade's `NodeBuilder` builds it from
/// the registered crons.
pub struct CronRunner {
    crons: Vec<CronJob>,
    config: CronConfig,
    /// How a stored cron's tick enqueues its job (`CronRunner::stored_crons`); `None`: the
    /// node runs no stored crons.
    pub(crate) stored: Option<EnqueueTick>,
}

/// The former name of [`CronRunner`], kept for one release.
#[deprecated(since = "0.2.0", note = "renamed `CronRunner`")]
pub type Crons = CronRunner;

impl CronRunner {
    /// The component for `crons`: rejects two different crons with one name and drops exact
    /// duplicates (a cron registered both automatically and explicitly).
    pub fn new(crons: Vec<CronJob>, config: CronConfig) -> Result<CronRunner> {
        let mut kept: Vec<CronJob> = Vec::new();
        for cron in crons {
            validate(&cron)?;
            match kept.iter().find(|k| k.name == cron.name) {
                Some(existing) if existing.same_definition(&cron) => {}
                Some(_) => {
                    return Err(invalid(format!(
                        "two different crons are named `{}`: give one of them another name (#[cron(..., name = \"...\")])",
                        cron.name
                    )));
                }
                None => kept.push(cron),
            }
        }
        Ok(CronRunner {
            crons: kept,
            config,
            stored: None,
        })
    }

    /// The roles that have crons.
    pub fn roles(&self) -> Vec<Role> {
        let mut roles: Vec<Role> = self.crons.iter().map(|c| c.role.clone()).collect();
        roles.sort();
        roles.dedup();
        roles
    }
}

fn validate(cron: &CronJob) -> Result<()> {
    check_name(Name::Cron, &cron.name).map_err(|err| invalid(err.to_string()))?;
    for (what, value) in [
        ("catch_up_window", Some(cron.catch_up_window)),
        ("timeout", cron.timeout),
    ] {
        if let Some(value) = value {
            check_duration(value)
                .map_err(|message| invalid(format!("cron `{}`: {what} {message}", cron.name)))?;
        }
    }
    if cron.timeout == Some(Duration::ZERO) {
        return Err(invalid(format!(
            "cron `{}`: a timeout must be longer than zero",
            cron.name
        )));
    }
    Ok(())
}

impl Component for CronRunner {
    fn name(&self) -> &'static str {
        "crons"
    }

    fn install(self: Box<Self>, node: &mut Assembly) -> Result<()> {
        node.describe_metrics(CRON_METRICS).prune(
            "cron_ticks",
            "prune_ticks",
            self.config.ledger_retention,
        );
        if self.crons.is_empty() && self.stored.is_none() {
            return Ok(());
        }
        let per_cron = node.config().metrics.per_cron;
        for cron in &self.crons {
            export_cron(node, cron, per_cron);
        }
        let board: SharedBoard = Arc::new(watch::Sender::new(Default::default()));
        let refresh = Arc::new(Notify::new());
        let settings = Arc::new(Settings {
            misfire_threshold: self.config.misfire_threshold,
            claim_ahead: self.config.claim_ahead,
            board: board.clone(),
            refresh_board: refresh.clone(),
            per_cron,
            stored: self.stored.clone(),
        });
        let mut by_role: BTreeMap<Role, Vec<CronJob>> = BTreeMap::new();
        if self.stored.is_some() {
            // Stored crons run on the scheduler's leader, whether or not it has crons of code.
            by_role.entry(Role::SCHEDULER).or_default();
        }
        for cron in &self.crons {
            by_role
                .entry(cron.role.clone())
                .or_default()
                .push(cron.clone());
        }
        for (role, crons) in by_role {
            let crons = Arc::new(crons);
            let settings = settings.clone();
            node.leader_task(role, "crons", move |leadership| {
                supervise(crons.clone(), leadership, settings.clone())
            });
        }
        let crons = Arc::new(self.crons);
        node.listen(CHANNEL_PAUSED)
            .service("cron-registry", move |ctx| {
                registry(crons, board, refresh, ctx)
            });
        Ok(())
    }
}

/// Exports a cron's counters at 0 from the start (runs by outcome, missed ticks) on nodes that
/// campaign for its role: Prometheus sees a first failure, a first missed tick (counted the
/// moment a tenure starts). Its lag and duration histograms are the leader's: registered
/// through the tenure's metrics when it starts, they go when it ends. With `[metrics]
/// per_cron = false` the series are the role's (label `role` only), histograms included:
/// 46 series per role on each node that campaigns for it, however many crons it has.
fn export_cron(node: &mut Assembly, cron: &CronJob, per_cron: bool) {
    let labels = super::supervisor::metric_labels(cron, per_cron);
    for outcome in TickState::ALL {
        if *outcome != TickState::Running {
            let mut labels = labels.to_vec();
            labels.push(("outcome", outcome.as_str()));
            node.export_series(Some(&cron.role), &CRON_RUNS, &labels);
        }
    }
    node.export_series(Some(&cron.role), &CRON_MISSED, &labels);
    if !per_cron {
        for def in [&CRON_LAG, &CRON_DURATION] {
            node.export_series(Some(&cron.role), def, &labels);
        }
    }
}

/// A cron was paused, resumed or triggered, or a manual run was claimed: payload
/// `<namespace> <cron>`.
const CHANNEL_PAUSED: &str = "forge_crons";

/// The node's cron registry service: records this node's crons in `forge.crons`, then keeps
/// the board (pauses, pending manual runs) current: its one writer, reading it again on a
/// notification on `forge_crons`, when the node session is restored, and when a tenure asks.
async fn registry(
    crons: Arc<Vec<CronJob>>,
    board: SharedBoard,
    asked: Arc<Notify>,
    ctx: NodeContext,
) {
    let mut events = ctx.subscribe();
    announce(crons, ctx.clone()).await;
    refresh(&board, &ctx).await;
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            // A tenure started: read the board again, as after a restored session.
            _ = asked.notified() => Ok(ListenerEvent::Restored),
            _ = ctx.shutdown().cancelled() => return,
        };
        let stale = match event {
            Ok(ListenerEvent::Notification { channel, payload }) => {
                &*channel == CHANNEL_PAUSED
                    && payload.split(' ').next() == Some(ctx.namespace().name())
            }
            Ok(ListenerEvent::Restored) | Err(_) => true,
            Ok(_) => false,
        };
        if stale {
            refresh(&board, &ctx).await;
        }
    }
}

/// Reads the board until a read succeeds (or the node shuts down): a notification is not
/// sent again, so a read that failed (pool exhausted, connection lost) would leave a pause or a
/// stored cron's change unseen until the next one.
async fn refresh(board: &SharedBoard, ctx: &NodeContext) {
    let mut delay = Duration::from_millis(50);
    loop {
        match ledger::board(ctx.pool(), ctx.namespace()).await {
            Ok(read) => {
                board.send_if_modified(|current| {
                    let changed = *current != read;
                    *current = read;
                    changed
                });
                return;
            }
            Err(err) => {
                warn!(target: "forge::cron", error = %err, retry_in = ?delay,
                      "cannot read paused, triggered and stored crons; trying again")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = ctx.shutdown().cancelled() => return,
        }
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// Records this node's crons in `forge.crons`, so that a leader whose binary lacks one of
/// them can say so.
async fn announce(crons: Arc<Vec<CronJob>>, ctx: NodeContext) {
    let mut delay = Duration::from_millis(200);
    for _ in 0..10 {
        match ledger::register(ctx.pool(), ctx.namespace(), ctx.node_id(), &crons).await {
            Ok(shadowed) => return report_shadowed(&shadowed),
            Err(err) => debug!(target: "forge::cron", error = %err, "cannot record crons yet"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = ctx.shutdown().cancelled() => return,
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}
