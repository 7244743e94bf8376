//! Tests of the test kit itself, against real PostgreSQL and real processes.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use forge_testkit::{
    Error, Filter, NodeProcess, PgOptions, PgProxy, PgServer, ProxyConnectionState, TxPooler,
    wait_for, wait_until,
};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection, PgPool, Row as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
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

/// A backend killed by a signal makes the postmaster restart every session: the crash watch
/// reports it with the postmaster's exit line; a crash-restart the test ordered is not reported.
#[tokio::test]
async fn crash_watch_reports_a_killed_backend_not_an_ordered_crash_restart() {
    let server = PgServer::start().expect("private server");
    let mut watch = server.crash_watch().expect("a throwaway cluster's log");
    assert_eq!(watch.poll().unwrap(), [], "a fresh server has not crashed");
    server.restart_immediate().expect("restart_immediate");
    let db = server.create_database().await.unwrap();
    let mut conn = db.connect().await.unwrap();
    assert_eq!(
        watch.poll().unwrap(),
        [],
        "an ordered crash-restart is no crash"
    );

    let pid = backend_pid(&mut conn).await;
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .await
        .expect("run kill");
    assert!(status.success(), "kill -KILL {pid}: {status}");
    let crashes = wait_until("the crash in the server log", LONG, POLL, || {
        let crashes = watch.poll().expect("read the log");
        async move { Some(crashes).filter(|c| !c.is_empty()) }
    })
    .await
    .unwrap();
    assert_eq!(crashes.len(), 1, "{crashes:?}");
    assert!(
        crashes[0].exit.contains(&format!(
            "server process (PID {pid}) was terminated by signal 9"
        )),
        "{crashes:?}"
    );
    // The server comes back by itself; the crash is reported once.
    wait_for("a connection after the crash", LONG, POLL, || db.connect())
        .await
        .unwrap();
    assert_eq!(watch.poll().unwrap(), [], "the crash is reported once");

    let external = PgServer::external(db.url()).unwrap();
    assert!(
        external.crash_watch().is_err(),
        "an external server's log is unknown"
    );
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
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'forge-testkit-txpooler' \
         AND datname = current_database()",
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

// ----------------------------------------------------------------- PgProxy

/// How long a black-holed request must stay unanswered in the tests: a real
/// answer through the proxy takes well under a millisecond.
const SILENCE: Duration = Duration::from_millis(300);

async fn try_connect_as(url: &str, application_name: &str) -> Result<PgConnection, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name(application_name);
    PgConnection::connect_with(&options).await
}

async fn connect_as(url: &str, application_name: &str) -> PgConnection {
    try_connect_as(url, application_name)
        .await
        .unwrap_or_else(|e| panic!("connecting as {application_name} to {url}: {e}"))
}

async fn server_port(conn: &mut PgConnection) -> u16 {
    let port: i32 = sqlx::raw_sql("SELECT inet_server_port()")
        .fetch_one(conn)
        .await
        .expect("SELECT inet_server_port()")
        .get(0);
    u16::try_from(port).expect("a TCP port")
}

/// Sessions of `application_name` on the server, optionally in `state`.
async fn sessions(pool: &PgPool, application_name: &str, state: Option<&str>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
         AND ($2::text IS NULL OR state = $2)",
    )
    .bind(application_name)
    .bind(state)
    .fetch_one(pool)
    .await
    .expect("counting sessions in pg_stat_activity")
}

fn states_of(proxy: &PgProxy, application_name: &str) -> Vec<ProxyConnectionState> {
    proxy
        .connections()
        .into_iter()
        .filter(|c| c.application_name == application_name)
        .map(|c| c.state)
        .collect()
}

