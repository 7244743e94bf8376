//! The dashboard in a real browser: headless Chromium driven over WebDriver (chromedriver,
//! through `fantoccini`), against a real cluster on a real PostgreSQL. Every page loads
//! without a console error; each role's leader appears; a SIGKILLed leader process is
//! replaced and the failover (with its gap) shows on the page within seconds; a dead job is
//! retried from the page and completes; read-only mode hides the actions; screenshots are
//! written to `target/dashboard-screenshots/`.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian packages `chromium` and
//! `chromium-driver`; `.ci/run` installs them), or `FORGE_CHROMIUM` / `FORGE_CHROMEDRIVER`
//! naming other paths. Without them the tests fail, saying so.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use forge::inspect::{Cluster, Workload};
use forge::jobs::{JobState, NewJob};
use forge::{Config, LockNamespace};
use forge_testkit::{NodeProcess, wait_for};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::jobs::{Behave, job_config, plain, setup, wait_state};
use crate::support::*;

const TOKEN: &str = "dashboard-test-token-5f1c2a";
const ALL: [&str; 3] = ["scheduler", "metrics_aggregator", "log_compactor"];
const PAGES: [&str; 7] = [
    "overview",
    "leadership",
    "events",
    "nodes",
    "crons",
    "jobs",
    "charts",
];

/// How long a page may take to show what the cluster did: a few polls of the default 2 s
/// interval, with room for a CI machine busy with the other tests.
const PAGE_DEADLINE: Duration = Duration::from_secs(15);

fn program(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// Where the screenshots go: `<target>/dashboard-screenshots/` next to the test binary's
/// profile directory.
fn screenshot_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // <target>/debug/deps/it-<hash>
    let target = exe
        .ancestors()
        .nth(3)
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = target.join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir
}

/// chromedriver's legacy log endpoint: the browser console's entries since the last call.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type":"browser"}"#.to_owned()))
    }
}

/// Headless Chromium behind a chromedriver this test started (in its own process group, so
/// that the browser it launches goes with it).
/// Whether headless Chromium and chromedriver are here (see [`tools_present`]; or point
/// `FORGE_CHROMIUM` / `FORGE_CHROMEDRIVER` at them).
fn browser_present() -> bool {
    let chromium = program("FORGE_CHROMIUM", "/usr/bin/chromium");
    let chromedriver = program("FORGE_CHROMEDRIVER", "/usr/bin/chromedriver");
    let missing: Vec<(&str, &str)> = [
        (&chromium, "chromium", "chromium"),
        (&chromedriver, "chromedriver", "chromium-driver"),
    ]
    .into_iter()
    .filter(|(path, _, _)| !path.is_file())
    .map(|(_, program, package)| (program, package))
    .collect();
    tools_present(&missing, "the dashboard's browser tests")
}

struct Browser {
    client: Client,
    driver: NodeProcess,
    /// The browser's profile, removed after the browser is gone.
    _profile: ScratchDir,
    shots: PathBuf,
    prefix: &'static str,
}

