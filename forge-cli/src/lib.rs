//! The `forge` command: inspect and operate a FORGE cluster from a shell or a deploy script.
//!
//! It connects with `DATABASE_URL` or `--config forge.toml` (the cluster is `[cluster]
//! lock_namespace`) and reads and writes through the same read models the admin API uses
//! (`forge::inspect`): `status`, `leaders`, `events [--follow]`, `nodes`, `crons`, `jobs`,
//! `queues`, `step-down`, `migrate status|up|sql`, `config check`, `doctor`, `alerts export`.
//! Aligned tables for people, `--json` for scripts. Exit codes: 0 ok, 1 something is wrong
//! (`doctor` found a problem, an id was not found, the database is unreachable), 2 the command
//! line or the configuration is wrong. Every write is recorded in the cluster's events as done
//! by `cli <user>@<host>`.
//!
//! The binary is a thin `main` over [`main`], so that other binaries (tests) can embed it.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

/// `print!` to standard output that ends the command quietly when the reader has gone
/// (`forge events | head`), instead of panicking as `print!` does.
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write_stdout(format_args!($($arg)*), false) };
}

/// `println!`, ending the command quietly when the reader has gone (see [`out!`]).
macro_rules! outln {
    () => { $crate::out::write_stdout(format_args!(""), true) };
    ($($arg:tt)*) => { $crate::out::write_stdout(format_args!($($arg)*), true) };
}

mod args;
mod cluster;
mod config_cmd;
mod ctx;
mod doctor;
mod fail;
mod kind_limits;
mod migrate;
mod out;
mod stored;
mod work;

use args::{
    AlertsCommand, Cli, Command, ConfigCommand, CronsCommand, MigrateCommand, QueuesCommand,
};
use ctx::{Ctx, Settings};
use fail::{Fail, Outcome};

/// Runs the `forge` command with the process's arguments and returns its exit code.
pub fn main() -> ExitCode {
    run(std::env::args_os())
}

/// Runs the `forge` command with these arguments (the first is the program's name).
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are not errors.
            let code = if err.use_stderr() { fail::USAGE } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("forge: cannot start: {err}");
            return ExitCode::from(fail::PROBLEM);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(fail) => {
            eprintln!("forge: {}", fail.message);
            if json {
                out::print_json(&serde_json::json!({
                    "error": fail.message,
                    "exit_code": fail.code,
                }));
            }
            ExitCode::from(fail.code)
        }
    }
}

async fn dispatch(cli: Cli) -> Outcome {
    let json = cli.json;
    // Commands that need no database.
    match &cli.command {
        Command::Config {
            action: ConfigCommand::Check { file, env },
        } => return config_cmd::check(file, *env, json),
        Command::Alerts {
            action: AlertsCommand::Export { output },
        } => return config_cmd::alerts_export(&cli, output.as_deref(), json),
        Command::Migrate {
            action: MigrateCommand::Sql { after },
        } => return migrate::print_sql(*after, json),
        _ => {}
    }
    let settings = Settings::load(&cli)?;
    if let Command::Doctor {
        strict,
        max_clock_skew,
    } = &cli.command
    {
        return doctor::run(settings, *strict, *max_clock_skew, json).await;
    }
    let ctx = Ctx::connect(settings).await?;
    match &cli.command {
        Command::Status => cluster::status(&ctx, json).await,
        Command::Leaders(args) => cluster::leaders(&ctx, args, json).await,
        Command::Events(args) => cluster::events(&ctx, args, json).await,
        Command::Nodes { node } => cluster::nodes(&ctx, node.as_deref(), json).await,
        Command::StepDown(args) => cluster::step_down(&ctx, args, json).await,
        Command::Crons { action } => {
            work::crons(&ctx, action.as_ref().unwrap_or(&CronsCommand::Ls), json).await
        }
        Command::Jobs { action, list } => match action {
            Some(action) => work::jobs(&ctx, action, json).await,
            None => work::jobs_list(&ctx, list, json).await,
        },
        Command::Queues { action } => {
            work::queues(&ctx, action.as_ref().unwrap_or(&QueuesCommand::Ls), json).await
        }
        Command::Migrate { action } => migrate::run(&ctx, action, json).await,
        Command::Config { .. } | Command::Alerts { .. } | Command::Doctor { .. } => {
            Err(Fail::usage("unreachable command"))
        }
    }
}