#[tokio::test]
async fn pg_proxy_forwards_and_identifies_connections() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    assert_ne!(proxy.port(), server.port());
    assert_eq!(proxy.upstream(), (server.host().to_owned(), server.port()));
    let url = proxy.url_for(server, db.name());
    assert!(
        url.contains(&format!("@127.0.0.1:{}/", proxy.port())),
        "{url}"
    );

    let mut conn = connect_as(&url, "forge:pool:node-a").await;
    let row = sqlx::raw_sql(
        "SELECT current_setting('application_name'), current_database()::text, current_user::text",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let (application_name, database, user): (String, String, String) =
        (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (application_name.as_str(), database.as_str()),
        ("forge:pool:node-a", db.name())
    );
    // The extended protocol (prepared statements) goes through untouched.
    for n in [20, 21] {
        let doubled: i32 = sqlx::query_scalar("SELECT $1::int4 * 2")
            .bind(n)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(doubled, n * 2);
    }

    let listed = proxy.connections();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let seen = &listed[0];
    assert_eq!(seen.state, ProxyConnectionState::Forwarding, "{seen:?}");
    assert_eq!(seen.application_name, "forge:pool:node-a");
    assert_eq!(
        (seen.user.as_str(), seen.database.as_str()),
        (user.as_str(), db.name())
    );
    assert!(!seen.replication);
    assert_eq!(
        seen.upstream,
        Some(format!("{}:{}", server.host(), server.port()))
    );

    conn.close().await.unwrap();
    wait_until(
        "the closed connection to leave the list",
        LONG,
        POLL,
        || async { proxy.connections().is_empty().then_some(()) },
    )
    .await
    .unwrap();
}

/// Reads one backend message: (type byte, body).
async fn read_message(stream: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut header = [0u8; 5];
    stream
        .read_exact(&mut header)
        .await
        .expect("message header");
    let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let mut body = vec![0u8; usize::try_from(len).unwrap() - 4];
    stream.read_exact(&mut body).await.expect("message body");
    (header[0], body)
}

/// The proxy's startup handling seen from a hand-written client: it declines
/// GSS and TLS itself, and forwards a CancelRequest to the server, which
/// cancels the running query.
#[tokio::test]
async fn pg_proxy_declines_encryption_and_forwards_cancel_requests() {
    // Private and trust-authenticated, so the raw client needs no password.
    let server = PgServer::start().unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let mut client = TcpStream::connect(("127.0.0.1", proxy.port()))
        .await
        .unwrap();
    for request in [80_877_104_i32, 80_877_103] {
        let packet = [8_i32.to_be_bytes(), request.to_be_bytes()].concat();
        client.write_all(&packet).await.unwrap();
        assert_eq!(
            client.read_u8().await.unwrap(),
            b'N',
            "answer to request {request}"
        );
    }
    let mut body = 196_608_i32.to_be_bytes().to_vec();
    for field in [
        "user",
        "postgres",
        "database",
        "postgres",
        "application_name",
        "forge:raw:a",
    ] {
        body.extend_from_slice(field.as_bytes());
        body.push(0);
    }
    body.push(0);
    let len = i32::try_from(body.len() + 4).unwrap();
    client
        .write_all(&[len.to_be_bytes().to_vec(), body].concat())
        .await
        .unwrap();
    let mut key = None;
    loop {
        match read_message(&mut client).await {
            (b'K', body) => key = Some(body),
            (b'Z', _) => break,
            (b'E', body) => panic!("login refused: {}", String::from_utf8_lossy(&body)),
            _ => {}
        }
    }
    let key = key.expect("BackendKeyData");

    let query = b"SELECT pg_sleep(600)\0";
    let len = i32::try_from(query.len() + 4).unwrap();
    client
        .write_all(&[&[b'Q'][..], &len.to_be_bytes(), query].concat())
        .await
        .unwrap();
    let direct = PgPool::connect(&server.url()).await.unwrap();
    wait_until("the query to run", LONG, POLL, || {
        let direct = direct.clone();
        async move { (sessions(&direct, "forge:raw:a", Some("active")).await == 1).then_some(()) }
    })
    .await
    .unwrap();

    let mut cancel = TcpStream::connect(("127.0.0.1", proxy.port()))
        .await
        .unwrap();
    let packet = [
        &16_i32.to_be_bytes()[..],
        &80_877_102_i32.to_be_bytes(),
        &key,
    ]
    .concat();
    cancel.write_all(&packet).await.unwrap();
    // The server closes a cancel connection once it has processed it.
    assert_eq!(cancel.read(&mut [0u8; 16]).await.unwrap(), 0);
    let canceled = tokio::time::timeout(LONG, async {
        loop {
            if let (b'E', body) = read_message(&mut client).await {
                return body;
            }
        }
    })
    .await
    .expect("the query was not cancelled");
    let error = String::from_utf8_lossy(&canceled);
    assert!(
        error.contains("C57014"),
        "expected query_canceled, got {error}"
    );
}

