//! FORGE's schema ([`Schema`]: its numbered migrations and its function files, which the `forge`
//! crate embeds from its `migrations/` folder), and how a node applies it at start, or checks it with `[database] migrate = false`.
//!
//! Tables, indexes and other objects that hold data change through numbered migrations
//! (`migrations/NNNN_<what>.sql`, recorded by sqlx in [`MIGRATIONS_TABLE`]). Every SQL
//! function is defined in exactly one file named after it (`migrations/functions/<name>.sql`), with
//! `CREATE OR REPLACE FUNCTION`. After the migrations, a node applies the function files whose
//! SQL differs from what the database recorded in [`FUNCTIONS_TABLE`], all in one transaction,
//! under an advisory lock of its own (nodes that start together apply them once), with
//! `check_function_bodies = off` (a `LANGUAGE sql` body may name a function created later in the
//! same step). A database whose function was applied by a newer FORGE release keeps it: an
//! older node never puts back an older body (docs/src/migrations.md, "Changing the schema").

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::migrate::{Migrate, MigrateError, Migration, MigrationType, Migrator};
use sqlx::{Connection, PgConnection, SqlSafeStr};

use tracing::warn;

use crate::error::{Error, Result};

mod status;

pub use status::{APP_MIGRATIONS_TABLE, MigrationState, MigrationStatus, migration_status};

/// One numbered migration: version, description (the file name after the number), SQL. The
/// migrations of every crate form one sequence, recorded in [`MIGRATIONS_TABLE`] in the `forge`
/// schema, so they never clash with the host application's.
pub type MigrationSource = (i64, &'static str, &'static str);

/// One function file: the function's name (the file's, `migrations/functions/<name>.sql`) and its
/// SQL (the comment that explains the function, then `CREATE OR REPLACE FUNCTION`).
pub type FunctionSource = (&'static str, &'static str);

/// FORGE's schema: its numbered migrations and its function files. The `forge` crate embeds its
/// `migrations/` folder as one (`forge::migrate::SCHEMA`) and hands it to the node with
/// [`Assembly::schema`](crate::Assembly::schema).
#[derive(Clone, Copy, Debug)]
pub struct Schema {
    /// Its numbered migrations (tables, indexes, ...).
    pub migrations: &'static [MigrationSource],
    /// Its function files.
    pub functions: &'static [FunctionSource],
}

/// The table FORGE records its own migrations in.
pub const MIGRATIONS_TABLE: &str = "forge._sqlx_migrations";

/// The table FORGE records the function files it applied in.
pub const FUNCTIONS_TABLE: &str = "forge.schema_functions";

