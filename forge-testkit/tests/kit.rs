//! Tests of the test kit itself, against real PostgreSQL and real processes.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use forge_testkit::{Error, NodeProcess, PgOptions, PgServer, TxPooler, wait_for, wait_until};
use sqlx::{Connection as _, PgConnection, Row as _};
use tokio::process::Command;

/// Generous upper bound for anything awaited (a slow CI machine), never a delay.
const LONG: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(10);

async fn backend_pid(conn: &mut PgConnection) -> i32 {
    sqlx::raw_sql("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .expect("SELECT pg_backend_pid()")
        .get(0)
}

async fn scalar_i64(conn: &mut PgConnection, sql: &'static str) -> i64 {
    sqlx::raw_sql(sql)
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// The directory a throwaway cluster lives in (parent of its data directory).
fn cluster_dir(data_dir: &Path) -> PathBuf {
    data_dir.parent().expect("data dir has a parent").to_owned()
}

/// The postmaster's pid, from the first line of `postmaster.pid`.
fn postmaster_pid(data_dir: &Path) -> u32 {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).expect("postmaster.pid");
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("pid in postmaster.pid")
}

/// The state letter of a process in /proc (R, S, T, Z, ...), `None` if it is gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

fn is_dead(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

fn assert_connection_refused(result: Result<PgConnection, sqlx::Error>, context: &str) {
    match result {
        Err(sqlx::Error::Io(e)) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{context}: {e}"
        ),
        Err(e) => panic!("{context}: expected a connection error, got {e:?}"),
        Ok(_) => panic!("{context}: connecting succeeded"),
    }
}

// ---------------------------------------------------------------- PgServer

#[tokio::test]
async fn shared_server_gives_distinct_empty_connectable_databases() {
    let server = PgServer::shared().expect("shared server");
    assert!(
        std::ptr::eq(server, PgServer::shared().unwrap()),
        "shared() must return one server"
    );

    let a = server.create_database().await.expect("first database");
    let b = server.create_database().await.expect("second database");
    assert_ne!(a.name(), b.name());
    assert_ne!(a.url(), b.url());
    assert!(a.name().starts_with("forge_test_"), "{}", a.name());

    let mut conn_a = a.connect().await.expect("connect to a");
    let mut conn_b = b.connect().await.expect("connect to b");
    for (db, conn) in [(&a, &mut conn_a), (&b, &mut conn_b)] {
        let name: String = sqlx::raw_sql("SELECT current_database()")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
            .get(0);
        assert_eq!(name, db.name());
        let relations = scalar_i64(
            conn,
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')",
        )
        .await;
        assert_eq!(relations, 0, "{} is not empty", db.name());
    }

    sqlx::raw_sql("CREATE TABLE only_in_a (x int)")
        .execute(&mut conn_a)
        .await
        .unwrap();
    let in_b: Option<String> = sqlx::raw_sql("SELECT to_regclass('only_in_a')::text")
        .fetch_one(&mut conn_b)
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        in_b, None,
        "a table of one test database is visible in another"
    );

    // A pool works too.
    let pool = a.pool().await.expect("pool");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
}

