//! A throwaway cluster whose wall clock a test can step while it runs (an NTP step, a VM
//! resumed, a snapshot restored): PostgreSQL started under libfaketime.
//!
//! The server runs with `LD_PRELOAD` = libfaketime, its fake time read from a file in the
//! cluster's directory at every clock read (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE`), so a
//! step reaches every backend at once. Only the wall clock moves: `CLOCK_MONOTONIC` stays true
//! (`FAKETIME_DONT_FAKE_MONOTONIC`), as in a real step, and so do file timestamps
//! (`NO_FAKE_STAT`).
//!
//! Use libfaketime 0.9.11 or later for this. Older releases (0.9.10 is Debian 12's and Ubuntu
//! 24.04's) read the timestamp file with `fopen`/`fgets` at every clock read, and PostgreSQL
//! reads the clock in its `SIGALRM` handler (`handle_sig_alarm`, while a timeout is active): a
//! read there that interrupts the backend inside `malloc` or stdio - often libfaketime's own
//! read of the file - corrupts the heap or deadlocks, and the backend aborts ("malloc
//! assertion failure in sysmalloc", "corrupted double-linked list": the postmaster then restarts
//! every session) or hangs for good. 0.9.11 reads the file with `open`/`read`, which is safe
//! there. `libfaketimeMT` (signals blocked during its own reads) still lets the handler's read
//! interrupt PostgreSQL's own `malloc`; a cache (`FAKETIME_CACHE_DURATION` instead of
//! `FAKETIME_NO_CACHE`) makes the reads rare but lets a step reach a backend up to a second
//! late. So the kit prefers a library without the stdio reader, and warns when it has only such
//! a one (point `FORGE_FAKETIME_LIB` at a newer build).
//!
//! One way this differs from a real step, and what a test sees of it: libfaketime answers the
//! *true* time to clock reads made while the process is inside a wait it intercepts (`epoll_wait`,
//! `poll`, ...). PostgreSQL's timeouts (`lock_timeout`, `statement_timeout`,
//! `idle_session_timeout`, `idle_in_transaction_session_timeout`) are deadlines on the wall
//! clock, checked by a `SIGALRM` handler that mostly runs inside such a wait: so while the clock
//! is stepped ahead, a timeout armed meanwhile fires late by the size of the step - what a real
//! *backward* step does to them. A real forward step can instead make a timeout armed before it
//! fire early, when another alarm arrives while the session idles; libfaketime cannot show that.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, PoisonError};
use std::time::Duration;

use super::PgServer;
use crate::Error;

/// The Debian package that ships the library, for messages.
const PACKAGE: &str = "libfaketime";

/// Where libfaketime's preload library is, if it is installed: `FORGE_FAKETIME_LIB`, else the
/// usual places (Debian/Ubuntu `/usr/lib/<arch>/faketime/`, Fedora `/usr/lib64/faketime/`, a
/// source install under `/usr/local/lib/faketime/`), the first one that reads its timestamp file
/// safely (0.9.11 or later, see the module's docs) if any does.
pub fn faketime_library() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("FORGE_FAKETIME_LIB").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let mut candidates: Vec<PathBuf> = [
        "/usr/lib/faketime",
        "/usr/lib64/faketime",
        "/usr/local/lib/faketime",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    if let Ok(entries) = fs::read_dir("/usr/lib") {
        candidates.extend(entries.flatten().map(|e| e.path().join("faketime")));
    }
    let found: Vec<PathBuf> = candidates
        .into_iter()
        .map(|dir| dir.join("libfaketime.so.1"))
        .filter(|lib| lib.is_file())
        .collect();
    found
        .iter()
        .find(|lib| !reads_with_stdio(lib))
        .or(found.first())
        .cloned()
}

/// Whether a libfaketime library reads its timestamp file with stdio (`fgets`: releases before
/// 0.9.11, unsafe in a signal handler), judged by the symbols it imports: the name `fgets` in
/// its dynamic string table.
fn reads_with_stdio(library: &Path) -> bool {
    const IMPORT: &[u8] = b"\0fgets\0";
    fs::read(library).is_ok_and(|bytes| bytes.windows(IMPORT.len()).any(|w| w == IMPORT))
}

/// Says once per process, on stderr, that `library` is a libfaketime whose clusters crash now
/// and then, and what to do.
fn warn_if_unsafe(library: &Path) {
    static WARNED: Once = Once::new();
    if reads_with_stdio(library) {
        WARNED.call_once(|| {
            eprintln!(
                "warning: {} is a libfaketime older than 0.9.11: it reads its timestamp file with \
                 fopen at every clock read, also in PostgreSQL's SIGALRM handler, so backends of a \
                 cluster with a steppable clock abort (\"malloc assertion failure\") or hang now \
                 and then; build libfaketime 0.9.11 or later and point FORGE_FAKETIME_LIB at its \
                 libfaketime.so.1",
                library.display()
            );
        });
    }
}

