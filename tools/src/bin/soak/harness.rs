//! The harness: its state (the node processes, the faults under way, what it saw), and the
//! small helpers every part of it uses.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::Role;
use forge_testkit::{NodeProcess, PgProxy, PgServer};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::options::{FaultKind, Rng};
use crate::{BoxError, NODE_ROLE};

mod claims;
mod clocks;
mod connections;
mod crashes;
mod faults;
mod figures;
mod finish;
mod flows;
mod freeze;
mod handlers;
mod ledger;
mod limits;
mod liveness;
mod memory;
mod moves;
mod run;
mod setup;
mod stalls;
mod stored;
mod storm;

pub(crate) use setup::soak;

/// What a run concludes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every target met, and the environment did nothing the harness did not order.
    Pass,
    /// A target missed.
    ProductFailed,
    /// PostgreSQL crashed without the harness ordering it: the figures are not the product's
    /// alone, whatever they are.
    EnvironmentFailed,
}

/// Where a node process is in its life.
enum Phase {
    /// Spawned; not ready yet.
    Starting { proc: NodeProcess, since: Instant },
    /// Ready and running.
    Running { proc: NodeProcess },
    /// SIGSTOPped until `resume_at`.
    Paused {
        proc: NodeProcess,
        resume_at: Instant,
    },
    /// SIGTERM sent at `since`.
    Terminating { proc: NodeProcess, since: Instant },
    /// Not running; restarted at `restart_at`.
    Dead { restart_at: Instant },
}

impl Phase {
    fn proc(&self) -> Option<&NodeProcess> {
        match self {
            Phase::Starting { proc, .. }
            | Phase::Running { proc }
            | Phase::Paused { proc, .. }
            | Phase::Terminating { proc, .. } => Some(proc),
            Phase::Dead { .. } => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Phase::Starting { .. } => "starting",
            Phase::Running { .. } => "up",
            Phase::Paused { .. } => "paused",
            Phase::Terminating { .. } => "stopping",
            Phase::Dead { .. } => "down",
        }
    }
}

