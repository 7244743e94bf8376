//! Soak benchmark: three node processes of a user-style binary under random faults, and the
//! ledger of what the guarantees survived.
//!
//! ```text
//! cargo run --release -p forge-tools --bin soak -- --minutes 30           # the full soak
//! cargo run --release -p forge-tools --bin soak -- --minutes 3 --seed 42  # replay a run's faults
//! cargo run --release -p forge-tools --bin soak -- --interval 5-10        # denser (default 5-30 s)
//! cargo run --release -p forge-tools --bin soak -- --only table-lock,write-stall  # these kinds
//! ```
//!
//! The harness starts a throwaway PostgreSQL (fsync on, `max_connections` 100; under
//! libfaketime when it is installed, so that its wall clock can be stepped, and so are its
//! standbys, which a failover promotes) with an asynchronous streaming standby, one [`PgProxy`](forge_testkit::PgProxy) per node (so one node's connections can be
//! black-holed alone and a primary failover is a promotion plus a retarget), and three node
//! processes: this binary re-executed as `soak node <forge.toml>`. The nodes log in as an
//! ordinary role (`forge_soak`, owner of the database; the harness applies FORGE's migrations
//! as that role with `forge::migrate` before they start), the harness as the superuser. Each
//! node registers, explicitly:
//!
//! * `soak_tick`, a per-second cron (`catch_up = "all"`, `overlap = "wait"`) whose handler, in
//!   its fenced transaction, inserts an effect row (no unique key: a repeated effect is a second
//!   row), enqueues one `soak_tx_job` and one `soak_plain_job` (and one `soak_limited_job`
//!   and four `soak_rated_job`s, below), and completes the tick in the same commit: exactly
//!   once;
//! * `soak_limited_job` (queue `limited`, `global_concurrency = 2`, 300 ms) and
//!   `soak_rated_job` (queue `rated`, `rate = "5/1s"`): each attempt's run in `soak_runs` (its
//!   own attempt; its start written by the handler, its end in the transaction that completes
//!   the job, so a rescued attempt's end never lands; the node's host clock less its known
//!   skew, which the database's clock steps do not move). The report prints the limited
//!   queue's most handlers at once, a run whose end never landed ending when its attempt left
//!   `running` (a rescue: a node frozen or cut off past down_after, whose thawed handler is
//!   outside the guarantee from then on), and the rated queue's most claims in any 1 s window
//!   of the database's clock, by the claims' own instants (`attempted_at`, from the job
//!   history), a window judged only with claims made under one offset of that clock (windows
//!   that hold claims from both sides of a step are printed apart); it FAILs above the limit;
//! * `soak_flow_job`: the steps of a workflow the harness enqueues every 6 s
//!   (`Jobs::enqueue_workflow`: a root, three children after it, a join after them), recorded
//!   in `soak_runs` as above; the report FAILs on a step that started before one of its
//!   parents' end rows (written in the parent's completing transaction), on a step (a join)
//!   whose completion landed twice, and on a workflow unfinished after the drain;
//! * `soak_stored`, a stored cron (`Workload::upsert_cron` before the nodes start, per second,
//!   `catch_up = "all"`) whose ticks enqueue `soak_stored_job`, its arguments changed once
//!   halfway through the faults: a deferred trigger ties each job to the tick its transaction
//!   completed, and the report counts missed and doubled ticks as for the crons of code, and
//!   ticks whose arguments are not those of the cron's version when they were due;
//! * `soak_default_tick`, a per-second cron with `catch_up = "all"` and the default overlap
//!   (since issue 22 `"wait"` under `catch_up = "all"`, `"skip"` before): an effect row, a read
//!   of `forge.jobs` and the tick's completion in its fenced transaction (with
//!   `catch_up = "all"` every tick must run, also one that came due while a run was held up);
//! * `soak_tx_job`, which inserts its effect and completes the job in one transaction: exactly
//!   once;
//! * `soak_plain_job`, which inserts its effect with autocommit before returning: at least once
//!   (duplicates are counted, not failures);
//! * `soak_hog`, which holds one pool connection for a while (pool starvation, and work only
//!   one node does), on a queue only its node works;
//! * `soak_burst_job`, a no-op of 100 ms the harness enqueues 40 at a time just before a write
//!   stall, so that workers are claiming when commits start to wait;
//! * a leader task per built-in role writing a fenced row every 500 ms (for the overlap check).
//!
//! Every job handler prints `SOAK-HANDLER start <job> <attempt> <µs>` when it starts and
//! `SOAK-HANDLER end ...` when it returns or is dropped (an attempt taken away); the harness
//! reads these lines from each process's output, so it knows which attempts have a live
//! handler, independently of the database.
//!
//! Timings are small so that faults matter: lease 3 s, renewal 1 s, lock_timeout 1 s,
//! check_interval 500 ms, drain 2 s, heartbeat 500 ms, drifted after 1.5 s, down after 4 s,
//! maintenance_interval 5 s, a pool of 5 connections.
//!
//! Every 5-30 s (seeded; the seed is printed; after a fault of several steps, 5-30 s after it
//! ended) the harness applies one fault, drawn from a shuffled deck so that every kind comes up
//! before any repeats: SIGKILL (restart after 1-4 s),
//! SIGTERM (restart once it exited), SIGSTOP for longer than the lease then SIGCONT, PostgreSQL
//! fast restart, immediate (crash) restart, primary failover (crash the primary, promote the
//! standby, retarget the proxies, build a new standby for the next one; half of the failovers
//! first black-hole the standby's replication for 2-5 s, so that the last seconds of commits
//! are lost, as with an asynchronous standby that fell behind), `pg_terminate_backend`
//! of node sessions, pool sessions or lock sessions, a black hole on one node's proxy for
//! longer than down_after (then healed, and the dead flows severed), pool starvation, lost
//! replies after commit (a deferred trigger makes the node's next effect COMMIT sleep 1.5 s on
//! the server; the node is SIGKILLed meanwhile: the commit completes, the reply is never heard),
//! and the stalls of issue 22:
//!
//! * **frozen inside a job's transaction**: the harness sets a flag row for a node; its next
//!   `soak_tx_job` keeps its transaction open after `ctx.complete(&mut tx)` (a marker
//!   statement, then 3 s before the commit); when `pg_stat_activity` shows that session idle in
//!   transaction with the marker, the node is SIGSTOPped for down_after + 1-8 s, then SIGCONT.
//!   Half the time another node is given a long job (its `soak_hog`) at the freeze and
//!   SIGKILLed once the frozen node is marked down (restarted only after the thaw): its job must
//!   be rescued while the frozen transaction holds its row lock;
//! * **frozen inside a tick's fenced transaction**: the same on the scheduler leader, in
//!   `soak_tick` after `CronContext::complete(&mut tx)` (held 2 s, under the lease after which
//!   the server ends an idle fenced transaction);
//! * **a write stall longer than the statement bound** (5 s): the standby is made synchronous
//!   (`PgServer::set_synchronous_standby`), a burst of `soak_burst_job`s is enqueued and its
//!   WAL receiver SIGSTOPped (`PgServer::pause_wal_receiver`) while they are being claimed, for
//!   6-15 s: every commit on the primary waits (invisible to others until it ends), reads do
//!   not; then resumed and the primary made asynchronous again;
//! * **a table lock**: `LOCK TABLE forge.jobs IN ACCESS EXCLUSIVE MODE` in a transaction of the
//!   harness (a migration's, an operator's), held 18-22 s, then committed;
//! * **a step-down storm**: 3-5 `forge.step_down` requests for each built-in role, 0.2-2 s
//!   apart, through `forge::inspect::Cluster::step_down` (the path of the admin API and the
//!   CLI); half the time with standbys waiting, half the time with one eligible node (the two
//!   others stopped with SIGTERM and kept down until the storm is over);
//! * **a node that cannot reconnect**: the harness opens connections as the nodes' role until
//!   the server refuses them (`max_connections` less the superuser-reserved slots, which keep
//!   the harness working), ends one node's node session, keeps taking every slot that frees
//!   (and ends the session again if the node got one back) for down_after + 2-5 s, then frees
//!   them. Jobs only that node works are due every second meanwhile: its handlers must keep
//!   running.
//!
//! and the faults of issue 31 (clocks that jump, requests that arrive late, a frozen claimant),
//! each printing its outcome (`OUTCOME <kind>`: what was done, then the `forge.events` of
//! leadership and membership, the rescued attempts and the skipped ticks from its start until
//! a few seconds after its end), all kept for the report:
//!
//! * **the database's clock stepped** (`db-clock-ahead` +90 s, `db-clock-behind` -90 s,
//!   `db-clock-down-after` +down_after and -down_after in turn): `PgServer::step_clock_*` on
//!   the primary, held 6-13 s (a few heartbeats and beyond a lease), then back to true time.
//!   The soak's own tables record true times (`soak_now()`: the server's clock less the offset
//!   the harness stepped it by, kept in `soak_clock`), and so does `soak_event_times` for each
//!   `forge.events` row (read through the view `soak_events`), so the ledger compares times
//!   across steps; times the product writes elsewhere (the jobs' timestamps, the lease times in
//!   an election's detail) stay the server's;
//! * **a node's clock skewed** (`node-clock-skew`): the node restarted (SIGTERM) under
//!   libfaketime `FAKETIME=+5m`, then `-5m` the next time (its monotonic clock true), run
//!   20-40 s, then restarted true. Its `SOAK-HANDLER` times are corrected by the skew. Without
//!   libfaketime the four clock kinds leave the deck, and the run says so;
//! * **SIGKILL in a write stall** (`kill-in-write-stall`): a write stall as above, and a node
//!   SIGKILLed 1-3 s into it (its claims of the burst waiting at commit) and restarted at once
//!   with the same id: its old backends' claims commit when the stall ends;
//! * **a claimant frozen with a large answer** (`frozen-large-claim`): while one node (not the
//!   scheduler leader: ticks keep coming) has its pool requests reach the server 600 ms late
//!   (`PgProxy::delay`), and the other nodes theirs 1.2 s late, 24 `soak_big_job`s of 2 MiB
//!   each are enqueued; 300 ms later (its claim of them sent, not arrived) the node is
//!   SIGSTOPped and the delays end, so the server sends its claim's answer (about 16 MB with
//!   the queue's 8 slots: more than the socket buffers hold) to a stopped client; the harness
//!   checks that a backend of the node is stuck in `ClientWrite`. Frozen for the statement
//!   bound + 1-3 s, then SIGCONT or SIGKILL (half the time each). The outcome says how long the
//!   other nodes' claims of that queue paused (the longest time between two of their claims,
//!   from the job history, from 1.2 s after the jobs' commit until the thaw);
//! * **delayed requests** (`delayed-requests`): `PgProxy::delay` holds what one node's pool
//!   connections send for the statement bound + 1-3 s (applied again every 500 ms, to catch
//!   new connections) for 12-20 s; answers are on time.
//!
//! After the last fault everything is healed, dead nodes are restarted, the backlog drains
//! (bounded), the nodes are stopped with SIGTERM, and the ledger is computed from the
//! database: duplicate effects, missing and skipped ticks of both crons, lost or stuck jobs,
//! reruns, overlapping epochs, node RSS over time, and:
//!
//! * **rescue latency after a node is marked down**: the harness adds deferred constraint
//!   triggers to `forge.jobs` (`soak_job_moves`: each commit that changes a job's state,
//!   attempt or node, at the time of the COMMIT); for each `node_down` event of `forge.events`,
//!   every job that history shows `running` on that node at that moment, and the time until it
//!   left `running`: rescued by the scheduler leader, rescued by the node's next run (its
//!   restart), or completed by its own attempt (so never rescued: a frozen node that thawed);
//!   p50, p99, max, per way out, and the slowest with the fault in force;
//! * **jobs running with no handler anywhere** (target: 0): every 2 s the harness reads the
//!   jobs `running` in the database, (job, attempt, node), and looks for a live handler of that
//!   attempt in that node's current process (from its `SOAK-HANDLER` lines; a SIGSTOPped
//!   process's handlers count as live: its jobs wait for it or for rescue, which the latency
//!   measures; a killed process's handlers end with it). A job seen without one for longer than
//!   lease + down_after + maintenance_interval + 15 s of slack (27 s: pool starvation holds a
//!   finished attempt's report for up to two rounds of hogs), not counting the time of the
//!   harness's own table lock and write stall, is stranded. Sampled through the run and once
//!   more after the drain;
//! * **jobs rescued from a live node** (target: 0, ARCHITECTURE's invariant 4): a rescue
//!   (`errors` entry `rescued`) of an attempt whose handler was running at that instant on a
//!   node neither SIGSTOPped nor black-holed then. Every rescue is also counted by who made it
//!   (the scheduler leader, the node's next run, the worker's own reconciliation) and where
//!   the attempt's handler was (running, already returned: its outcome was on its way, gone
//!   with its process, never started);
//! * **leaderless time per role**: from `forge.events`, a tenure ends at its release, its
//!   `leader_lost` report or its lease expiry, whichever is first, and the next begins at
//!   `leader_elected`; a crashed leader's tenure counts from its lease expiry, so its gap is a
//!   lower bound. Sum and max per role, the gaps grouped by the last fault before them, the
//!   longest ones;
//! * **step-down requests** and what they answered; for each connections-full fault, the
//!   node's handler starts and ends while it could not reconnect (target: some);
//! * **leader changes, placement moves and flaps per kind of fault** (target: 0 flaps): each
//!   `leader_elected` of another node than the role's last leader is a change, put down to the
//!   fault under way or ended at most 30 s before (else to "no fault"); a placement move is a
//!   change handed over by `leader_rebalanced` for `spread` or `preferred`; a flap is a role
//!   going A -> B -> A with no fault started between the two changes, where the first was a
//!   placement move or had no fault to explain it (a change forced by a fault, undone once the
//!   node is back, is recovery, not a flap).
//!
//! **PostgreSQL crashes the harness did not order** (target: 0, an environment target): the
//! servers' logs are read as the run goes (`forge_testkit::CrashWatch`) for a server process
//! that died (a signal, an abort) and made the postmaster end every session, which loses every
//! advisory lock of the cluster. Each is printed when seen (`UNPLANNED PostgreSQL crash`, with
//! the postmaster's exit line and what the process wrote to stderr) and in the summary
//! (`unplanned PostgreSQL crashes: N (at ...)`); it explains the leader changes after it as a
//! fault does (the flaps it explains are printed apart, not counted), and the gaps after it are
//! put down to it.
//!
//! One PASS/FAIL line per target (and `info` lines for the figures without one). The verdict:
//! `RESULT: PASS` (exit status 0), `RESULT: FAIL` when a target is missed (1), and
//! `RESULT: ENVIRONMENT FAILED` when PostgreSQL crashed unplanned (3), whatever the targets say
//! (the line says it too): such a run's figures are not the product's alone. Node logs are
//! kept in the printed run directory.
//!
//! Why `overlap = "wait"` on `soak_tick`: with the default `"skip"`, a tick that comes due while
//! the previous run is still going (a commit held 1.5 s by the lost-reply trigger, a starved
//! pool) is recorded as `skipped` and its effect never happens; "0 missing ticks" is only a
//! meaningful target when every tick runs. `soak_default_tick` measures what the default does
//! under `catch_up = "all"`.

