//! The crashes a throwaway server's log reports: a server process that died abnormally (a
//! signal, an exit code other than 0 or 1), after which the postmaster ends every other session
//! and reinitializes - every connection and every advisory lock of the cluster is gone, as after
//! an immediate restart, but nobody asked for it.
//!
//! The postmaster logs `terminating any other active server processes` once per such crash,
//! right after the line that names the process and how it ended; a stopped server (even
//! `pg_ctl stop -m immediate`, [`PgServer::kill_immediate`]) logs neither, so a test that crashes
//! the server on purpose is not reported here.

use std::collections::VecDeque;
use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use super::PgServer;
use crate::Error;

/// The line the postmaster logs once per crash, when it starts ending the other sessions.
const CRASH_LINE: &str = "terminating any other active server processes";
/// How many lines before the crash line are searched for its cause.
const CAUSE_WINDOW: usize = 8;

/// One crash of a server process that made the postmaster restart every session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerCrash {
    /// The postmaster's line naming the process and how it ended, such as `server process (PID
    /// 123) was terminated by signal 6: Aborted` (with the log's prefix); empty if the log did
    /// not have it.
    pub exit: String,
    /// What the process wrote to stderr just before, without a log prefix (glibc's `malloc
    /// assertion failure in sysmalloc`, for one): the likely cause, if any.
    pub stderr: Vec<String>,
}

impl ServerCrash {
    /// The exit line and the stderr lines, for a report.
    pub fn describe(&self) -> String {
        let mut parts: Vec<&str> = self.stderr.iter().map(String::as_str).collect();
        if !self.exit.is_empty() {
            parts.push(&self.exit);
        }
        if parts.is_empty() {
            CRASH_LINE.to_owned()
        } else {
            parts.join(" | ")
        }
    }
}

/// Reads a throwaway server's log as it grows and picks out its crashes
/// ([`PgServer::crash_watch`]). Each call of [`poll`](CrashWatch::poll) reads what was appended
/// since the last one.
#[derive(Debug)]
pub struct CrashWatch {
    log: PathBuf,
    offset: u64,
    /// The last lines read, to find a crash's cause before its crash line.
    recent: VecDeque<String>,
}

impl CrashWatch {
    fn new(log: &Path) -> CrashWatch {
        CrashWatch {
            log: log.to_owned(),
            offset: 0,
            recent: VecDeque::with_capacity(CAUSE_WINDOW),
        }
    }

    /// The log this watch reads.
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// The crashes logged since the last call (since the server's first start, at the first
    /// call). Reads complete lines only: a line being written is read by the next call.
    pub fn poll(&mut self) -> Result<Vec<ServerCrash>, Error> {
        let what = || format!("reading the server log {}", self.log.display());
        let mut bytes = Vec::new();
        fs::File::open(&self.log)
            .and_then(|mut file| {
                file.seek(SeekFrom::Start(self.offset))?;
                file.read_to_end(&mut bytes)
            })
            .map_err(|e| Error::io(what(), e))?;
        let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |n| n + 1);
        self.offset += complete as u64;
        let text = String::from_utf8_lossy(&bytes[..complete]);
        let mut crashes = Vec::new();
        for line in text.lines() {
            if line.contains(CRASH_LINE) {
                crashes.push(self.cause());
                self.recent.clear();
                continue;
            }
            if self.recent.len() == CAUSE_WINDOW {
                self.recent.pop_front();
            }
            self.recent.push_back(line.to_owned());
        }
        Ok(crashes)
    }

    /// The crash whose crash line comes after the recent lines: the last exit line among them,
    /// and the unprefixed lines (stderr) before it.
    fn cause(&self) -> ServerCrash {
        let exit_at = self.recent.iter().rposition(|l| is_exit_line(l));
        let before = exit_at.unwrap_or(self.recent.len());
        ServerCrash {
            exit: exit_at.map_or_else(String::new, |n| self.recent[n].clone()),
            stderr: self
                .recent
                .iter()
                .take(before)
                .filter(|l| is_stderr_line(l))
                .cloned()
                .collect(),
        }
    }
}