#[tokio::test]
async fn pg_proxy_blackhole_silences_matching_connections_only() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let url = proxy.url_for(server, db.name());
    let mut listen_a = connect_as(&url, "forge:listen:node-a").await;
    let mut pool_a = connect_as(&url, "forge:pool:node-a").await;
    let mut listen_b = connect_as(&url, "forge:listen:node-b").await;
    let mut direct = db.connect().await.unwrap();
    let observer = db.pool().await.unwrap();

    // A query of node-a's LISTEN session is pending (waiting for a lock)
    // when the black hole opens; the server then answers it.
    sqlx::raw_sql("SELECT pg_advisory_lock(7)")
        .execute(&mut direct)
        .await
        .unwrap();
    backend_pid(&mut listen_a).await;
    let mut pending = tokio::spawn(async move {
        let result = sqlx::raw_sql("SELECT pg_advisory_lock(7)")
            .execute(&mut listen_a)
            .await;
        (result.map(drop), listen_a)
    });
    wait_until("node-a's query to wait for the lock", LONG, POLL, || {
        let observer = observer.clone();
        async move {
            (sessions(&observer, "forge:listen:node-a", Some("active")).await == 1).then_some(())
        }
    })
    .await
    .unwrap();
    let filter = Filter::application_prefix("forge:listen:node-a");
    assert_eq!(proxy.blackhole(filter.clone()), 1);
    sqlx::raw_sql("SELECT pg_advisory_unlock(7)")
        .execute(&mut direct)
        .await
        .unwrap();
    wait_until("the server to answer node-a's query", LONG, POLL, || {
        let observer = observer.clone();
        async move {
            (sessions(&observer, "forge:listen:node-a", Some("idle")).await == 1).then_some(())
        }
    })
    .await
    .unwrap();
    assert!(
        tokio::time::timeout(SILENCE, &mut pending).await.is_err(),
        "the answer to a black-holed connection's query reached the client"
    );

    // Its neighbours do not notice.
    assert!(backend_pid(&mut pool_a).await > 0);
    assert!(backend_pid(&mut listen_b).await > 0);
    assert_eq!(
        states_of(&proxy, "forge:listen:node-a"),
        [ProxyConnectionState::BlackHoled]
    );
    assert_eq!(
        states_of(&proxy, "forge:pool:node-a"),
        [ProxyConnectionState::Forwarding]
    );
    assert_eq!(
        states_of(&proxy, "forge:listen:node-b"),
        [ProxyConnectionState::Forwarding]
    );

    // A reconnect is accepted, then hangs: its startup message is swallowed.
    let reconnect_url = url.clone();
    let mut reconnect =
        tokio::spawn(async move { try_connect_as(&reconnect_url, "forge:listen:node-a").await });
    wait_until("the reconnect to be swallowed", LONG, POLL, || async {
        (states_of(&proxy, "forge:listen:node-a").len() == 2).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        states_of(&proxy, "forge:listen:node-a"),
        [ProxyConnectionState::BlackHoled; 2]
    );
    assert!(
        tokio::time::timeout(SILENCE, &mut reconnect).await.is_err(),
        "the reconnect got through"
    );
    assert_eq!(
        sessions(&observer, "forge:listen:node-a", None).await,
        1,
        "it reached the server"
    );

    // Healed: new connections get through; the black-holed ones stay dead.
    assert!(proxy.heal(&filter));
    assert!(!proxy.heal(&filter), "healed twice");
    let mut fresh = connect_as(&url, "forge:listen:node-a").await;
    assert!(backend_pid(&mut fresh).await > 0);
    let dead: Vec<u64> = proxy
        .connections()
        .into_iter()
        .filter(|c| c.state == ProxyConnectionState::BlackHoled)
        .map(|c| c.id)
        .collect();
    assert_eq!(dead.len(), 2, "{:?}", proxy.connections());

    // Severing them is what finally tells their clients.
    for id in dead {
        assert_eq!(proxy.sever(&Filter::Connection(id)), 1);
    }
    let (result, _) = tokio::time::timeout(LONG, pending).await.unwrap().unwrap();
    assert!(matches!(result, Err(sqlx::Error::Io(_))), "{result:?}");
    let reconnected = tokio::time::timeout(LONG, reconnect)
        .await
        .unwrap()
        .unwrap();
    assert!(reconnected.is_err(), "the swallowed reconnect succeeded");
    assert!(backend_pid(&mut fresh).await > 0);
}

