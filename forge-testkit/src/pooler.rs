//! A TCP proxy behaving like PgBouncer in *transaction* pooling mode.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use crate::{Error, PgServer};

const PROTOCOL_3_0: i32 = 196_608;
/// Request codes of the startup phase (shared with [`PgProxy`](crate::PgProxy)).
pub(crate) const SSL_REQUEST: i32 = 80_877_103;
pub(crate) const GSSENC_REQUEST: i32 = 80_877_104;
pub(crate) const CANCEL_REQUEST: i32 = 80_877_102;
/// Larger messages are treated as a protocol error.
const MAX_MESSAGE: usize = 1 << 30;

/// A TCP proxy that behaves like PgBouncer in *transaction* mode, so FORGE
/// (or your code) can prove it detects and refuses such a pooler.
///
/// It speaks just enough of the PostgreSQL wire protocol (message framing):
///
/// * each client is authenticated by the proxy itself (`AuthenticationOk`,
///   server parameters copied from a real backend, a fake `BackendKeyData`);
/// * the proxy keeps up to `server_connections` connections to the real
///   server, opened lazily, logged in as the user of the server's URL
///   (`postgres` on a throwaway cluster) with trust authentication;
/// * when a client that holds no backend sends a message, the proxy takes a
///   backend from the pool, last-returned first (PgBouncer's default), and
///   forwards messages both ways until the backend reports `ReadyForQuery`
///   with status *idle* (transaction finished) and no other `Sync`/`Query`
///   of the client is pending; then the backend goes back to the pool. If no
///   backend is free, the client waits.
///
/// This reproduces the real hazards: session state (advisory locks, `SET`,
/// `LISTEN`, prepared statements) stays on whichever backend served that
/// transaction, two client connections can be served by the same backend,
/// and one client connection can be served by different backends from one
/// statement to the next.
///
/// Limitations (like a real transaction pooler, on purpose or for brevity):
/// clients' prepared statements land on one backend and are missing on the
/// others, so sqlx's statement cache (named prepared statements) fails with
/// "prepared statement ... does not exist" or "already exists" as soon as
/// more than one backend or client is involved: use `sqlx::raw_sql` (simple
/// query protocol). Extended-protocol messages (Parse/Bind/Describe/Execute/
/// Sync/Flush) and COPY are nevertheless forwarded transparently. Startup
/// parameters of clients are not applied to backends; cancel requests are
/// ignored; only trust authentication towards the server is supported. If a
/// client disconnects while holding a backend (mid-transaction), that
/// backend is closed rather than reused.
///
/// The proxy runs as tasks of the tokio runtime that called
/// [`TxPooler::start`]; dropping the `TxPooler` stops it and closes all its
/// connections.
///
/// ```no_run
/// # async fn demo() -> Result<(), forge_testkit::Error> {
/// use forge_testkit::{PgServer, TxPooler};
///
/// let server = PgServer::shared()?;
/// let db = server.create_database().await?;
/// let pooler = TxPooler::start(server, db.name(), 2).await?;
/// // Give pooler.url() to the code under test: it should refuse it.
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TxPooler {
    port: u16,
    database: String,
    accept: JoinHandle<()>,
}

impl TxPooler {
    /// Starts the proxy on `127.0.0.1` (free port) in front of `database` on
    /// `server`, with at most `server_connections` backends. Opens one
    /// backend right away to check the server and copy its parameters.
    pub async fn start(
        server: &PgServer,
        database: &str,
        server_connections: usize,
    ) -> Result<TxPooler, Error> {
        if server_connections == 0 {
            return Err(Error::Proxy(
                "server_connections must be at least 1".to_owned(),
            ));
        }
        let upstream = UpstreamConfig {
            host: server.host().to_owned(),
            port: server.port(),
            user: server_user(server),
            database: database.to_owned(),
        };
        let (first, params) = upstream.connect().await.map_err(Error::Proxy)?;
        let mut slots: Vec<Option<Backend>> = (1..server_connections).map(|_| None).collect();
        slots.push(Some(first));
        let pool = Arc::new(Pool {
            config: upstream,
            params,
            slots: Mutex::new(slots),
            free: Semaphore::new(server_connections),
        });
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| Error::io("TxPooler: binding 127.0.0.1:0", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("TxPooler: local address", e))?
            .port();
        let accept = tokio::spawn(async move {
            // Dropping the JoinSet (when this task is aborted) aborts every session.
            let mut sessions = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        if let Ok((socket, _)) = accepted {
                            let _ = socket.set_nodelay(true);
                            sessions.spawn(serve_client(socket, pool.clone()));
                        }
                    }
                    Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                }
            }
        });
        Ok(TxPooler {
            port,
            database: database.to_owned(),
            accept,
        })
    }

    /// The proxy's URL: `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port, self.database
        )
    }

    /// The proxy's TCP port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TxPooler {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The user name the proxy logs in with: the one in the server's URL.
