//! `forge-pg`: start a throwaway PostgreSQL cluster and keep it while this
//! process runs.
//!
//! Prints `DATABASE_URL=...`, `PGDATA=...` and `PGLOG=...` lines on stdout,
//! then waits until it is interrupted or killed. The cluster is stopped and
//! its directory removed whenever the process ends, even by `SIGKILL`.
//!
//! ```text
//! $ cargo run -p forge-testkit --bin forge-pg
//! DATABASE_URL=postgres://postgres@127.0.0.1:40123/postgres
//! ```

use std::io::Write as _;
use std::process::ExitCode;

use forge_testkit::PgServer;

fn main() -> ExitCode {
    let started = std::time::Instant::now();
    let server = match PgServer::start() {
        Ok(server) => server,
        Err(e) => {
            eprintln!("forge-pg: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "DATABASE_URL={}", server.url());
    if let (Some(data), Some(log)) = (server.data_dir(), server.log_file()) {
        let _ = writeln!(out, "PGDATA={}", data.display());
        let _ = writeln!(out, "PGLOG={}", log.display());
    }
    let _ = out.flush();
    drop(out);
    eprintln!(
        "forge-pg: cluster started in {:?}; it is removed when this process ends (Ctrl-C, kill, ...)",
        started.elapsed()
    );
    loop {
        std::thread::park();
    }
}