#[tokio::test]
async fn pg_proxy_sever_resets_matching_connections() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let url = proxy.url_for(server, db.name());
    let mut a = connect_as(&url, "forge:scheduler:node-a").await;
    let mut b = connect_as(&url, "forge:scheduler:node-b").await;
    let pid_a = backend_pid(&mut a).await;

    assert_eq!(
        proxy.sever(&Filter::application_prefix("forge:scheduler:node-a")),
        1
    );
    match sqlx::raw_sql("SELECT 1").execute(&mut a).await {
        Err(sqlx::Error::Io(_)) => {}
        other => panic!("expected an I/O error on a severed connection, got {other:?}"),
    }
    assert!(backend_pid(&mut b).await > 0, "a neighbour was severed");
    // The server's side was closed too.
    let observer = db.pool().await.unwrap();
    wait_until(
        "the severed session to end on the server",
        LONG,
        POLL,
        || {
            let observer = observer.clone();
            async move {
                let left: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                        .bind(pid_a)
                        .fetch_one(&observer)
                        .await
                        .ok()?;
                (left == 0).then_some(())
            }
        },
    )
    .await
    .unwrap();
    // A reset is not a rule: node-a reconnects.
    let mut again = connect_as(&url, "forge:scheduler:node-a").await;
    assert!(backend_pid(&mut again).await > 0);
    assert_eq!(proxy.sever(&Filter::application_prefix("forge:nobody")), 0);
}

/// A delayed connection's request reaches the server late, after its client
/// gave up on it and left; a neighbour's is not delayed.
#[tokio::test]
async fn pg_proxy_delay_delivers_a_request_late_even_after_its_client_left() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let observer = db.pool().await.unwrap();
    sqlx::raw_sql("CREATE TABLE late (x int)")
        .execute(&observer)
        .await
        .unwrap();
    let rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM late")
            .fetch_one(&observer)
            .await
            .unwrap()
    };
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let url = proxy.url_for(server, db.name());
    let mut a = connect_as(&url, "forge:pool:node-a").await;
    let mut b = connect_as(&url, "forge:pool:node-b").await;

    let hold = Duration::from_secs(3);
    assert_eq!(
        proxy.delay(Filter::application_prefix("forge:pool:node-a"), hold),
        1
    );
    let insert = sqlx::raw_sql("INSERT INTO late VALUES (1)").execute(&mut a);
    assert!(
        tokio::time::timeout(SILENCE, insert).await.is_err(),
        "a delayed request was answered at once"
    );
    // The client gives up and leaves; its request is still on its way.
    drop(a);
    assert!(backend_pid(&mut b).await > 0, "a neighbour was delayed");
    assert_eq!(rows().await, 0, "the request arrived before its time");
    wait_until("the late request to be delivered", LONG, POLL, || async {
        (rows().await == 1).then_some(())
    })
    .await
    .unwrap();
    wait_until("the server to see the client's close", LONG, POLL, || {
        let observer = observer.clone();
        async move { (sessions(&observer, "forge:pool:node-a", None).await == 0).then_some(()) }
    })
    .await
    .unwrap();
    assert_eq!(
        proxy.delay(Filter::application_prefix("forge:nobody"), hold),
        0
    );
}