/// The FORGE release that applies function files (recorded with each, compared with the
/// release that applied what the database has).
const FORGE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `sources` (deduplicated, in version order) as a migrator set up the way a node runs it:
/// schema `forge` created under sqlx's migration lock, bookkeeping in [`MIGRATIONS_TABLE`].
pub fn migrator(sources: &[MigrationSource]) -> Migrator {
    let mut sources = sources.to_vec();
    sources.sort_by_key(|(version, _, _)| *version);
    sources.dedup_by_key(|(version, _, _)| *version);
    let migrations = sources
        .iter()
        .map(|(version, description, sql)| {
            Migration::new(
                *version,
                Cow::Borrowed(*description),
                MigrationType::Simple,
                sql.into_sql_str(),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.create_schema("forge");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// How long one statement of a FORGE migration waits for a lock before the migration is rolled
/// back and tried again ([`apply_schema`]). An `ALTER TABLE` asks for an ACCESS EXCLUSIVE lock,
/// and every later statement on that table - every claim of every node, for `forge.jobs` -
/// queues behind the request: waiting without a bound behind one long transaction (a frozen
/// node inside a claim, an operator's open psql session) would stop the cluster's jobs for as
/// long as that transaction lasts. Bounded, they wait at most this long per attempt.
pub const MIGRATION_LOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// How long [`apply_schema`] goes on trying a migration whose locks it cannot take (pausing
/// between attempts: 1 s, doubling up to 10 s) before it gives up with what to do.
pub const MIGRATION_LOCK_PATIENCE: Duration = Duration::from_secs(300);

/// Brings FORGE's schema up to date, as a node does at start: refuses a database migrated by
/// another line of migrations ([`check_history`]), applies the pending migrations (several
/// processes doing it at once serialize on sqlx's migration lock, which this one waits for
/// without a bound), then the function files ([`apply_functions`]). Returns the names of the
/// function files it applied.
///
/// Each migration's statements wait at most [`MIGRATION_LOCK_TIMEOUT`] for a lock: a migration
/// that cannot take one is rolled back whole (each runs in its own transaction), and tried again
/// after a pause, for up to [`MIGRATION_LOCK_PATIENCE`]; each failed attempt is logged with the
/// sessions that hold locks on FORGE's tables. Then the error says which migration, which
/// sessions, and what to do; nothing was half applied.
pub async fn apply_schema(
    conn: &mut PgConnection,
    migrations: &[MigrationSource],
    functions: &[FunctionSource],
) -> Result<Vec<&'static str>> {
    let mut migrator = migrator(migrations);
    check_history(conn, &migrator).await?;
    // sqlx's migration lock, taken here, before the lock timeout: another process applying
    // these migrations holds it for as long as they take, and nothing else queues behind it.
    conn.lock().await?;
    migrator.set_locking(false);
    let applied = apply_migrations_bounded(conn, &migrator).await;
    let unlocked = conn.unlock().await;
    applied?;
    unlocked?;
    apply_functions(conn, functions).await
}

/// Runs `migrator` (its lock already held) with [`MIGRATION_LOCK_TIMEOUT`] on the session,
/// again after a pause each time a migration could not take a lock in time, for up to
/// [`MIGRATION_LOCK_PATIENCE`].
async fn apply_migrations_bounded(conn: &mut PgConnection, migrator: &Migrator) -> Result<()> {
    let set = format!("SET lock_timeout = {}", MIGRATION_LOCK_TIMEOUT.as_millis());
    sqlx::raw_sql(sqlx::AssertSqlSafe(set))
        .execute(&mut *conn)
        .await?;
    let began = Instant::now();
    let mut pause = Duration::from_secs(1);
    let result = loop {
        // run_direct rather than run: `run` is generic over Acquire, which makes the future
        // non-Send for higher-ranked lifetimes, and Node::start must be spawnable.
        match migrator.run_direct(None, conn, false).await {
            Err(MigrateError::ExecuteMigration(err, version)) if is_lock_timeout(&err) => {
                let holders = lock_holders(conn).await;
                if began.elapsed() + pause > MIGRATION_LOCK_PATIENCE {
                    break Err(Error::Schema {
                        message: format!(
                            "FORGE's migration {version} could not take the locks it needs: for {} s every attempt waited over {} ms behind other sessions' transactions ({holders}). End them (SELECT pg_terminate_backend(pid)) or start this node again when they have finished; no migration was half applied",
                            MIGRATION_LOCK_PATIENCE.as_secs(),
                            MIGRATION_LOCK_TIMEOUT.as_millis()
                        ),
                        source: Some(err),
                    });
                }
                warn!(target: "forge::node", version, holders = %holders, retry_in = ?pause,
                      "a FORGE migration waited over its lock timeout behind other sessions' transactions: rolled back, trying again (claims queued behind it waited at most that long)");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
            }
            other => break other.map_err(Error::from),
        }
    };
    // The session's own setting again (the same connection goes on to apply the application's
    // migrations, whose waits are the application's to bound).
    let reset = sqlx::raw_sql("RESET lock_timeout")
        .execute(&mut *conn)
        .await;
    result?;
    reset?;
    Ok(())
}

fn is_lock_timeout(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}

/// The other sessions holding locks on FORGE's tables in transactions older than the lock
/// timeout, for the log and the error ("none seen" when they ended meanwhile).
async fn lock_holders(conn: &mut PgConnection) -> String {
    let holders: std::result::Result<Option<String>, sqlx::Error> = sqlx::query_scalar(
        "SELECT string_agg(DISTINCT format('pid %s %s, %s since %s', a.pid,
                                           coalesce(nullif(a.application_name, ''), a.usename),
                                           a.state, to_char(a.xact_start, 'HH24:MI:SS')), '; ')
           FROM pg_locks l
           JOIN pg_stat_activity a ON a.pid = l.pid
           JOIN pg_class c ON c.oid = l.relation
          WHERE l.granted AND l.locktype = 'relation' AND l.pid <> pg_backend_pid()
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND c.relnamespace = 'forge'::regnamespace
            AND a.xact_start < clock_timestamp() - $1 * interval '1 millisecond'",
    )
    .bind(MIGRATION_LOCK_TIMEOUT.as_millis() as f64)
    .fetch_one(&mut *conn)
    .await;
    match holders {
        Ok(Some(holders)) => holders,
        Ok(None) => "none seen: they ended meanwhile".to_owned(),
        Err(err) => format!("not read: {err}"),
    }
}

/// Refuses a database whose FORGE migrations are another line than `migrator`'s: one of them
/// was applied under the same version with another name. That is a database made by a
/// development build from before FORGE squashed its migrations into one baseline (0.x), which
/// cannot be upgraded in place; sqlx would only say that a migration's checksum changed.
pub async fn check_history(conn: &mut PgConnection, migrator: &Migrator) -> Result<()> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(MIGRATIONS_TABLE)
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(());
    }
    let applied: Vec<(i64, String)> =
        sqlx::query_as("SELECT version, description FROM forge._sqlx_migrations ORDER BY version")
            .fetch_all(&mut *conn)
            .await?;
    let ours: BTreeMap<i64, &str> = migrator
        .iter()
        .map(|m| (m.version, m.description.as_ref()))
        .collect();
    let Some((version, theirs, ours)) = applied.iter().find_map(|(version, description)| {
        ours.get(version)
            .filter(|ours| **ours != description.as_str())
            .map(|ours| (*version, description, *ours))
    }) else {
        return Ok(());
    };
    Err(Error::Schema {
        message: format!(
            "FORGE's schema in this database was made by a development build of FORGE from \
             before its migrations were squashed into one baseline (it has migration \
             {version:04}_{theirs} where this build has {version:04}_{ours}), and cannot be \
             upgraded in place. Recreate it: `DROP SCHEMA forge CASCADE` deletes FORGE's \
             tables (leadership, history, membership, the cron ledger, jobs; not your own), \
             then start a node or run `forge migrate up`"
        ),
        source: None,
    })
}