/// One node id: its proxy, its config file, its current process.
struct Slot {
    id: String,
    proxy: PgProxy,
    config: PathBuf,
    phase: Phase,
    /// Processes started so far under this id.
    incarnation: u32,
    started: Instant,
    /// A black hole on the node's proxy, healed at this instant.
    blackhole_until: Option<Instant>,
    /// Another node-level fault (starvation) is under way until this instant.
    busy_until: Option<Instant>,
    /// When to look whether the pool hogs hold the node's pool.
    starve_check_at: Option<Instant>,
    start_failures: u32,
    unexpected_exits: u32,
    /// Held down (not restarted) until this instant, or until cleared (a step-down storm with
    /// one eligible node).
    hold_until: Option<Instant>,
    /// How many lines of the current process's output were read for its handlers.
    cursor: usize,
    /// The current process's handlers that started and have not ended: (job, attempt) -> span.
    open: HashMap<(i64, i32), usize>,
    /// SIGSTOPped since (µs since the epoch).
    paused_since_us: Option<i64>,
    /// Black-holed since (µs since the epoch).
    blackhole_since_us: Option<i64>,
    /// The wall-clock offset the next process of this id starts with (libfaketime's
    /// `FAKETIME`, such as `"+5m"`, and the same in seconds); `None`: a true clock.
    skew: Option<(&'static str, i64)>,
    /// How far the current process's wall clock is ahead of the true time, in µs (its
    /// `SOAK-HANDLER` times are corrected by it).
    clock_us: i64,
}

/// A lost-reply fault waiting for the node's next slow COMMIT.
struct Armed {
    slot: usize,
    kind: &'static str,
    deadline: Instant,
}

/// One run of a job handler, from the lines its node printed (`SOAK-HANDLER`).
struct HandlerSpan {
    slot: usize,
    job: i64,
    attempt: i32,
    start_us: i64,
    /// When it returned or was dropped; or when its process ended (`died`).
    end_us: Option<i64>,
    died: bool,
}

/// A job `running` in the database with no live handler of its attempt, since `first`.
struct Handlerless {
    node: String,
    first: Instant,
    first_at: f64,
    /// The harness's write-stall time at `first` (not counted in the job's age).
    stall_at_first: Duration,
}

/// A job that stayed `running` with no live handler for longer than
/// [`STRANDED_AFTER`](crate::STRANDED_AFTER).
struct Stranded {
    node: String,
    first_at: f64,
    age: f64,
    still: bool,
}

/// The freeze-inside-a-transaction faults: armed (the flag is set, the node's next handler
/// holds its transaction open), then frozen.
struct Freeze {
    slot: usize,
    flag: &'static str,
    cron: bool,
    hold: Duration,
    /// Also SIGKILL another node (kept down until after the thaw) once the frozen one is
    /// marked down: its jobs must be rescued while the frozen transaction holds its row lock.
    compound: bool,
    stage: FreezeStage,
}

enum FreezeStage {
    Armed {
        deadline: Instant,
    },
    Frozen {
        since: Instant,
        since_utc: DateTime<Utc>,
        until: Instant,
        down_seen: bool,
        next_check: Instant,
        /// The node to SIGKILL once the frozen one is marked down (running a long hog).
        victim: Option<usize>,
    },
}

/// `LOCK TABLE forge.jobs IN ACCESS EXCLUSIVE MODE`, held in this transaction until `until`.
struct TableLock {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    since: Instant,
    until: Instant,
}

/// The standby made synchronous and its WAL receiver frozen until `until`.
struct WriteStall {
    standby: Arc<PgServer>,
    since: Instant,
    until: Instant,
    resumed: bool,
    /// `kill-in-write-stall`: the node SIGKILLed at this instant of the stall (restarted at
    /// once with the same id), and the cluster before the stall.
    kill: Option<(usize, Instant, faults::Snapshot)>,
}

/// The server's connections filled by the harness while one node's node session is cut.
struct ConnFill {
    slot: usize,
    state: Arc<std::sync::Mutex<FillState>>,
    task: JoinHandle<()>,
    hold: Duration,
    stage: FillStage,
}

enum FillStage {
    Filling {
        deadline: Instant,
    },
    Holding {
        since: Instant,
        since_us: i64,
        until: Instant,
        next_check: Instant,
        terminations: u32,
    },
}

/// What the filling task shares with the harness.
#[derive(Default)]
struct FillState {
    held: usize,
    refused: u64,
    full: bool,
    /// Retry refused connections every few ms until then (a slot was just freed).
    spin_until: Option<Instant>,
    stop: bool,
    errors: u64,
    last_error: String,
}

/// A step-down storm: requests for each role, with standbys or with one eligible node.
struct Storm {
    alone: bool,
    held: Vec<usize>,
    plan: Vec<(Duration, Role, bool)>,
    queue: VecDeque<(Instant, Role, bool)>,
    started: bool,
    wait_deadline: Instant,
    end_at: Option<Instant>,
}

/// One step-down request: when (harness seconds), role, whether the storm had one eligible
/// node, and what it answered.
struct StepDownRecord {
    at: f64,
    role: String,
    alone: bool,
    outcome: String,
}

/// A standby being built: the server and the proxy it replicates through.
type StandbyBuild = Result<(PgServer, Arc<PgProxy>), forge_testkit::Error>;

/// `url` (the kit's `postgres://postgres@...`) for the nodes' role.
fn as_node_role(url: &str) -> Result<String, BoxError> {
    url.strip_prefix("postgres://postgres@")
        .map(|rest| format!("postgres://{NODE_ROLE}@{rest}"))
        .ok_or_else(|| format!("unexpected server URL {url}: cannot log in as {NODE_ROLE}").into())
}

/// Starts a streaming standby of `primary` replicating through a new proxy.
fn build_standby(primary: &PgServer) -> StandbyBuild {
    let proxy = Arc::new(PgProxy::start(primary.host(), primary.port())?);
    let standby = primary.start_standby(Some(&proxy))?;
    Ok((standby, proxy))
}

struct FaultRecord {
    at: f64,
    kind: FaultKind,
    text: String,
    /// When a fault of several steps ended (harness seconds); `None` for one step.
    ended: Option<f64>,
}

impl FaultRecord {
    /// The kind, and for a step-down storm which one (the report groups by it).
    fn label(&self) -> &'static str {
        match self.kind {
            FaultKind::StepDownStorm if self.text.contains("one eligible node") => {
                "step-down storm, one eligible node"
            }
            FaultKind::StepDownStorm => "step-down storm, standbys waiting",
            kind => kind.name(),
        }
    }
}

/// RSS of each node at one instant: (incarnation, uptime, KiB).
struct RssSample {
    at: f64,
    nodes: Vec<Option<(u32, f64, u64)>>,
}