#[tokio::test]
async fn pg_proxy_retarget_moves_new_connections_only() {
    let first = PgServer::start().unwrap();
    let second = PgServer::start().unwrap();
    let proxy = PgProxy::start(first.host(), first.port()).unwrap();
    let url = proxy.url_for(&first, "postgres");
    let mut before = connect_as(&url, "forge:pool:node-a").await;
    assert_eq!(server_port(&mut before).await, first.port());

    proxy.retarget(second.host(), second.port());
    assert_eq!(proxy.upstream(), (second.host().to_owned(), second.port()));
    let mut after = connect_as(&url, "forge:pool:node-a").await;
    assert_eq!(server_port(&mut after).await, second.port());
    assert_eq!(
        server_port(&mut before).await,
        first.port(),
        "an existing connection moved"
    );
    let upstreams: Vec<Option<String>> = proxy
        .connections()
        .into_iter()
        .map(|c| c.upstream)
        .collect();
    assert_eq!(
        upstreams,
        [
            Some(format!("127.0.0.1:{}", first.port())),
            Some(format!("127.0.0.1:{}", second.port()))
        ]
    );

    // An unreachable upstream is reported to the client, as a pooler would.
    second.stop().unwrap();
    let err = try_connect_as(&url, "forge:pool:node-a").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("PgProxy: cannot connect to the upstream server"),
        "{err}"
    );
}

#[tokio::test]
async fn pg_proxy_blackhole_all_then_drop_closes_everything() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let url = proxy.url_for(server, db.name());
    let mut conn = connect_as(&url, "forge:pool:node-a").await;
    assert_eq!(proxy.blackhole(Filter::All), 1);

    // Not even the TLS negotiation is answered: a new client hangs at once.
    let hanging_url = url.clone();
    let mut hanging = tokio::spawn(async move { try_connect_as(&hanging_url, "late").await });
    wait_until("the new connection to be swallowed", LONG, POLL, || async {
        let connections = proxy.connections();
        let swallowed = connections.len() == 2
            && connections
                .iter()
                .all(|c| c.state == ProxyConnectionState::BlackHoled);
        swallowed.then_some(())
    })
    .await
    .unwrap();
    assert!(
        tokio::time::timeout(SILENCE, &mut hanging).await.is_err(),
        "the new client got an answer"
    );
    assert_eq!(
        proxy.connections()[1].application_name,
        "",
        "identified without a startup message"
    );

    drop(proxy);
    let connected = tokio::time::timeout(LONG, hanging)
        .await
        .expect("the hanging connect did not end when the proxy was dropped")
        .unwrap();
    assert!(connected.is_err());
    assert!(sqlx::raw_sql("SELECT 1").execute(&mut conn).await.is_err());
    assert_connection_refused(
        PgConnection::connect(&url).await,
        "after the proxy was dropped",
    );
}

// ------------------------------------------------------ standby, failover