fn server_user(server: &PgServer) -> String {
    let url = server.url();
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    authority
        .rsplit_once('@')
        .map(|(userinfo, _)| userinfo.split(':').next().unwrap_or_default().to_owned())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres".to_owned())
}

/// One protocol message: type byte and body (without the length).
struct Message {
    tag: u8,
    body: Vec<u8>,
}

impl Message {
    fn new(tag: u8, body: Vec<u8>) -> Self {
        Message { tag, body }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + self.body.len());
        out.push(self.tag);
        out.extend_from_slice(&frame_len(self.body.len()).to_be_bytes());
        out.extend_from_slice(&self.body);
        out
    }
}

fn frame_len(body: usize) -> i32 {
    i32::try_from(body + 4).unwrap_or(i32::MAX)
}

/// Reads whole messages; cancel-safe (partial input stays in `buf`).
struct MessageReader<R> {
    inner: R,
    buf: Vec<u8>,
}

impl<R: AsyncRead + Unpin> MessageReader<R> {
    fn new(inner: R) -> Self {
        MessageReader {
            inner,
            buf: Vec::new(),
        }
    }

    /// Reads more input; `Ok(false)` on a clean EOF at a message boundary.
    async fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 8192];
        let n = self.inner.read(&mut chunk).await?;
        if n == 0 {
            return if self.buf.is_empty() {
                Ok(false)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-message",
                ))
            };
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(true)
    }

    /// A regular message (type byte + length); `None` on EOF.
    async fn next(&mut self) -> io::Result<Option<Message>> {
        loop {
            if self.buf.len() >= 5 {
                let len = read_len(&self.buf[1..5])?;
                if self.buf.len() > len {
                    let body = self.buf[5..=len].to_vec();
                    let tag = self.buf[0];
                    self.buf.drain(..=len);
                    return Ok(Some(Message::new(tag, body)));
                }
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// A startup-phase packet (length, no type byte): returns its body; `None` on EOF.
    async fn next_startup(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if self.buf.len() >= 4 {
                let len = read_len(&self.buf[..4])?;
                if self.buf.len() >= len {
                    let body = self.buf[4..len].to_vec();
                    self.buf.drain(..len);
                    return Ok(Some(body));
                }
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }
}

/// A length field (which counts itself) as usize.
fn read_len(bytes: &[u8]) -> io::Result<usize> {
    let len = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    usize::try_from(len)
        .ok()
        .filter(|l| (4..=MAX_MESSAGE).contains(l))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("invalid message length {len}"),
            )
        })
}

/// A backend connection to the real server.
struct Backend {
    reader: MessageReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

struct UpstreamConfig {
    host: String,
    port: u16,
    user: String,
    database: String,
}

impl UpstreamConfig {
    /// Opens and logs in a backend; returns it with the server's parameters.
    async fn connect(&self) -> Result<(Backend, Vec<(String, String)>), String> {
        let target = format!("{}:{}", self.host, self.port);
        let socket = TcpStream::connect(&target)
            .await
            .map_err(|e| format!("cannot connect to the server at {target}: {e}"))?;
        let _ = socket.set_nodelay(true);
        let (read, mut writer) = socket.into_split();
        let mut reader = MessageReader::new(read);

        let mut body = PROTOCOL_3_0.to_be_bytes().to_vec();
        for (key, value) in [
            ("user", self.user.as_str()),
            ("database", self.database.as_str()),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("application_name", "forge-testkit-txpooler"),
        ] {
            push_cstr(&mut body, key);
            push_cstr(&mut body, value);
        }
        body.push(0);
        let mut packet = frame_len(body.len()).to_be_bytes().to_vec();
        packet.extend_from_slice(&body);
        let io_err = |e: io::Error| format!("talking to the server at {target}: {e}");
        writer.write_all(&packet).await.map_err(io_err)?;

        let mut params = Vec::new();
        loop {
            let Some(msg) = reader.next().await.map_err(io_err)? else {
                return Err(format!(
                    "the server at {target} closed the connection during startup"
                ));
            };
            match msg.tag {
                b'R' => {
                    let code = msg
                        .body
                        .get(..4)
                        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                    if code != Some(0) {
                        return Err(format!(
                            "the server at {target} asks user {:?} for authentication (request {code:?}); \
                             TxPooler supports only trust authentication (use a throwaway PgServer)",
                            self.user
                        ));
                    }
                }
                b'S' => {
                    let mut fields = msg
                        .body
                        .split(|b| *b == 0)
                        .map(|f| String::from_utf8_lossy(f).into_owned());
                    if let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                        params.push((name, value));
                    }
                }
                b'E' => {
                    return Err(format!(
                        "the server at {target} refused the login: {}",
                        error_text(&msg.body)
                    ));
                }
                b'Z' => return Ok((Backend { reader, writer }, params)),
                _ => {} // BackendKeyData, notices
            }
        }
    }
}