use std::process::ExitCode;
use std::time::Duration;

use harness::{Verdict, soak};
use node::node_main;
use options::Options;

mod harness;
mod node;
mod options;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str =
    "usage: soak [--minutes N] [--seed N] [--interval MIN-MAX] [--only KIND,KIND...]
fault kinds for --only: sigkill sigterm sigstop pg-fast-restart pg-immediate-restart failover
  kill-node-sessions kill-pool-sessions kill-lock-sessions blackhole pool-starvation
  lost-reply-cron lost-reply-job freeze-job-tx freeze-cron-tx write-stall table-lock
  step-down-storm connections-full db-clock-ahead db-clock-behind db-clock-down-after
  node-clock-skew kill-in-write-stall frozen-large-claim delayed-requests";

/// The node processes.
const NODE_IDS: [&str; 3] = ["n1", "n2", "n3"];
/// `[cluster.leader_election] lease_duration`.
const LEASE: Duration = Duration::from_secs(3);
/// `[cluster.membership] down_after`.
const DOWN_AFTER: Duration = Duration::from_secs(4);
/// `[database] max_connections` of every node: two per queue worker (four queues) and one, the
/// least FORGE does not warn about (a smaller pool starved the handlers for minutes).
const POOL_SIZE: u32 = 9;
/// How long a lost-reply COMMIT sleeps on the server (in `SETUP_SQL`).
const SLOW_COMMIT_SECS: f64 = 1.5;
/// The "work" each handler does in the middle of its run (inside the transaction for the
/// transactional ones, between the effect and the return for the plain job), so that faults
/// land mid-run: reruns, and the plain job's at-least-once duplicates, become observable.
const WORK: Duration = Duration::from_millis(250);
/// How often node RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(30);
/// Bound of every query the harness makes.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the backlog may take to drain after the faults.
const DRAIN_DEADLINE: Duration = Duration::from_secs(180);
/// A node with RSS above this fails the memory target whatever its history.
const RSS_CAP_KIB: u64 = 512 * 1024;
/// `[jobs] maintenance_interval` of every node.
const MAINTENANCE: Duration = Duration::from_secs(5);
/// The jobs' statement bound (a worker round trip, a maintenance pass): max(lease, 5 s).
const STATEMENT_BOUND: Duration = Duration::from_secs(5);
/// The database role the nodes log in as: not a superuser, so that the superuser-reserved
/// connection slots stay free for the harness when the server's connections are full.
const NODE_ROLE: &str = "forge_soak";
/// `max_connections` of the server (three nodes use about 30).
const MAX_CONNECTIONS: u32 = 100;
/// How long a handler asked to hold its transaction open keeps it (the harness SIGSTOPs the
/// node meanwhile). A tick's fenced transaction is ended by the server after a lease idle, so
/// its hold stays below the lease (a hold the harness misses then commits normally).
const HOLD_JOB_TX: Duration = Duration::from_secs(3);
const HOLD_CRON_TX: Duration = Duration::from_secs(2);
/// The flags (`soak_flags.kind`) asking a node's handlers to hold their transaction open.
const FREEZE_JOB_FLAG: &str = "freeze_job";
const FREEZE_CRON_FLAG: &str = "freeze_cron";
/// How many no-op jobs are enqueued just before a write stall.
const BURST: usize = 40;
/// How often running jobs are compared with the handlers the nodes report.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// A job `running` in the database with no live handler of its attempt for longer than this
/// (not counting the harness's own write stalls: a table lock, a stalled synchronous standby)
/// is stranded: lease + down_after + maintenance_interval + slack for pool starvation (two
/// rounds of hogs) and a black hole.
const STRANDED_AFTER: Duration =
    Duration::from_secs(LEASE.as_secs() + DOWN_AFTER.as_secs() + MAINTENANCE.as_secs() + 15);

