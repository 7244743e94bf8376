//! Connections: options, first contact with clear errors, the dedicated lock sessions and the
//! transaction-pooler check. (FORGE's migrations and function files: `schema`.)

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection, Postgres, Row, Transaction};
use tokio::time::Instant;

use crate::config::{DatabaseConfig, LeaderElectionConfig};
use crate::error::{Error, Result, is_transient, redact_url};

/// The parsed connection options for `database`, with `application_name` set (PostgreSQL
/// truncates it to 63 bytes).
pub(crate) fn connect_options(
    database: &DatabaseConfig,
    application_name: &str,
) -> Result<PgConnectOptions> {
    let url = database.url()?;
    let options: PgConnectOptions = url.parse().map_err(|err: sqlx::Error| Error::Config {
        path: None,
        line: None,
        key: "database.url".into(),
        message: format!(
            "cannot parse {:?}: {err}; use postgres://user:password@host:port/database",
            redact_url(url)
        ),
    })?;
    Ok(options
        .application_name(&truncate(application_name, 63))
        .log_statements(tracing::log::LevelFilter::Trace)
        // Lock sessions wait inside PostgreSQL on purpose; that is not a slow statement.
        .log_slow_statements(tracing::log::LevelFilter::Off, Duration::from_secs(3600)))
}

fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn describe_target(options: &PgConnectOptions) -> String {
    let database = options.get_database().unwrap_or("(default database)");
    match options.get_socket() {
        Some(socket) => format!(
            "database {database:?} as user {:?} via socket {}",
            options.get_username(),
            socket.display()
        ),
        None => format!(
            "database {database:?} as user {:?} at {}:{}",
            options.get_username(),
            options.get_host(),
            options.get_port()
        ),
    }
}

fn connect_error(options: &PgConnectOptions, err: sqlx::Error, waited: Duration) -> Error {
    let target = describe_target(options);
    let hint = match &err {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused: is PostgreSQL running there? check DATABASE_URL / [database] url"
                .to_owned()
        }
        sqlx::Error::Io(io) => format!(
            "{io}: check the host and port in DATABASE_URL / [database] url and that PostgreSQL is reachable"
        ),
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("28P01" | "28000") => format!(
                "authentication failed ({}): check the user and password in DATABASE_URL",
                db.message()
            ),
            Some("3D000") => format!(
                "{}: create it (createdb) or fix the database name in DATABASE_URL",
                db.message()
            ),
            Some("53300") => format!(
                "{}: the server is out of connections; raise its max_connections or lower [database] max_connections",
                db.message()
            ),
            Some("57P03") => format!(
                "{}: the server is starting up or shutting down",
                db.message()
            ),
            _ => db.message().to_owned(),
        },
        sqlx::Error::Tls(tls) => format!("TLS failed ({tls}): check sslmode in DATABASE_URL"),
        other => other.to_string(),
    };
    let waited = if waited >= Duration::from_millis(500) {
        format!(
            " (kept trying for {})",
            humantime::format_duration(round_ms(waited))
        )
    } else {
        String::new()
    };
    Error::Connect {
        message: format!("cannot connect to PostgreSQL, {target}{waited}: {hint}"),
        source: err,
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Whether the server at `options`' host and port is something other than PostgreSQL: asked
/// PostgreSQL's first question (an `SSLRequest`, which a PostgreSQL server answers with one
/// byte, `S` or `N`), it answered something else - an HTTP server's `HTTP/1.1 400 Bad Request`,
/// say. Then `Some(the start of its answer)`; `None` when it answered as PostgreSQL does, gave
/// no answer within a second, or could not be asked (a Unix socket, nothing listening).
///
/// A connection attempt to such a server fails with the protocol error of reading its answer
/// as PostgreSQL's (`expected to read 1414811696 bytes`): FORGE asks this to say what is wrong.
pub async fn not_postgres(options: &PgConnectOptions) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if options.get_socket().is_some() {
        return None;
    }
    let ask = async {
        let mut stream =
            tokio::net::TcpStream::connect((options.get_host(), options.get_port())).await?;
        // Length 8, then the SSLRequest code 80877103.
        stream
            .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
            .await?;
        let mut answer = vec![0u8; 64];
        let n = stream.read(&mut answer).await?;
        answer.truncate(n);
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()?
        .ok()?;
    match answer.first() {
        // S or N: PostgreSQL. E: a server too old for SSLRequest, still PostgreSQL.
        None | Some(b'S' | b'N' | b'E') => None,
        Some(_) => {
            let text = String::from_utf8_lossy(&answer);
            let first_line = text.lines().next().unwrap_or_default();
            let shown: String = first_line
                .chars()
                .map(|c| if c.is_control() { '.' } else { c })
                .take(40)
                .collect();
            Some(shown)
        }
    }
}

/// A connection error, said plainly when the server turns out not to be PostgreSQL.
async fn explain(options: &PgConnectOptions, err: sqlx::Error, waited: Duration) -> Error {
    let protocol_trouble = match &err {
        sqlx::Error::Protocol(_) => true,
        sqlx::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::InvalidData
                | std::io::ErrorKind::ConnectionReset
        ),
        _ => false,
    };
    if protocol_trouble && let Some(answer) = not_postgres(options).await {
        return Error::Connect {
            message: format!(
                "cannot connect to PostgreSQL, {}: the server there is not PostgreSQL (it answered {answer:?} to PostgreSQL's first message): check the host and port in DATABASE_URL / [database] url",
                describe_target(options)
            ),
            source: err,
        };
    }
    connect_error(options, err, waited)
}

