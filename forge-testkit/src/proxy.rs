//! [`PgProxy`]: a TCP proxy for the PostgreSQL protocol that injects network
//! faults between nodes and a server (silent partitions, resets, late
//! requests, a moved database address).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io;
use std::net::TcpListener as StdTcpListener;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep_until};

use crate::pooler::{CANCEL_REQUEST, GSSENC_REQUEST, SSL_REQUEST, send_fatal};
use crate::{Error, PgServer};

/// PostgreSQL's own limit for startup packets (`MAX_STARTUP_PACKET_LENGTH`).
const MAX_STARTUP_PACKET: usize = 10_000;
/// Pause after a failed `accept` (out of file descriptors, ...), so the
/// accept loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// Read buffer per direction of a connection.
const CHUNK: usize = 16 * 1024;

/// A TCP proxy for the PostgreSQL protocol, placed between the code under
/// test and a server to inject network faults connection by connection.
///
/// It listens on `127.0.0.1` (free port). For each client connection it
/// answers `SSLRequest`/`GSSENCRequest` with `N` itself (so the flow stays
/// plain text and readable), reads the `StartupMessage` to learn the
/// connection's `application_name`, user, database and whether it is a
/// replication connection, then connects to the current upstream and
/// forwards the startup message and everything after it verbatim in both
/// directions (authentication included). `CancelRequest`s are forwarded to
/// the *current* upstream on a one-shot connection.
///
/// Faults, chosen with a [`Filter`]:
///
/// * [`blackhole`](PgProxy::blackhole): matching connections, now and
///   later, go silent in both directions: bytes are read and dropped,
///   nothing is closed. Like a half-open TCP flow or a middlebox dropping a
///   flow: the client gets no error, just no answer; the server sees an idle
///   client. New matching connections are accepted and their startup bytes
///   swallowed, so reconnecting hangs too. A black-holed connection that one
///   side closes stays open on the other side (nobody would tell it).
/// * [`heal`](PgProxy::heal) / [`heal_all`](PgProxy::heal_all): new
///   connections are forwarded again. Connections black-holed already stay
///   dead, as after a real partition: bytes were lost mid-stream, so the
///   protocol cannot resume. [`sever`](PgProxy::sever) them to let their
///   ends notice.
/// * [`sever`](PgProxy::sever): matching connections are reset at once
///   (both sides, TCP `RST`): the next read or write fails with an I/O
///   error. Affects only current connections.
/// * [`delay`](PgProxy::delay): what matching open connections send to the
///   server is held for a while before it is forwarded, in order, like
///   packets retransmitted late: a request reaches the server after its
///   client gave up on it. Answers are not delayed. A client that closes
///   meanwhile still has its bytes delivered, then the server sees the close.
/// * [`retarget`](PgProxy::retarget): new connections go to another server
///   (the database address moved to a promoted standby); existing ones stay
///   where they are.
///
/// **Limitation of a user-space proxy:** the proxy's own TCP stack keeps
/// acknowledging both peers, so a black hole is invisible to TCP keepalives
/// and `tcp_user_timeout` on either side (a real partition would trip
/// them). It is detected only by application-level timeouts: query and
/// lock timeouts, lease deadlines, `idle_session_timeout`,
/// `wal_receiver_timeout`, `wal_sender_timeout`, ...
///
/// The proxy runs on its own thread (with a private tokio runtime), so it
/// keeps forwarding while a test blocks its own thread (for example in
/// [`PgServer::promote`]), whatever the test's runtime. The controls are
/// plain synchronous methods, callable from sync and async code, and take
/// effect before they return: no byte read from a socket afterwards is
/// forwarded against them. Dropping the `PgProxy` closes the listener and
/// every connection, black-holed ones included, before `drop` returns.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use forge_testkit::{Filter, PgProxy, PgServer};
///
/// let server = PgServer::shared()?;
/// let db = server.create_database().await?;
/// let proxy = PgProxy::start(server.host(), server.port())?;
/// let url = proxy.url_for(server, db.name()); // give this to the nodes
/// // ... nodes connect with application_name forge:<purpose>:<node> ...
/// proxy.blackhole(Filter::application_prefix("forge:listen:node-a"));
/// // node-a's LISTEN session now hears nothing, and learns nothing.
/// # Ok(()) }
/// ```
pub struct PgProxy {
    port: u16,
    shared: Arc<Shared>,
    /// Dropped to stop the proxy thread.
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

/// Which connections a [`PgProxy`] fault applies to.
///
/// Connections are known by what their client sent in the startup message.
/// Until it arrives (the first milliseconds of a connection, or forever for
/// a connection black-holed by [`Filter::All`] before it) only
/// [`Filter::All`] and [`Filter::Connection`] match it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Filter {
    /// Every connection, including cancel requests and connections that
    /// have not sent their startup message yet.
    All,
    /// Connections whose `application_name` starts with the prefix. FORGE
    /// names its sessions `forge:<purpose>:<node id>` (`forge:listen:node-a`,
    /// `forge:pool:node-a`, `forge:scheduler:node-a`), so
    /// `"forge:listen:"` selects every node's LISTEN session and
    /// `"forge:pool:node-a"` one node's pool.
    ApplicationPrefix(String),
    /// Replication connections (startup parameter `replication` set and not
    /// false): a standby's WAL receiver, `pg_basebackup`, logical
    /// replication. See [`PgServer::start_standby`].
    Replication,
    /// The connection with this id (see [`PgProxy::connections`]).
    Connection(u64),
}