async fn texts(conn: &mut PgConnection, sql: &'static str) -> Vec<String> {
    sqlx::raw_sql(sql)
        .fetch_all(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Directory and postmaster pid of a running throwaway cluster.
fn cluster_of(server: &PgServer) -> (PathBuf, u32) {
    let data = server.data_dir().expect("a throwaway cluster");
    (cluster_dir(data), postmaster_pid(data))
}

#[tokio::test]
async fn standbys_are_made_only_of_private_clusters() {
    let external = PgServer::external("postgres://me@db.example:5433/app").unwrap();
    let shared = PgServer::shared().unwrap();
    for (what, server) in [("external", &external), ("shared", shared)] {
        match server.start_standby(None) {
            Err(Error::Unsupported(msg)) => {
                assert!(msg.contains("PgServer::start()"), "{what}: {msg}")
            }
            other => {
                panic!("start_standby of the {what} server: expected Unsupported, got {other:?}")
            }
        }
        assert!(server.standby_application_name().is_none());
    }
    assert!(matches!(external.promote(), Err(Error::Unsupported(_))));
}

#[tokio::test]
async fn a_standby_replicates_and_is_promoted() {
    let primary = PgServer::start().unwrap();
    let standby = primary.start_standby(None).unwrap();
    assert_ne!(standby.port(), primary.port());
    let name = standby.standby_application_name().unwrap();
    assert!(name.starts_with("forge-testkit-standby-"), "{name}");
    assert!(standby.is_in_recovery().await.unwrap());
    assert!(!primary.is_in_recovery().await.unwrap());

    let mut p = PgConnection::connect(&primary.url()).await.unwrap();
    sqlx::raw_sql("CREATE TABLE events (n int PRIMARY KEY); INSERT INTO events VALUES (1)")
        .execute(&mut p)
        .await
        .unwrap();
    let replayed = primary.wait_caught_up(&standby, LONG).await.unwrap();
    assert!(standby.replay_lsn().await.unwrap().unwrap() >= replayed);
    assert_eq!(primary.replay_lsn().await.unwrap(), None);
    let mut s = PgConnection::connect(&standby.url()).await.unwrap();
    assert_eq!(scalar_i64(&mut s, "SELECT count(*) FROM events").await, 1);
    match sqlx::raw_sql("INSERT INTO events VALUES (2)")
        .execute(&mut s)
        .await
    {
        Err(sqlx::Error::Database(e)) => assert_eq!(e.code().as_deref(), Some("25006"), "{e}"),
        other => {
            panic!("a write on the standby: expected read_only_sql_transaction, got {other:?}")
        }
    }
    assert!(matches!(
        standby.current_wal_lsn().await,
        Err(Error::Unsupported(_))
    ));

    // Restarted, it is still a standby, and goes on replicating.
    standby.restart().unwrap();
    assert!(standby.is_in_recovery().await.unwrap());
    sqlx::raw_sql("INSERT INTO events VALUES (2)")
        .execute(&mut p)
        .await
        .unwrap();
    primary.wait_caught_up(&standby, LONG).await.unwrap();
    let mut s = PgConnection::connect(&standby.url()).await.unwrap();
    assert_eq!(scalar_i64(&mut s, "SELECT count(*) FROM events").await, 2);

    match primary.promote() {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("not a standby"), "{msg}"),
        other => panic!("promoting a primary: expected Unsupported, got {other:?}"),
    }
    standby.promote().unwrap();
    assert!(!standby.is_in_recovery().await.unwrap());
    let mut s = PgConnection::connect(&standby.url()).await.unwrap();
    sqlx::raw_sql("INSERT INTO events VALUES (3)")
        .execute(&mut s)
        .await
        .unwrap();
    assert!(matches!(standby.promote(), Err(Error::Unsupported(_))));
    match primary.wait_caught_up(&standby, LONG).await {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("not a standby"), "{msg}"),
        other => panic!("waiting for a promoted server to catch up: got {other:?}"),
    }
    // The old primary lives on, on its own (a split brain, if a test wants one).
    sqlx::raw_sql("INSERT INTO events VALUES (4)")
        .execute(&mut p)
        .await
        .unwrap();
    assert_eq!(
        texts(&mut p, "SELECT n::text FROM events ORDER BY n").await,
        ["1", "2", "4"]
    );

    // A crash of the promoted server: it comes back as a primary with its data.
    standby.kill_immediate().unwrap();
    assert!(!standby.is_running().unwrap());
    standby.start_again().unwrap();
    assert!(!standby.is_in_recovery().await.unwrap());
    let mut s = PgConnection::connect(&standby.url()).await.unwrap();
    assert_eq!(
        texts(&mut s, "SELECT n::text FROM events ORDER BY n").await,
        ["1", "2", "3"]
    );

    let (dir, postmaster) = cluster_of(&standby);
    drop(standby);
    assert!(!dir.exists(), "{} still exists after drop", dir.display());
    assert!(
        is_dead(postmaster),
        "the standby's postmaster survived drop"
    );
}

