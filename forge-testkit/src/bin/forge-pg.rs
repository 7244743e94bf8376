//! `forge-pg`: start a throwaway PostgreSQL cluster and keep it while this
//! process runs.
//!
//! The cluster is durable (`fsync` and `full_page_writes` on, as in production), so that
//! benchmarks run side by side against it (`tools/peers`, `bench_jobs --database-url`)
//! pay for their commits.
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

use forge_testkit::{PgOptions, PgServer};

const USAGE: &str = "usage: forge-pg (no arguments)
Starts a throwaway PostgreSQL cluster (fsync on) on a free port, prints DATABASE_URL=, PGDATA=
and PGLOG= lines, and keeps it until this process ends (Ctrl-C, kill), then removes it.";

fn main() -> ExitCode {
    if let Some(arg) = std::env::args().nth(1) {
        if arg == "--help" || arg == "-h" {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        eprintln!("forge-pg: unexpected argument {arg:?}\n{USAGE}");
        return ExitCode::from(2);
    }
    let started = std::time::Instant::now();
    let server = match PgServer::start_with(PgOptions::default().durable(true)) {
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