impl Filter {
    /// [`Filter::ApplicationPrefix`] with `prefix`.
    pub fn application_prefix(prefix: impl Into<String>) -> Filter {
        Filter::ApplicationPrefix(prefix.into())
    }

    /// Whether connection `id` with these startup parameters (`None`: not
    /// received yet) matches.
    fn matches(&self, id: u64, params: Option<&Params>) -> bool {
        match self {
            Filter::All => true,
            Filter::ApplicationPrefix(prefix) => {
                params.is_some_and(|p| p.application_name.starts_with(prefix.as_str()))
            }
            Filter::Replication => params.is_some_and(|p| p.replication),
            Filter::Connection(wanted) => *wanted == id,
        }
    }
}

/// What a [`ProxyConnection`] is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProxyConnectionState {
    /// Accepted; its startup message has not arrived yet (or it is a cancel
    /// request being forwarded).
    Startup,
    /// Forwarding in both directions.
    Forwarding,
    /// Black-holed: whatever arrives from either side is dropped.
    BlackHoled,
}

/// A live connection through a [`PgProxy`], as listed by
/// [`PgProxy::connections`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyConnection {
    /// Unique within the proxy, in order of acceptance (for
    /// [`Filter::Connection`]).
    pub id: u64,
    /// What it is doing.
    pub state: ProxyConnectionState,
    /// `application_name` from the startup message (empty if the client
    /// sent none, or before the startup message).
    pub application_name: String,
    /// `user` from the startup message (empty before it).
    pub user: String,
    /// `database` from the startup message, defaulting to the user as
    /// PostgreSQL does (empty before the startup message).
    pub database: String,
    /// Whether it is a replication connection ([`Filter::Replication`]).
    pub replication: bool,
    /// `host:port` of the server it was forwarded to (`None` if it never
    /// was: before its startup message, or swallowed by a black hole).
    pub upstream: Option<String>,
}

