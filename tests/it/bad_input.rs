//! Bad input gets a clear error that says what is wrong and what to do, never a panic.

use std::time::Duration;

use forge::{Config, Error, Node, Role, RoleState};
use forge_testkit::{PgServer, TxPooler};
use sqlx::Connection;

use crate::support::*;

#[test]
fn a_broken_forge_toml_names_file_key_and_line() {
    let dir = ScratchDir::new("badtoml");
    let path = dir.0.join("forge.toml");
    std::fs::write(
        &path,
        "[cluster.leader_election]\nlease_duration = \"15s\"\nrefresh_interval = \"often\"\n",
    )
    .unwrap();
    let message = Config::load(&path).unwrap_err().to_string();
    assert!(
        message.starts_with(&format!(
            "{}:3: `cluster.leader_election.refresh_interval`",
            path.display()
        )),
        "{message}"
    );
    assert!(message.contains("\"5s\""), "says what is valid: {message}");

    std::fs::write(&path, "[cluster.leader_election]\nlease = \"15s\"\n").unwrap();
    let message = Config::load(&path).unwrap_err().to_string();
    assert!(
        message.contains(":2:") && message.contains("unknown field `lease`"),
        "{message}"
    );

    std::fs::write(&path, "[database\nurl = 1\n").unwrap();
    let message = Config::load(&path).unwrap_err().to_string();
    assert!(message.contains(":1:"), "{message}");

    let message = Config::load(dir.0.join("missing.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("cannot read config file") && message.contains("missing.toml"),
        "{message}"
    );
}

async fn start_error(url: &str) -> String {
    let mut config = config(url, "bad");
    config.database.connect_timeout = Duration::from_secs(1);
    match Node::builder(config)
        .leader_task(
            Role::SCHEDULER,
            "idle",
            |l| async move { l.stopping().await },
        )
        .start()
        .await
    {
        Ok(_) => panic!("a node started with {url}"),
        Err(err) => err.to_string(),
    }
}

#[tokio::test]
async fn wrong_database_urls_fail_with_what_to_check() {
    // Nothing listens on port 1.
    let message = start_error("postgres://forge:secret@127.0.0.1:1/app").await;
    assert!(
        message.contains("cannot connect to PostgreSQL"),
        "{message}"
    );
    assert!(message.contains("127.0.0.1:1"), "{message}");
    assert!(message.contains("connection refused"), "{message}");
    assert!(
        !message.contains("secret"),
        "never print a password: {message}"
    );

    let server = PgServer::shared().unwrap();
    let message = start_error(&server.url_for("no_such_database_here")).await;
    assert!(
        message.contains("does not exist") && message.contains("createdb"),
        "{message}"
    );

    // An HTTP server where PostgreSQL should be: said at once, not retried.
    let (addr, http) = crate::cli::http_server().await;
    let message = start_error(&format!("postgres://forge:secret@{addr}/app")).await;
    assert!(
        message.contains("is not PostgreSQL")
            && message.contains("HTTP/1.1 400 Bad Request")
            && message.contains(&addr.to_string()),
        "{message}"
    );
    assert!(!message.contains("expected to read"), "{message}");
    assert!(!message.contains("secret"), "{message}");
    assert!(
        !message.contains("kept trying"),
        "a server that is not PostgreSQL is not waited for: {message}"
    );
    http.abort();

    let message = start_error("postgres://127.0.0.1:notaport/app").await;
    assert!(
        message.contains("database.url") && message.contains("cannot parse"),
        "{message}"
    );

    let mut config = Config::default();
    config.database.url = None;
    let message = Node::builder(config)
        .start()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(message.contains("DATABASE_URL"), "{message}");
}

#[tokio::test]
async fn an_unreachable_database_is_retried_then_reported() {
    // A private server that is down: the node keeps trying for connect_timeout, then says so.
    let server = PgServer::start().unwrap();
    let url = server.url();
    server.stop().unwrap();
    let mut config = config(&url, "patient");
    config.database.connect_timeout = Duration::from_secs(1);
    let started = std::time::Instant::now();
    let err = Node::builder(config).start().await.err().unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "it retried"
    );
    let message = err.to_string();
    assert!(message.contains("kept trying for"), "{message}");
    assert!(
        message.contains("is PostgreSQL running there?"),
        "{message}"
    );
}

#[tokio::test]
async fn a_transaction_pooler_is_refused() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let pooler = TxPooler::start(server, db.name(), 2).await.unwrap();
    let message = start_error(&pooler.url()).await;
    assert!(message.contains("transaction-mode pooler"), "{message}");
    assert!(
        message.contains("session advisory locks cannot work there"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_holder_of_a_role_key_is_reported_as_a_conflict() {
    let db = fresh_db().await;
    let key = Role::SCHEDULER.lock_key(&forge::LockNamespace::default()).0;
    let mut foreign =
        sqlx::PgConnection::connect(&format!("{}?application_name=billing-cron", db.url()))
            .await
            .unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut foreign)
        .await
        .unwrap();

    let node = start_node(db.url(), "a", &[Role::SCHEDULER]).await;
    let mut state = node.watch_role(&Role::SCHEDULER).unwrap();
    let conflict = tokio::time::timeout(
        SOON,
        state.wait_for(|s| matches!(s, RoleState::Conflict { .. })),
    )
    .await
    .expect("the conflict is reported")
    .unwrap()
    .clone();
    let RoleState::Conflict { message } = conflict else {
        unreachable!()
    };
    assert!(message.contains("not a FORGE node"), "{message}");
    assert!(message.contains("billing-cron"), "{message}");
    assert!(
        message.contains("lock_namespace"),
        "says what to do: {message}"
    );
    assert!(
        node.render_metrics()
            .contains("forge_leader_lock_conflicts_total{role=\"scheduler\"}")
    );

    // Once the other application lets go, the node leads.
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut foreign)
        .await
        .unwrap();
    tokio::time::timeout(SOON, state.wait_for(RoleState::is_leader))
        .await
        .unwrap()
        .unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn a_database_without_forge_tables_and_migrations_off_says_how_to_fix_it() {
    let db = fresh_db().await;
    let mut config = config(db.url(), "a");
    config.database.migrate = false;
    let err = Node::builder(config)
        .leader_task(
            Role::SCHEDULER,
            "idle",
            |l| async move { l.stopping().await },
        )
        .start()
        .await
        .err()
        .unwrap();
    assert!(matches!(err, Error::Config { .. }));
    assert!(err.to_string().contains("migrate = true"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_together_apply_migrations_once() {
    let db = fresh_db().await;
    let starts = (0..4).map(|i| {
        let url = db.url().to_owned();
        tokio::spawn(async move { start_node(&url, &format!("n{i}"), &[Role::SCHEDULER]).await })
    });
    let mut nodes = Vec::new();
    for start in starts {
        nodes.push(start.await.unwrap());
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    wait_single_leader(&refs, &Role::SCHEDULER).await;
    let pool = db.pool().await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM forge._sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(applied >= 1);
    for node in &nodes {
        node.shutdown().await;
    }
}