#[tokio::test]
async fn shared_server_cannot_be_stopped_or_restarted() {
    let server = PgServer::shared().expect("shared server");
    for (op, result) in [
        ("restart", server.restart()),
        ("stop", server.stop()),
        ("kill_immediate", server.kill_immediate()),
    ] {
        match result {
            Err(Error::Unsupported(msg)) => {
                assert!(msg.contains("PgServer::start()"), "{op}: {msg}")
            }
            other => panic!("{op} on the shared server: expected Unsupported, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn private_server_restart_stop_and_start_again() {
    let server = PgServer::start().expect("private server");
    assert!(!server.is_external() && !server.is_shared());
    assert_ne!(server.port(), PgServer::shared().unwrap().port());
    let db = server.create_database().await.unwrap();
    let mut before = db.connect().await.unwrap();
    sqlx::raw_sql("CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")
        .execute(&mut before)
        .await
        .unwrap();
    let max_connections: String = sqlx::raw_sql("SHOW max_connections")
        .fetch_one(&mut before)
        .await
        .unwrap()
        .get(0);
    assert_eq!(max_connections, "300");

    // restart: connections opened before are gone; new ones work; data kept.
    server.restart().expect("restart");
    let stale = sqlx::raw_sql("SELECT 1").execute(&mut before).await;
    assert!(
        stale.is_err(),
        "a connection opened before restart() still works"
    );
    let mut after = db.connect().await.expect("connect after restart");
    assert_eq!(
        scalar_i64(&mut after, "SELECT sum(x)::int8 FROM kept").await,
        42
    );
    after.close().await.unwrap();

    // stop: connecting fails with a connection error.
    server.stop().expect("stop");
    assert!(!server.is_running().unwrap());
    assert_connection_refused(PgConnection::connect(db.url()).await, "after stop()");
    match db.connect().await {
        Err(Error::Database { context, .. }) => assert!(context.contains(db.name()), "{context}"),
        other => panic!("expected a Database error, got {other:?}"),
    }

    // start_again: same port, same data.
    server.start_again().expect("start_again");
    assert!(server.is_running().unwrap());
    let mut again = db.connect().await.expect("connect after start_again");
    assert_eq!(
        scalar_i64(&mut again, "SELECT sum(x)::int8 FROM kept").await,
        42
    );
}

#[tokio::test]
async fn crash_restart_keeps_committed_data() {
    let server = PgServer::start().expect("private server");
    let log = server.log_file().unwrap().to_owned();
    let db = server.create_database().await.unwrap();
    let mut conn = db.connect().await.unwrap();
    sqlx::raw_sql("CREATE TABLE epochs (n int8)")
        .execute(&mut conn)
        .await
        .unwrap();
    for n in 1..=50 {
        sqlx::query("INSERT INTO epochs VALUES ($1)")
            .bind(n as i64)
            .execute(&mut conn)
            .await
            .unwrap();
    }

    server.kill_immediate().expect("kill_immediate");
    assert_connection_refused(
        PgConnection::connect(db.url()).await,
        "after kill_immediate()",
    );
    server.start_again().expect("start after crash");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("automatic recovery in progress"),
        "no crash recovery in the log:\n{log_text}"
    );
    let mut conn = db.connect().await.unwrap();
    assert_eq!(scalar_i64(&mut conn, "SELECT max(n) FROM epochs").await, 50);

    sqlx::raw_sql("INSERT INTO epochs VALUES (51)")
        .execute(&mut conn)
        .await
        .unwrap();
    server.restart_immediate().expect("restart_immediate");
    let mut conn = db.connect().await.unwrap();
    assert_eq!(scalar_i64(&mut conn, "SELECT max(n) FROM epochs").await, 51);
}

#[tokio::test]
async fn dropping_a_private_server_stops_and_removes_it() {
    let server = PgServer::start().expect("private server");
    let data = server.data_dir().unwrap().to_owned();
    let dir = cluster_dir(&data);
    let url = server.url();
    let postmaster = postmaster_pid(&data);
    let conn = PgConnection::connect(&url).await.expect("connect");
    assert!(dir.is_dir() && !is_dead(postmaster));

    drop(server);
    assert!(!dir.exists(), "{} still exists after drop", dir.display());
    assert!(
        is_dead(postmaster),
        "postmaster {postmaster} still running after drop"
    );
    assert_connection_refused(PgConnection::connect(&url).await, "after drop");
    drop(conn);
}

/// The reaper at work across processes: `forge-pg` (this crate's binary)
/// starts a cluster and is then SIGKILLed, so none of its destructors run.
/// The cluster must still be stopped and its directory removed.
#[tokio::test]
async fn a_sigkilled_owner_leaves_no_cluster_behind() {
    let mut owner = NodeProcess::spawn(Command::new(env!("CARGO_BIN_EXE_forge-pg")))
        .unwrap()
        .named("forge-pg");
    let url = owner
        .wait_for_line("DATABASE_URL", LONG, |l| l.starts_with("DATABASE_URL="))
        .await
        .unwrap();
    let url = url.trim_start_matches("DATABASE_URL=").to_owned();
    let data = owner
        .wait_for_line("PGDATA", LONG, |l| l.starts_with("PGDATA="))
        .await
        .unwrap();
    let data = PathBuf::from(data.trim_start_matches("PGDATA="));
    let dir = cluster_dir(&data);
    let postmaster = postmaster_pid(&data);
    let mut conn = PgConnection::connect(&url)
        .await
        .expect("connect to forge-pg's cluster");
    assert!(backend_pid(&mut conn).await > 0);

    owner.kill().unwrap();
    let status = owner.wait_exit(LONG).await.unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");

    wait_until(
        "the reaper to remove the cluster directory",
        LONG,
        POLL,
        || async { (!dir.exists()).then_some(()) },
    )
    .await
    .unwrap();
    assert!(
        is_dead(postmaster),
        "postmaster {postmaster} survived its owner"
    );
    assert_connection_refused(
        PgConnection::connect(&url).await,
        "after the owner was killed",
    );
    assert!(sqlx::raw_sql("SELECT 1").execute(&mut conn).await.is_err());
}

#[tokio::test]
async fn a_bad_setting_fails_the_start_with_the_server_log() {
    let err =
        PgServer::start_with(PgOptions::default().setting("shared_buffers", "plenty")).unwrap_err();
    match &err {
        Error::ServerStart { log_tail, .. } => {
            assert!(
                log_tail.contains("shared_buffers"),
                "the log tail does not name the setting: {err}"
            )
        }
        other => panic!("expected ServerStart, got {other:?}"),
    }
}

#[tokio::test]
async fn a_bad_forge_pg_bin_is_reported() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forge-pg"));
    cmd.env("FORGE_PG_BIN", "/nonexistent/pg-bin");
    let mut forge_pg = NodeProcess::spawn(cmd).unwrap();
    let status = forge_pg.wait_exit(LONG).await.unwrap();
    assert!(!status.success());
    let output = forge_pg.lines().join("\n");
    assert!(
        output.contains(
            "FORGE_PG_BIN=/nonexistent/pg-bin does not contain the PostgreSQL server binaries"
        ),
        "{output}"
    );
}

// ------------------------------------------------------------- NodeProcess

fn sh(script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    cmd
}

#[tokio::test]
async fn node_process_pause_resume_kill() {
    // `sleep` is the child's behaviour here, not synchronisation.
    let mut node = NodeProcess::spawn(sh("echo ready; exec sleep 1000"))
        .unwrap()
        .named("sleeper");
    let pid = node.pid();
    assert_eq!(node.name(), "sleeper");
    assert_eq!(
        node.wait_for_line("ready", LONG, |l| l == "ready")
            .await
            .unwrap(),
        "ready"
    );

    node.pause().unwrap();
    wait_until("the process to be stopped", LONG, POLL, || async {
        (proc_state(pid) == Some('T')).then_some(())
    })
    .await
    .unwrap();
    node.resume().unwrap();
    wait_until("the process to run again", LONG, POLL, || async {
        matches!(proc_state(pid), Some('S' | 'R')).then_some(())
    })
    .await
    .unwrap();

    node.pause().unwrap();
    node.kill().unwrap(); // SIGKILL works on a stopped process
    let status = node.wait_exit(LONG).await.unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    assert!(node.try_status().is_some());
    let err = node.kill().unwrap_err();
    assert!(err.to_string().contains("already exited"), "{err}");
    assert!(node.pause().is_err() && node.resume().is_err() && node.terminate().is_err());
}

#[tokio::test]
async fn node_process_terminate_and_drop() {
    let mut node = NodeProcess::spawn(sh("echo up; exec sleep 1000")).unwrap();
    node.wait_for_line("up", LONG, |l| l == "up").await.unwrap();
    node.terminate().unwrap();
    let status = node.wait_exit(LONG).await.unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");

    // Dropping a paused process kills it.
    let paused = NodeProcess::spawn(sh("echo up; exec sleep 1000")).unwrap();
    let pid = paused.pid();
    paused.pause().unwrap();
    drop(paused);
    wait_until("the dropped process to die", LONG, POLL, || async {
        is_dead(pid).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn wait_for_line_consumes_lines_and_fails_fast_when_output_ends() {
    let mut node = NodeProcess::spawn(sh(
        "echo a; echo from-stderr >&2; echo b; echo a; echo done",
    ))
    .unwrap()
    .named("printer");
    node.wait_for_line("first a", LONG, |l| l == "a")
        .await
        .unwrap();
    node.wait_for_line("b", LONG, |l| l == "b").await.unwrap();
    // The cursor is past the first "a": this finds the second one.
    node.wait_for_line("second a", LONG, |l| l == "a")
        .await
        .unwrap();
    node.wait_for_line("done", LONG, |l| l == "done")
        .await
        .unwrap();

    let started = Instant::now();
    let err = node
        .wait_for_line("a third a", LONG, |l| l == "a")
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < LONG / 2,
        "did not fail fast on closed output"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("a third a") && msg.contains("printer") && msg.contains("done"),
        "{msg}"
    );

    let status = node.wait_exit(LONG).await.unwrap();
    assert!(status.success());
    let lines = node.lines();
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert!(
        lines.contains(&"from-stderr".to_owned()),
        "stderr not captured: {lines:?}"
    );
}

#[tokio::test]
async fn wait_for_line_timeout_names_what_and_shows_output() {
    let mut node = NodeProcess::spawn(sh("echo one; echo two; exec sleep 1000"))
        .unwrap()
        .named("talker");
    node.wait_for_line("two", LONG, |l| l == "two")
        .await
        .unwrap();
    let err = node
        .wait_for_line("line three", Duration::from_millis(200), |l| l == "three")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("line three") && msg.contains("talker") && msg.contains("one\ntwo"),
        "{msg}"
    );
}

#[tokio::test]
async fn wait_until_and_wait_for() {
    let mut calls = 0;
    let value = wait_until("the third call", LONG, Duration::from_millis(1), || {
        calls += 1;
        let n = calls;
        async move { (n >= 3).then_some(n) }
    })
    .await
    .unwrap();
    assert_eq!(value, 3);

    let err = wait_until::<(), _, _>(
        "godot",
        Duration::from_millis(50),
        Duration::from_millis(10),
        || async { None },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::Timeout { what, .. } if what == "godot"),
        "{err:?}"
    );

    let err = wait_for::<(), _, _, _>(
        "seven to change",
        Duration::from_millis(30),
        Duration::from_millis(10),
        || async { Err("still 7") },
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("seven to change") && msg.contains("last observed: still 7"),
        "{msg}"
    );
}

// ---------------------------------------------------------------- TxPooler

#[tokio::test]
async fn tx_pooler_serves_two_clients_with_one_backend() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let pooler = TxPooler::start(server, db.name(), 2).await.unwrap();
    let mut a = PgConnection::connect(&pooler.url())
        .await
        .expect("client a");
    let mut b = PgConnection::connect(&pooler.url())
        .await
        .expect("client b");

    let pid_a = backend_pid(&mut a).await;
    let pid_b = backend_pid(&mut b).await;
    assert_eq!(
        pid_a, pid_b,
        "two client connections should share the last-used backend"
    );

    // Session state lands on the shared backend: b "gets" a's advisory lock
    // (advisory locks are re-entrant within one session).
    let locked: bool = sqlx::raw_sql("SELECT pg_try_advisory_lock(4242)")
        .fetch_one(&mut a)
        .await
        .unwrap()
        .get(0);
    assert!(locked);
    let also: bool = sqlx::raw_sql("SELECT pg_try_advisory_lock(4242)")
        .fetch_one(&mut b)
        .await
        .unwrap()
        .get(0);
    assert!(also, "b should see a's lock as its own through the pooler");
    let mut direct = db.connect().await.unwrap();
    let direct_lock: bool = sqlx::raw_sql("SELECT pg_try_advisory_lock(4242)")
        .fetch_one(&mut direct)
        .await
        .unwrap()
        .get(0);
    assert!(
        !direct_lock,
        "the lock is really held, by the shared backend"
    );
}