/// The failover hazard: an asynchronous standby promoted while behind lacks
/// what the old primary committed after replication stopped.
#[tokio::test]
async fn a_lagging_standby_is_promoted_without_the_commits_it_missed() {
    let primary = PgServer::start().unwrap();
    let elsewhere = PgProxy::start("127.0.0.1", 1).unwrap();
    match primary.start_standby(Some(&elsewhere)) {
        Err(Error::Config(msg)) => assert!(msg.contains("not to this primary"), "{msg}"),
        other => panic!("a standby via a proxy to elsewhere: expected Config, got {other:?}"),
    }
    let proxy = PgProxy::start(primary.host(), primary.port()).unwrap();
    let standby = primary.start_standby(Some(&proxy)).unwrap();

    let mut p = PgConnection::connect(&primary.url()).await.unwrap();
    sqlx::raw_sql("CREATE TABLE facts (what text); INSERT INTO facts VALUES ('before')")
        .execute(&mut p)
        .await
        .unwrap();
    primary.wait_caught_up(&standby, LONG).await.unwrap();
    let streams: Vec<_> = proxy
        .connections()
        .into_iter()
        .filter(|c| c.replication)
        .collect();
    assert_eq!(streams.len(), 1, "{:?}", proxy.connections());
    assert_eq!(
        Some(streams[0].application_name.as_str()),
        standby.standby_application_name()
    );
    assert_eq!(streams[0].state, ProxyConnectionState::Forwarding);

    assert_eq!(proxy.blackhole(Filter::Replication), 1);
    sqlx::raw_sql("INSERT INTO facts VALUES ('after')")
        .execute(&mut p)
        .await
        .unwrap();
    match primary.wait_caught_up(&standby, SILENCE).await {
        Err(Error::Timeout { details, .. }) => {
            assert!(
                details.contains("replayed up to") && details.contains("server.log"),
                "{details}"
            )
        }
        other => panic!("a black-holed standby caught up: {other:?}"),
    }

    standby.promote().unwrap();
    let mut s = PgConnection::connect(&standby.url()).await.unwrap();
    assert_eq!(texts(&mut s, "SELECT what FROM facts").await, ["before"]);
    assert_eq!(
        texts(&mut p, "SELECT what FROM facts ORDER BY what").await,
        ["after", "before"]
    );
    sqlx::raw_sql("INSERT INTO facts VALUES ('new primary')")
        .execute(&mut s)
        .await
        .unwrap();

    // The old primary dies; dropping everything leaves nothing behind.
    primary.kill_immediate().unwrap();
    assert!(!primary.is_running().unwrap());
    let primary_dir = cluster_dir(primary.data_dir().unwrap());
    let (standby_dir, standby_postmaster) = cluster_of(&standby);
    drop((s, p));
    drop(proxy);
    drop(standby);
    drop(primary);
    for dir in [primary_dir, standby_dir] {
        assert!(!dir.exists(), "{} still exists after drop", dir.display());
    }
    assert!(
        is_dead(standby_postmaster),
        "the standby's postmaster survived drop"
    );
}