struct Harness {
    t0: Instant,
    rng: Rng,
    interval: (f64, f64),
    dir: PathBuf,
    primary: Arc<PgServer>,
    standby: Option<Arc<PgServer>>,
    /// The proxy the standby replicates through (to make it fall behind).
    repl_proxy: Option<Arc<PgProxy>>,
    standby_build: Option<JoinHandle<StandbyBuild>>,
    standby_retry_at: Option<Instant>,
    /// A lossy failover under way: the standby's replication is black-holed; the primary is
    /// crashed and the standby promoted at this instant.
    pending_failover: Option<Instant>,
    /// WAL bytes the promoted standby lacked, per failover.
    failover_losses: Vec<u64>,
    admin_proxy: PgProxy,
    admin: PgPool,
    slots: Vec<Slot>,
    deck: Vec<FaultKind>,
    faults: Vec<FaultRecord>,
    /// Things that should not happen (each is a target miss or a harness problem).
    findings: Vec<String>,
    armed: Option<Armed>,
    /// Backend pids of COMMITs whose node was killed while they slept.
    lost_reply_pids: Vec<i32>,
    failovers: u32,
    term_exits: Vec<(String, f64, String)>,
    rss: Vec<RssSample>,
    /// ERROR lines and panics in the node logs.
    error_lines: usize,
    error_examples: Vec<String>,
    /// The wall clock at `t0`, to place the database's timestamps on the harness's clock.
    t0_utc: DateTime<Utc>,
    db_name: String,
    /// `--only`.
    only: Option<Vec<FaultKind>>,
    /// Every handler run the nodes reported.
    spans: Vec<HandlerSpan>,
    /// SIGSTOP intervals: (slot, from µs, to µs).
    pauses: Vec<(usize, i64, i64)>,
    /// Black-hole intervals: (slot, from µs, to µs).
    blackholes: Vec<(usize, i64, i64)>,
    /// The harness's own write stalls (table lock, frozen synchronous standby).
    stalls: Vec<(Instant, Option<Instant>)>,
    handlerless: HashMap<(i64, i32), Handlerless>,
    stranded: BTreeMap<(i64, i32), Stranded>,
    max_handlerless: f64,
    samples: u64,
    sample_failures: u64,
    next_sample: Instant,
    freeze: Option<Freeze>,
    table_lock: Option<TableLock>,
    write_stall: Option<WriteStall>,
    fill: Option<ConnFill>,
    storm: Option<Storm>,
    step_downs: Vec<StepDownRecord>,
    /// One line per connections-full fault: did the node's handlers keep running?
    fill_reports: Vec<(bool, String)>,
    /// When the final SIGTERMs were sent (the end of the leaderless accounting).
    stop_began: Option<DateTime<Utc>>,
    /// libfaketime was found: the primary's clock can be stepped, node clocks skewed.
    faketime: bool,
    db_clock: Option<clocks::DbClock>,
    skew: Option<clocks::Skew>,
    /// Node clock skews so far (they alternate ahead and behind), database steps by
    /// down_after so far (they alternate too).
    skews: u32,
    down_after_steps: u32,
    large_claim: Option<claims::LargeClaim>,
    delayed: Option<claims::Delayed>,
    /// The outcome of each fault of the clock and claim kinds, for the report.
    outcomes: Vec<(FaultKind, String)>,
    /// When the next workflow is enqueued, how many were tried, and the enqueues that failed.
    next_flow: Instant,
    flows_tried: u32,
    flow_errors: Vec<String>,
    /// The stored cron's change, once the faults begin.
    stored_change: Option<stored::StoredChange>,
    /// The servers' logs, watched for crashes the harness did not order.
    crashes: crashes::Crashes,
}

impl Harness {
    fn secs(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn note(&self, message: impl AsRef<str>) {
        println!("[{:>7.1}s] {}", self.secs(), message.as_ref());
    }

    fn finding(&mut self, message: String) {
        self.note(format!("FINDING: {message}"));
        let at = self.secs();
        self.findings.push(format!("[{at:>7.1}s] {message}"));
    }

    /// A fault of several steps is under way: no other fault starts meanwhile.
    fn busy(&self) -> bool {
        self.armed.is_some()
            || self.freeze.is_some()
            || self.table_lock.is_some()
            || self.write_stall.is_some()
            || self.fill.is_some()
            || self.storm.is_some()
            || self.db_clock.is_some()
            || self.skew.is_some()
            || self.large_claim.is_some()
            || self.delayed.is_some()
    }

    /// A database timestamp on the harness's clock (seconds since the start). The soak's own
    /// times are true times (`soak_now()`, `soak_events`), whatever the database's clock does.
    fn secs_of(&self, at: DateTime<Utc>) -> f64 {
        (at - self.t0_utc).num_microseconds().unwrap_or(0) as f64 / 1e6
    }

    /// The last fault applied at or before `secs`, for the report.
    fn fault_at(&self, secs: f64) -> String {
        match self.faults.iter().rposition(|f| f.at <= secs + 0.05) {
            Some(n) => {
                let fault = &self.faults[n];
                format!("fault #{} {} at {:.1}s", n + 1, fault.label(), fault.at)
            }
            None => "before any fault".to_owned(),
        }
    }
}

/// How a node process ended, in words.
fn describe_status(status: &Result<std::process::ExitStatus, forge_testkit::Error>) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            _ => status.to_string(),
        },
        Err(err) => format!("unknown status: {err}"),
    }
}