/// Opens one connection, retrying transient failures until `patience` has passed; fails at once
/// on mistakes (bad password, unknown database, bad URL, a server that is not PostgreSQL).
pub(crate) async fn connect_patiently(
    options: &PgConnectOptions,
    patience: Duration,
) -> Result<PgConnection> {
    let started = Instant::now();
    let mut delay = Duration::from_millis(50);
    loop {
        let remaining = patience.saturating_sub(started.elapsed());
        let attempt =
            tokio::time::timeout(remaining.max(Duration::from_millis(100)), options.connect())
                .await;
        let err = match attempt {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(err)) => err,
            Err(_) => sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connection attempt timed out",
            )),
        };
        let remaining = patience.saturating_sub(started.elapsed());
        if !is_transient(&err) || remaining.is_zero() {
            return Err(explain(options, err, started.elapsed()).await);
        }
        if matches!(err, sqlx::Error::Protocol(_)) && not_postgres(options).await.is_some() {
            // Not a server that may come up: no use waiting.
            return Err(explain(options, err, started.elapsed()).await);
        }
        // The last attempt happens at the deadline.
        tokio::time::sleep(delay.min(remaining)).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// One connection attempt with a bound, for reconnect loops (which do their own backoff).
pub(crate) async fn connect_once(
    options: &PgConnectOptions,
    bound: Duration,
) -> Result<PgConnection> {
    match tokio::time::timeout(bound, options.connect()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(explain(options, err, Duration::ZERO).await),
        Err(_) => Err(connect_error(
            options,
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connection attempt timed out",
            )),
            bound,
        )),
    }
}