/// The environment that runs a process (a node binary) with its wall clock off by `offset`,
/// in libfaketime's `FAKETIME` syntax (`"+5m"`, `"-5m"`, `"+90s"`): `LD_PRELOAD` = libfaketime,
/// `FAKETIME`, and a true monotonic clock (`FAKETIME_DONT_FAKE_MONOTONIC`, so that timers and
/// tokio's clock stay true, as on a machine whose wall clock is wrong). Fails, saying what to
/// install, when libfaketime is missing.
pub fn skewed_clock_env(offset: &str) -> Result<Vec<(&'static str, std::ffi::OsString)>, Error> {
    let library = faketime_library().ok_or_else(missing_library)?;
    Ok(vec![
        ("LD_PRELOAD", library.into_os_string()),
        ("FAKETIME", offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ])
}

fn missing_library() -> Error {
    Error::Config(format!(
        "a stepped or skewed clock runs the process under libfaketime, which was not found: \
         install it (Debian/Ubuntu: `apt-get install {PACKAGE}`) or set FORGE_FAKETIME_LIB to \
         its libfaketime.so.1"
    ))
}

/// The stepped clock of one cluster: the library, the file libfaketime reads, and the offset
/// written there.
pub(super) struct SteppedClock {
    library: PathBuf,
    file: PathBuf,
    offset_ms: Mutex<i64>,
}

impl SteppedClock {
    /// A clock at true time for the cluster in `dir`; fails, saying what to install, when
    /// libfaketime is missing.
    pub(super) fn new(dir: &Path) -> Result<SteppedClock, Error> {
        let library = faketime_library().ok_or_else(missing_library)?;
        warn_if_unsafe(&library);
        let clock = SteppedClock {
            library,
            file: dir.join("faketime"),
            offset_ms: Mutex::new(0),
        };
        clock.write(0)?;
        Ok(clock)
    }

    /// The environment the server is started with.
    pub(super) fn env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        vec![
            ("LD_PRELOAD", self.library.clone().into_os_string()),
            (
                "FAKETIME_TIMESTAMP_FILE",
                self.file.clone().into_os_string(),
            ),
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
            ("FAKETIME_DONT_RESET", "1".into()),
            ("NO_FAKE_STAT", "1".into()),
        ]
    }

    fn offset_ms(&self) -> i64 {
        *self
            .offset_ms
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the clock by `delta_ms` (negative: back).
    fn step(&self, delta_ms: i64) -> Result<(), Error> {
        let mut offset = self
            .offset_ms
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.write(*offset + delta_ms)?;
        *offset += delta_ms;
        Ok(())
    }

    /// Writes the offset, atomically (a rename), so that no backend reads a half-written file.
    fn write(&self, offset_ms: i64) -> Result<(), Error> {
        let sign = if offset_ms < 0 { '-' } else { '+' };
        let ms = offset_ms.unsigned_abs();
        let text = format!("{sign}{}.{:03}\n", ms / 1000, ms % 1000);
        let temp = self.file.with_extension("new");
        fs::write(&temp, text)
            .and_then(|()| fs::rename(&temp, &self.file))
            .map_err(|e| Error::io(format!("writing {}", self.file.display()), e))
    }
}

fn millis(by: Duration) -> i64 {
    by.as_millis().min(i64::MAX as u128) as i64
}

impl PgServer {
    /// Steps this server's wall clock ahead by `by`, at once, while it runs (see
    /// [`PgOptions::steppable_clock`](crate::PgOptions::steppable_clock)). Steps add up.
    pub fn step_clock_ahead(&self, by: Duration) -> Result<(), Error> {
        self.stepped_clock("step the clock of")?.step(millis(by))
    }

    /// Steps this server's wall clock back by `by`, at once, while it runs. Steps add up.
    pub fn step_clock_back(&self, by: Duration) -> Result<(), Error> {
        self.stepped_clock("step the clock of")?.step(-millis(by))
    }

    /// Steps this server's wall clock back to the true time.
    pub fn step_clock_to_true_time(&self) -> Result<(), Error> {
        let clock = self.stepped_clock("step the clock of")?;
        clock.step(-clock.offset_ms())
    }

    /// How far this server's wall clock is from the true time, in milliseconds (positive:
    /// ahead); `None` when its clock cannot be stepped.
    pub fn clock_offset_ms(&self) -> Option<i64> {
        self.stepped_clock("read the clock of")
            .ok()
            .map(SteppedClock::offset_ms)
    }

    fn stepped_clock(&self, op: &str) -> Result<&SteppedClock, Error> {
        match &self.kind {
            super::Kind::Throwaway(super::Cluster {
                clock: Some(clock), ..
            }) => Ok(clock),
            _ => Err(Error::Unsupported(format!(
                "cannot {op} this server: only a throwaway cluster started with \
                 PgOptions::default().steppable_clock() has a clock a test can step"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_importing_fgets_reads_with_stdio() {
        let dir =
            std::env::temp_dir().join(format!("forge-faketime-{}", super::super::unique_suffix()));
        fs::create_dir_all(&dir).unwrap();
        let old = dir.join("old.so");
        let new = dir.join("new.so");
        fs::write(&old, b"\x7fELF...\0fopen\0fgets\0fclose\0open\0").unwrap();
        fs::write(&new, b"\x7fELF...\0open\0read\0my_fgets_x\0").unwrap();
        assert!(reads_with_stdio(&old));
        assert!(!reads_with_stdio(&new));
        assert!(!reads_with_stdio(&dir.join("missing.so")));
        fs::remove_dir_all(&dir).unwrap();
    }
}
