//! Child OS processes (e.g. FORGE node binaries) with captured output that
//! can really be killed, paused and resumed.

use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Error;
use crate::sys;

/// How many output lines error messages show.
const TAIL_LINES: usize = 20;
/// After exit, how long [`NodeProcess::wait_exit`] waits at most for the
/// output pipes to drain (a grandchild may keep them open).
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// A child OS process (for example a FORGE node binary) whose output is
/// captured line by line, and which can really be killed (`SIGKILL`), paused
/// (`SIGSTOP`), resumed and terminated.
///
/// * stdout and stderr are both captured, merged in arrival order, as lines
///   (invalid UTF-8 is replaced, line endings stripped). With
///   `FORGE_TEST_ECHO=1` every line is also echoed to our stderr, prefixed
///   with the process name.
/// * stdin is `/dev/null`.
/// * [`wait_for_line`](NodeProcess::wait_for_line) reads the output like a
///   tape: a cursor moves past each matched line, so a later call only sees
///   lines after the previous match. [`lines`](NodeProcess::lines) returns
///   everything captured, regardless of the cursor.
/// * Dropping it kills the process (`SIGCONT` if paused, then `SIGKILL`).
///
/// Must be created inside a tokio runtime (it spawns tasks reading the
/// pipes); use it from that runtime.
///
/// ```no_run
/// # async fn demo() -> Result<(), forge_testkit::Error> {
/// use std::time::Duration;
/// use forge_testkit::NodeProcess;
///
/// let mut cmd = tokio::process::Command::new("sh");
/// cmd.args(["-c", "echo listening on 8080; exec sleep 1000"]);
/// let mut node = NodeProcess::spawn(cmd)?.named("node-a");
/// let line = node.wait_for_line("the listen line", Duration::from_secs(10), |l| l.starts_with("listening")).await?;
/// assert_eq!(line, "listening on 8080");
/// node.kill()?;
/// let status = node.wait_exit(Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
pub struct NodeProcess {
    child: Mutex<ChildState>,
    pid: u32,
    output: Arc<Captured>,
    /// Index of the first line `wait_for_line` will look at.
    cursor: usize,
    paused: AtomicBool,
    readers: Vec<JoinHandle<()>>,
}

struct ChildState {
    child: Child,
    /// Set once the exit status has been collected (the pid may then be reused).
    status: Option<ExitStatus>,
}

impl ChildState {
    fn poll_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.status = Some(status);
        }
        self.status
    }
}

/// Output shared between the reader tasks and the `NodeProcess`.
struct Captured {
    name: Mutex<String>,
    lines: Mutex<Vec<String>>,
    /// Pipes still open (2 → 0).
    open: AtomicUsize,
    /// Bumped on every new line and on every pipe closing.
    tick: watch::Sender<u64>,
    echo: bool,
}