/// A synchronous standby whose WAL receiver is frozen stalls the primary's
/// commits, not its reads; resumed, the commits complete; asynchronous
/// again, a frozen receiver stalls nothing.
#[tokio::test]
async fn a_frozen_synchronous_standby_stalls_commits_but_not_reads() {
    let external = PgServer::external("postgres://me@db.example:5433/app").unwrap();
    assert!(matches!(
        external.set_synchronous_standby(None, LONG).await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        external.pause_wal_receiver().await,
        Err(Error::Unsupported(_))
    ));
    let primary = PgServer::start().unwrap();
    match primary.pause_wal_receiver().await {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("no WAL receiver"), "{msg}"),
        other => panic!("pausing the WAL receiver of a primary: got {other:?}"),
    }
    match primary.set_synchronous_standby(Some(&primary), LONG).await {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("start_standby"), "{msg}"),
        other => panic!("a primary as its own synchronous standby: got {other:?}"),
    }
    let standby = primary.start_standby(None).unwrap();
    let mut p = PgConnection::connect(&primary.url()).await.unwrap();
    sqlx::raw_sql("CREATE TABLE writes (n int)")
        .execute(&mut p)
        .await
        .unwrap();

    primary
        .set_synchronous_standby(Some(&standby), LONG)
        .await
        .unwrap();
    let name = standby.standby_application_name().unwrap();
    assert_eq!(
        texts(
            &mut p,
            "SELECT application_name || ' ' || sync_state FROM pg_stat_replication"
        )
        .await,
        [format!("{name} sync")]
    );
    sqlx::raw_sql("INSERT INTO writes VALUES (1)")
        .execute(&mut p)
        .await
        .unwrap();

    let pid = standby.pause_wal_receiver().await.unwrap();
    wait_until("the WAL receiver to stop", LONG, POLL, || async move {
        (proc_state(pid) == Some('T')).then_some(())
    })
    .await
    .unwrap();
    let url = primary.url();
    let mut write = tokio::spawn(async move {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("INSERT INTO writes VALUES (2)")
            .execute(&mut conn)
            .await
            .unwrap();
        conn
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut write)
            .await
            .is_err(),
        "a commit returned while the synchronous standby's WAL receiver was frozen"
    );
    // Reads go on; the waiting commit is not visible yet (it ends after the standby's answer).
    assert_eq!(scalar_i64(&mut p, "SELECT count(*) FROM writes").await, 1);
    assert_eq!(standby.resume_wal_receiver().await.unwrap(), pid);
    let conn = tokio::time::timeout(LONG, write)
        .await
        .expect("the commit completes once the WAL receiver runs")
        .unwrap();
    drop(conn);

    // Asynchronous again: a frozen WAL receiver stalls nothing.
    primary.set_synchronous_standby(None, LONG).await.unwrap();
    assert_eq!(
        texts(&mut p, "SELECT sync_state FROM pg_stat_replication").await,
        ["async"]
    );
    standby.pause_wal_receiver().await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::raw_sql("INSERT INTO writes VALUES (3)").execute(&mut p),
    )
    .await
    .expect("an asynchronous commit does not wait for the standby")
    .unwrap();
    standby.resume_wal_receiver().await.unwrap();
    primary.wait_caught_up(&standby, LONG).await.unwrap();
    let mut s = PgConnection::connect(&standby.url()).await.unwrap();
    assert_eq!(scalar_i64(&mut s, "SELECT count(*) FROM writes").await, 3);
}

/// A standby of a primary with a steppable clock gets its own, at true time: after a failover
/// promoted it, its clock can be stepped (the soak steps the database's clock after failovers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_of_a_steppable_primary_is_steppable_after_its_promotion() {
    if forge_testkit::faketime_library().is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "libfaketime is missing (Debian: apt-get install libfaketime)"
        );
        eprintln!("skipped: libfaketime is missing (Debian: apt-get install libfaketime)");
        return;
    }
    let (primary, standby) = tokio::task::spawn_blocking(|| {
        let primary = PgServer::start_with(PgOptions::default().steppable_clock())?;
        let standby = primary.start_standby(None)?;
        Ok::<_, Error>((primary, standby))
    })
    .await
    .unwrap()
    .unwrap();
    primary.step_clock_ahead(Duration::from_secs(90)).unwrap();
    assert_eq!(
        standby.clock_offset_ms(),
        Some(0),
        "its own clock, at true time"
    );
    let standby = tokio::task::spawn_blocking(move || standby.promote().map(|()| standby))
        .await
        .unwrap()
        .unwrap();
    standby.step_clock_back(Duration::from_secs(90)).unwrap();
    let mut conn = PgConnection::connect(&standby.url()).await.unwrap();
    let server_secs: f64 =
        sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    let true_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let behind_ms = (true_secs - server_secs) * 1000.0;
    assert!(
        (behind_ms - 90_000.0).abs() < 5_000.0,
        "the promoted standby's clock is {behind_ms} ms behind, not 90 s"
    );
    standby.step_clock_to_true_time().unwrap();
    assert_eq!(standby.clock_offset_ms(), Some(0));
}