/// Where one function file stands in a database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FunctionState {
    /// Applied, with the same SQL.
    Applied,
    /// Never applied: the next node start (or `forge migrate up`) applies it.
    Pending,
    /// Applied with other SQL, by this FORGE release or an older one: the next node start (or
    /// `forge migrate up`) applies it again.
    Changed,
    /// Applied with other SQL by a newer FORGE release: left as it is (a newer body stays
    /// compatible with older callers).
    Newer,
    /// Applied, but unknown to this binary (applied by a newer release).
    Unknown,
}

impl FunctionState {
    /// Whether applying the schema would apply this file.
    pub fn is_due(self) -> bool {
        matches!(self, FunctionState::Pending | FunctionState::Changed)
    }
}

/// One function file and its state in a database.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FunctionStatus {
    /// The function's name (its file is `migrations/functions/<name>.sql`).
    pub name: String,
    /// Where it stands.
    pub state: FunctionState,
    /// When it was applied.
    pub applied_at: Option<DateTime<Utc>>,
    /// The FORGE release that applied it.
    pub forge_version: Option<String>,
    /// Its SQL (empty for [`FunctionState::Unknown`]).
    #[serde(skip)]
    pub sql: String,
}

/// What the database recorded of one function file.
struct Recorded {
    name: String,
    checksum: Vec<u8>,
    forge_version: String,
    applied_at: DateTime<Utc>,
}