impl PgProxy {
    /// Starts a proxy on `127.0.0.1` (free port) forwarding to
    /// `upstream_host:upstream_port`.
    ///
    /// The upstream is not contacted until a client connects (it may be down
    /// on purpose). Returns once the proxy accepts connections.
    pub fn start(upstream_host: &str, upstream_port: u16) -> Result<PgProxy, Error> {
        let listener = StdTcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| Error::io("PgProxy: binding 127.0.0.1:0", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("PgProxy: reading its local address", e))?
            .port();
        let shared = Arc::new(Shared::new(upstream_host, upstream_port));
        let (shutdown, shutdown_rx) = oneshot::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(format!("forge-pg-proxy-{port}"))
            .spawn({
                let shared = shared.clone();
                move || run_proxy(listener, shared, shutdown_rx, ready_tx)
            })
            .map_err(|e| Error::io("PgProxy: spawning its thread", e))?;
        let started = ready_rx.recv().unwrap_or_else(|_| {
            Err(io::Error::other(
                "the proxy thread ended before it was ready",
            ))
        });
        if let Err(e) = started {
            let _ = thread.join();
            return Err(Error::io("PgProxy: starting its runtime", e));
        }
        Ok(PgProxy {
            port,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address clients connect to: always `127.0.0.1`.
    pub fn host(&self) -> &str {
        "127.0.0.1"
    }

    /// The proxy's TCP port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// URL of `database` on `server`, through this proxy: the URL
    /// [`PgServer::url_for`] gives (same user, password and options) with
    /// host and port replaced by the proxy's, and any `host`, `hostaddr` or
    /// `port` query parameter removed (it would bypass the proxy).
    ///
    /// The proxy forwards to its upstream whatever server the URL names:
    /// pass the server the proxy was started for.
    pub fn url_for(&self, server: &PgServer, database: &str) -> String {
        reroute(&server.url_for(database), self.host(), self.port)
    }

    /// The server new connections are forwarded to, as `(host, port)`.
    pub fn upstream(&self) -> (String, u16) {
        self.shared.lock().target.clone()
    }

    /// Forwards new connections (and cancel requests) to `host:port` from
    /// now on, for example to a promoted standby. Existing connections are
    /// not touched: [`sever`](PgProxy::sever) them to force a reconnect.
    pub fn retarget(&self, host: &str, port: u16) {
        self.shared.lock().target = (host.to_owned(), port);
    }

    /// Black-holes connections matching `filter`: those open now, and every
    /// later one until [`heal`](PgProxy::heal)ed. Returns how many open
    /// connections went silent now (connections still in their startup
    /// phase are caught when their startup message arrives).
    pub fn blackhole(&self, filter: Filter) -> usize {
        let mut state = self.shared.lock();
        let mut silenced = 0;
        for (id, link) in &state.links {
            let open = *link.mode.borrow() == Mode::Open;
            if open && filter.matches(*id, link.params.as_ref()) {
                link.mode.send_replace(Mode::BlackHoled);
                silenced += 1;
            }
        }
        if !state.rules.contains(&filter) {
            state.rules.push(filter);
        }
        silenced
    }

    /// Removes the black hole made by [`blackhole`](PgProxy::blackhole) with
    /// this very filter (compared with `==`, not by what it matches): new
    /// connections it selected are forwarded again. Connections black-holed
    /// already stay dead (see the type docs). Returns whether there was such
    /// a black hole.
    pub fn heal(&self, filter: &Filter) -> bool {
        let mut state = self.shared.lock();
        let before = state.rules.len();
        state.rules.retain(|rule| rule != filter);
        state.rules.len() != before
    }

    /// Removes every black hole: all new connections are forwarded again.
    /// Connections black-holed already stay dead.
    pub fn heal_all(&self) {
        self.shared.lock().rules.clear();
    }

    /// Resets the open connections matching `filter` (black-holed ones
    /// included) at once, on both sides, like a network reset: both peers
    /// get `ECONNRESET` on their next read or write. Later connections are
    /// not affected. Returns how many connections were severed.
    pub fn sever(&self, filter: &Filter) -> usize {
        let state = self.shared.lock();
        let mut severed = 0;
        for (id, link) in &state.links {
            let alive = *link.mode.borrow() != Mode::Severed;
            if alive && filter.matches(*id, link.params.as_ref()) {
                link.mode.send_replace(Mode::Severed);
                severed += 1;
            }
        }
        severed
    }

    /// Holds what the open connections matching `filter` send to the server
    /// for `hold` before forwarding it: bytes read from the client at `t`
    /// reach the server at `t + hold`, in order, whatever happens to the
    /// client meanwhile (a client that closes has its bytes delivered first,
    /// then its close). The server's answers are not delayed. Later
    /// connections are not affected; `Duration::ZERO` ends the delay (bytes
    /// held already keep their times). Returns how many connections are now
    /// delayed. A black hole or a sever drops what is still held.
    pub fn delay(&self, filter: Filter, hold: Duration) -> usize {
        let state = self.shared.lock();
        let mut delayed = 0;
        for (id, link) in &state.links {
            let alive = *link.mode.borrow() != Mode::Severed;
            if alive && filter.matches(*id, link.params.as_ref()) {
                link.hold.send_replace(hold);
                delayed += 1;
            }
        }
        delayed
    }

    /// The live connections, oldest first (severed ones are left out: they
    /// are closing).
    pub fn connections(&self) -> Vec<ProxyConnection> {
        let state = self.shared.lock();
        state
            .links
            .iter()
            .filter_map(|(id, link)| {
                let state = match (*link.mode.borrow(), &link.params) {
                    (Mode::Severed, _) => return None,
                    (Mode::BlackHoled, _) => ProxyConnectionState::BlackHoled,
                    (Mode::Open, None) => ProxyConnectionState::Startup,
                    (Mode::Open, Some(_)) => ProxyConnectionState::Forwarding,
                };
                let params = link.params.clone().unwrap_or_default();
                Some(ProxyConnection {
                    id: *id,
                    state,
                    application_name: params.application_name,
                    user: params.user,
                    database: params.database,
                    replication: params.replication,
                    upstream: link.upstream.clone(),
                })
            })
            .collect()
    }
}

impl fmt::Debug for PgProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("PgProxy")
            .field("port", &self.port)
            .field("upstream", &state.target)
            .field("black_holes", &state.rules)
            .field("connections", &state.links.len())
            .finish()
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        // Closing the channel ends the accept loop; the thread then drops its
        // runtime, which drops every connection task and so closes their
        // sockets. Joining makes that happen before drop returns.
        drop(self.shutdown.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a connection does with the bytes it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Open,
    BlackHoled,
    /// Terminal: close both sides with a reset.
    Severed,
}

/// What the proxy learnt from a client's startup message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Params {
    application_name: String,
    user: String,
    database: String,
    replication: bool,
}

impl Params {
    /// Parses the key/value pairs of a StartupMessage (after the length and
    /// protocol version): NUL-terminated strings, ending with an empty one.
    fn parse(pairs: &[u8]) -> Params {
        let mut params = Params::default();
        let mut database = None;
        let mut fields = pairs
            .split(|b| *b == 0)
            .map(|f| String::from_utf8_lossy(f).into_owned());
        while let (Some(key), Some(value)) = (fields.next(), fields.next()) {
            match key.as_str() {
                "" => break,
                "user" => params.user = value,
                "database" => database = Some(value),
                "application_name" => params.application_name = value,
                // "true"/"on"/"yes"/"1" (physical) or "database" (logical).
                "replication" => {
                    params.replication = !matches!(
                        value.to_ascii_lowercase().as_str(),
                        "false" | "off" | "no" | "0"
                    );
                }
                _ => {}
            }
        }
        params.database = database
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| params.user.clone());
        params
    }
}

/// State shared by the controls and the proxy thread.
struct Shared {
    state: Mutex<State>,
}

struct State {
    /// Where new connections go.
    target: (String, u16),
    /// Active black holes.
    rules: Vec<Filter>,
    links: BTreeMap<u64, LinkState>,
    next_id: u64,
}

struct LinkState {
    params: Option<Params>,
    upstream: Option<String>,
    /// The connection's task watches this.
    mode: watch::Sender<Mode>,
    /// How long what the client sends is held before it is forwarded.
    hold: watch::Sender<Duration>,
}

impl Shared {
    fn new(host: &str, port: u16) -> Shared {
        Shared {
            state: Mutex::new(State {
                target: (host.to_owned(), port),
                rules: Vec::new(),
                links: BTreeMap::new(),
                next_id: 1,
            }),
        }
    }

