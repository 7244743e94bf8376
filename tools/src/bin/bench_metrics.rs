//! What FORGE's Prometheus endpoints cost a cluster with many crons: the series each node serves
//! and, with `--prometheus`, what a real Prometheus scraping the nodes holds.
//!
//! ```text
//! cargo run --release --example bench_metrics                         # 3 nodes, 10,000 crons
//! cargo run --release --example bench_metrics -- --prometheus         # and a real Prometheus
//! cargo run --release --example bench_metrics -- --crons 2000 --nodes 3 --extra-config $'[metrics]\nper_cron = false'
//! ```
//!
//! It starts a throwaway PostgreSQL (forge-testkit) and `--nodes` nodes in this process, each
//! with its own registry served on a free port of 127.0.0.1, all of them campaigning for the
//! three built-in roles and knowing `--crons` per-minute crons `c<i>` at second `i % 60` (the
//! crons of `bench_scale`: the leader of `scheduler` runs `count / 60` of them every second).
//! Once every role has a leader and the scheduler's leader has run its crons for a minute, it
//! counts the samples each node's `GET /metrics` serves (its lines that are not comments).
//!
//! With `--prometheus` it also runs the `prometheus` binary (Debian: `apt-get install
//! prometheus`) with a scrape job for the nodes every 5 s and a data directory of its own, and
//! prints the series in its head block (`/api/v1/status/tsdb`) and per node (`count by
//! (instance) ({job="forge"})`) once two scrapes in a row saw the same numbers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use forge::crons::CronJob;
use forge::{Config, CronContext, CronError, Node, Role, RoleState, Schedule};
use forge_testkit::PgServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    crons: usize,
    nodes: usize,
    extra_config: String,
    prometheus: bool,
    /// How long the crons run before the count.
    settle: Duration,
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    match run(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        crons: 10_000,
        nodes: 3,
        extra_config: String::new(),
        prometheus: false,
        settle: Duration::from_secs(60),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--crons" => {
                options.crons = value("--crons")?
                    .parse()
                    .map_err(|e| format!("--crons: {e}"))?
            }
            "--nodes" => {
                options.nodes = value("--nodes")?
                    .parse()
                    .map_err(|e| format!("--nodes: {e}"))?
            }
            "--settle-secs" => {
                let secs: u64 = value("--settle-secs")?
                    .parse()
                    .map_err(|e| format!("--settle-secs: {e}"))?;
                options.settle = Duration::from_secs(secs);
            }
            "--extra-config" => options.extra_config = value("--extra-config")?,
            "--prometheus" => options.prometheus = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (--crons N, --nodes N, --settle-secs S, --extra-config TOML, --prometheus)"
                ));
            }
        }
    }
    Ok(options)
}

async fn run(options: Options) -> Result<(), BoxError> {
    let server = PgServer::start()?;
    let db = server.create_database().await?;
    println!(
        "== {} nodes x 3 roles, {} per-minute crons each ({} due at every whole second on the scheduler's leader){}",
        options.nodes,
        options.crons,
        options.crons.div_ceil(60),
        if options.extra_config.is_empty() {
            String::new()
        } else {
            format!(", with:\n{}", options.extra_config.trim_end())
        }
    );
    let mut nodes = Vec::new();
    let mut addrs = Vec::new();
    let started = Instant::now();
    for n in 0..options.nodes {
        let id = format!("node-{n}");
        let addr = free_port()?;
        let text = format!(
            "[database]\nurl = \"{}\"\n\n[node]\nid = \"{id}\"\n\n{}",
            db.url(),
            options.extra_config
        );
        let mut config = Config::from_toml(&text)?;
        config.metrics.listen = Some(addr);
        let mut builder = Node::builder(config).auto_register(false);
        for i in 0..options.crons {
            let schedule = Schedule::parse(&format!("{} * * * * *", i % 60))?;
            builder = builder.cron(CronJob::new(
                format!("c{i}"),
                schedule,
                |_ctx: CronContext| async { Ok::<(), CronError>(()) },
            ));
        }
        nodes.push(builder.start().await?);
        addrs.push(addr);
    }
    let leaders = wait_for_leaders(&nodes).await?;
    println!(
        "started and elected in {:.1} s; leaders: {}",
        started.elapsed().as_secs_f64(),
        leaders
            .iter()
            .map(|(role, node)| format!("{role} on {node}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut prometheus = if options.prometheus {
        Some(Prometheus::start(&addrs).await?)
    } else {
        None
    };
    println!(
        "letting the crons run for {} s ...",
        options.settle.as_secs()
    );
    sleep(options.settle).await;

    println!("samples served per node (GET /metrics, lines that are not comments):");
    let mut total = 0;
    for (node, addr) in nodes.iter().zip(&addrs) {
        let started = Instant::now();
        let body = http_get(*addr, "/metrics").await?;
        let took = started.elapsed();
        let samples = body
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count();
        total += samples;
        let led: Vec<&str> = leaders
            .iter()
            .filter(|(_, leader)| leader.as_str() == node.id().to_string())
            .map(|(role, _)| role.as_str())
            .collect();
        println!(
            "  {}: {samples} samples, {:.1} MB, scraped in {} ms (leads: {})",
            node.id(),
            body.len() as f64 / 1e6,
            took.as_millis(),
            if led.is_empty() {
                "nothing".to_owned()
            } else {
                led.join(", ")
            }
        );
    }
    println!("  all nodes: {total} samples");
    if let Some(prometheus) = prometheus.as_mut() {
        prometheus.report(options.nodes).await?;
    }
    for node in nodes {
        node.shutdown().await;
    }
    Ok(())
}

/// Waits until every built-in role has a leader among `nodes` and returns who leads what.
async fn wait_for_leaders(nodes: &[Node]) -> Result<BTreeMap<String, String>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut leaders = BTreeMap::new();
        for role in [
            Role::SCHEDULER,
            Role::METRICS_AGGREGATOR,
            Role::LOG_COMPACTOR,
        ] {
            for node in nodes {
                if matches!(node.role_state(&role), Some(RoleState::Leader { .. })) {
                    leaders.insert(role.name().to_owned(), node.id().to_string());
                }
            }
        }
        if leaders.len() == 3 {
            return Ok(leaders);
        }
        if Instant::now() > deadline {
            return Err(format!("no leader for every role within 120 s: {leaders:?}").into());
        }
        sleep(Duration::from_millis(100)).await;
    }
}