/// The human part of an ErrorResponse body.
fn error_text(body: &[u8]) -> String {
    body.split(|b| *b == 0)
        .filter(|f| f.first().is_some_and(|t| matches!(t, b'S' | b'M' | b'D')))
        .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
        .collect::<Vec<_>>()
        .join(": ")
}

fn push_cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// The backends: a LIFO stack of slots (`None`: not connected yet or
/// discarded; kept at the bottom), and a semaphore counting free slots.
struct Pool {
    config: UpstreamConfig,
    params: Vec<(String, String)>,
    slots: Mutex<Vec<Option<Backend>>>,
    free: Semaphore,
}

impl Pool {
    async fn acquire(&self) -> Result<Backend, String> {
        let permit = self
            .free
            .acquire()
            .await
            .map_err(|_| "pool closed".to_owned())?;
        permit.forget();
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .flatten();
        match slot {
            Some(backend) => Ok(backend),
            None => match self.config.connect().await {
                Ok((backend, _)) => Ok(backend),
                Err(e) => {
                    self.discard();
                    Err(e)
                }
            },
        }
    }

    /// Returns a backend whose transaction is finished (on top: LIFO).
    fn release(&self, backend: Backend) {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Some(backend));
        self.free.add_permits(1);
    }

    /// Gives up a slot's backend (broken or dirty); a new one is opened on demand.
    fn discard(&self) {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(0, None);
        self.free.add_permits(1);
    }

    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What happened while a backend was attached.
enum Event {
    Client(io::Result<Option<Message>>),
    Server(io::Result<Option<Message>>),
}

async fn serve_client(socket: TcpStream, pool: Arc<Pool>) {
    let (read, mut writer) = socket.into_split();
    let mut client = MessageReader::new(read);
    let application_name = match client_startup(&mut client, &mut writer).await {
        Ok(Some(name)) => name,
        Ok(None) | Err(_) => return,
    };
    if greet(&mut writer, &pool, &application_name).await.is_err() {
        return;
    }

    let mut attached: Option<Backend> = None;
    // Client Query/Sync/FunctionCall messages not yet answered by ReadyForQuery.
    let mut pending: usize = 0;
    loop {
        let event = match attached.as_mut() {
            None => {
                let msg = match client.next().await {
                    Ok(Some(msg)) if msg.tag != b'X' => msg,
                    _ => return, // EOF, error or Terminate: nothing to clean up
                };
                let mut backend = match pool.acquire().await {
                    Ok(backend) => backend,
                    Err(e) => {
                        let _ = send_fatal(
                            &mut writer,
                            &format!("TxPooler: no server connection: {e}"),
                        )
                        .await;
                        return;
                    }
                };
                if backend.writer.write_all(&msg.encode()).await.is_err() {
                    pool.discard();
                    let _ = send_fatal(&mut writer, "TxPooler: server connection lost").await;
                    return;
                }
                pending += counts_as_pending(msg.tag);
                attached = Some(backend);
                continue;
            }
            Some(backend) => tokio::select! {
                msg = client.next() => Event::Client(msg),
                msg = backend.reader.next() => Event::Server(msg),
            },
        };
        match event {
            Event::Client(Ok(Some(msg))) if msg.tag != b'X' => {
                let backend = attached.as_mut().expect("attached");
                if backend.writer.write_all(&msg.encode()).await.is_err() {
                    drop(attached.take());
                    pool.discard();
                    let _ = send_fatal(&mut writer, "TxPooler: server connection lost").await;
                    return;
                }
                pending += counts_as_pending(msg.tag);
            }
            Event::Client(_) => {
                // The client left while holding a backend, maybe mid-transaction:
                // that backend is dirty, close it.
                drop(attached.take());
                pool.discard();
                return;
            }
            Event::Server(Ok(Some(msg))) => {
                let finished = msg.tag == b'Z' && {
                    pending = pending.saturating_sub(1);
                    pending == 0 && msg.body.first() == Some(&b'I')
                };
                let sent = writer.write_all(&msg.encode()).await;
                if finished {
                    pool.release(attached.take().expect("attached"));
                } else if sent.is_err() {
                    drop(attached.take());
                    pool.discard();
                }
                if sent.is_err() {
                    return;
                }
            }
            Event::Server(_) => {
                drop(attached.take());
                pool.discard();
                let _ = send_fatal(&mut writer, "TxPooler: server connection lost").await;
                return;
            }
        }
    }
}

