//! FORGE's schema outside a node: exactly what a node applies at start - the numbered
//! migrations (schema `forge`, bookkeeping in [`TABLE`]), then the function files whose SQL
//! changed (bookkeeping in [`FUNCTIONS_TABLE`]) - for tools and deploy pipelines that check or
//! apply them first (`forge migrate status`, `forge migrate up`), or that migrate with a tool
//! of their own and take FORGE's SQL as a script ([`script`], `forge migrate sql`).
//!
//! ```no_run
//! # async fn demo(conn: &mut forge::sqlx::PgConnection) -> forge::Result<()> {
//! let migrator = forge::migrate::migrator();
//! let pending = forge::migrate::status(conn, &migrator, forge::migrate::TABLE)
//!     .await?
//!     .into_iter()
//!     .filter(|m| m.state == forge::migrate::MigrationState::Pending)
//!     .count();
//! let due = forge::migrate::function_status(conn)
//!     .await?
//!     .into_iter()
//!     .filter(|f| f.state.is_due())
//!     .count();
//! if pending + due > 0 {
//!     forge::migrate::up(conn).await?;
//! }
//! # Ok(()) }
//! ```

pub use forge_core::{
    FUNCTIONS_TABLE, FunctionState, FunctionStatus, MIGRATION_LOCK_PATIENCE,
    MIGRATION_LOCK_TIMEOUT, MigrationState, MigrationStatus,
};
use forge_core::{FunctionSource, MigrationSource, Result};
use sqlx::PgConnection;
use sqlx::migrate::Migrator;

/// The table FORGE records its own migrations in (the application's stay in
/// [`APP_TABLE`]).
pub const TABLE: &str = forge_core::MIGRATIONS_TABLE;

/// The table sqlx records the application's migrations in (`NodeBuilder::migrations`).
pub const APP_TABLE: &str = forge_core::APP_MIGRATIONS_TABLE;

// `MIGRATION_FILES` and `FUNCTION_FILES`: the files of `migrations/`, listed by build.rs.
include!(concat!(env!("OUT_DIR"), "/schema.rs"));

/// FORGE's whole schema, as every node applies it: the numbered migrations of `migrations/`
/// (tables, indexes) and the function files of `migrations/functions/`, embedded when `forge`
/// is built. The folder is the list: build.rs refuses a file that breaks its rules.
pub const SCHEMA: forge_core::Schema = forge_core::Schema {
    migrations: MIGRATION_FILES,
    functions: FUNCTION_FILES,
};

/// Every migration a node applies, in version order.
pub fn sources() -> Vec<MigrationSource> {
    SCHEMA.migrations.to_vec()
}

/// Every function file a node applies, by name.
pub fn functions() -> Vec<FunctionSource> {
    SCHEMA.functions.to_vec()
}

/// FORGE's migrations as a migrator set up the way a node runs it: schema `forge` created
/// under sqlx's migration lock, bookkeeping in [`TABLE`].
pub fn migrator() -> Migrator {
    forge_core::migrator(&sources())
}

/// The state of each of `migrator`'s migrations in the database, by version, followed by the
/// applied ones it does not know. `table` is where they are recorded: [`TABLE`] for FORGE's,
/// [`APP_TABLE`] for the application's. Reads only. For FORGE's, a database migrated by a
/// development build from before FORGE's migrations were squashed is an error that says what
/// to do.
pub async fn status(
    conn: &mut PgConnection,
    migrator: &Migrator,
    table: &str,
) -> Result<Vec<MigrationStatus>> {
    forge_core::migration_status(conn, migrator, table).await
}

/// The state of each of FORGE's function files in the database, by name, followed by the
/// applied ones this binary does not know. Reads only.
pub async fn function_status(conn: &mut PgConnection) -> Result<Vec<FunctionStatus>> {
    forge_core::function_status(conn, &functions()).await
}

/// Applies `migrator`'s pending migrations (the application's: FORGE's are applied with
/// [`up`]): several processes doing it at once serialize on sqlx's migration lock, so each
/// migration is applied once.
pub async fn apply(conn: &mut PgConnection, migrator: &Migrator) -> Result<()> {
    migrator.run_direct(None, conn, false).await?;
    Ok(())
}

/// Brings FORGE's schema up to date exactly as a node does at start: its pending migrations
/// (serialized on sqlx's migration lock; each statement waits at most
/// [`MIGRATION_LOCK_TIMEOUT`] for a table lock, a migration that could not take one is rolled
/// back and tried again for up to [`MIGRATION_LOCK_PATIENCE`]), then, in one transaction under a lock of their own,
/// the function files whose state is due ([`FunctionState::is_due`]). Returns the names of the
/// function files applied.
pub async fn up(conn: &mut PgConnection) -> Result<Vec<&'static str>> {
    forge_core::apply_schema(conn, &sources(), &functions()).await
}

/// FORGE's schema as one SQL script for a migration tool of your own (Flyway, goose, sqitch,
/// Rails, psql), as `forge migrate sql` prints it: applied once, in one transaction, to a
/// database without FORGE's schema (`after: None`) or with its migrations up to `after`, it
/// leaves the schema and its bookkeeping as [`up`] would, so that nodes started with
/// `[database] migrate = false` accept the database. Schema `forge` and [`TABLE`] are created
/// if missing; each migration after `after` is followed by the row sqlx records for it (with
/// sqlx's checksum); every function file follows, idempotent, with `check_function_bodies =
/// off`, each followed by its row of [`FUNCTIONS_TABLE`].
///
/// An upgrade applies the next release's script with `after` set to the last migration the
/// previous one applied (the script's header names it). Unlike [`up`], the script cannot look
/// at the database: it applies every migration after `after`, and replaces a function that a
/// newer FORGE release applied, so apply the script of the newest release you run. It holds no
/// `BEGIN` or `COMMIT`, so that a tool that runs each migration in a transaction of its own
/// (Flyway, goose, Rails) can take it as it is; with psql, pass `--single-transaction`.
///
/// # Errors
///
/// [`Error::InvalidInput`](crate::Error::InvalidInput) when `after` is negative or later than
/// this release's last migration (the database was migrated by a newer FORGE).
///
/// ```
/// let everything = forge::migrate::script(None)?;
/// assert!(everything.contains("CREATE SCHEMA IF NOT EXISTS forge;"));
/// let last = forge::migrate::sources().last().map_or(0, |(version, _, _)| *version);
/// let functions_only = forge::migrate::script(Some(last))?;
/// assert!(functions_only.contains("SET check_function_bodies = off;"));
/// # Ok::<(), forge::Error>(())
/// ```
pub fn script(after: Option<i64>) -> Result<String> {
    forge_core::schema_script(SCHEMA.migrations, SCHEMA.functions, after)
}
