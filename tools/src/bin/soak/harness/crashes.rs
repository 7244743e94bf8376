//! PostgreSQL crashes the harness did not order: a server process that died (an abort, a
//! signal), after which the postmaster ended every session and lock of the cluster. They are
//! read from the servers' logs ([`forge_testkit::CrashWatch`]) as the run goes, reported on
//! their own line, explain the leader changes after them as a fault does, and make the run's
//! verdict an environment failure: the product's figures of such a run are not its own.

use std::path::PathBuf;

use forge_testkit::{CrashWatch, PgServer, ServerCrash};

use super::Harness;

/// How the report names a crash among the faults (the moves table, the leaderless gaps).
pub(super) const CRASH_LABEL: &str = "unplanned PostgreSQL crash";

/// The logs watched and the crashes seen.
#[derive(Default)]
pub(super) struct Crashes {
    watches: Vec<Watched>,
    pub(super) seen: Vec<UnplannedCrash>,
    /// When the logs were last read (harness seconds): a crash seen now happened after it.
    last_poll: f64,
}

/// The log of one server the harness runs (the primary or its standby, each in turn).
struct Watched {
    server: String,
    watch: CrashWatch,
    /// A read failed, and the run said so (once).
    failed: bool,
}

/// A crash seen in a server's log.
pub(super) struct UnplannedCrash {
    /// The last read of the logs before it (harness seconds): it happened at or after this.
    pub(super) at: f64,
    /// When the harness read it.
    pub(super) seen: f64,
    /// Which server, such as `primary :5433`.
    pub(super) server: String,
    pub(super) crash: ServerCrash,
}

impl UnplannedCrash {
    /// One line for the report.
    pub(super) fn describe(&self) -> String {
        format!(
            "{:.1}-{:.1}s on the {}: {}",
            self.at,
            self.seen,
            self.server,
            self.crash.describe()
        )
    }
}

impl Harness {
    /// Reads what the servers logged since the last call and records their crashes. The logs
    /// of servers the harness no longer runs (a failed-over primary) are read a last time and
    /// dropped.
    pub(super) fn watch_crashes(&mut self) {
        let mut current: Vec<(String, PathBuf)> = Vec::new();
        let servers = std::iter::once(("primary", &self.primary))
            .chain(self.standby.iter().map(|s| ("standby", s)));
        for (role, server) in servers {
            let name = format!("{role} :{}", server.port());
            if let Some(log) = server.log_file() {
                current.push((name.clone(), log.to_owned()));
                if !self
                    .crashes
                    .watches
                    .iter()
                    .any(|w| w.watch.log_file() == log)
                {
                    self.crashes.watches.extend(new_watch(server, name));
                }
            }
        }
        let (now, since) = (self.secs(), self.crashes.last_poll);
        let mut found = Vec::new();
        let mut unreadable = Vec::new();
        for watched in &mut self.crashes.watches {
            let is_current = current
                .iter()
                .any(|(_, log)| log == watched.watch.log_file());
            match watched.watch.poll() {
                Ok(crashes) => found.extend(crashes.into_iter().map(|crash| UnplannedCrash {
                    at: since,
                    seen: now,
                    server: watched.server.clone(),
                    crash,
                })),
                Err(err) if is_current && !watched.failed => {
                    watched.failed = true;
                    unreadable.push(format!(
                        "harness: cannot read the log of the {} to watch it for crashes: {err}",
                        watched.server
                    ));
                }
                Err(_) => {}
            }
            // A server that changed role (a promoted standby) keeps its watch under its new
            // name.
            if let Some((name, _)) = current
                .iter()
                .find(|(_, log)| log == watched.watch.log_file())
            {
                watched.server.clone_from(name);
            }
        }
        self.crashes
            .watches
            .retain(|w| current.iter().any(|(_, log)| log == w.watch.log_file()));
        self.crashes.last_poll = now;
        for message in unreadable {
            self.finding(message);
        }
        for crash in found {
            self.note(format!(
                "UNPLANNED PostgreSQL crash (the harness did not order it; every session of the server was ended): {}",
                crash.describe()
            ));
            self.crashes.seen.push(crash);
        }
    }
}

fn new_watch(server: &PgServer, name: String) -> Option<Watched> {
    server.crash_watch().ok().map(|watch| Watched {
        server: name,
        watch,
        failed: false,
    })
}