/// The state of each function file in the database (sorted by name, duplicates dropped),
/// followed by the applied ones it does not know. Reads only.
pub async fn function_status(
    conn: &mut PgConnection,
    functions: &[FunctionSource],
) -> Result<Vec<FunctionStatus>> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(FUNCTIONS_TABLE)
        .fetch_one(&mut *conn)
        .await?;
    let recorded: Vec<(String, Vec<u8>, String, DateTime<Utc>)> = if exists {
        sqlx::query_as(
            "SELECT name, checksum, forge_version, applied_at FROM forge.schema_functions",
        )
        .fetch_all(&mut *conn)
        .await?
    } else {
        Vec::new()
    };
    let recorded = recorded
        .into_iter()
        .map(|(name, checksum, forge_version, applied_at)| Recorded {
            name,
            checksum,
            forge_version,
            applied_at,
        })
        .collect();
    Ok(states(functions, recorded, FORGE_VERSION))
}

fn states(
    functions: &[FunctionSource],
    recorded: Vec<Recorded>,
    version: &str,
) -> Vec<FunctionStatus> {
    let mut recorded: BTreeMap<String, Recorded> =
        recorded.into_iter().map(|r| (r.name.clone(), r)).collect();
    let files: BTreeMap<&str, &str> = functions.iter().copied().collect();
    let mut out: Vec<FunctionStatus> = files
        .into_iter()
        .map(|(name, sql)| {
            let row = recorded.remove(name);
            let state = match &row {
                None => FunctionState::Pending,
                Some(r) if r.checksum == checksum(sql) => FunctionState::Applied,
                Some(r) if release(&r.forge_version) > release(version) => FunctionState::Newer,
                Some(_) => FunctionState::Changed,
            };
            FunctionStatus {
                name: name.to_owned(),
                state,
                applied_at: row.as_ref().map(|r| r.applied_at),
                forge_version: row.map(|r| r.forge_version),
                sql: sql.to_owned(),
            }
        })
        .collect();
    out.extend(recorded.into_values().map(|r| FunctionStatus {
        name: r.name,
        state: FunctionState::Unknown,
        applied_at: Some(r.applied_at),
        forge_version: Some(r.forge_version),
        sql: String::new(),
    }));
    out
}

/// The SHA-256 of a function file's SQL, as recorded in [`FUNCTIONS_TABLE`].
fn checksum(sql: &str) -> Vec<u8> {
    Sha256::digest(sql.as_bytes()).to_vec()
}

/// A release's `major.minor.patch`, for ordering releases (a part that is no number counts as
/// 0; pre-release and build suffixes are ignored, so builds of one version are equals).
fn release(version: &str) -> [u64; 3] {
    let core = version.split(['-', '+']).next().unwrap_or_default();
    let mut parts = core.split('.').map(|p| p.parse().unwrap_or(0));
    [(); 3].map(|()| parts.next().unwrap_or(0))
}

/// Taken, in the transaction that applies function files, by every process that applies them
/// (a two-int key: another key space than the roles' and nodes' bigint keys).
const FUNCTIONS_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('forge.schema_functions'), 0)";

/// Records function file `$1` as applied with checksum `$2` by release `$3`. A file recorded with
/// the same checksum keeps its row as it is (when it was applied, by which release).
const RECORD_FUNCTION: &str = "INSERT INTO forge.schema_functions (name, checksum, forge_version)
     VALUES ($1, $2, $3)
     ON CONFLICT (name) DO UPDATE
        SET checksum = EXCLUDED.checksum, forge_version = EXCLUDED.forge_version,
            applied_at = clock_timestamp()
      WHERE schema_functions.checksum IS DISTINCT FROM EXCLUDED.checksum";