impl Browser {
    async fn start(prefix: &'static str) -> Browser {
        let chromium = program("FORGE_CHROMIUM", "/usr/bin/chromium");
        let chromedriver = program("FORGE_CHROMEDRIVER", "/usr/bin/chromedriver");
        let profile = ScratchDir::new(&format!("chromium-{prefix}"));
        let mut last_error = String::new();
        for _ in 0..3 {
            let port = free_port();
            let mut command = tokio::process::Command::new(&chromedriver);
            command
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .process_group(0);
            let mut driver = NodeProcess::spawn(command)
                .expect("chromedriver starts")
                .named("chromedriver");
            if let Err(err) = driver
                .wait_for_line("its start line", SOON, |l| {
                    l.contains("started successfully")
                })
                .await
            {
                last_error = err.to_string();
                kill_group(&driver);
                continue;
            }
            let capabilities = json!({
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                        "--window-size=1400,1000", "--force-device-scale-factor=1",
                        format!("--user-data-dir={}", profile.0.display()),
                    ],
                },
                "goog:loggingPrefs": { "browser": "ALL" },
            });
            let Value::Object(capabilities) = capabilities else {
                unreachable!()
            };
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities)
                .connect(&format!("http://127.0.0.1:{port}/"))
                .await
            {
                Ok(client) => {
                    return Browser {
                        client,
                        driver,
                        _profile: profile,
                        shots: screenshot_dir(),
                        prefix,
                    };
                }
                Err(err) => {
                    last_error =
                        format!("{err}; chromedriver said:\n{}", driver.lines().join("\n"));
                    kill_group(&driver);
                }
            }
        }
        panic!("could not start a Chromium session through chromedriver: {last_error}");
    }

    /// Opens a page of the dashboard (`base` + `#/page`).
    async fn open(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Runs `script` until it returns something other than null/false, and returns that.
    async fn wait_js(
        &self,
        what: &str,
        timeout: Duration,
        script: &str,
        args: Vec<Value>,
    ) -> Value {
        let started = Instant::now();
        let value = wait_for(what, timeout, Duration::from_millis(50), || {
            let args = args.clone();
            async move {
                match self.client.execute(script, args).await {
                    Ok(Value::Null) | Ok(Value::Bool(false)) => Err("not yet".to_owned()),
                    Ok(value) => Ok(value),
                    Err(err) => Err(err.to_string()),
                }
            }
        })
        .await;
        match value {
            Ok(value) => value,
            Err(err) => {
                self.screenshot(&format!("failed-{}", slug(what))).await;
                let text = self.text("body").await;
                panic!(
                    "{err} after {:?}\n--- page text ---\n{text}",
                    started.elapsed()
                );
            }
        }
    }

    /// Waits until the page `name` has loaded its data at least once since it was opened.
    async fn wait_loaded(&self, name: &str) {
        self.wait_js(
            &format!("the {name} page to load"),
            PAGE_DEADLINE,
            "const p = document.querySelector('#page');
             return p && p.dataset.page === arguments[0] && p.dataset.loaded === 'true'
               && !document.querySelector('#page-error .error');",
            vec![json!(name)],
        )
        .await;
    }

    async fn text(&self, selector: &str) -> String {
        match self.client.find(Locator::Css(selector)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(err) => format!("({selector}: {err})"),
        }
    }

    async fn click(&self, selector: &str) {
        self.client
            .find(Locator::Css(selector))
            .await
            .unwrap_or_else(|e| panic!("find {selector}: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {selector}: {e}"));
    }

    /// The console's errors (level SEVERE) since the last call: uncaught exceptions, failed
    /// requests, CSP violations.
    async fn console_errors(&self) -> Vec<String> {
        let entries = self
            .client
            .issue_cmd(BrowserLog)
            .await
            .expect("the browser log (chromedriver's se/log)");
        entries
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    async fn assert_no_console_errors(&self, when: &str) {
        let errors = self.console_errors().await;
        assert!(
            errors.is_empty(),
            "console errors {when}:\n{}",
            errors.join("\n")
        );
    }

    /// Writes `<prefix>-<name>.png` to the screenshot directory.
    async fn screenshot(&self, name: &str) -> PathBuf {
        let path = self.shots.join(format!("{}-{name}.png", self.prefix));
        match self.client.screenshot().await {
            Ok(png) => std::fs::write(&path, png).expect("write the screenshot"),
            Err(err) => eprintln!("no screenshot {name}: {err}"),
        }
        path
    }

    /// Ends the session (the browser quits), then chromedriver (dropping `self`).
    async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&self.driver);
    }
}

/// SIGKILLs chromedriver's process group: chromedriver and the browser it started.
fn kill_group(driver: &NodeProcess) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", driver.pid())])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn slug(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(60)
        .collect()
}

/// The admin API and dashboard served by this test over `pool`, with these access rules:
/// any process answers for the whole cluster, so killing a node does not take it down.
async fn serve(pool: &PgPool, configure: impl FnOnce(&mut Config)) -> (String, StopServer) {
    let mut config = Config::default();
    configure(&mut config);
    let namespace = LockNamespace::default();
    let state = forge::admin::AdminState::new(
        Cluster::new(pool.clone(), namespace.clone(), Duration::from_millis(1500)),
        Workload::new(pool.clone(), namespace),
        config.admin.clone(),
    );
    let listener = forge::admin::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(forge::admin::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    (format!("http://{addr}/"), StopServer(Some(stop)))
}

/// Stops a server of [`serve`] when dropped.
struct StopServer(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for StopServer {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            let _ = stop.send(());
        }
    }
}

