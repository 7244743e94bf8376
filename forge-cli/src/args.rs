//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const AFTER_HELP: &str = "\
Connects with DATABASE_URL, or with the [database] url of --config FILE (DATABASE_URL wins, as
for nodes); the cluster is [cluster] lock_namespace (default `forge`) unless --namespace says
otherwise.

Exit codes: 0 ok; 1 something is wrong (doctor found a problem, an id was not found, the
database is unreachable); 2 the command line or the configuration is wrong.";

/// Inspect and operate a FORGE cluster: leaders, nodes, events, crons, jobs, queues,
/// migrations, health checks and alert rules.
#[derive(Debug, Parser)]
#[command(name = "forge", version, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    /// forge.toml to read the database URL and the namespace from.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The cluster's namespace (default: [cluster] lock_namespace).
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) namespace: Option<String>,
    /// Print JSON for scripts instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The cluster at a glance: leaders, nodes, crons, queues, migrations.
    Status,
    /// Who leads each role, with the lease left (or the leadership history).
    Leaders(LeadersArgs),
    /// The cluster's history: elections, handoffs, membership, operators' actions.
    Events(EventsArgs),
    /// The nodes and their membership state (or one node in detail).
    Nodes {
        /// Show this node only.
        node: Option<String>,
    },
    /// Crons: list, show with recent ticks, pause, resume, trigger now.
    Crons {
        #[command(subcommand)]
        action: Option<CronsCommand>,
    },
    /// Jobs: list with filters, show, retry, cancel, delete (one, or all matching). Without a
    /// subcommand, `ls` with the filters given (`forge jobs --state dead`).
    #[command(args_conflicts_with_subcommands = true)]
    Jobs {
        #[command(subcommand)]
        action: Option<JobsCommand>,
        #[command(flatten)]
        list: JobsList,
    },
    /// Queues: depth, oldest job, paused; pause and resume.
    Queues {
        #[command(subcommand)]
        action: Option<QueuesCommand>,
    },
    /// Asks the leader of a role to hand over gracefully (through the database).
    StepDown(StepDownArgs),
    /// FORGE's database migrations: what is applied, what is pending; apply them, or print
    /// them for a migration tool of your own.
    Migrate {
        #[command(subcommand)]
        action: MigrateCommand,
    },
    /// Configuration files.
    Config {
        #[command(subcommand)]
        action: ConfigCommand,
    },
    /// Checks the cluster and exits non-zero when something is wrong (for deploy gates):
    /// transaction pooler, pending migrations, foreign holders of FORGE's lock keys, roles
    /// without a leader, nodes down or drifted, clock skew.
    Doctor {
        /// Treat warnings (nodes down or drifted, clock skew over 1 s) as problems too.
        #[arg(long)]
        strict: bool,
        /// The largest difference between this host's clock and the database's that passes:
        /// beyond it the clock check fails (exit 1); over 1 s within it is a warning. A host
        /// behind the database runs its crons late by as much.
        #[arg(long, default_value = "5s", value_parser = duration, value_name = "DURATION")]
        max_clock_skew: Duration,
    },
    /// Prometheus alert rules.
    Alerts {
        #[command(subcommand)]
        action: AlertsCommand,
    },
}

#[derive(Debug, Args)]
pub(crate) struct LeadersArgs {
    /// The leadership history (each tenure, how it began and ended) instead of the current
    /// leaders.
    #[arg(long)]
    pub(crate) history: bool,
    /// With --history: only this role.
    #[arg(long, requires = "history")]
    pub(crate) role: Option<String>,
    /// With --history: tenures per page.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub(crate) limit: u32,
    /// With --history: the `next` cursor of the previous page.
    #[arg(long, requires = "history", value_name = "CURSOR")]
    pub(crate) before: Option<i64>,
}