fn free_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// A GET over HTTP/1.0 (so that the answer is never chunked); returns the body.
async fn http_get(addr: SocketAddr, path: &str) -> Result<String, BoxError> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8(response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or("an HTTP answer without a blank line")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!("GET {path} from {addr}: {head}").into());
    }
    Ok(body.to_owned())
}

/// A real Prometheus scraping the nodes every 5 s.
struct Prometheus {
    addr: SocketAddr,
    _process: tokio::process::Child,
    _dir: TempDir,
}

impl Prometheus {
    async fn start(targets: &[SocketAddr]) -> Result<Prometheus, BoxError> {
        let dir = TempDir::new("forge-bench-prometheus")?;
        let targets: Vec<String> = targets.iter().map(|a| format!("'{a}'")).collect();
        let config = dir.0.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 5s\n  scrape_timeout: 5s\nscrape_configs:\n  - job_name: forge\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )?;
        let addr = free_port()?;
        let process = tokio::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.0.join("prometheus.log"))?)
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| {
                format!(
                    "cannot run prometheus ({err}): install it (Debian: apt-get install prometheus)"
                )
            })?;
        let prometheus = Prometheus {
            addr,
            _process: process,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_get(addr, "/-/ready").await.is_err() {
            if Instant::now() > deadline {
                return Err("prometheus did not get ready within 60 s".into());
            }
            sleep(Duration::from_millis(200)).await;
        }
        println!(
            "prometheus {} scraping the nodes every 5 s",
            prometheus.addr
        );
        Ok(prometheus)
    }

    async fn query(&self, promql: &str) -> Result<serde_json::Value, BoxError> {
        let body = http_get(
            self.addr,
            &format!("/api/v1/query?query={}", encode(promql)),
        )
        .await?;
        let answer: serde_json::Value = serde_json::from_str(&body)?;
        Ok(answer["data"]["result"].clone())
    }

    /// Waits until two scrapes in a row saw every node up with the same series, then prints.
    async fn report(&self, nodes: usize) -> Result<(), BoxError> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last = None;
        let (head, per_node) = loop {
            let up = self.query("count(up == 1)").await?;
            let up = up[0]["value"][1].as_str().unwrap_or("0").parse::<usize>()?;
            let status: serde_json::Value =
                serde_json::from_str(&http_get(self.addr, "/api/v1/status/tsdb").await?)?;
            let head = status["data"]["headStats"]["numSeries"]
                .as_u64()
                .unwrap_or_default();
            let mut per_node: Vec<(String, String)> = self
                .query("count by (instance) ({job=\"forge\"})")
                .await?
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|r| {
                    (
                        r["metric"]["instance"].as_str().unwrap_or("").to_owned(),
                        r["value"][1].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect();
            per_node.sort();
            let now = (head, per_node);
            if up == nodes && last.as_ref() == Some(&now) {
                break now;
            }
            if Instant::now() > deadline {
                return Err(format!("prometheus did not settle within 120 s: {now:?}").into());
            }
            last = Some(now);
            sleep(Duration::from_secs(5)).await;
        };
        println!(
            "prometheus: {head} series in its head block; per node (count by (instance) ({{job=\"forge\"}}), up and scrape_* included):"
        );
        for (instance, count) in per_node {
            println!("  {instance}: {count}");
        }
        Ok(())
    }
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A directory removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(prefix: &str) -> std::io::Result<TempDir> {
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