    /// Never held across an `.await`, so a std mutex is right (and lets the
    /// controls be synchronous).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection's registration in [`Shared`]; removed when dropped, which
/// happens when the connection's task ends or is dropped with the runtime.
struct Link {
    shared: Arc<Shared>,
    id: u64,
    mode: watch::Receiver<Mode>,
    hold: watch::Receiver<Duration>,
}

impl Link {
    /// Registers a new connection. A black hole matching connections not
    /// yet identified ([`Filter::All`]) swallows it from its first byte.
    fn register(shared: Arc<Shared>) -> Link {
        let (id, mode, hold) = {
            let mut state = shared.lock();
            let id = state.next_id;
            state.next_id += 1;
            let silent = state.rules.iter().any(|rule| rule.matches(id, None));
            let (tx, rx) = watch::channel(if silent { Mode::BlackHoled } else { Mode::Open });
            let (hold_tx, hold) = watch::channel(Duration::ZERO);
            let link = LinkState {
                params: None,
                upstream: None,
                mode: tx,
                hold: hold_tx,
            };
            state.links.insert(id, link);
            (id, rx, hold)
        };
        Link {
            shared,
            id,
            mode,
            hold,
        }
    }

    /// Records the startup parameters and decides, atomically with respect
    /// to the controls: `Some(upstream)` to forward to, or `None` if the
    /// connection is black-holed (or severed) and must not be forwarded.
    fn identified(&self, params: Params) -> Option<(String, u16)> {
        let mut state = self.shared.lock();
        let silent = state
            .rules
            .iter()
            .any(|rule| rule.matches(self.id, Some(&params)));
        let target = state.target.clone();
        let link = state.links.get_mut(&self.id)?;
        link.params = Some(params);
        if silent && *link.mode.borrow() == Mode::Open {
            link.mode.send_replace(Mode::BlackHoled);
        }
        if *link.mode.borrow() != Mode::Open {
            return None;
        }
        link.upstream = Some(format!("{}:{}", target.0, target.1));
        Some(target)
    }

    fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Completes when the connection is severed.
    async fn severed(&self) {
        let mut mode = self.mode.clone();
        // An error means the sender is gone: the proxy is shutting down.
        let _ = mode.wait_for(|m| *m == Mode::Severed).await;
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.lock().links.remove(&self.id);
    }
}

/// The proxy thread: a private runtime running the accept loop until
/// `shutdown` closes. Dropping the runtime at the end drops every
/// connection task, closing their sockets.
fn run_proxy(
    listener: StdTcpListener,
    shared: Arc<Shared>,
    shutdown: oneshot::Receiver<()>,
    ready: mpsc::Sender<io::Result<()>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        accept_loop(listener, shared, shutdown).await;
    });
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    tokio::spawn(serve(shared.clone(), socket));
                }
                Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
            },
        }
    }
}

/// What a client's first packets asked for.
enum Opening {
    /// A StartupMessage: the raw packet (forwarded verbatim) and what it says.
    Session { packet: Vec<u8>, params: Params },
    /// A CancelRequest packet.
    Cancel(Vec<u8>),
    /// The connection was black-holed before it was identified.
    BlackHoled,
    /// The client left, or spoke something other than PostgreSQL.
    Closed,
}

/// One client connection, from accept to close.
async fn serve(shared: Arc<Shared>, mut client: TcpStream) {
    let _ = client.set_nodelay(true);
    let link = Link::register(shared);
    let opening = tokio::select! {
        biased;
        () = link.severed() => Ok(Opening::Closed),
        opening = read_opening(&mut client, &link) => opening,
    };
    match opening {
        Ok(Opening::Session { packet, params }) => match link.identified(params) {
            Some(target) => forward_session(&link, &mut client, &packet, target).await,
            None => drain(&link, &mut client).await,
        },
        Ok(Opening::Cancel(packet)) => forward_cancel(&link, &packet).await,
        Ok(Opening::BlackHoled) => drain(&link, &mut client).await,
        Ok(Opening::Closed) | Err(_) => {}
    }
    if link.mode() == Mode::Severed {
        // An abortive close: the client gets ECONNRESET, as from a reset.
        let _ = client.set_zero_linger();
    }
}

