//! FORGE's schema: the function files applied after the migrations (once, again when changed,
//! never over a newer release's), what a node with `migrate = false` says of stale functions,
//! a database made before the pre-1.0 squash refused with what to do, and a migration behind a
//! long transaction holding up the table's other queries at most its lock timeout.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use forge::migrate::{FunctionState, TABLE};
use forge::{Error, Node};
use forge_testkit::wait_until;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Connection, PgConnection, SqlSafeStr};

use crate::support::*;

/// The state of one function file.
async fn state_of(conn: &mut PgConnection, name: &str) -> FunctionState {
    forge::migrate::function_status(conn)
        .await
        .unwrap()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap()
        .state
}

/// Starts a node on `url` (nothing registered) with `[database] migrate` as given.
async fn start(url: &str, id: &str, migrate: bool) -> forge::Result<Node> {
    let mut config = config(url, id);
    config.database.migrate = migrate;
    Node::builder(config).auto_register(false).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_files_apply_once_again_when_changed_and_never_over_a_newer_release() {
    let db = fresh_db().await;
    let files: BTreeSet<&str> = forge::migrate::functions()
        .into_iter()
        .map(|(name, _)| name)
        .collect();

    // Three processes at once: each file is applied by one of them.
    let ups = (0..3).map(|_| {
        let url = db.url().to_owned();
        tokio::spawn(async move {
            let mut conn = PgConnection::connect(&url).await.unwrap();
            forge::migrate::up(&mut conn).await.unwrap()
        })
    });
    let mut applied = Vec::new();
    for up in ups {
        applied.extend(up.await.unwrap());
    }
    applied.sort();
    assert_eq!(applied, files.iter().copied().collect::<Vec<_>>());

    let mut conn = db.connect().await.unwrap();
    let status = forge::migrate::function_status(&mut conn).await.unwrap();
    assert!(
        status.iter().all(|f| f.state == FunctionState::Applied),
        "{status:?}"
    );
    assert_eq!(
        forge::migrate::up(&mut conn).await.unwrap(),
        Vec::<&str>::new()
    );

    // The database has exactly one function per file, and each body compiles.
    let defined: Vec<(String, i64)> = sqlx::query_as(
        "SELECT proname::text, count(*) FROM pg_proc
          WHERE pronamespace = 'forge'::regnamespace GROUP BY proname ORDER BY proname",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        defined,
        files.iter().map(|f| (f.to_string(), 1)).collect::<Vec<_>>()
    );
    let functions: Vec<(i64, String)> = sqlx::query_as(
        "SELECT p.oid::bigint, l.lanname::text FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
          WHERE p.pronamespace = 'forge'::regnamespace",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    for (oid, language) in functions {
        let validator = match language.as_str() {
            "plpgsql" => "SELECT plpgsql_validator($1::bigint::oid)",
            _ => "SELECT fmgr_sql_validator($1::bigint::oid)",
        };
        sqlx::query(validator)
            .bind(oid)
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("function {oid} ({language}): {e}"));
    }

    // A function whose file changed (here: the database's body did) is applied again; until
    // then a node with migrations off names it.
    sqlx::raw_sql(
        "CREATE OR REPLACE FUNCTION forge.tx_marked(p_mark text) RETURNS boolean
         LANGUAGE sql STABLE AS $$ SELECT false $$;
         UPDATE forge.schema_functions SET checksum = '\\x00' WHERE name = 'tx_marked';",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        state_of(&mut conn, "tx_marked").await,
        FunctionState::Changed
    );
    let err = start(db.url(), "stale", false).await.err().unwrap();
    assert!(matches!(err, Error::Config { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("tx_marked (changed)"), "{message}");
    assert!(message.contains("forge migrate up"), "{message}");
    assert_eq!(forge::migrate::up(&mut conn).await.unwrap(), ["tx_marked"]);
    let body: String = sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE proname = 'tx_marked'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(body.contains("position("), "{body}");
    start(db.url(), "current", false)
        .await
        .expect("a node with migrations off finds the schema current")
        .shutdown()
        .await;

    // Applied with other SQL by a newer release: kept, by a node and by `forge migrate up`.
    sqlx::query(
        "UPDATE forge.schema_functions SET checksum = '\\x00', forge_version = '999.0.0'
          WHERE name = 'tx_marked'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(state_of(&mut conn, "tx_marked").await, FunctionState::Newer);
    assert_eq!(
        forge::migrate::up(&mut conn).await.unwrap(),
        Vec::<&str>::new()
    );
    start(db.url(), "older", false)
        .await
        .expect("a newer release's function is no stale one")
        .shutdown()
        .await;
    start(db.url(), "older-migrating", true)
        .await
        .expect("a node leaves a newer release's function as it is")
        .shutdown()
        .await;
    assert_eq!(state_of(&mut conn, "tx_marked").await, FunctionState::Newer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_made_before_the_squash_is_refused_with_what_to_do() {
    let db = fresh_db().await;
    let mut conn = db.connect().await.unwrap();
    // The bookkeeping of a development build from before the squash: its first migration was
    // 0001_leaders.
    let mut old = Migrator::with_migrations(vec![Migration::new(
        1,
        Cow::Borrowed("leaders"),
        MigrationType::Simple,
        "CREATE TABLE forge.leaders (namespace text)".into_sql_str(),
        false,
    )]);
    old.create_schema("forge");
    old.dangerous_set_table_name(TABLE);
    old.run_direct(None, &mut conn, false).await.unwrap();

    for migrate in [true, false] {
        let err = start(db.url(), "n", migrate).await.err().unwrap();
        assert!(matches!(err, Error::Schema { .. }), "{err}");
        let message = err.to_string();
        for says in [
            "0001_leaders",
            "0001_core",
            "squashed",
            "DROP SCHEMA forge CASCADE",
        ] {
            assert!(message.contains(says), "{message}");
        }
    }
    let err = forge::migrate::status(&mut conn, &forge::migrate::migrator(), TABLE)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("DROP SCHEMA forge CASCADE"),
        "{err}"
    );

    // Doing what it says works.
    sqlx::raw_sql("DROP SCHEMA forge CASCADE")
        .execute(&mut conn)
        .await
        .unwrap();
    start(db.url(), "n", true)
        .await
        .expect("a node starts on the recreated schema")
        .shutdown()
        .await;
}

/// A migration that cannot take its lock waits at most `MIGRATION_LOCK_TIMEOUT` per attempt,
/// so the statements queued behind its lock request (every claim of every node, when it alters
/// `forge.jobs`) wait no longer than that; it is rolled back, tried again, and applied once the
/// lock's holder is done. (A migration of FORGE's own list, appended here, altering a table the
/// test holds: a long transaction of an operator, or of a node frozen inside a claim.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_behind_a_long_transaction_holds_up_the_tables_queries_at_most_its_lock_timeout()
 {
    let db = fresh_db().await;
    let mut conn = db.connect().await.unwrap();
    forge::migrate::up(&mut conn).await.unwrap();
    sqlx::raw_sql("CREATE TABLE forge.lock_probe (x integer)")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut sources = forge::migrate::sources();
    let probe = sources.last().unwrap().0 + 1;
    sources.push((
        probe,
        "lock_probe",
        "ALTER TABLE forge.lock_probe ADD COLUMN y integer",
    ));

    // The long transaction: it holds the table while the migration asks for it.
    let mut holder = db.connect().await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE forge.lock_probe IN ROW EXCLUSIVE MODE")
        .execute(&mut holder)
        .await
        .unwrap();
    let url = db.url().to_owned();
    let migrating = tokio::spawn(async move {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        forge_core::apply_schema(&mut conn, &sources, &forge::migrate::functions()).await
    });
    wait_until(
        "the migration waiting for its lock on forge.lock_probe",
        SOON,
        Duration::from_millis(5),
        || {
            let probe_conn = db.connect();
            async move {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks
                      WHERE NOT granted AND relation = 'forge.lock_probe'::regclass",
                )
                .fetch_one(&mut probe_conn.await.ok()?)
                .await
                .ok()?;
                (waiting > 0).then_some(())
            }
        },
    )
    .await
    .unwrap();

    // A reader that comes after the migration's request: without the bound it would wait
    // behind that request for as long as the holder's transaction lasts (its own timeout,
    // 20 s, would end it).
    let mut reader = db.connect().await.unwrap();
    sqlx::raw_sql("SET statement_timeout = '20s'")
        .execute(&mut reader)
        .await
        .unwrap();
    let began = Instant::now();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.lock_probe")
        .fetch_one(&mut reader)
        .await
        .expect("a read behind a waiting migration is held up at most its lock timeout");
    assert_eq!(rows, 0);
    let waited = began.elapsed();
    assert!(
        !migrating.is_finished(),
        "the migration cannot have been applied while the table is held"
    );

    // The holder's transaction ends: the migration's next attempt is applied.
    sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    migrating
        .await
        .unwrap()
        .expect("the migration is applied once the lock is free");
    let applied: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM forge._sqlx_migrations WHERE version = $1)
            AND EXISTS (SELECT 1 FROM information_schema.columns
                         WHERE table_schema = 'forge' AND table_name = 'lock_probe'
                           AND column_name = 'y')",
    )
    .bind(probe)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(applied, "the migration is recorded and its column is there");
    println!("a read behind the waiting migration waited {waited:?}");
}
