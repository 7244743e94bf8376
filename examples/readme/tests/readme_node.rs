//! The README's code runs as written, with nothing configured but `DATABASE_URL` and
//! `FORGE_NODE_ID`: two `forge-readme` processes (`src/main.rs`: the README's migrations, its
//! leader task on the role `billing`, its crons and its job on the queue `mailers`, each snippet
//! word for word) issue the invoice and run the welcome job each of them enqueues.

use std::path::Path;
use std::time::Duration;

use forge::sqlx;
use forge_testkit::{NodeProcess, PgServer, wait_until};
use tokio::process::Command;

/// Far more than a start, an election and a job take (milliseconds to a few seconds).
const PATIENCE: Duration = Duration::from_secs(30);

/// A `forge-readme` process with no environment but `DATABASE_URL` and `FORGE_NODE_ID`: no
/// forge.toml, no `FORGE_ROLES`, no `FORGE_QUEUES`.
async fn readme_node(url: &str, id: &str) -> NodeProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_forge-readme"));
    command
        .env_clear()
        .env("DATABASE_URL", url)
        .env("FORGE_NODE_ID", id);
    let mut node = NodeProcess::spawn(command).unwrap().named(id);
    node.wait_for_line("ready", PATIENCE, |line| line.starts_with("ready "))
        .await
        .unwrap();
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_leader_task_and_job_run_on_two_nodes_configured_by_the_environment_alone() {
    let db = PgServer::shared()
        .expect("PostgreSQL for tests")
        .create_database()
        .await
        .expect("a fresh database");
    let pool = db.pool().await.unwrap();
    // The README's tables (the nodes find them applied), and an invoice for the billing leader.
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    sqlx::migrate::Migrator::new(migrations)
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO invoices DEFAULT VALUES")
        .execute(&pool)
        .await
        .unwrap();

    let mut a = readme_node(db.url(), "a").await;
    let mut b = readme_node(db.url(), "b").await;
    wait_until(
        "the leader task on billing to issue the invoice",
        PATIENCE,
        Duration::from_millis(50),
        || async {
            let issued: i64 =
                sqlx::query_scalar("SELECT count(*) FROM invoices WHERE issued_at IS NOT NULL")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (issued == 1).then_some(())
        },
    )
    .await
    .unwrap();
    wait_until(
        "the welcome job on mailers that each node enqueued to run",
        PATIENCE,
        Duration::from_millis(50),
        || async {
            let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE user_id = 7")
                .fetch_one(&pool)
                .await
                .unwrap();
            (sent == 2).then_some(())
        },
    )
    .await
    .unwrap();
    // No default hid work: neither node left a role or a queue of its binary to others.
    for node in [&a, &b] {
        for line in node.lines() {
            assert!(
                !line.contains("not campaigning") && !line.contains("does not work a queue"),
                "{}: {line}",
                node.name()
            );
        }
    }
    for node in [&mut a, &mut b] {
        node.terminate().unwrap();
        assert!(node.wait_exit(PATIENCE).await.unwrap().success());
    }
}