/// Handles SSL/GSS encryption requests (declined: the proxy must read the
/// flow) until the StartupMessage or a CancelRequest arrives.
async fn read_opening(client: &mut TcpStream, link: &Link) -> io::Result<Opening> {
    loop {
        let Some(packet) = read_startup_packet(client).await? else {
            return Ok(Opening::Closed);
        };
        if link.mode() != Mode::Open {
            // Swallowed: not even the answer to an SSLRequest gets out.
            return Ok(Opening::BlackHoled);
        }
        match i32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]) {
            SSL_REQUEST | GSSENC_REQUEST => client.write_all(b"N").await?,
            CANCEL_REQUEST => return Ok(Opening::Cancel(packet)),
            // Protocol 3.x, any minor version: the server negotiates it.
            version if version >> 16 == 3 => {
                let params = Params::parse(&packet[8..]);
                return Ok(Opening::Session { packet, params });
            }
            other => {
                let message = format!("PgProxy: unsupported protocol version or request {other}");
                send_fatal(client, &message).await?;
                return Ok(Opening::Closed);
            }
        }
    }
}

/// A startup-phase packet (length, then a 4-byte code, no type byte),
/// whole; `None` on EOF before it.
async fn read_startup_packet(client: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match client.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let declared = i32::from_be_bytes(len);
    let size = usize::try_from(declared)
        .ok()
        .filter(|n| (8..=MAX_STARTUP_PACKET).contains(n))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("invalid startup packet length {declared}"),
            )
        })?;
    let mut packet = vec![0u8; size];
    packet[..4].copy_from_slice(&len);
    client.read_exact(&mut packet[4..]).await?;
    Ok(Some(packet))
}