/// The node's pool (fenced writes, job claims, the application's own queries).
///
/// Its sessions start with `idle_in_transaction_session_timeout` = the lease: a transaction
/// left open by a process that froze (SIGSTOP, a VM pause) or by a handler that forgot it
/// would hold its row locks - on a job being rescued, say - for as long as the process stays
/// frozen; the server ends it after a lease instead. A statement of the session can set
/// another value for its own work (`SET idle_in_transaction_session_timeout = ...`).
///
/// **The guard.** A connection goes back to the pool only when the server answered, within
/// [`POOL_CHECK_BOUND`], that it is outside any transaction block ([`outside_transaction`],
/// run as sqlx's `after_release` hook); otherwise it is closed and the pool opens another.
/// sqlx 0.9 returns a connection inside a transaction it believes closed when a future is
/// dropped while `Pool::begin`'s `BEGIN` travels (a handler's timeout, a lost leadership, a
/// dropped request): every later user of it would run inside that transaction - enqueues
/// acknowledged but never committed, row locks held for others. The same bound closes a
/// connection whose last statement was abandoned by a timeout and never answered (a
/// half-open session): sqlx's own release ping has no bound, and would hold the pool slot
/// until TCP gives up (it still runs, right after the check was answered). Before a
/// connection is handed out it is pinged with the same bound (sqlx's `before_acquire` hook, in
/// place of its unbounded `test_before_acquire` ping), so that one the server ended while it
/// sat idle (a restart, a failover) is replaced rather than handed out.
pub(crate) fn pool(
    database: &DatabaseConfig,
    options: PgConnectOptions,
    election: &LeaderElectionConfig,
) -> PgPool {
    let idle_in_transaction = election.lease_duration.as_millis().max(1).to_string();
    let options = options.options([(
        "idle_in_transaction_session_timeout",
        idle_in_transaction.as_str(),
    )]);
    guarded(PgPoolOptions::new())
        .max_connections(database.max_connections)
        .min_connections(0)
        // An idle node gives its pool connections back (leader duties run on the roles' lock
        // sessions, job workers release theirs after a second without work).
        .idle_timeout(POOL_IDLE_TIMEOUT)
        .acquire_timeout(database.connect_timeout)
        .connect_lazy_with(options)
}

/// How long a pool connection may stay idle before the pool closes it.
const POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the pool's checks wait for the server's answer before they close the connection
/// (the pool then opens another): a healthy server answers in a millisecond; a connection that
/// is half-open, or still busy with a statement its caller gave up on, does not.
const POOL_CHECK_BOUND: Duration = Duration::from_secs(2);

/// `options` with the node pool's guard (see [`pool`]).
fn guarded(options: PgPoolOptions) -> PgPoolOptions {
    options
        .test_before_acquire(false)
        .before_acquire(|conn, _| {
            Box::pin(async move { bounded(conn.ping()).await.map(|()| true) })
        })
        .after_release(|conn, _| Box::pin(outside_transaction(conn)))
}

/// Whether `conn` is outside any transaction block, by the server's account (sqlx keeps the
/// status of the server's last ReadyForQuery to itself). Over the simple-query protocol a
/// statement's `statement_timestamp()` is the arrival of its message, and in autocommit its
/// transaction starts then too: the two timestamps differ only when an earlier message opened
/// a transaction block. Inside a failed block the statement fails, as it does when the answer
/// takes longer than [`POOL_CHECK_BOUND`] (first the answers of statements still in flight).
async fn outside_transaction(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let row = bounded(
        sqlx::raw_sql("SELECT transaction_timestamp() = statement_timestamp()").fetch_one(conn),
    )
    .await?;
    let outside: bool = row.try_get(0)?;
    if !outside {
        tracing::warn!(target: "forge::pool",
            "a pool connection came back inside a transaction (a BEGIN whose caller was dropped before its answer, or a BEGIN sent as a plain statement): closed, so that nobody else runs inside it");
    }
    Ok(outside)
}

/// `check` within [`POOL_CHECK_BOUND`].
async fn bounded<T>(
    check: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(POOL_CHECK_BOUND, check)
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "a pool connection did not answer its check within {POOL_CHECK_BOUND:?} (half-open, or still busy with an abandoned statement): closed"
                ),
            )))
        })
}

/// [`PgPool::begin`] on a task of its own. The caller's future may be dropped at any moment -
/// a timeout, a lost leadership, a dropped request - without cutting a `BEGIN` in flight: the
/// task owns the transaction until it is handed back, and a transaction nobody takes back is
/// rolled back and its connection returned, as any dropped transaction. (Cut mid-flight, sqlx
/// 0.9 would return the connection inside a transaction it believes never began; the node
/// pool's guard would then close it rather than reuse it.)
pub async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let pool = pool.clone();
    tokio::spawn(async move { pool.begin().await })
        .await
        .unwrap_or_else(|err| {
            Err(sqlx::Error::Io(std::io::Error::other(format!(
                "the task beginning a transaction ended early: {err}"
            ))))
        })
}