#[derive(Debug, Args)]
pub(crate) struct EventsArgs {
    /// Keep printing new events as they happen (until interrupted).
    #[arg(long, short)]
    pub(crate) follow: bool,
    /// Only events of this kind (repeat, or separate with commas).
    #[arg(long = "kind", value_name = "KIND", value_delimiter = ',')]
    pub(crate) kinds: Vec<String>,
    /// Only events about this node.
    #[arg(long, value_name = "NODE")]
    pub(crate) node: Option<String>,
    /// Only events about this role.
    #[arg(long, value_name = "ROLE")]
    pub(crate) role: Option<String>,
    /// Events per page (the newest first).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub(crate) limit: u32,
    /// The `next` cursor of the previous page.
    #[arg(long, value_name = "CURSOR", conflicts_with = "follow")]
    pub(crate) before: Option<i64>,
    /// With --follow: how often to look for new events.
    #[arg(long, default_value = "500ms", value_parser = duration, value_name = "DURATION")]
    pub(crate) interval: Duration,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CronsCommand {
    /// Every cron the cluster knows, with its next and last run (the default).
    #[command(alias = "list")]
    Ls,
    /// One cron, with its recent ticks.
    Show {
        /// The cron's name.
        name: String,
        /// Ticks to show.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        /// The `next` cursor of the previous page of ticks.
        #[arg(long, value_name = "CURSOR")]
        before: Option<i64>,
    },
    /// Pauses a cron: its ticks are recorded as skipped until it is resumed.
    Pause {
        /// The cron's name.
        name: String,
    },
    /// Resumes a paused cron from its next tick.
    Resume {
        /// The cron's name.
        name: String,
    },
    /// Runs a cron once now, on the leader of its role.
    Trigger {
        /// The cron's name.
        name: String,
    },
    /// Creates a cron stored in the database, which enqueues a job at each tick on the
    /// scheduler's leader (refused when a cron has the name: `set` changes one).
    Add(StoredCronArgs),
    /// Creates or changes a cron stored in the database; the leader runs the new definition
    /// within a second.
    Set(StoredCronArgs),
    /// Deletes a cron stored in the database (not a cron of code).
    Delete {
        /// The cron's name.
        name: String,
    },
}

/// A stored cron's definition on the command line.
#[derive(Debug, Args)]
pub(crate) struct StoredCronArgs {
    /// The cron's name.
    pub(crate) name: String,
    /// Its expression, such as "*/5 * * * *" (5 or 6 fields, or an @ alias).
    pub(crate) expression: String,
    /// The kind of the job each tick enqueues (a #[job] of the nodes).
    #[arg(long)]
    pub(crate) kind: String,
    /// The job's arguments, as JSON.
    #[arg(long, default_value = "null")]
    pub(crate) args: String,
    /// An IANA time zone.
    #[arg(long, default_value = "UTC")]
    pub(crate) timezone: String,
    /// skip, latest or all (default latest).
    #[arg(long)]
    pub(crate) catch_up: Option<String>,
    /// How far back catch-up looks, such as 1h (default 24h).
    #[arg(long)]
    pub(crate) catch_up_window: Option<String>,
    /// skip, wait or allow.
    #[arg(long)]
    pub(crate) overlap: Option<String>,
    /// rerun or abandon (default rerun).
    #[arg(long)]
    pub(crate) interrupted: Option<String>,
    /// Bounds a tick's enqueue, such as 30s.
    #[arg(long)]
    pub(crate) timeout: Option<String>,
}

/// Which jobs.
#[derive(Debug, Default, Args)]
pub(crate) struct JobFilterArgs {
    /// Only jobs in this state (repeat, or separate with commas): available, scheduled,
    /// running, retryable, completed, dead, cancelled.
    #[arg(long = "state", value_name = "STATE", value_delimiter = ',')]
    pub(crate) states: Vec<String>,
    /// Only jobs of this queue.
    #[arg(long, value_name = "QUEUE")]
    pub(crate) queue: Option<String>,
    /// Only jobs of this kind.
    #[arg(long, value_name = "KIND")]
    pub(crate) kind: Option<String>,
    /// Only jobs whose arguments contain this JSON, e.g. '{"user_id": 7}'.
    #[arg(long = "args", value_name = "JSON")]
    pub(crate) args: Option<String>,
}

impl JobFilterArgs {
    pub(crate) fn is_empty(&self) -> bool {
        self.states.is_empty() && self.queue.is_none() && self.kind.is_none() && self.args.is_none()
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum JobsCommand {
    /// Jobs matching the filters, newest first (the default).
    #[command(alias = "list")]
    Ls(JobsList),
    /// One job, with each failed attempt's error.
    Show {
        /// The job's id.
        id: i64,
    },
    /// Makes a job (or, with --all-matching, every job matching the filters) available again
    /// now, with one more attempt.
    Retry(JobAction),
    /// Cancels a job (or every job matching the filters); running ones are asked to stop.
    Cancel(JobAction),
    /// Deletes a job that is not running (or every such job matching the filters).
    Delete(JobAction),
    /// Sets a job kind's cluster-wide limits, over every queue and node at once and without a
    /// restart: the ones given, and no other (`--none`: none at all). An operator's limits win
    /// over forge.toml's or the code's until `--reset`.
    Limit(KindLimitArgs),
    /// Every job kind with cluster-wide limits, who set them and what counts against them.
    Limits,
}

/// A page of jobs: `forge jobs ls` (or `forge jobs` alone).
#[derive(Debug, Args)]
pub(crate) struct JobsList {
    #[command(flatten)]
    pub(crate) filter: JobFilterArgs,
    /// Jobs per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub(crate) limit: u32,
    /// The `next` cursor of the previous page.
    #[arg(long, value_name = "CURSOR")]
    pub(crate) before: Option<i64>,
}

#[derive(Debug, Args)]
pub(crate) struct JobAction {
    /// The job's id.
    #[arg(required_unless_present = "all_matching")]
    pub(crate) id: Option<i64>,
    /// Act on every job matching the filters instead of one id (at least one filter is
    /// required).
    #[arg(long, conflicts_with = "id")]
    pub(crate) all_matching: bool,
    #[command(flatten)]
    pub(crate) filter: JobFilterArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum QueuesCommand {
    /// Every queue with its depth, oldest job and pause state (the default).
    #[command(alias = "list")]
    Ls,
    /// Pauses a queue: no node claims its jobs until it is resumed (running ones finish).
    /// A queue the cluster does not know (no node works it, no unfinished or dead job) is
    /// refused, unless --new.
    Pause {
        /// The queue.
        queue: String,
        /// Pause it although no node works it and it holds no job yet (pre-pause a new queue).
        #[arg(long)]
        new: bool,
    },
    /// Resumes a paused queue.
    Resume {
        /// The queue.
        queue: String,
    },
    /// Sets a queue's cluster-wide limits, for every node at once and without a restart: the
    /// ones given, and no other (`--none`: none at all). An operator's limits win over
    /// forge.toml's until `--reset`.
    Limit(LimitArgs),
}

/// `forge queues limit`.
#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    /// The queue.
    pub(crate) queue: String,
    #[command(flatten)]
    pub(crate) values: LimitValues,
    /// Limit it although no node works it and it holds no job yet.
    #[arg(long)]
    pub(crate) new: bool,
}

/// `forge jobs limit`.
#[derive(Debug, Args)]
pub(crate) struct KindLimitArgs {
    /// The job kind.
    pub(crate) kind: String,
    #[command(flatten)]
    pub(crate) values: LimitValues,
}

/// The limits of `forge queues limit` and `forge jobs limit`.
#[derive(Debug, Args)]
pub(crate) struct LimitValues {
    /// At most this many of its jobs running at once on all nodes together.
    #[arg(long = "global", value_name = "N")]
    pub(crate) global: Option<u32>,
    /// At most this many claims in any window, such as 100/1m.
    #[arg(long, value_name = "COUNT/WINDOW")]
    pub(crate) rate: Option<String>,
    /// The rate per value of this top-level field of the jobs' arguments.
    #[arg(long, value_name = "FIELD", requires = "rate")]
    pub(crate) rate_key: Option<String>,
    /// No limits at all (over forge.toml's or the code's, until --reset).
    #[arg(long, conflicts_with_all = ["global", "rate", "reset"])]
    pub(crate) none: bool,
    /// Give the limits back to forge.toml (a queue's) or the code (a kind's): unlimited until
    /// a node starts and writes them.
    #[arg(long, conflicts_with_all = ["global", "rate"])]
    pub(crate) reset: bool,
}

impl LimitValues {
    /// The limits these values set, checked; `None` for `--reset`.
    pub(crate) fn limits(&self) -> Result<Option<forge::jobs::QueueLimits>, crate::fail::Fail> {
        if self.reset {
            return Ok(None);
        }
        if self.global.is_none() && self.rate.is_none() && !self.none {
            return Err(crate::fail::Fail::usage(
                "say which limits: --global N, --rate COUNT/WINDOW (with --rate-key FIELD), --none, or --reset".to_owned(),
            ));
        }
        let rate = match &self.rate {
            Some(text) => Some(
                text.parse::<forge::jobs::Rate>()
                    .map_err(|err| crate::fail::Fail::usage(format!("--rate: {err}")))?,
            ),
            None => None,
        };
        forge::jobs::QueueLimits::new(self.global, rate, self.rate_key.clone())
            .map(Some)
            .map_err(crate::fail::Fail::usage)
    }
}

#[derive(Debug, Args)]
pub(crate) struct StepDownArgs {
    /// The role whose leader should hand over.
    pub(crate) role: String,
    /// Wait until another tenure leads the role.
    #[arg(long)]
    pub(crate) wait: bool,
    /// Step down even when no standby waits for the role (it is refused otherwise: the role
    /// would be without a leader until a node campaigned again).
    #[arg(long)]
    pub(crate) force: bool,
    /// With --wait: how long to wait.
    #[arg(long, default_value = "30s", value_parser = duration, value_name = "DURATION")]
    pub(crate) timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub(crate) enum MigrateCommand {
    /// Every migration and whether this database has it.
    Status {
        /// Also the application's migrations in this directory (as given to
        /// `NodeBuilder::migrations`, recorded in `_sqlx_migrations`).
        #[arg(long, value_name = "DIR")]
        app: Option<PathBuf>,
    },
    /// Applies the pending migrations (FORGE's, then the application's).
    Up {
        /// Print what would be applied, and apply nothing.
        #[arg(long)]
        dry_run: bool,
        /// With --dry-run: print the SQL of each pending migration too.
        #[arg(long, requires = "dry_run")]
        sql: bool,
        /// Also the application's migrations in this directory.
        #[arg(long, value_name = "DIR")]
        app: Option<PathBuf>,
    },
    /// Prints FORGE's schema as SQL for a migration tool of your own.
    ///
    /// One script for Flyway, goose, sqitch, Rails or psql: applied once, in one transaction,
    /// it leaves the database as `forge migrate up` would, bookkeeping included, so that nodes
    /// with [database] migrate = false start on it. Needs no database.
    Sql {
        /// Only the migrations after this version (the last one the SQL of the release before
        /// applied; its header names it), then every function file: the SQL of an upgrade.
        #[arg(long, value_name = "VERSION", value_parser = clap::value_parser!(i64).range(0..))]
        after: Option<i64>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Checks a forge.toml: syntax, keys, durations, combinations (exit 2 when broken).
    Check {
        /// The file.
        file: PathBuf,
        /// Apply the environment's overrides (DATABASE_URL, FORGE_NODE_ID, FORGE_ROLES, ...)
        /// as a node would.
        #[arg(long)]
        env: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum AlertsCommand {
    /// Writes the Prometheus rule file for this configuration (built-in rules and
    /// forge.toml's [[alerts]]).
    Export {
        /// Write to this file instead of stdout.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|err| format!("{err} (e.g. 500ms, 30s, 2m)"))
}