/// Connects to the upstream, sends the startup message and forwards both
/// ways until the connection ends.
async fn forward_session(
    link: &Link,
    client: &mut TcpStream,
    packet: &[u8],
    (host, port): (String, u16),
) {
    let connected = tokio::select! {
        biased;
        () = link.severed() => return,
        connected = TcpStream::connect((host.as_str(), port)) => connected,
    };
    let mut upstream = match connected {
        Ok(upstream) => upstream,
        Err(_) if link.mode() != Mode::Open => return drain(link, client).await,
        Err(e) => {
            // Like a pooler: the client learns why, as a connection failure.
            let message =
                format!("PgProxy: cannot connect to the upstream server {host}:{port}: {e}");
            let _ = send_fatal(client, &message).await;
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    // Black-holed while connecting: the startup message is lost like
    // anything else from then on.
    if link.mode() == Mode::Open && upstream.write_all(packet).await.is_err() {
        return;
    }
    forward_both_ways(link, client, &mut upstream).await;
    if link.mode() == Mode::Severed {
        let _ = upstream.set_zero_linger();
    }
}

async fn forward_both_ways(link: &Link, client: &mut TcpStream, upstream: &mut TcpStream) {
    let (mut client_rx, mut client_tx) = client.split();
    let (mut upstream_rx, mut upstream_tx) = upstream.split();
    let hold = Some(link.hold.clone());
    let to_upstream = pump(
        &mut client_rx,
        Some(&mut upstream_tx),
        link.mode.clone(),
        hold,
    );
    let to_client = pump(
        &mut upstream_rx,
        Some(&mut client_tx),
        link.mode.clone(),
        None,
    );
    tokio::pin!(to_upstream, to_client);
    let client_side_ended = tokio::select! {
        _ = &mut to_upstream => true,
        ended = &mut to_client => {
            // The client is gone while the server still talks: what it sent before
            // may still be held (a delay); deliver that first.
            if ended == Ended::WriteFailed {
                to_upstream.await;
                return;
            }
            false
        }
    };
    // While forwarding, one side closing ends the connection (both sockets
    // close on return). A black-holed flow is half-open: the other side is
    // told nothing, so keep draining it until it closes too or is severed.
    if link.mode() == Mode::BlackHoled {
        if client_side_ended {
            to_client.await;
        } else {
            to_upstream.await;
        }
    }
}

/// Reads and drops everything the client sends until it closes or the
/// connection is severed (a black-holed connection that was never forwarded).
async fn drain(link: &Link, client: &mut TcpStream) {
    pump(client, None::<&mut TcpStream>, link.mode.clone(), None).await;
}

/// Why a [`pump`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The source closed (or failed), and nothing it sent is held any more.
    SourceClosed,
    /// Writing to the destination failed.
    WriteFailed,
    /// The connection was severed.
    Severed,
}

/// Copies `src` to `dst` while the connection is open; drops what it reads
/// once black-holed (or always, without `dst`). With `hold`, each chunk is
/// forwarded that long after it was read, in order (held chunks keep going
/// after `src` closes). Returns on EOF or an error of either side (once
/// nothing is held), or when severed.
async fn pump<R, W>(
    src: &mut R,
    mut dst: Option<&mut W>,
    mut mode: watch::Receiver<Mode>,
    hold: Option<watch::Receiver<Duration>>,
) -> Ended
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    let mut held: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut reading = true;
    loop {
        if !reading && held.is_empty() {
            return Ended::SourceClosed;
        }
        let due = held.front().map(|(at, _)| *at);
        // Biased: a sever wins over data that arrived at the same time.
        let chunk = tokio::select! {
            biased;
            _ = mode.wait_for(|m| *m == Mode::Severed) => return Ended::Severed,
            _ = async { sleep_until(due.expect("guarded")).await }, if due.is_some() => {
                held.pop_front().map(|(_, chunk)| chunk)
            }
            read = src.read(&mut buf), if reading => match read {
                Ok(0) | Err(_) => {
                    reading = false;
                    None
                }
                Ok(n) => {
                    let hold = hold.as_ref().map_or(Duration::ZERO, |h| *h.borrow());
                    if hold.is_zero() && held.is_empty() {
                        Some(buf[..n].to_vec())
                    } else {
                        held.push_back((Instant::now() + hold, buf[..n].to_vec()));
                        None
                    }
                }
            },
        };
        let Some(chunk) = chunk else {
            continue;
        };
        // Checked when forwarding: bytes read (or held) after blackhole()
        // returned are never forwarded.
        if *mode.borrow() != Mode::Open {
            continue;
        }
        let Some(dst) = dst.as_deref_mut() else {
            continue;
        };
        let written = tokio::select! {
            biased;
            // Black-holed or severed mid-write: the rest is lost.
            _ = mode.wait_for(|m| *m != Mode::Open) => Ok(()),
            written = dst.write_all(&chunk) => written,
        };
        if written.is_err() {
            return Ended::WriteFailed;
        }
    }
}