/// The postmaster's line on a process that ended abnormally (`LogChildExit`).
fn is_exit_line(line: &str) -> bool {
    line.contains("was terminated by signal")
        || line.contains("exited with exit code")
        || line.contains("was terminated by exception")
}

/// Whether a line is what a process or a library wrote to stderr, not a server message: it
/// neither starts with the kit's log prefix (a date: `log_line_prefix` starts with `%m`) nor
/// continues a message (a tab: a `CONTEXT` of several lines).
fn is_stderr_line(line: &str) -> bool {
    let bytes = line.as_bytes();
    let prefixed = bytes.len() >= 10
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[4] == b'-'
        && bytes[7] == b'-';
    !prefixed && !line.starts_with(char::is_whitespace) && !line.trim().is_empty()
}

impl PgServer {
    /// A [`CrashWatch`] on this throwaway server's log: the crashes of its processes that made
    /// it restart every session (a backend killed by a signal, an abort), which a test did not
    /// order - [`kill_immediate`](PgServer::kill_immediate) and
    /// [`restart_immediate`](PgServer::restart_immediate) are not crashes of this kind. Fails
    /// on an external server (the kit cannot read its log).
    pub fn crash_watch(&self) -> Result<CrashWatch, Error> {
        self.log_file().map(CrashWatch::new).ok_or_else(|| {
            Error::Unsupported(
                "cannot watch the log of an external server for crashes: only a throwaway \
                 cluster's log is known to the kit"
                    .to_owned(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_crash_with_its_exit_line_and_stderr() {
        let dir =
            std::env::temp_dir().join(format!("forge-crashes-{}", super::super::unique_suffix()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("server.log");
        fs::write(
            &log,
            "2026-11-27 08:55:56.100 UTC [10] LOG:  checkpoint starting\n\
             2026-11-27 08:55:56.200 UTC [11] CONTEXT:  SQL statement \"SELECT 1\"\n\
             \tPL/pgSQL function f() line 3 at PERFORM\n\
             Fatal glibc error: malloc assertion failure in sysmalloc\n\
             2026-11-27 08:55:56.280 UTC [9] LOG:  server process (PID 42) was terminated by signal 6: Aborted\n\
             2026-11-27 08:55:56.280 UTC [9] DETAIL:  Failed process was running: SELECT 1\n\
             2026-11-27 08:55:56.280 UTC [9] LOG:  terminating any other active server processes\n\
             2026-11-27 08:55:57.000 UTC [9] LOG:  received immediate shutdown request\n\
             2026-11-27 08:55:58.000 UTC [9] LOG:  server process (PID 43) was term",
        )
        .unwrap();
        let mut watch = CrashWatch::new(&log);
        let crashes = watch.poll().unwrap();
        assert_eq!(crashes.len(), 1, "{crashes:?}");
        assert!(
            crashes[0]
                .exit
                .ends_with("(PID 42) was terminated by signal 6: Aborted")
        );
        assert_eq!(
            crashes[0].stderr,
            ["Fatal glibc error: malloc assertion failure in sysmalloc"]
        );
        assert!(watch.poll().unwrap().is_empty(), "read twice");

        // The half-written line is read once complete.
        let mut file = fs::OpenOptions::new().append(true).open(&log).unwrap();
        std::io::Write::write_all(
            &mut file,
            b"inated by signal 9: Killed\n\
              2026-11-27 08:55:58.000 UTC [9] LOG:  terminating any other active server processes\n",
        )
        .unwrap();
        let crashes = watch.poll().unwrap();
        assert_eq!(crashes.len(), 1, "{crashes:?}");
        assert!(
            crashes[0]
                .exit
                .ends_with("(PID 43) was terminated by signal 9: Killed")
        );
        assert!(crashes[0].stderr.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
