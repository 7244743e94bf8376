//! Where each numbered migration stands in a database (FORGE's, or the application's): for
//! tools that check the schema before nodes start (`forge migrate status`, the doctor).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::migrate::Migrator;
use sqlx::{AssertSqlSafe, PgConnection};

use super::{MIGRATIONS_TABLE, check_history};
use crate::error::Result;

/// The table sqlx records the application's migrations in (`NodeBuilder::migrations`).
pub const APP_MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// Where one migration stands in a database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationState {
    /// Applied, with the same SQL.
    Applied,
    /// Not applied yet.
    Pending,
    /// Applied with different SQL: this binary and the database disagree.
    Changed,
    /// Started and failed: the database needs a human (sqlx calls it dirty).
    Failed,
    /// Applied, but unknown to this binary (applied by a newer version).
    Unknown,
}

/// One migration and its state in a database.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MigrationStatus {
    /// Its version.
    pub version: i64,
    /// Its description (the file name after the version).
    pub description: String,
    /// Where it stands.
    pub state: MigrationState,
    /// When it was applied.
    pub installed_on: Option<DateTime<Utc>>,
    /// Its SQL (empty for [`MigrationState::Unknown`]).
    #[serde(skip)]
    pub sql: String,
}

/// The state of each of `migrator`'s migrations in the database, by version, followed by the
/// applied ones it does not know. `table` is where they are recorded: [`MIGRATIONS_TABLE`] for
/// FORGE's, [`APP_MIGRATIONS_TABLE`] for the application's. Reads only. For FORGE's, a database
/// migrated by a development build from before FORGE's migrations were squashed is an error
/// that says what to do.
pub async fn migration_status(
    conn: &mut PgConnection,
    migrator: &Migrator,
    table: &str,
) -> Result<Vec<MigrationStatus>> {
    if table == MIGRATIONS_TABLE {
        check_history(conn, migrator).await?;
    }
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(&mut *conn)
        .await?;
    // version -> (description, installed_on, success, checksum)
    type Applied = (String, DateTime<Utc>, bool, Vec<u8>);
    let mut applied: BTreeMap<i64, Applied> = BTreeMap::new();
    if exists {
        /// A row of the migrations table.
        #[derive(sqlx::FromRow)]
        struct MigrationRow {
            version: i64,
            description: String,
            installed_on: DateTime<Utc>,
            success: bool,
            checksum: Vec<u8>,
        }
        let rows: Vec<MigrationRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT version, description, installed_on, success, checksum FROM {table}"
        )))
        .fetch_all(&mut *conn)
        .await?;
        for row in rows {
            let applied_as = (row.description, row.installed_on, row.success, row.checksum);
            applied.insert(row.version, applied_as);
        }
    }
    let mut out = Vec::new();
    for migration in migrator.iter() {
        if migration.migration_type.is_down_migration() {
            continue;
        }
        let (state, installed_on) = match applied.remove(&migration.version) {
            None => (MigrationState::Pending, None),
            Some((_, at, false, _)) => (MigrationState::Failed, Some(at)),
            Some((_, at, true, checksum)) if *checksum != *migration.checksum => {
                (MigrationState::Changed, Some(at))
            }
            Some((_, at, true, _)) => (MigrationState::Applied, Some(at)),
        };
        out.push(MigrationStatus {
            version: migration.version,
            description: migration.description.to_string(),
            state,
            installed_on,
            sql: migration.sql.as_str().to_owned(),
        });
    }
    for (version, (description, at, _, _)) in applied {
        out.push(MigrationStatus {
            version,
            description,
            state: MigrationState::Unknown,
            installed_on: Some(at),
            sql: String::new(),
        });
    }
    Ok(out)
}
