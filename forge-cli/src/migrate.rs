//! `migrate status` and `migrate up [--dry-run]`: FORGE's schema (its migrations, then its
//! function files) exactly as a node applies it (`forge::migrate`), and optionally the
//! application's own migrations from a directory. `migrate sql [--after VERSION]`: the same
//! schema as a script for a migration tool of the user's own (`forge::migrate::script`).

use std::io::Write as _;
use std::path::Path;

use forge::migrate::{
    APP_TABLE, FunctionState, FunctionStatus, MigrationState, MigrationStatus, TABLE,
};
use forge::sqlx::migrate::Migrator;
use serde_json::json;

use crate::args::MigrateCommand;
use crate::ctx::Ctx;
use crate::fail::{Fail, Outcome};
use crate::out::{self, Table};

/// FORGE's migrations and their state in the cluster's database.
pub(crate) async fn forge_status(ctx: &Ctx) -> Result<Vec<MigrationStatus>, Fail> {
    let mut conn = ctx.pool.acquire().await.map_err(|e| Fail::database(&e))?;
    Ok(forge::migrate::status(&mut conn, &forge::migrate::migrator(), TABLE).await?)
}

/// FORGE's function files and their state in the cluster's database.
pub(crate) async fn forge_functions(ctx: &Ctx) -> Result<Vec<FunctionStatus>, Fail> {
    let mut conn = ctx.pool.acquire().await.map_err(|e| Fail::database(&e))?;
    Ok(forge::migrate::function_status(&mut conn).await?)
}

/// Names, comma-separated: all of them when there are few, else how many.
fn names<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    if names.len() <= 10 {
        names.join(", ")
    } else {
        format!("{} of them", names.len())
    }
}

/// "2 migrations and 3 function files", leaving out a kind there is none of.
fn counted(migrations: usize, functions: usize) -> String {
    match (migrations, functions) {
        (m, 0) => format!("{m} migrations"),
        (0, f) => format!("{f} function files"),
        (m, f) => format!("{m} migrations and {f} function files"),
    }
}

/// One line on FORGE's function files: how many are applied, and which are not (or are
/// someone else's).
pub(crate) fn functions_line(functions: &[FunctionStatus]) -> String {
    let named = |state: FunctionState| -> Vec<&str> {
        functions
            .iter()
            .filter(|f| f.state == state)
            .map(|f| f.name.as_str())
            .collect()
    };
    let mut parts = vec![format!("{} applied", named(FunctionState::Applied).len())];
    for (state, label) in [
        (FunctionState::Pending, "pending"),
        (
            FunctionState::Changed,
            "changed (applied again by `forge migrate up`)",
        ),
        (FunctionState::Newer, "applied by a newer FORGE (kept)"),
        (FunctionState::Unknown, "unknown to this CLI"),
    ] {
        let these = named(state);
        if !these.is_empty() {
            parts.push(format!("{} {label}: {}", these.len(), names(these)));
        }
    }
    format!("function files: {}", parts.join("; "))
}

async fn app_migrator(dir: &Path) -> Result<Migrator, Fail> {
    if !dir.is_dir() {
        return Err(Fail::usage(format!(
            "--app {}: not a directory (give the directory of the application's migrations, as passed to sqlx::migrate!)",
            dir.display()
        )));
    }
    Migrator::new(dir.to_path_buf()).await.map_err(|err| {
        Fail::usage(format!(
            "--app {}: cannot read the migrations: {err}",
            dir.display()
        ))
    })
}

/// One set of migrations: whose, and their states.
struct Set {
    name: &'static str,
    migrations: Vec<MigrationStatus>,
}