/// Applies the function files whose state is due ([`FunctionState::is_due`]) in one
/// transaction, under an advisory lock of its own (several processes doing it at once apply
/// each file once), with `check_function_bodies = off`, and records them in
/// [`FUNCTIONS_TABLE`]. Returns the names of the files applied (none when every file is
/// current: then it takes no lock).
pub async fn apply_functions(
    conn: &mut PgConnection,
    functions: &[FunctionSource],
) -> Result<Vec<&'static str>> {
    let due = |status: Vec<FunctionStatus>| -> Vec<FunctionSource> {
        let due: Vec<String> = status
            .into_iter()
            .filter(|s| s.state.is_due())
            .map(|s| s.name)
            .collect();
        let mut files: Vec<FunctionSource> = functions
            .iter()
            .copied()
            .filter(|(name, _)| due.iter().any(|d| d == name))
            .collect();
        files.sort();
        files.dedup_by_key(|(name, _)| *name);
        files
    };
    if due(function_status(conn, functions).await?).is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = conn.begin().await?;
    sqlx::query(FUNCTIONS_LOCK).execute(&mut *tx).await?;
    sqlx::query("SET LOCAL check_function_bodies = off")
        .execute(&mut *tx)
        .await?;
    // Again under the lock: another process may have applied them meanwhile.
    let files = due(function_status(&mut tx, functions).await?);
    for (name, sql) in &files {
        sqlx::raw_sql(*sql)
            .execute(&mut *tx)
            .await
            .map_err(|err| Error::Schema {
                message: format!(
                    "applying FORGE's function file migrations/functions/{name}.sql failed: {err}"
                ),
                source: Some(err),
            })?;
        sqlx::query(RECORD_FUNCTION)
            .bind(name)
            .bind(checksum(sql))
            .bind(FORGE_VERSION)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(files.into_iter().map(|(name, _)| name).collect())
}

