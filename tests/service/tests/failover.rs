//! Two processes of the service on a real PostgreSQL (forge-testkit's throwaway server, or
//! `DATABASE_URL`); orders placed through both; the scheduler's leader SIGKILLed while jobs
//! run on it. Every order is shipped exactly once, the audit cron's ticks are each written at
//! most once and none is missing (`catch_up = "all"`), and the survivor goes on ticking.

use std::time::Duration;

use forge::sqlx::{self, PgPool};
use forge_testkit::{NodeProcess, PgServer, TestDatabase, wait_for};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const ORDERS_PER_NODE: i64 = 300;
const POLL: Duration = Duration::from_millis(50);

/// A node process of the service, configured as a user would: the environment only.
struct Service {
    process: NodeProcess,
    id: &'static str,
    http: String,
}

async fn start(db: &TestDatabase, id: &'static str) -> Service {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_orders-service"));
    cmd.env("DATABASE_URL", db.url())
        .env("FORGE_NODE_ID", id)
        .env("LISTEN", "127.0.0.1:0");
    let mut process = NodeProcess::spawn(cmd).unwrap().named(id);
    let line = process
        .wait_for_line("the service listening", Duration::from_secs(60), |l| {
            l.starts_with("listening on http://")
        })
        .await
        .unwrap();
    let http = line.trim_start_matches("listening on http://").to_owned();
    Service { process, id, http }
}

/// One HTTP/1.1 request; the status code and the body.
async fn request(addr: &str, method: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
}

async fn scheduler_leader(pool: &PgPool) -> String {
    wait_for(
        "a leader of the scheduler role",
        Duration::from_secs(30),
        POLL,
        || async {
            sqlx::query_scalar::<_, String>(
                "SELECT node_id FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
            )
            .fetch_optional(pool)
            .await
            .map_err(|err| err.to_string())?
            .ok_or_else(|| "no leader yet".to_owned())
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_loses_no_order_and_ships_none_twice() {
    let db = PgServer::shared().unwrap().create_database().await.unwrap();
    let a = start(&db, "a").await;
    let b = start(&db, "b").await;
    let pool = db.pool().await.unwrap();

    for node in [&a, &b] {
        let (status, body) = request(
            &node.http,
            "POST",
            &format!("/orders?count={ORDERS_PER_NODE}"),
        )
        .await;
        assert_eq!(status, 200, "POST /orders on {}: {body}", node.id);
    }
    let orders = 2 * ORDERS_PER_NODE;
    wait_for(
        "a quarter of the orders shipped",
        Duration::from_secs(60),
        POLL,
        || async {
            let shipped = count(&pool, "SELECT count(*) FROM shipments").await;
            (shipped >= orders / 4)
                .then_some(())
                .ok_or(format!("{shipped} of {orders} shipped"))
        },
    )
    .await
    .unwrap();

    // The scheduler's leader runs the cron, and jobs as every node does.
    let leader = scheduler_leader(&pool).await;
    let (mut killed, survivor) = if leader == a.id { (a, b) } else { (b, a) };
    killed.process.kill().unwrap();
    killed
        .process
        .wait_exit(Duration::from_secs(10))
        .await
        .unwrap();
    // The database's clock decides when a tick is due.
    let killed_at: String = sqlx::query_scalar("SELECT now()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.jobs WHERE state = 'running' AND node_id = $1",
    )
    .bind(killed.id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        held > 0,
        "node {} held no job when it was killed: the test did not test a rescue",
        killed.id
    );
    let shipped = count(&pool, "SELECT count(*) FROM shipments").await;
    eprintln!(
        "killed node {} (the scheduler's leader) holding {held} jobs, {shipped} of {orders} orders shipped",
        killed.id
    );
    let killed_when = std::time::Instant::now();

    wait_for(
        "every job finished",
        Duration::from_secs(120),
        POLL,
        || async {
            let unfinished = count(
                &pool,
                "SELECT count(*) FROM forge.jobs WHERE state NOT IN ('completed', 'dead', 'cancelled')",
            )
            .await;
            (unfinished == 0)
                .then_some(())
                .ok_or(format!("{unfinished} of {orders} jobs unfinished"))
        },
    )
    .await
    .unwrap();
    eprintln!(
        "every job finished {:.1} s after the kill",
        killed_when.elapsed().as_secs_f64()
    );
    let completed = count(
        &pool,
        "SELECT count(*) FROM forge.jobs WHERE state = 'completed'",
    )
    .await;
    assert_eq!(completed, orders, "one job per order, each completed");
    let twice: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT order_id, count(*) FROM shipments GROUP BY order_id HAVING count(*) > 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(twice.is_empty(), "orders shipped more than once: {twice:?}");
    let unshipped = count(
        &pool,
        "SELECT count(*) FROM orders WHERE id NOT IN (SELECT order_id FROM shipments)",
    )
    .await;
    assert_eq!(unshipped, 0, "orders never shipped");

    // The survivor leads now and ticks on.
    wait_for(
        "three ticks of the audit cron after the kill, on the survivor",
        Duration::from_secs(60),
        POLL,
        || async {
            let ticks: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM audits WHERE tick > $1::timestamptz AND node = $2",
            )
            .bind(&killed_at)
            .bind(survivor.id)
            .fetch_one(&pool)
            .await
            .map_err(|err| err.to_string())?;
            (ticks >= 3).then_some(()).ok_or(format!("{ticks} ticks"))
        },
    )
    .await
    .unwrap();

    // One scrape of the service's endpoint: its own metrics and FORGE's.
    let (status, text) = request(&survivor.http, "GET", "/metrics").await;
    assert_eq!(status, 200, "{text}");
    for expected in [
        "orders_shipped_total ",
        "orders_placed_total ",
        "forge_leader_is_leader{role=\"scheduler\"} 1",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }

    let Service {
        process: mut survivor,
        ..
    } = survivor;
    survivor.terminate().unwrap();
    let status = survivor.wait_exit(Duration::from_secs(60)).await.unwrap();
    assert!(status.success(), "graceful stop: {status}");

    let twice: Vec<(String, i64)> =
        sqlx::query_as("SELECT tick::text, count(*) FROM audits GROUP BY tick HAVING count(*) > 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(twice.is_empty(), "ticks written more than once: {twice:?}");
    let (first, last, ticks): (String, String, i64) =
        sqlx::query_as("SELECT min(tick)::text, max(tick)::text, count(*) FROM audits")
            .fetch_one(&pool)
            .await
            .unwrap();
    let seconds = count(
        &pool,
        "SELECT extract(epoch FROM max(tick) - min(tick))::bigint + 1 FROM audits",
    )
    .await;
    assert_eq!(
        ticks, seconds,
        "ticks from {first} to {last}: {ticks} written, {seconds} due (catch_up = \"all\" runs every one)"
    );
    eprintln!("{ticks} ticks from {first} to {last}, each written once");
}