impl Captured {
    fn name(&self) -> String {
        self.name
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn tail(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let start = lines.len().saturating_sub(TAIL_LINES);
        if lines.is_empty() {
            "(no output)".to_owned()
        } else {
            lines[start..].join("\n")
        }
    }
}

impl NodeProcess {
    /// Spawns `cmd` with stdout and stderr captured, stdin `/dev/null` and
    /// `kill_on_drop`. The default name is the program's file name and pid.
    pub fn spawn(mut cmd: Command) -> Result<NodeProcess, Error> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Process(
                "NodeProcess::spawn must be called inside a tokio runtime (it spawns tasks reading the \
                 child's output)"
                    .to_owned(),
            ));
        }
        let program = cmd.as_std().get_program().to_string_lossy().into_owned();
        let short = program.rsplit('/').next().unwrap_or(&program).to_owned();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::io(format!("spawning {program}"), e))?;
        let pid = child.id().unwrap_or_default();
        let (tick, _) = watch::channel(0);
        let output = Arc::new(Captured {
            name: Mutex::new(format!("{short}[{pid}]")),
            lines: Mutex::new(Vec::new()),
            open: AtomicUsize::new(2),
            tick,
            echo: std::env::var_os("FORGE_TEST_ECHO").is_some_and(|v| v == "1"),
        });
        let mut readers = Vec::with_capacity(2);
        match child.stdout.take() {
            Some(stdout) => readers.push(tokio::spawn(pump(stdout, output.clone()))),
            None => close_stream(&output),
        }
        match child.stderr.take() {
            Some(stderr) => readers.push(tokio::spawn(pump(stderr, output.clone()))),
            None => close_stream(&output),
        }
        Ok(NodeProcess {
            child: Mutex::new(ChildState {
                child,
                status: None,
            }),
            pid,
            output,
            cursor: 0,
            paused: AtomicBool::new(false),
            readers,
        })
    }

    /// Names the process for messages and echo (default: program name and pid).
    pub fn named(self, name: &str) -> Self {
        *self
            .output
            .name
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = name.to_owned();
        self
    }

    /// The process's name as used in messages.
    pub fn name(&self) -> String {
        self.output.name()
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `SIGKILL` (works on a paused process too). Does not wait: use
    /// [`wait_exit`](NodeProcess::wait_exit). Errors if the process already
    /// exited (a test that meant to kill a live node should hear about it).
    pub fn kill(&mut self) -> Result<(), Error> {
        let name = self.name();
        let state = self.child.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(status) = state.poll_status() {
            return Err(Error::Process(format!(
                "cannot kill {name}: it already exited ({status})"
            )));
        }
        state
            .child
            .start_kill()
            .map_err(|e| Error::io(format!("killing {name}"), e))
    }

    /// Sends `SIGSTOP`: the process freezes (no CPU, no I/O, its connections
    /// stay open), like a stalled VM or a long GC pause.
    pub fn pause(&self) -> Result<(), Error> {
        self.signal(libc::SIGSTOP, "pause")?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Sends `SIGCONT` to a paused process.
    pub fn resume(&self) -> Result<(), Error> {
        self.signal(libc::SIGCONT, "resume")?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Sends `SIGTERM` (graceful shutdown request). Does not wait.
    pub fn terminate(&self) -> Result<(), Error> {
        self.signal(libc::SIGTERM, "terminate")
    }

    fn signal(&self, signal: libc::c_int, verb: &str) -> Result<(), Error> {
        let mut state = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        // Holding the lock: nobody can reap the child meanwhile, so the pid
        // cannot be reused under us (an exited but unreaped child is a zombie).
        if let Some(status) = state.poll_status() {
            return Err(Error::Process(format!(
                "cannot {verb} {}: it already exited ({status})",
                self.output.name()
            )));
        }
        sys::send_signal(self.pid, signal)
            .map_err(|e| Error::io(format!("cannot {verb} {}", self.output.name()), e))
    }

    /// Waits for the first line after the cursor for which `pred` is true,
    /// returns it and moves the cursor past it (lines skipped on the way are
    /// consumed too).
    ///
    /// Fails after `timeout` with an error naming `what` and the process and
    /// showing its last output lines; fails at once if the process closed its
    /// output (exited) without printing such a line.
    pub async fn wait_for_line(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String, Error> {
        let deadline = Instant::now() + timeout;
        let mut ticks = self.output.tick.subscribe();
        let mut scanned = self.cursor;
        loop {
            ticks.borrow_and_update();
            // Read `open` before scanning: if it was 0, every line is in.
            let closed = self.output.open.load(Ordering::SeqCst) == 0;
            {
                let lines = self
                    .output
                    .lines
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                for (i, line) in lines.iter().enumerate().skip(scanned) {
                    if pred(line) {
                        self.cursor = i + 1;
                        return Ok(line.clone());
                    }
                }
                scanned = lines.len();
            }
            if closed {
                let status = {
                    let mut state = self.child.lock().unwrap_or_else(PoisonError::into_inner);
                    match state.poll_status() {
                        Some(status) => format!("exited: {status}"),
                        None => "still running".to_owned(),
                    }
                };
                return Err(Error::Process(format!(
                    "{} closed its output ({status}) without printing {what}\n--- last lines of {} ---\n{}",
                    self.output.name(),
                    self.output.name(),
                    self.output.tail()
                )));
            }
            if tokio::time::timeout_at(deadline, ticks.changed())
                .await
                .is_err()
            {
                return Err(self.timeout_error(
                    &format!("{what} (a line from {})", self.output.name()),
                    timeout,
                ));
            }
        }
    }

    /// Every line captured so far (both streams, arrival order), regardless
    /// of the [`wait_for_line`](NodeProcess::wait_for_line) cursor.
    pub fn lines(&self) -> Vec<String> {
        self.output
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The exit status if the process has exited, without waiting.
    pub fn try_status(&self) -> Option<ExitStatus> {
        self.child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .poll_status()
    }

    /// Waits for the process to exit and returns its status (for a killed
    /// process, `status.signal() == Some(9)` via
    /// `std::os::unix::process::ExitStatusExt`). Afterwards also waits
    /// (briefly) for the remaining output to be captured, so
    /// [`lines`](NodeProcess::lines) is complete.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, Error> {
        let deadline = Instant::now() + timeout;
        let state = self.child.get_mut().unwrap_or_else(PoisonError::into_inner);
        let status = match state.status {
            Some(status) => status,
            None => match tokio::time::timeout_at(deadline, state.child.wait()).await {
                Ok(Ok(status)) => {
                    state.status = Some(status);
                    status
                }
                Ok(Err(e)) => {
                    return Err(Error::io(
                        format!("waiting for {} to exit", self.output.name()),
                        e,
                    ));
                }
                Err(_) => {
                    return Err(
                        self.timeout_error(&format!("{} to exit", self.output.name()), timeout)
                    );
                }
            },
        };
        self.paused.store(false, Ordering::SeqCst);
        let drain_deadline = deadline.min(Instant::now() + DRAIN_LIMIT);
        let mut ticks = self.output.tick.subscribe();
        while self.output.open.load(Ordering::SeqCst) > 0 {
            if tokio::time::timeout_at(drain_deadline, ticks.changed())
                .await
                .is_err()
            {
                break;
            }
        }
        Ok(status)
    }

    fn timeout_error(&self, what: &str, waited: Duration) -> Error {
        Error::Timeout {
            what: what.to_owned(),
            waited,
            details: format!(
                "\n--- last lines of {} ---\n{}",
                self.output.name(),
                self.output.tail()
            ),
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let state = self.child.get_mut().unwrap_or_else(PoisonError::into_inner);
        if state.poll_status().is_none() {
            if *self.paused.get_mut() {
                let _ = sys::send_signal(self.pid, libc::SIGCONT);
            }
            // kill_on_drop would do it too; explicit is clearer.
            let _ = state.child.start_kill();
        }
        for reader in &self.readers {
            reader.abort();
        }
    }
}

impl std::fmt::Debug for NodeProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeProcess")
            .field("name", &self.output.name())
            .field("pid", &self.pid)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

/// Reads `stream` line by line into `output` until EOF.
async fn pump(stream: impl AsyncRead + Unpin, output: Arc<Captured>) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                let line = String::from_utf8_lossy(&buf).into_owned();
                if output.echo {
                    eprintln!("[{}] {line}", output.name());
                }
                output
                    .lines
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
                output.tick.send_modify(|t| *t += 1);
            }
        }
    }
    close_stream(&output);
}

fn close_stream(output: &Captured) {
    output.open.fetch_sub(1, Ordering::SeqCst);
    output.tick.send_modify(|t| *t += 1);
}