fn counts_as_pending(tag: u8) -> usize {
    usize::from(matches!(tag, b'Q' | b'S' | b'F'))
}

/// Handles SSL/GSS requests and the StartupMessage. `Some(application_name)`
/// when the client may proceed.
async fn client_startup(
    client: &mut MessageReader<OwnedReadHalf>,
    writer: &mut (impl AsyncWrite + Unpin),
) -> io::Result<Option<String>> {
    loop {
        let Some(body) = client.next_startup().await? else {
            return Ok(None);
        };
        if body.len() < 4 {
            return Ok(None);
        }
        match i32::from_be_bytes([body[0], body[1], body[2], body[3]]) {
            SSL_REQUEST | GSSENC_REQUEST => writer.write_all(b"N").await?,
            PROTOCOL_3_0 => {
                let fields: Vec<String> = body[4..]
                    .split(|b| *b == 0)
                    .map(|f| String::from_utf8_lossy(f).into_owned())
                    .collect();
                let application_name = fields
                    .chunks(2)
                    .find(|kv| kv.len() == 2 && kv[0] == "application_name")
                    .map(|kv| kv[1].clone())
                    .unwrap_or_default();
                return Ok(Some(application_name));
            }
            CANCEL_REQUEST => return Ok(None),
            other => {
                send_fatal(writer, &format!("TxPooler: unsupported protocol {other}")).await?;
                return Ok(None);
            }
        }
    }
}

/// AuthenticationOk, parameters, BackendKeyData, ReadyForQuery.
async fn greet(
    writer: &mut (impl AsyncWrite + Unpin),
    pool: &Pool,
    application_name: &str,
) -> io::Result<()> {
    let mut out = Message::new(b'R', 0i32.to_be_bytes().to_vec()).encode();
    let parameters = [
        (
            "server_version",
            pool.param("server_version").unwrap_or("15.0"),
        ),
        ("client_encoding", "UTF8"),
        ("server_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("TimeZone", pool.param("TimeZone").unwrap_or("UTC")),
        ("application_name", application_name),
    ];
    for (name, value) in parameters {
        let mut body = Vec::new();
        push_cstr(&mut body, name);
        push_cstr(&mut body, value);
        out.extend(Message::new(b'S', body).encode());
    }
    let mut key = fastrand::i32(1..i32::MAX).to_be_bytes().to_vec();
    key.extend_from_slice(&fastrand::i32(..).to_be_bytes());
    out.extend(Message::new(b'K', key).encode());
    out.extend(Message::new(b'Z', vec![b'I']).encode());
    writer.write_all(&out).await
}

/// Sends a FATAL ErrorResponse (SQLSTATE 08006, connection failure).
pub(crate) async fn send_fatal(
    writer: &mut (impl AsyncWrite + Unpin),
    message: &str,
) -> io::Result<()> {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "08006"),
        (b'M', message),
    ] {
        body.push(field);
        push_cstr(&mut body, value);
    }
    body.push(0);
    writer.write_all(&Message::new(b'E', body).encode()).await
}
