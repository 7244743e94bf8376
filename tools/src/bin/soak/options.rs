//! The command line, the faults it names, and the seeded random numbers that pick them.

use std::time::Duration;

pub(crate) struct Options {
    pub(crate) minutes: f64,
    pub(crate) seed: u64,
    pub(crate) interval: (f64, f64),
    /// `--only`: the deck holds these kinds alone.
    pub(crate) only: Option<Vec<FaultKind>>,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options, String> {
        let mut options = Options {
            minutes: 30.0,
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 ^ u64::from(std::process::id()))
                .unwrap_or(1),
            interval: (5.0, 30.0),
            only: None,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match arg.as_str() {
                "--minutes" => {
                    options.minutes = value("--minutes")?
                        .parse()
                        .ok()
                        .filter(|m: &f64| *m > 0.0)
                        .ok_or("--minutes: a positive number")?;
                }
                "--seed" => {
                    options.seed = value("--seed")?
                        .parse()
                        .map_err(|_| "--seed: an unsigned integer")?;
                }
                "--interval" => {
                    let text = value("--interval")?;
                    let parsed = text
                        .split_once('-')
                        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                        .filter(|(a, b): &(f64, f64)| *a > 0.0 && a <= b);
                    options.interval =
                        parsed.ok_or("--interval: MIN-MAX in seconds, such as 5-30")?;
                }
                "--only" => {
                    let text = value("--only")?;
                    let kinds = text
                        .split(',')
                        .map(|key| {
                            FaultKind::ALL
                                .into_iter()
                                .find(|k| k.key() == key.trim())
                                .ok_or_else(|| format!("--only: unknown fault kind {key:?}"))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    options.only = Some(kinds);
                }
                "-h" | "--help" => return Err("help".into()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(options)
    }
}

/// SplitMix64: small, seedable, good enough to pick faults.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(crate) fn secs(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(lo + (hi - lo) * self.unit())
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FaultKind {
    SigKill,
    SigTerm,
    SigStop,
    PgFastRestart,
    PgImmediateRestart,
    Failover,
    TerminateNodeSessions,
    TerminatePoolSessions,
    TerminateLockSessions,
    BlackHole,
    PoolStarvation,
    LostReplyCron,
    LostReplyJob,
    FreezeJobTx,
    FreezeCronTx,
    WriteStall,
    TableLock,
    StepDownStorm,
    ConnectionsFull,
    DbClockAhead,
    DbClockBehind,
    DbClockDownAfter,
    NodeClockSkew,
    KillInWriteStall,
    FrozenLargeClaim,
    DelayedRequests,
}

impl FaultKind {
    pub(crate) const ALL: [FaultKind; 26] = [
        FaultKind::SigKill,
        FaultKind::SigTerm,
        FaultKind::SigStop,
        FaultKind::PgFastRestart,
        FaultKind::PgImmediateRestart,
        FaultKind::Failover,
        FaultKind::TerminateNodeSessions,
        FaultKind::TerminatePoolSessions,
        FaultKind::TerminateLockSessions,
        FaultKind::BlackHole,
        FaultKind::PoolStarvation,
        FaultKind::LostReplyCron,
        FaultKind::LostReplyJob,
        FaultKind::FreezeJobTx,
        FaultKind::FreezeCronTx,
        FaultKind::WriteStall,
        FaultKind::TableLock,
        FaultKind::StepDownStorm,
        FaultKind::ConnectionsFull,
        FaultKind::DbClockAhead,
        FaultKind::DbClockBehind,
        FaultKind::DbClockDownAfter,
        FaultKind::NodeClockSkew,
        FaultKind::KillInWriteStall,
        FaultKind::FrozenLargeClaim,
        FaultKind::DelayedRequests,
    ];

    /// Kinds that need libfaketime (a steppable database clock, a skewed node clock).
    pub(crate) fn needs_faketime(self) -> bool {
        matches!(
            self,
            FaultKind::DbClockAhead
                | FaultKind::DbClockBehind
                | FaultKind::DbClockDownAfter
                | FaultKind::NodeClockSkew
        )
    }

    /// The name `--only` takes.
    pub(crate) fn key(self) -> &'static str {
        match self {
            FaultKind::SigKill => "sigkill",
            FaultKind::SigTerm => "sigterm",
            FaultKind::SigStop => "sigstop",
            FaultKind::PgFastRestart => "pg-fast-restart",
            FaultKind::PgImmediateRestart => "pg-immediate-restart",
            FaultKind::Failover => "failover",
            FaultKind::TerminateNodeSessions => "kill-node-sessions",
            FaultKind::TerminatePoolSessions => "kill-pool-sessions",
            FaultKind::TerminateLockSessions => "kill-lock-sessions",
            FaultKind::BlackHole => "blackhole",
            FaultKind::PoolStarvation => "pool-starvation",
            FaultKind::LostReplyCron => "lost-reply-cron",
            FaultKind::LostReplyJob => "lost-reply-job",
            FaultKind::FreezeJobTx => "freeze-job-tx",
            FaultKind::FreezeCronTx => "freeze-cron-tx",
            FaultKind::WriteStall => "write-stall",
            FaultKind::TableLock => "table-lock",
            FaultKind::StepDownStorm => "step-down-storm",
            FaultKind::ConnectionsFull => "connections-full",
            FaultKind::DbClockAhead => "db-clock-ahead",
            FaultKind::DbClockBehind => "db-clock-behind",
            FaultKind::DbClockDownAfter => "db-clock-down-after",
            FaultKind::NodeClockSkew => "node-clock-skew",
            FaultKind::KillInWriteStall => "kill-in-write-stall",
            FaultKind::FrozenLargeClaim => "frozen-large-claim",
            FaultKind::DelayedRequests => "delayed-requests",
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::SigKill => "SIGKILL",
            FaultKind::SigTerm => "SIGTERM",
            FaultKind::SigStop => "SIGSTOP/SIGCONT",
            FaultKind::PgFastRestart => "PostgreSQL fast restart",
            FaultKind::PgImmediateRestart => "PostgreSQL immediate restart",
            FaultKind::Failover => "primary failover",
            FaultKind::TerminateNodeSessions => "pg_terminate_backend node sessions",
            FaultKind::TerminatePoolSessions => "pg_terminate_backend pool sessions",
            FaultKind::TerminateLockSessions => "pg_terminate_backend lock sessions",
            FaultKind::BlackHole => "black hole (half-open)",
            FaultKind::PoolStarvation => "pool starvation",
            FaultKind::LostReplyCron => "lost reply after commit (cron)",
            FaultKind::LostReplyJob => "lost reply after commit (tx job)",
            FaultKind::FreezeJobTx => "frozen inside a job transaction",
            FaultKind::FreezeCronTx => "frozen inside a tick transaction",
            FaultKind::WriteStall => "write stall (synchronous standby frozen)",
            FaultKind::TableLock => "LOCK TABLE forge.jobs",
            FaultKind::StepDownStorm => "step-down storm",
            FaultKind::ConnectionsFull => "connections full, node session cut",
            FaultKind::DbClockAhead => "database clock stepped ahead 90 s",
            FaultKind::DbClockBehind => "database clock stepped back 90 s",
            FaultKind::DbClockDownAfter => "database clock stepped by down_after",
            FaultKind::NodeClockSkew => "node clock skewed 5 min",
            FaultKind::KillInWriteStall => "SIGKILL in a write stall, same id",
            FaultKind::FrozenLargeClaim => "claimant frozen, large answer",
            FaultKind::DelayedRequests => "pool requests delayed past the bound",
        }
    }
}