/// Refuses transaction-mode poolers. Over a direct connection a session keeps one backend pid
/// for its life, and two concurrent sessions never share a backend. Behind PgBouncer in
/// transaction mode either can break: the pid can change between statements (round robin), or
/// two idle clients are served by the same backend (LIFO reuse). Simple-protocol statements are
/// used so that the check runs before prepared statements could fail confusingly.
pub(crate) async fn check_not_pooled(options: &PgConnectOptions, patience: Duration) -> Result<()> {
    async fn pid(conn: &mut PgConnection) -> Result<i32> {
        let row = sqlx::raw_sql("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await?;
        Ok(row.try_get(0)?)
    }
    let mut a = connect_patiently(options, patience).await?;
    let mut b = connect_patiently(options, patience).await?;
    let a1 = pid(&mut a).await?;
    let b1 = pid(&mut b).await?;
    let a2 = pid(&mut a).await?;
    let _ = a.close().await;
    let _ = b.close().await;
    if a1 != a2 {
        return Err(Error::TransactionPooler {
            evidence: format!("one connection was served by backend {a1}, then by backend {a2}"),
        });
    }
    if a1 == b1 {
        return Err(Error::TransactionPooler {
            evidence: format!("two open connections were both served by backend {a1}"),
        });
    }
    Ok(())
}

/// Session settings of a lock session, so PostgreSQL itself ends a leader that stops renewing.
///
/// * `idle_session_timeout` (PostgreSQL 14+) = the lease: a holder that stays silent that long
///   (SIGSTOP, a long pause, a partition) is disconnected and its lock granted to a waiter.
/// * `tcp_user_timeout` and keepalives end a session whose client host vanished.
/// * `client_connection_check_interval` (14+) lets a backend notice a vanished client while it
///   waits for the lock.
/// * `lock_timeout` bounds the follower's wait inside `pg_advisory_lock`.
/// * `synchronous_commit = on` makes every epoch durable before it is used.
pub(crate) async fn setup_lock_session(
    conn: &mut PgConnection,
    election: &LeaderElectionConfig,
) -> Result<()> {
    let sql = session_settings(election, election.lock_timeout, election.lease_duration);
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Session settings of a node session (membership, LISTEN): those of a lock session, with
/// `lock_wait` bounding the wait for the node's lock and `idle` as `idle_session_timeout`: the
/// node session heartbeats every few seconds, so a session silent for `idle` belongs to a
/// frozen or vanished node (or sits behind a half-open connection) and is ended by the server,
/// which frees the node's id.
pub(crate) fn node_session_settings(
    election: &LeaderElectionConfig,
    lock_wait: std::time::Duration,
    idle: std::time::Duration,
) -> String {
    session_settings(election, lock_wait, idle)
}

fn session_settings(
    election: &LeaderElectionConfig,
    lock_wait: std::time::Duration,
    idle: std::time::Duration,
) -> String {
    let lease_ms = election.lease_duration.as_millis();
    let lock_ms = lock_wait.as_millis().max(1);
    let idle_ms = idle.as_millis().max(1);
    let keepalive_idle = (election.lease_duration.as_secs() / 3).max(1);
    // idle_session_timeout and client_connection_check_interval are PostgreSQL 14 settings:
    // set through a block that ignores servers without them.
    format!(
        "SET lock_timeout = {lock_ms}; SET statement_timeout = 0; \
         SET idle_in_transaction_session_timeout = {lease_ms}; SET synchronous_commit = on; \
         SET tcp_keepalives_idle = {keepalive_idle}; SET tcp_keepalives_interval = 1; \
         SET tcp_keepalives_count = 3; SET tcp_user_timeout = {lease_ms}; \
         DO $$ BEGIN \
             PERFORM set_config('idle_session_timeout', '{idle_ms}', false); \
             PERFORM set_config('client_connection_check_interval', '1000', false); \
         EXCEPTION WHEN undefined_object THEN NULL; END $$;"
    )
}