/// Waits until the Overview shows, for every role, the leader PostgreSQL has right now (read
/// again on every poll: on a loaded machine a role may change hands meanwhile).
async fn wait_overview_leaders(browser: &Browser, pool: &PgPool) -> BTreeMap<String, String> {
    let script = "const leaders = arguments[0];
         for (const [role, node] of Object.entries(leaders)) {
           const cell = document.querySelector(
             `#page[data-page=overview] tr[data-role=\"${CSS.escape(role)}\"] [data-field=leader]`);
           if (!cell || cell.textContent.trim() !== node) return null;
         }
         return true;";
    let shown = wait_for(
        "the overview to show every role's current leader",
        PAGE_DEADLINE,
        Duration::from_millis(50),
        || async {
            let leaders: BTreeMap<String, String> = current_leaders(pool)
                .await
                .into_iter()
                .map(|(role, (node, _))| (role, node))
                .collect();
            if leaders.len() != ALL.len() {
                return Err(format!("PostgreSQL has leaders {leaders:?}"));
            }
            match browser.client.execute(script, vec![json!(leaders)]).await {
                Ok(Value::Bool(true)) => Ok(leaders),
                Ok(_) => Err(format!(
                    "the page does not show {leaders:?}: {}",
                    browser.text("#page").await
                )),
                Err(err) => Err(err.to_string()),
            }
        },
    )
    .await;
    match shown {
        Ok(leaders) => leaders,
        Err(err) => {
            browser.screenshot("failed-overview-leaders").await;
            panic!("{err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_every_page_and_a_sigkilled_leaders_failover() {
    if !browser_present() {
        return;
    }
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("dashboard");
    let mut probes = Vec::new();
    for id in ["d1", "d2", "d3"] {
        probes.push(Probe::start(&db, &dir.0, id, &ALL).await);
    }
    forge_testkit::wait_until(
        "every role to have a leader",
        SOON,
        Duration::from_millis(10),
        || async {
            let leaders = current_leaders(&pool).await;
            (leaders.len() == ALL.len()).then_some(())
        },
    )
    .await
    .unwrap();
    // Read-only: the page must hide every action.
    let (base, _server) = serve(&pool, |c| {
        c.admin.token = Some(TOKEN.to_owned());
        c.admin.read_only = true;
    })
    .await;
    let browser = Browser::start("cluster").await;

    // Every page loads, without a console error, and is screenshotted.
    for page in PAGES {
        browser.open(&format!("{base}#/{page}")).await;
        browser.wait_loaded(page).await;
        browser.screenshot(page).await;
        browser
            .assert_no_console_errors(&format!("on the {page} page"))
            .await;
    }

    // Each role's leader, as PostgreSQL says.
    browser.open(&format!("{base}#/overview")).await;
    wait_overview_leaders(&browser, &pool).await;

    // Read-only: a banner says so, and no action is offered.
    let banner = browser.text("#banner").await;
    assert!(banner.contains("Read-only"), "banner: {banner:?}");
    let actions = browser
        .client
        .find_all(Locator::Css("#page [data-action]"))
        .await
        .unwrap();
    assert!(
        actions.is_empty(),
        "{} actions shown in read-only mode",
        actions.len()
    );

    // The keyboard pauses and resumes live updates ('.').
    let body = browser.client.find(Locator::Css("body")).await.unwrap();
    body.send_keys(".").await.unwrap();
    browser
        .wait_js(
            "the pause control to say paused",
            SOON,
            "return document.querySelector('#live').getAttribute('aria-pressed') === 'false'
               && document.body.classList.contains('paused');",
            vec![],
        )
        .await;
    body.send_keys(".").await.unwrap();
    browser
        .wait_js(
            "the pause control to say live",
            SOON,
            "return document.querySelector('#live').getAttribute('aria-pressed') === 'true';",
            vec![],
        )
        .await;

    // SIGKILL the scheduler's leader: the Leadership page shows the next tenure as a
    // failover, by another node, with its gap in milliseconds.
    browser.open(&format!("{base}#/leadership")).await;
    browser.wait_loaded("leadership").await;
    let (victim, epoch) = current_leaders(&pool).await["scheduler"].clone();
    let index = probes.iter().position(|p| p.id == victim).unwrap();
    let killed = Instant::now();
    probes[index].process.kill().unwrap();
    let seen = browser
        .wait_js(
            "the failover of the scheduler to show on the Leadership page",
            PAGE_DEADLINE,
            "const [epoch, victim] = arguments;
             const row = document.querySelector(
               `#page[data-page=leadership] tr.tenure-row[data-role=scheduler][data-epoch=\"${epoch}\"]`);
             if (!row || row.dataset.start !== 'failover' || row.dataset.node === victim) return null;
             const gap = row.querySelector('[data-field=gap]');
             const marker = [...document.querySelectorAll('.lane[data-role=scheduler] .marker.failover')];
             if (!gap || !marker.length) return null;
             return { node: row.dataset.node, gapMs: Number(row.dataset.gapMs), gap: gap.textContent,
                      text: row.textContent };",
            vec![json!(epoch + 1), json!(victim)],
        )
        .await;
    let elapsed = killed.elapsed();
    let successor = seen["node"].as_str().unwrap().to_owned();
    let gap_text = seen["gap"].as_str().unwrap();
    assert!(
        seen["text"].as_str().unwrap().contains("failover"),
        "{seen}"
    );
    assert!(
        gap_text.ends_with(" ms gap") || gap_text.ends_with(" s gap"),
        "the gap in the page: {gap_text:?}"
    );
    let gap_ms = seen["gapMs"].as_f64().unwrap();
    assert!(
        gap_ms >= 0.0 && gap_ms < LEASE.as_millis() as f64 * 2.0,
        "gap {gap_ms} ms"
    );
    // The page agrees with PostgreSQL's history.
    let elected = events(&pool, "scheduler").await;
    assert!(
        elected.contains(&(epoch + 1, successor.clone(), "elected".to_owned(), true)),
        "epoch {} by {successor} as a failover in {elected:?}",
        epoch + 1
    );
    eprintln!(
        "the failover to {successor} ({gap_text}) showed on the page {elapsed:?} after the SIGKILL"
    );
    browser.screenshot("leadership-after-failover").await;
    browser
        .assert_no_console_errors("while following the failover")
        .await;

    // The Overview shows the new leader too, and the events page the election.
    browser.open(&format!("{base}#/overview")).await;
    let shown = wait_overview_leaders(&browser, &pool).await;
    assert_ne!(shown["scheduler"], victim, "the killed node still leads");
    browser.screenshot("overview-after-failover").await;
    browser
        .open(&format!(
            "{base}#/events?kind=leader_elected&role=scheduler"
        ))
        .await;
    browser
        .wait_js(
            "the election to show on the Events page",
            PAGE_DEADLINE,
            "const row = [...document.querySelectorAll('#page tr[data-kind=leader_elected]')]
               .find((r) => r.textContent.includes(arguments[0]) && r.textContent.includes('failover'));
             return row ? row.textContent : null;",
            vec![json!(successor)],
        )
        .await;
    browser
        .assert_no_console_errors("on the Overview and Events pages after the failover")
        .await;
    browser.close().await;
    for probe in &probes {
        let _ = probe.process.terminate();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_job_is_retried_from_the_dashboard_and_completes() {
    if !browser_present() {
        return;
    }
    let (db, pool) = setup().await;
    // The node itself serves the dashboard at `/` on [admin] listen, with a token.
    let mut config = job_config(db.url(), "web-1");
    config.jobs.queues = [("work".to_owned(), 2)].into_iter().collect();
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    config.admin.token = Some(TOKEN.to_owned());
    let node = forge::Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts");
    let base = format!(
        "{}/",
        node.admin_url().expect("the node serves the admin API")
    );

    // Dead on its first attempt (discarded); a retry makes attempt 2, which succeeds.
    let id = client(&pool)
        .enqueue_job(
            NewJob::new(
                plain,
                Behave {
                    fail_attempts: 1,
                    discard: true,
                    ..Behave::tag("dashboard")
                },
            )
            .queue("work"),
        )
        .await
        .unwrap()
        .id();
    wait_state(&pool, id, JobState::Dead).await;

    let browser = Browser::start("jobs").await;
    browser.open(&format!("{base}#/jobs?state=dead")).await;
    browser.wait_loaded("jobs").await;
    browser
        .wait_js(
            "the dead job in the list",
            PAGE_DEADLINE,
            "return document.querySelector(`#page tr[data-job=\"${arguments[0]}\"][data-state=dead]`) !== null;",
            vec![json!(id.0)],
        )
        .await;
    browser.screenshot("dead-jobs").await;
    browser
        .click(&format!("#page tr[data-job=\"{}\"] a", id.0))
        .await;
    browser.wait_loaded("jobs").await;
    // The job with its attempt's error.
    browser
        .wait_js(
            "the job's failed attempt and its error",
            PAGE_DEADLINE,
            "const state = document.querySelector('#page [data-field=state]');
             const attempt = document.querySelector('#page tr[data-attempt=\"1\"]');
             return state && state.textContent === 'dead' && attempt
               && attempt.textContent.includes('discarded on attempt 1');",
            vec![],
        )
        .await;
    browser.screenshot("dead-job").await;

    // Retry: the page asks for the token first (none in this tab yet), then retries.
    browser.click("#page button[data-action=retry]").await;
    browser
        .wait_js(
            "the token dialog",
            SOON,
            "return document.querySelector('#token-dialog').open;",
            vec![],
        )
        .await;
    browser
        .client
        .find(Locator::Css("#token-input"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    browser.click("#token-save").await;
    browser
        .wait_js(
            "the retried job to complete on the page",
            PAGE_DEADLINE,
            "const state = document.querySelector('#page [data-field=state]');
             return state && state.textContent === 'completed' ? true : null;",
            vec![],
        )
        .await;
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.attempt, 2, "the retry was a second attempt");
    let audit: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.events
          WHERE kind = 'admin_action' AND detail->>'action' = 'retry_job' AND detail->>'subject' = $1",
    )
    .bind(id.0.to_string())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(audit, 1, "one audited retry");
    browser.screenshot("retried-job").await;
    browser
        .assert_no_console_errors("while retrying a job")
        .await;

    // Everything matching a filter: two more dead jobs, retried with one confirmed action.
    let mut more = Vec::new();
    for tag in ["bulk-1", "bulk-2"] {
        let job = NewJob::new(
            plain,
            Behave {
                fail_attempts: 1,
                discard: true,
                ..Behave::tag(tag)
            },
        )
        .queue("work");
        more.push(client(&pool).enqueue_job(job).await.unwrap().id());
    }
    for id in &more {
        wait_state(&pool, *id, JobState::Dead).await;
    }
    browser
        .open(&format!("{base}#/jobs?state=dead&queue=work"))
        .await;
    browser
        .wait_js(
            "both dead jobs in the filtered list",
            PAGE_DEADLINE,
            "return document.querySelectorAll('#page tr[data-state=dead]').length === 2;",
            vec![],
        )
        .await;
    browser.click("#page button[data-action=bulk-retry]").await;
    let question = browser
        .wait_js(
            "the confirmation of the bulk retry",
            SOON,
            "const d = document.querySelector('dialog.confirm');
             return d && d.open ? d.textContent : null;",
            vec![],
        )
        .await;
    assert!(
        question
            .as_str()
            .unwrap()
            .contains("state dead, queue work"),
        "the confirmation names the filter: {question}"
    );
    browser.click("#confirm-yes").await;
    for id in &more {
        let job = wait_state(&pool, *id, JobState::Completed).await;
        assert_eq!(job.attempt, 2);
    }
    browser
        .wait_js(
            "the dead-job list to empty",
            PAGE_DEADLINE,
            "return document.querySelectorAll('#page tr[data-state=dead]').length === 0
               && document.querySelector('#page .empty') !== null;",
            vec![],
        )
        .await;
    browser
        .assert_no_console_errors("during the bulk retry")
        .await;

    // The other pages of a node with a queue and a finished job load cleanly too.
    for page in PAGES {
        browser.open(&format!("{base}#/{page}")).await;
        browser.wait_loaded(page).await;
    }
    // A phone-sized window: the page reflows instead of scrolling sideways.
    browser.client.set_window_size(390, 844).await.unwrap();
    browser.open(&format!("{base}#/overview")).await;
    browser.wait_loaded("overview").await;
    let overflow = browser
        .client
        .execute(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        overflow.as_f64().unwrap_or(0.0) <= 1.0,
        "the page scrolls sideways on a phone by {overflow} px"
    );
    browser.screenshot("phone-overview").await;
    browser.assert_no_console_errors("on every page").await;
    browser.close().await;
    node.shutdown().await;
}