/// The cron and job kinds of the soak.
const CRON: &str = "soak_tick";
/// The cron at the default `overlap` (with `catch_up = "all"`).
const DEFAULT_CRON: &str = "soak_default_tick";
const TX_JOB: &str = "soak_tx_job";
const PLAIN_JOB: &str = "soak_plain_job";
/// The pool hogs' kinds, as a LIKE pattern (one kind per node).
const HOG_JOB: &str = "soak_hog%";
/// The no-op jobs enqueued in a burst just before a write stall.
const BURST_JOB: &str = "soak_burst_job";
/// The no-op jobs with a large payload, for a frozen claimant.
const BIG_JOB: &str = "soak_big_job";
/// The steps of the workflows the harness enqueues.
const FLOW_JOB: &str = "soak_flow_job";
/// The stored cron, and the kind of the job each of its ticks enqueues.
const STORED_CRON: &str = "soak_stored";
const STORED_JOB: &str = "soak_stored_job";
/// The environment variable telling a node process how far ahead the harness set its wall
/// clock, in µs (its handlers record true times).
const SKEW_ENV: &str = "SOAK_CLOCK_SKEW_US";

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("node") {
        return node_main(args.get(2).cloned().unwrap_or_default()).await;
    }
    let options = match Options::parse(&args[1..]) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("error: {err}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match soak(options).await {
        Ok(Verdict::Pass) => ExitCode::SUCCESS,
        Ok(Verdict::ProductFailed) => ExitCode::FAILURE,
        Ok(Verdict::EnvironmentFailed) => ExitCode::from(3),
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}