/// FORGE's schema as one SQL script, for a database migrated by another tool (Flyway, goose,
/// sqitch, Rails, psql): what [`apply_schema`] does to a database, written out. Schema
/// `forge` and sqlx's bookkeeping table [`MIGRATIONS_TABLE`] (created if missing), each numbered
/// migration after `after` (all of them when `None`) followed by its row in that table, with
/// sqlx's checksum; then every function file (idempotent: `CREATE OR REPLACE`), with
/// `check_function_bodies = off`, under the lock nodes take to apply them, each followed by its
/// row in [`FUNCTIONS_TABLE`]. A database brought up to date by it is one that nodes started
/// with `[database] migrate = false` accept.
///
/// Unlike [`apply_schema`], the script does not look at the database: it applies the migrations
/// after `after` whether or not they are there (give the last version the database has), and
/// it replaces a function that a newer release applied (apply the script of the newest release
/// that runs). It holds no transaction statement, so that a tool that runs it in its own
/// transaction can: apply it in one (`psql --single-transaction`).
///
/// # Errors
///
/// [`Error::InvalidInput`] when `after` is negative or later than the last migration.
pub fn schema_script(
    migrations: &[MigrationSource],
    functions: &[FunctionSource],
    after: Option<i64>,
) -> Result<String> {
    let migrator = migrator(migrations);
    let versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
    let (first, last) = (
        versions.first().copied().unwrap_or(0),
        versions.last().copied().unwrap_or(0),
    );
    if let Some(after) = after.filter(|after| !(0..=last).contains(after)) {
        return Err(Error::InvalidInput {
            message: format!(
                "there is no FORGE migration {after:04} to print the schema after: this release's \
                 migrations are {first:04} to {last:04} (a database with a later one was migrated \
                 by a newer FORGE: print its SQL with that release's CLI)"
            ),
        });
    }
    let after = after.unwrap_or(0);
    let mut functions = functions.to_vec();
    functions.sort();
    functions.dedup_by_key(|(name, _)| *name);

    let applied: Vec<i64> = versions.into_iter().filter(|v| *v > after).collect();
    let applies = match applied.as_slice() {
        [] => format!("no migration (this release's last is {last:04})"),
        [only] => format!("migration {only:04}"),
        [from, .., to] => format!("migrations {from:04} to {to:04}"),
    };
    let mut out = format!(
        "-- FORGE {FORGE_VERSION}'s schema: {applies}, then all {} function files,
-- each recorded as `forge migrate up` records it. Apply it once, in one transaction
-- (psql --single-transaction -v ON_ERROR_STOP=1 -f FILE), while no node with
-- [database] migrate = true starts; then nodes with migrate = false start on it.
-- The next release's SQL for this database: `forge migrate sql --after {last}`.

CREATE SCHEMA IF NOT EXISTS forge;
{}
",
        functions.len(),
        // sqlx's own table, as its `Migrate::ensure_migrations_table` creates it.
        format_args!(
            "CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
    success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
);"
        )
    );
    for migration in migrator.iter().filter(|m| m.version > after) {
        // Recorded as sqlx records it. -1: how long it took is not measured (sqlx's value
        // until it has timed the migration's transaction).
        out.push_str(&format!(
            "
-- migrations/{version:04}_{description}.sql
{sql}
INSERT INTO {MIGRATIONS_TABLE} (version, description, success, checksum, execution_time)
    VALUES ({version}, {literal}, TRUE, {checksum}, -1);
",
            version = migration.version,
            description = migration.description,
            sql = terminated(migration.sql.as_str()),
            literal = literal(&migration.description),
            checksum = bytea(&migration.checksum),
        ));
    }
    out.push_str(&format!(
        "
-- The function files, each followed by its row: a file already recorded with the same
-- SQL keeps its row.
{FUNCTIONS_LOCK};
SET check_function_bodies = off;
"
    ));
    for (name, sql) in &functions {
        let record = RECORD_FUNCTION
            .replace("$1", &literal(name))
            .replace("$2", &bytea(&checksum(sql)))
            .replace("$3", &literal(FORGE_VERSION));
        out.push_str(&format!(
            "
-- migrations/functions/{name}.sql
{sql}
{record};
",
            sql = terminated(sql)
        ));
    }
    out.push_str("\nRESET check_function_bodies;\n");
    Ok(out)
}

/// `sql` without its trailing blank lines, ending with a semicolon that separates it from the
/// statement the script writes after it: on a line of its own when the file's last line ends
/// with none or may be a comment (an empty statement at worst).
fn terminated(sql: &str) -> Cow<'_, str> {
    let sql = sql.trim_end();
    let last_line = sql.lines().last().unwrap_or_default();
    if last_line.ends_with(';') && !last_line.contains("--") {
        Cow::Borrowed(sql)
    } else {
        Cow::Owned(format!("{sql}\n;"))
    }
}

/// `text` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `bytes` as an SQL `bytea` value.
fn bytea(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("decode('{hex}', 'hex')")
}