#[tokio::test]
async fn tx_pooler_moves_a_client_between_backends() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let pooler = TxPooler::start(server, db.name(), 2).await.unwrap();
    let mut a = PgConnection::connect(&pooler.url()).await.unwrap();
    let mut b = PgConnection::connect(&pooler.url()).await.unwrap();

    let first = backend_pid(&mut a).await;
    sqlx::raw_sql("BEGIN").execute(&mut b).await.unwrap();
    // LIFO: b's transaction got the backend a just returned, and keeps it.
    assert_eq!(backend_pid(&mut b).await, first);
    let second = backend_pid(&mut a).await;
    assert_ne!(
        first, second,
        "a's next statement must run on another backend"
    );
    sqlx::raw_sql("COMMIT").execute(&mut b).await.unwrap();

    let mut direct = db.connect().await.unwrap();
    let backends = scalar_i64(
        &mut direct,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'forge-testkit-txpooler'",
    )
    .await;
    assert_eq!(backends, 2);
}

#[tokio::test]
async fn tx_pooler_forwards_extended_protocol_and_queues_clients() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let pooler = TxPooler::start(server, db.name(), 1).await.unwrap();
    let mut a = PgConnection::connect(&pooler.url()).await.unwrap();

    // One client, one backend: prepared statements work (Parse/Bind/Describe/Execute/Sync).
    for _ in 0..3 {
        let v: i32 = sqlx::query_scalar("SELECT $1::int4 + 1")
            .bind(41)
            .fetch_one(&mut a)
            .await
            .unwrap();
        assert_eq!(v, 42);
    }

    // While a holds the only backend in a transaction, b waits for it.
    sqlx::raw_sql("BEGIN").execute(&mut a).await.unwrap();
    let in_tx = backend_pid(&mut a).await;
    let url = pooler.url();
    let mut waiting = tokio::spawn(async move {
        let mut b = PgConnection::connect(&url).await.unwrap();
        backend_pid(&mut b).await
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiting)
            .await
            .is_err(),
        "b was served while a's transaction held the only backend"
    );
    sqlx::raw_sql("COMMIT").execute(&mut a).await.unwrap();
    let served = tokio::time::timeout(LONG, waiting)
        .await
        .expect("b is served after COMMIT")
        .unwrap();
    assert_eq!(served, in_tx);

    let err = TxPooler::start(server, db.name(), 0).await.unwrap_err();
    assert!(err.to_string().contains("at least 1"), "{err}");
}

#[tokio::test]
async fn tx_pooler_start_reports_why_the_server_refused() {
    let server = PgServer::shared().unwrap();
    let err = TxPooler::start(server, "no_such_database_here", 1)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("refused the login") && msg.contains("no_such_database_here"),
        "{msg}"
    );
}