/// Forwards a CancelRequest to the current upstream on a one-shot
/// connection, and waits until the server closes it (it has then processed
/// the request), so the client sees the same sequence as without the proxy.
async fn forward_cancel(link: &Link, packet: &[u8]) {
    let (host, port) = link.shared.lock().target.clone();
    let forward = async {
        let mut upstream = TcpStream::connect((host.as_str(), port)).await?;
        upstream.write_all(packet).await?;
        let mut rest = [0u8; 64];
        while upstream.read(&mut rest).await? > 0 {}
        io::Result::Ok(())
    };
    tokio::select! {
        biased;
        () = link.severed() => {}
        _ = forward => {}
    }
}

/// `url` with its host and port replaced by `host:port`, keeping user,
/// password, database and options, minus the query parameters that would
/// override the address (`host`, `hostaddr`, `port`).
fn reroute(url: &str, host: &str, port: u16) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority
        .rsplit_once('@')
        .map(|(userinfo, _)| format!("{userinfo}@"))
        .unwrap_or_default();
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let key = pair.split('=').next().unwrap_or_default();
            !pair.is_empty() && !matches!(key, "host" | "hostaddr" | "port")
        })
        .collect();
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    format!("{scheme}://{userinfo}{host}:{port}{path}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn startup_pairs(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (key, value) in pairs {
            body.extend_from_slice(key.as_bytes());
            body.push(0);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        body
    }

    #[test]
    fn parses_startup_parameters() {
        let params = Params::parse(&startup_pairs(&[
            ("user", "postgres"),
            ("database", "app"),
            ("application_name", "forge:listen:node-a"),
            ("client_encoding", "UTF8"),
        ]));
        assert_eq!(
            params,
            Params {
                application_name: "forge:listen:node-a".to_owned(),
                user: "postgres".to_owned(),
                database: "app".to_owned(),
                replication: false,
            }
        );
        // The database defaults to the user; replication=true/database counts.
        let walreceiver = Params::parse(&startup_pairs(&[
            ("user", "postgres"),
            ("replication", "true"),
            ("application_name", "standby"),
        ]));
        assert_eq!(walreceiver.database, "postgres");
        assert!(walreceiver.replication);
        assert!(Params::parse(&startup_pairs(&[("replication", "database")])).replication);
        assert!(!Params::parse(&startup_pairs(&[("replication", "off")])).replication);
        assert_eq!(Params::parse(&[]), Params::default());
    }

    #[test]
    fn filters_match_what_they_say() {
        let listen = Params {
            application_name: "forge:listen:node-a".to_owned(),
            ..Params::default()
        };
        let replication = Params {
            replication: true,
            ..Params::default()
        };
        let prefix = Filter::application_prefix("forge:listen:");
        assert!(prefix.matches(1, Some(&listen)));
        assert!(!prefix.matches(1, Some(&replication)));
        assert!(
            !prefix.matches(1, None),
            "unidentified connections match only All"
        );
        assert!(Filter::Replication.matches(1, Some(&replication)));
        assert!(!Filter::Replication.matches(1, Some(&listen)));
        assert!(Filter::All.matches(1, None));
        assert!(Filter::Connection(7).matches(7, None));
        assert!(!Filter::Connection(7).matches(8, Some(&listen)));
    }

    #[test]
    fn reroutes_urls_through_the_proxy() {
        assert_eq!(
            reroute("postgres://postgres@127.0.0.1:5432/db", "127.0.0.1", 6000),
            "postgres://postgres@127.0.0.1:6000/db"
        );
        assert_eq!(
            reroute(
                "postgresql://u:p%40ss@[::1]:5433/db?sslmode=disable&host=/run/pg&port=1",
                "127.0.0.1",
                6000
            ),
            "postgresql://u:p%40ss@127.0.0.1:6000/db?sslmode=disable"
        );
        assert_eq!(
            reroute("postgres://db.example?application_name=x", "127.0.0.1", 1),
            "postgres://127.0.0.1:1?application_name=x"
        );
    }
}