/// Checks that every FORGE migration is applied and every function file current (for nodes
/// started with `migrate = false`).
pub(crate) async fn check_schema(
    conn: &mut PgConnection,
    migrations: &[MigrationSource],
    functions: &[FunctionSource],
) -> Result<()> {
    check_history(conn, &migrator(migrations)).await?;
    let applied: Vec<i64> = sqlx::query_scalar(
        "SELECT version FROM forge._sqlx_migrations WHERE success
          UNION ALL SELECT -1 WHERE to_regclass('forge._sqlx_migrations') IS NULL",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_default();
    let missing: Vec<String> = migrations
        .iter()
        .filter(|(version, _, _)| !applied.contains(version))
        .map(|(version, description, _)| format!("{version:04}_{description}"))
        .collect();
    let stale: Vec<String> = function_status(conn, functions)
        .await?
        .into_iter()
        .filter(|s| s.state.is_due())
        .map(|s| match s.state {
            FunctionState::Changed => format!("{} (changed)", s.name),
            _ => s.name,
        })
        .collect();
    let mut lacks = Vec::new();
    if !missing.is_empty() {
        lacks.push(format!("migrations {}", missing.join(", ")));
    }
    if !stale.is_empty() {
        lacks.push(format!(
            "the current definitions of functions {}",
            stale.join(", ")
        ));
    }
    if lacks.is_empty() {
        return Ok(());
    }
    Err(Error::Config {
        path: None,
        line: None,
        key: "database.migrate".into(),
        message: format!(
            "FORGE's schema in this database is missing {}: set [database] migrate = true for one start, or run `forge migrate up`",
            lacks.join(" and ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(name: &str, sql: &str, version: &str) -> Recorded {
        Recorded {
            name: name.to_owned(),
            checksum: checksum(sql),
            forge_version: version.to_owned(),
            applied_at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_file_is_due_when_new_or_changed_by_this_or_an_older_release() {
        let files = [
            ("same", "a"),
            ("new", "b"),
            ("edited", "c2"),
            ("older", "d2"),
            ("newer", "e1"),
        ];
        let db = vec![
            recorded("same", "a", "1.2.0"),
            recorded("edited", "c1", "1.2.0"),
            recorded("older", "d1", "1.1.9"),
            recorded("newer", "e2", "1.10.0"),
            recorded("gone", "f", "1.3.0"),
        ];
        let states: Vec<(String, FunctionState)> = states(&files, db, "1.2.0")
            .into_iter()
            .map(|s| (s.name, s.state))
            .collect();
        let expect = [
            ("edited", FunctionState::Changed),
            ("new", FunctionState::Pending),
            ("newer", FunctionState::Newer),
            ("older", FunctionState::Changed),
            ("same", FunctionState::Applied),
            ("gone", FunctionState::Unknown),
        ];
        let expect: Vec<(String, FunctionState)> =
            expect.iter().map(|(n, s)| (n.to_string(), *s)).collect();
        assert_eq!(states, expect);
    }

    #[test]
    fn the_script_applies_the_migrations_after_the_one_given_and_every_function_file() {
        let migrations = [
            (1, "one", "CREATE TABLE forge.a ();"),
            (2, "it's", "SELECT 1 -- no ;"),
        ];
        let functions = [("f", "CREATE OR REPLACE FUNCTION forge.f() ...;\n\n")];
        let all = schema_script(&migrations, &functions, None).unwrap();
        assert!(all.contains("CREATE TABLE forge.a ();\nINSERT INTO forge._sqlx_migrations"));
        // A file whose last statement has no semicolon of its own gets one.
        assert!(all.contains("SELECT 1 -- no ;\n;\nINSERT INTO forge._sqlx_migrations"));
        assert!(all.contains("VALUES (2, 'it''s', TRUE, decode('"), "{all}");
        let after = schema_script(&migrations, &functions, Some(1)).unwrap();
        assert!(
            !after.contains("forge.a") && after.contains("VALUES (2, "),
            "{after}"
        );
        let none = schema_script(&migrations, &functions, Some(2)).unwrap();
        assert!(
            !none.contains("INSERT INTO forge._sqlx_migrations"),
            "{none}"
        );
        assert!(none.contains(
            "CREATE OR REPLACE FUNCTION forge.f() ...;\nINSERT INTO forge.schema_functions"
        ));
        for bad in [-1, 3] {
            let err = schema_script(&migrations, &functions, Some(bad)).unwrap_err();
            assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
            assert!(err.to_string().contains("0001 to 0002"), "{err}");
        }
    }

    #[test]
    fn releases_order_by_number_not_text() {
        assert!(release("1.10.0") > release("1.9.3"));
        assert!(release("2.0.0") > release("1.99.99"));
        assert_eq!(release("1.2.0-rc.1"), release("1.2.0"));
        assert_eq!(release("1.2"), [1, 2, 0]);
        assert_eq!(release("x"), [0, 0, 0]);
    }
}