fn state_name(state: MigrationState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn set_json(set: &Set) -> serde_json::Value {
    json!({
        "set": set.name,
        "migrations": set.migrations,
    })
}

fn print_sets(sets: &[Set]) {
    let mut table = Table::new(&["SET", "VERSION", "DESCRIPTION", "STATE", "APPLIED"]);
    for set in sets {
        for m in &set.migrations {
            table.row(vec![
                set.name.to_owned(),
                format!("{:04}", m.version),
                m.description.clone(),
                state_name(m.state),
                out::opt_time(m.installed_on),
            ]);
        }
    }
    table.print();
}

/// A migration the database has in a state `up` cannot fix.
fn blocking(sets: &[Set]) -> Option<String> {
    sets.iter().find_map(|set| {
        set.migrations.iter().find_map(|m| match m.state {
            MigrationState::Changed => Some(format!(
                "{} migration {:04}_{} was applied with different SQL than this binary has: \
                 the database and this version disagree; do not apply, find out which version migrated it",
                set.name, m.version, m.description
            )),
            MigrationState::Failed => Some(format!(
                "{} migration {:04}_{} failed part-way (sqlx calls it dirty): repair the schema by hand, \
                 then delete its row from {}",
                set.name,
                m.version,
                m.description,
                if set.name == "forge" { TABLE } else { APP_TABLE }
            )),
            _ => None,
        })
    })
}

/// `forge migrate sql`: the script on stdout (with `--json`, in an object that also lists what
/// it applies). Reads no database.
pub(crate) fn print_sql(after: Option<i64>, json: bool) -> Outcome {
    let sql = forge::migrate::script(after)?;
    if json {
        let after = after.unwrap_or(0);
        out::print_json(&json!({
            "after": after,
            "migrations": forge::migrate::sources().iter()
                .filter(|(version, _, _)| *version > after)
                .map(|(version, description, _)| json!({ "version": version, "description": description }))
                .collect::<Vec<_>>(),
            "functions": forge::migrate::functions().iter().map(|(name, _)| name).collect::<Vec<_>>(),
            "sql": sql,
        }));
        return Ok(0);
    }
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(sql.as_bytes())
        .and_then(|()| stdout.flush())
    {
        // A reader that stopped early (`| head`) is no failure of the command.
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => Err(Fail::problem(format!(
            "cannot write the SQL to stdout: {err}"
        ))),
        _ => Ok(0),
    }
}

pub(crate) async fn run(ctx: &Ctx, action: &MigrateCommand, json: bool) -> Outcome {
    let (app_dir, dry_run, show_sql, up) = match action {
        MigrateCommand::Status { app } => (app.as_deref(), true, false, false),
        MigrateCommand::Up { dry_run, sql, app } => (app.as_deref(), *dry_run, *sql, true),
        MigrateCommand::Sql { after } => return print_sql(*after, json),
    };
    let forge_migrator = forge::migrate::migrator();
    let app = match app_dir {
        Some(dir) => Some(app_migrator(dir).await?),
        None => None,
    };
    let mut conn = ctx.connection().await?;
    let mut sets = vec![Set {
        name: "forge",
        migrations: forge::migrate::status(&mut conn, &forge_migrator, TABLE).await?,
    }];
    let functions = forge::migrate::function_status(&mut conn).await?;
    let due: Vec<&FunctionStatus> = functions.iter().filter(|f| f.state.is_due()).collect();
    if let Some(app) = &app {
        sets.push(Set {
            name: "app",
            migrations: forge::migrate::status(&mut conn, app, APP_TABLE).await?,
        });
    }
    let pending: Vec<(&'static str, &MigrationStatus)> = sets
        .iter()
        .flat_map(|set| {
            set.migrations
                .iter()
                .filter(|m| m.state == MigrationState::Pending)
                .map(move |m| (set.name, m))
        })
        .collect();

    if !up {
        if json {
            out::print_json(&json!({
                "sets": sets.iter().map(set_json).collect::<Vec<_>>(),
                "pending": pending.len(),
                "functions": functions,
                "functions_due": due.len(),
            }));
        } else {
            print_sets(&sets);
            outln!("{}", functions_line(&functions));
            outln!();
            match (blocking(&sets), pending.len(), due.len()) {
                (Some(why), _, _) => outln!("{why}"),
                (None, 0, 0) => outln!("up to date"),
                (None, n, f) => outln!(
                    "{} pending: apply with `forge migrate up` (or start a node)",
                    counted(n, f)
                ),
            }
        }
        return Ok(u8::from(blocking(&sets).is_some()));
    }
    if let Some(why) = blocking(&sets) {
        return Err(Fail::problem(why));
    }
    if dry_run {
        if json {
            out::print_json(&json!({
                "dry_run": true,
                "would_apply": pending.iter().map(|(set, m)| {
                    let mut v = json!({ "set": set, "version": m.version, "description": m.description });
                    if show_sql {
                        v["sql"] = m.sql.clone().into();
                    }
                    v
                }).collect::<Vec<_>>(),
                "would_apply_functions": due.iter().map(|f| {
                    let mut v = json!({ "name": f.name, "state": f.state });
                    if show_sql {
                        v["sql"] = f.sql.clone().into();
                    }
                    v
                }).collect::<Vec<_>>(),
            }));
        } else if pending.is_empty() && due.is_empty() {
            outln!("nothing to apply: up to date");
        } else {
            outln!(
                "would apply {} (dry run, nothing applied):",
                counted(pending.len(), due.len())
            );
            let print_sql = |sql: &str| {
                if show_sql {
                    outln!();
                    for line in sql.lines() {
                        outln!("    {line}");
                    }
                    outln!();
                }
            };
            for (set, m) in &pending {
                outln!("  {set} {:04}_{}", m.version, m.description);
                print_sql(&m.sql);
            }
            for f in &due {
                outln!("  forge function {}", f.name);
                print_sql(&f.sql);
            }
        }
        return Ok(0);
    }
    let applied_functions = forge::migrate::up(&mut conn).await?;
    if let Some(app) = &app {
        forge::migrate::apply(&mut conn, app).await.map_err(|err| {
            Fail::problem(format!("applying the application's migrations: {err}"))
        })?;
    }
    if json {
        out::print_json(&json!({
            "applied": pending.iter().map(|(set, m)| json!({
                "set": set, "version": m.version, "description": m.description,
            })).collect::<Vec<_>>(),
            "applied_functions": applied_functions,
        }));
    } else if pending.is_empty() && applied_functions.is_empty() {
        outln!("nothing to apply: up to date");
    } else {
        for (set, m) in &pending {
            outln!("applied {set} {:04}_{}", m.version, m.description);
        }
        if !applied_functions.is_empty() {
            outln!(
                "applied forge function files: {}",
                names(applied_functions.iter().copied())
            );
        }
    }
    Ok(0)
}
