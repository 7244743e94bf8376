//! The dashboard in a real browser: headless Chromium driven over WebDriver (chromedriver,
//! through `fantoccini`), against a real cluster on a real PostgreSQL. Every page loads
//! without a console error; each role's leader appears; a SIGKILLed leader process is
//! replaced and the failover (with its gap) shows on the page within seconds, and a step-down
//! asked for from the page shows as a graceful handoff, told apart from it; the Nodes page
//! shows each node's state, roles, heartbeat age and version; a dead job is retried from the
//! page and completes; a cron's list and page show its recent ticks, and pause (by keyboard),
//! resume and trigger now from the page take effect; the charts draw the aggregator's points;
//! every action is a keyboard-operable button with a visible focus outline; read-only mode
//! hides the actions; screenshots are written to `target/dashboard-screenshots/`.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian packages `chromium` and
//! `chromium-driver`; `.ci/run` installs them), or `FORGE_CHROMIUM` / `FORGE_CHROMEDRIVER`
//! naming other paths. Without them a test fails, saying what to install, when `CI=true` or
//! `FORGE_REQUIRE_TOOLS` is set (as `.ci/run` does); elsewhere it checks nothing and says so
//! on stderr ([`tools_present`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use forge::crons::CronJob;
use forge::inspect::{Cluster, Workload};
use forge::jobs::{JobState, NewJob};
use forge::{Config, CronContext, LockNamespace, Schedule};
use forge_testkit::{NodeProcess, wait_for};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::jobs::{Behave, plain, served_job_config, setup, wait_state};
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

/// A chromedriver extension command: POST `session/{id}/<path>` with a JSON body - the
/// browser console's entries since the last call (`se/log`, the legacy log endpoint), or a
/// Chrome DevTools Protocol command (`goog/cdp/execute`).
#[derive(Debug)]
struct DriverCommand {
    path: &'static str,
    body: String,
}

impl DriverCommand {
    fn browser_log() -> DriverCommand {
        DriverCommand {
            path: "se/log",
            body: r#"{"type":"browser"}"#.to_owned(),
        }
    }

    fn cdp(cmd: &str, params: Value) -> DriverCommand {
        DriverCommand {
            path: "goog/cdp/execute",
            body: json!({ "cmd": cmd, "params": params }).to_string(),
        }
    }
}

impl WebDriverCompatibleCommand for DriverCommand {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/{}",
            session_id.unwrap_or_default(),
            self.path
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.clone()))
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

    /// Sets the browser's clock `skew_ms` off the real one (every page opened from now on:
    /// `Date` and `Date.now()`), keeping the real clock as `window.__realDate`.
    async fn skew_clock(&self, skew_ms: i64) {
        let source = format!(
            "(() => {{
               const Real = Date;
               const skew = {skew_ms};
               class Skewed extends Real {{
                 constructor(...args) {{ if (args.length) super(...args); else super(Real.now() + skew); }}
                 static now() {{ return Real.now() + skew; }}
               }}
               window.__realDate = Real;
               window.Date = Skewed;
             }})();"
        );
        self.client
            .issue_cmd(DriverCommand::cdp(
                "Page.addScriptToEvaluateOnNewDocument",
                json!({ "source": source }),
            ))
            .await
            .expect("CDP Page.addScriptToEvaluateOnNewDocument");
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

    /// Presses and releases `key` on whatever has the focus, as a keyboard does.
    async fn press(&self, key: Key) {
        let value: char = key.into();
        let keys = KeyActions::new("keyboard".to_owned())
            .then(KeyAction::Down { value })
            .then(KeyAction::Up { value });
        self.client
            .perform_actions(keys)
            .await
            .unwrap_or_else(|e| panic!("press {key:?}: {e}"));
    }

    /// Moves the focus with Tab, from the start of the page's content, until the element
    /// `selector` has it; returns how many presses that took and the focused element's label
    /// and focus style. Panics when Tab never reaches it.
    async fn tab_to(&self, selector: &str) -> (usize, Value) {
        self.client
            .execute("document.getElementById('main').focus();", vec![])
            .await
            .expect("focus the page's content");
        for presses in 1..=60 {
            self.press(Key::Tab).await;
            let focused = self
                .client
                .execute(FOCUSED, vec![json!(selector)])
                .await
                .expect("the focused element");
            if !focused.is_null() {
                return (presses, focused);
            }
        }
        self.screenshot(&format!("failed-tab-to-{}", slug(selector)))
            .await;
        panic!("60 presses of Tab never reached {selector}");
    }

    /// Types the admin token into the dialog the page opened for it, and saves it.
    async fn give_token(&self) {
        self.wait_js(
            "the token dialog",
            SOON,
            "return document.querySelector('#token-dialog').open;",
            vec![],
        )
        .await;
        self.client
            .find(Locator::Css("#token-input"))
            .await
            .unwrap()
            .send_keys(TOKEN)
            .await
            .unwrap();
        self.click("#token-save").await;
    }

    /// Every action control on the page (`[data-action]`: pause, retry, step-down, ...) is a
    /// visible, enabled `<button>` in the Tab order, so Tab reaches it and Enter and Space
    /// operate it; returns the actions found.
    async fn assert_actions_are_keyboard_buttons(&self, page: &str) -> Vec<String> {
        let controls = self
            .client
            .execute(
                "return [...document.querySelectorAll('#page [data-action]')].map((a) => ({
                   action: a.dataset.action, tag: a.tagName, tabIndex: a.tabIndex,
                   disabled: Boolean(a.disabled), shown: a.getClientRects().length > 0 }));",
                vec![],
            )
            .await
            .unwrap();
        let controls = controls.as_array().cloned().unwrap_or_default();
        assert!(!controls.is_empty(), "no action on the {page} page");
        for control in &controls {
            assert!(
                control["tag"] == "BUTTON"
                    && control["tabIndex"] == 0
                    && control["disabled"] == false
                    && control["shown"] == true,
                "an action on the {page} page that the keyboard cannot reach or operate: {control}"
            );
        }
        controls
            .iter()
            .map(|c| c["action"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The console's errors (level SEVERE) since the last call: uncaught exceptions, failed
    /// requests, CSP violations.
    async fn console_errors(&self) -> Vec<String> {
        let entries = self
            .client
            .issue_cmd(DriverCommand::browser_log())
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

/// The focused element when it matches `arguments[0]`: its label, whether the browser shows
/// its focus (`:focus-visible`, as after a key press) and its outline.
const FOCUSED: &str = "const el = document.activeElement;
     if (!el || !el.matches(arguments[0])) return null;
     const style = getComputedStyle(el);
     return { label: el.textContent, visible: el.matches(':focus-visible'),
              outline: style.outlineStyle, width: style.outlineWidth };";

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
async fn the_dashboard_shows_every_page_a_sigkilled_leaders_failover_a_handoff_and_the_nodes() {
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
    // Its kind filter offers every event kind the API has (`GET /api/meta`), the one chosen
    // selected, and the leadership group as one choice.
    let offered = browser
        .wait_js(
            "the kind filter's choices",
            SOON,
            "const select = document.querySelector('#f-kind');
             return select ? [...select.options].map((o) => [o.value, o.selected]) : null;",
            vec![],
        )
        .await;
    let offered: Vec<(String, bool)> = serde_json::from_value(offered).unwrap();
    for kind in forge::inspect::EventKind::ALL {
        assert!(
            offered.iter().any(|(value, _)| value == kind.as_str()),
            "{kind} is not offered: {offered:?}"
        );
    }
    assert!(
        offered.contains(&("leader_elected".to_owned(), true)),
        "{offered:?}"
    );
    assert!(
        offered
            .iter()
            .any(|(value, _)| value.starts_with("leader_elected,") && !value.contains("node_")),
        "no leadership group: {offered:?}"
    );
    browser
        .assert_no_console_errors("on the Overview and Events pages after the failover")
        .await;

    // A graceful handoff, asked for from the Overview of a server that takes writes (the
    // token typed in once): the Leadership page shows it as a handoff, told apart from the
    // failover above.
    let (writable, _writable_server) = serve(&pool, |c| {
        c.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    let (from, old_epoch) = wait_for(
        "log_compactor led by a live node",
        SOON,
        Duration::from_millis(20),
        || async {
            match current_leaders(&pool).await.remove("log_compactor") {
                Some((node, epoch)) if node != victim => Ok((node, epoch)),
                other => Err(format!("log_compactor: {other:?}")),
            }
        },
    )
    .await
    .unwrap();
    // A step-down without a standby waiting asks to be forced (the role would go leaderless):
    // the surviving standby may still be campaigning again after the failover on a loaded
    // machine.
    wait_standby(&pool, "log_compactor").await;
    browser.open(&format!("{writable}#/overview")).await;
    browser.wait_loaded("overview").await;
    let step_down = "#page tr[data-role=log_compactor] button[data-action=step-down]";
    browser
        .wait_js(
            "the step-down button of log_compactor",
            PAGE_DEADLINE,
            "return document.querySelector(arguments[0]) !== null;",
            vec![json!(step_down)],
        )
        .await;
    assert!(
        browser
            .assert_actions_are_keyboard_buttons("overview")
            .await
            .contains(&"step-down".to_owned())
    );
    browser.click(step_down).await;
    browser
        .wait_js(
            "the step-down confirmation",
            SOON,
            "const d = document.querySelector('dialog.confirm'); return d && d.open;",
            vec![],
        )
        .await;
    browser.click("#confirm-yes").await;
    browser.give_token().await;
    browser.open(&format!("{writable}#/leadership")).await;
    let seen = browser
        .wait_js(
            "the handoff of log_compactor and the failover of the scheduler on the Leadership page",
            PAGE_DEADLINE,
            "const [epoch, from, failedOver] = arguments;
             const row = (role, e) => document.querySelector(
               `#page[data-page=leadership] tr.tenure-row[data-role=${role}][data-epoch=\"${e}\"]`);
             const handoff = row('log_compactor', epoch + 1);
             const released = row('log_compactor', epoch);
             const failover = row('scheduler', failedOver);
             if (!handoff || !released || !failover || handoff.dataset.node === from) return null;
             const marker = (role, kind) =>
               document.querySelector(`.lane[data-role=${role}] .marker.${kind}`) !== null;
             return { start: handoff.dataset.start, node: handoff.dataset.node,
                      gap: handoff.querySelector('[data-field=gap]')?.textContent,
                      released: released.textContent, failoverStart: failover.dataset.start,
                      handoffMarker: marker('log_compactor', 'handoff'),
                      failoverMarker: marker('scheduler', 'failover'),
                      handoffs: document.querySelectorAll(
                        '.lane[data-role=log_compactor] .marker.handoff').length };",
            vec![json!(old_epoch), json!(from), json!(epoch + 1)],
        )
        .await;
    assert_eq!(seen["start"], "handoff", "{seen}");
    assert_eq!(seen["failoverStart"], "failover", "{seen}");
    assert!(
        seen["handoffMarker"] == true && seen["failoverMarker"] == true,
        "{seen}"
    );
    assert_eq!(seen["handoffs"], 1, "one handoff in the lane: {seen}");
    assert!(
        seen["gap"].as_str().is_some_and(|g| g.ends_with(" gap")),
        "{seen}"
    );
    assert!(
        seen["released"].as_str().unwrap().contains("released"),
        "{seen}"
    );
    let taker = seen["node"].as_str().unwrap().to_owned();
    let history = events(&pool, "log_compactor").await;
    assert!(
        history.contains(&(old_epoch, from.clone(), "released".to_owned(), false))
            && history.contains(&(old_epoch + 1, taker.clone(), "elected".to_owned(), false)),
        "{from} released epoch {old_epoch} and {taker} was elected, no failover: {history:?}"
    );
    browser.screenshot("leadership-after-handoff").await;

    // The Nodes page: each node's state (the killed one down), roles, heartbeat age and
    // version, as membership has them.
    let versions: BTreeMap<String, String> =
        sqlx::query_as("SELECT node_id, version FROM forge.nodes")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    browser.open(&format!("{base}#/nodes")).await;
    browser.wait_loaded("nodes").await;
    let rows = browser
        .wait_js(
            "the killed node down and the others active on the Nodes page",
            PAGE_DEADLINE,
            "const victim = arguments[0];
             const rows = [...document.querySelectorAll('#page[data-page=nodes] tr[data-node]')];
             const field = (r, f) => r.querySelector(`[data-field=${f}]`);
             const shown = rows.map((r) => ({
               node: r.dataset.node, state: field(r, 'state').textContent.trim(),
               roles: field(r, 'roles').textContent, heartbeat: field(r, 'heartbeat').textContent,
               leads: r.querySelectorAll('[data-field=roles] strong').length,
               ageMs: Number(field(r, 'heartbeat').dataset.ageMs),
               version: field(r, 'version').textContent }));
             const ok = shown.length === 3
               && shown.every((n) => n.state === (n.node === victim ? 'down' : 'active'));
             return ok ? shown : null;",
            vec![json!(victim)],
        )
        .await;
    for row in rows.as_array().unwrap() {
        let node = row["node"].as_str().unwrap();
        for role in ALL {
            assert!(
                row["roles"].as_str().unwrap().contains(role),
                "{node} lists its roles: {row}"
            );
        }
        assert_eq!(
            row["version"].as_str(),
            versions.get(node).map(String::as_str),
            "{row}"
        );
        assert!(
            row["version"].as_str().unwrap().starts_with("forge "),
            "{row}"
        );
        let heartbeat = row["heartbeat"].as_str().unwrap();
        assert!(
            heartbeat.ends_with(" ago") && heartbeat.starts_with(|c: char| c.is_ascii_digit()),
            "{row}"
        );
        let age_ms = row["ageMs"].as_f64().unwrap();
        if row["state"] == "active" {
            // Active means a heartbeat within drift_after (1.5 s here).
            assert!((0.0..=1500.0).contains(&age_ms), "{row}");
        } else {
            assert!(age_ms > 500.0, "the killed node's heartbeat stopped: {row}");
            assert_eq!(row["leads"], 0, "a node down leads nothing: {row}");
        }
    }
    browser.screenshot("nodes-after-failover").await;
    browser
        .assert_no_console_errors("while stepping down and on the Nodes page")
        .await;
    browser.close().await;
    for probe in &probes {
        let _ = probe.process.terminate();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_and_a_cron_are_operated_from_the_dashboard_by_mouse_and_keyboard_and_charted() {
    if !browser_present() {
        return;
    }
    let (db, pool) = setup().await;
    // The node itself serves the dashboard at `/` on [admin] listen, with a token. It runs a
    // cron every second, and leads the metrics aggregator with a 1 s rollup, so the charts
    // have points within seconds.
    let every_second = CronJob::new(
        "every_second",
        Schedule::parse("* * * * * *").unwrap(),
        |_ctx: CronContext| async move { Ok::<_, forge::CronError>(()) },
    );
    let (node, base) = token_node(db.url(), true, Some(every_second)).await;

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
    browser.give_token().await;
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
    // What a retry leaves alone, from the API's JobAction::states (`GET /api/meta`).
    assert!(
        question
            .as_str()
            .unwrap()
            .contains("Jobs that are pending or available or running are left alone."),
        "the confirmation says which states are left alone: {question}"
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
    assert!(
        browser
            .assert_actions_are_keyboard_buttons("jobs")
            .await
            .contains(&"bulk-retry".to_owned())
    );
    browser
        .assert_no_console_errors("during the bulk retry")
        .await;

    crons_from_the_page(&browser, &base, &pool).await;
    charts_with_points(&browser, &base).await;

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

/// Waits until PostgreSQL says the cron `every_second` is paused (or not).
async fn wait_paused(pool: &PgPool, paused: bool, what: &str) {
    forge_testkit::wait_until(what, SOON, Duration::from_millis(20), || async {
        let now: bool = sqlx::query_scalar(
            "SELECT paused_at IS NOT NULL FROM forge.crons WHERE name = 'every_second'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        (now == paused).then_some(())
    })
    .await
    .unwrap();
}

/// The Crons page and the page of the cron `every_second` (the token already given): its
/// recent ticks as the ledger has them; keyboard: Tab reaches its pause button, which shows
/// the focus outline, Enter pauses (ticks are skipped), Space resumes; trigger now runs a
/// manual tick.
async fn crons_from_the_page(browser: &Browser, base: &str, pool: &PgPool) {
    browser.open(&format!("{base}#/crons")).await;
    browser.wait_loaded("crons").await;
    browser
        .wait_js(
            "the cron, its schedule and its last run in the list",
            PAGE_DEADLINE,
            "const row = document.querySelector('#page tr[data-cron=every_second]');
             return row && row.textContent.includes('* * * * * *')
               && row.textContent.includes('succeeded');",
            vec![],
        )
        .await;
    assert!(
        browser
            .assert_actions_are_keyboard_buttons("crons")
            .await
            .contains(&"pause-cron".to_owned())
    );
    browser.screenshot("crons").await;
    browser
        .click("#page tr[data-cron=every_second] a[href]")
        .await;
    browser.wait_loaded("crons").await;
    let ticks = browser
        .wait_js(
            "the cron's recent ticks",
            PAGE_DEADLINE,
            "const rows = [...document.querySelectorAll('#page tr[data-tick][data-state=succeeded]')];
             return rows.length >= 2 ? rows.map((r) => r.dataset.tick) : null;",
            vec![],
        )
        .await;
    // The page's ticks are the ledger's.
    for tick in ticks.as_array().unwrap().iter().take(3) {
        let at = chrono::DateTime::parse_from_rfc3339(tick.as_str().unwrap()).unwrap();
        let state: String = sqlx::query_scalar(
            "SELECT state FROM forge.cron_ticks WHERE cron = 'every_second' AND scheduled_at = $1",
        )
        .bind(at)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(state, "succeeded", "tick {at}");
    }
    browser.screenshot("cron").await;
    browser.assert_actions_are_keyboard_buttons("cron").await;

    // Keyboard only: Tab to Pause (focus visible), Enter.
    let (presses, focused) = browser.tab_to("#page button[data-action=pause-cron]").await;
    assert_eq!(focused["label"], "Pause", "{focused}");
    assert!(
        focused["visible"] == true && focused["outline"] == "solid" && focused["width"] == "3px",
        "the focused button shows the focus outline: {focused}"
    );
    eprintln!("Tab reached the cron's pause button in {presses} presses");
    browser.press(Key::Enter).await;
    wait_paused(pool, true, "Enter to pause the cron").await;
    // The page says so, keeps the focus on the button (now Resume), and its ticks are skipped.
    browser
        .wait_js(
            "the paused cron, its skipped ticks and the focus on Resume",
            PAGE_DEADLINE,
            "const status = [...document.querySelectorAll('#page .facts dd')]
               .some((d) => d.textContent.includes('paused'));
             const skipped = document.querySelector('#page tr[data-tick][data-state=skipped]');
             const focused = document.activeElement;
             return status && skipped && focused.matches('button[data-action=resume-cron]')
               && focused.textContent === 'Resume';",
            vec![],
        )
        .await;
    let skipped: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.cron_ticks
          WHERE cron = 'every_second' AND state = 'skipped' AND error = 'paused'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(skipped >= 1, "ticks skipped while paused");
    browser.screenshot("cron-paused").await;
    browser.press(Key::Space).await;
    wait_paused(pool, false, "Space to resume the cron").await;
    browser
        .wait_js(
            "the focus back on Pause",
            PAGE_DEADLINE,
            "const focused = document.activeElement;
             return focused.matches('button[data-action=pause-cron]') && focused.textContent === 'Pause';",
            vec![],
        )
        .await;

    // Trigger now: a manual tick runs on the leader and shows among the ticks.
    browser
        .click("#page button[data-action=trigger-cron]")
        .await;
    let manual = wait_for(
        "the triggered tick in the ledger",
        PAGE_DEADLINE,
        Duration::from_millis(20),
        || async {
            let manual: Vec<(chrono::DateTime<chrono::Utc>, String)> = sqlx::query_as(
                "SELECT scheduled_at, state FROM forge.cron_ticks
                  WHERE cron = 'every_second' AND manual",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            let requested: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
                "SELECT trigger_requested_at FROM forge.crons WHERE name = 'every_second'",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            match manual.as_slice() {
                [(at, state)] if state == "succeeded" => Ok(*at),
                _ => Err(format!(
                    "manual ticks {manual:?}, request pending {requested:?}"
                )),
            }
        },
    )
    .await
    .unwrap();
    browser
        .wait_js(
            "the manual tick on the page",
            PAGE_DEADLINE,
            "return [...document.querySelectorAll('#page tr[data-tick]')]
               .some((r) => new Date(r.dataset.tick).getTime() === arguments[0]
                 && r.textContent.includes('manual'));",
            vec![json!(manual.timestamp_millis())],
        )
        .await;
    let audited: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'action' FROM forge.events
          WHERE kind = 'admin_action' AND detail->>'subject' = 'every_second' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(audited, ["pause_cron", "resume_cron", "trigger_cron"]);
    browser
        .assert_no_console_errors("while operating the cron")
        .await;
}

/// The Charts page draws the aggregator's points: the cron's runs per second (counted by role:
/// the line of `every_second`'s role, `scheduler`) and the jobs
/// completed on `work` (three: the retried job and the two of the bulk retry; the figures
/// table may count fewer, never more, while the aggregator can lose a heartbeat's increments:
/// see the series test in `admin`).
async fn charts_with_points(browser: &Browser, base: &str) {
    browser.open(&format!("{base}#/charts")).await;
    browser.wait_loaded("charts").await;
    let drawn = browser
        .wait_js(
            "the cron runs and the completed jobs in the charts",
            PAGE_DEADLINE,
            "const chart = (key) => document.querySelector(`#page [data-chart=${key}]`);
             const draw = (c) => c && {
               points: [...c.querySelectorAll('svg .series polyline')]
                 .map((p) => p.getAttribute('points').trim().split(' ').length),
               circles: c.querySelectorAll('svg .series circle').length,
               legend: [...c.querySelectorAll('ul.legend li')].map((li) => li.textContent),
               figures: [...c.querySelectorAll('details tbody tr')]
                 .map((tr) => [...tr.cells].map((td) => td.textContent)) };
             const runs = draw(chart('cron-runs'));
             const done = draw(chart('throughput'));
             if (!runs || !done || !runs.points.length || runs.points[0] < 2) return null;
             const work = done.figures.find((row) => row[0] === 'work');
             const sum = work ? Number(work[3]) : 0;
             return sum >= 1 && sum <= 3 ? { runs, done } : null;",
            vec![],
        )
        .await;
    // Each chart has a line named after its label, drawn through its points.
    for (chart, line, points) in [("runs", "scheduler", 2), ("done", "work", 1)] {
        let legend = drawn[chart]["legend"].as_array();
        assert!(
            legend.is_some_and(|l| l.iter().any(|name| name == line))
                && drawn[chart]["circles"].as_u64() >= Some(points),
            "{chart}: a line {line} through {points} points or more: {drawn}"
        );
    }
    browser.screenshot("charts").await;
    browser.assert_no_console_errors("on the Charts page").await;
}

/// What the dashboard shows is what the server knows, also with a browser whose clock is 90 s
/// ahead: relative times ("next run in ...") count from the server's clock and the header's
/// time is the server's, in the 24-hour format of the rest; a tick's lag and duration are the
/// API's (the handler's, not the claim-ahead's); a chart draws a counter only at the intervals
/// the aggregator rolled up (no invented drop at the newest point, where only samples are yet);
/// a gap is coloured by its size; and with PostgreSQL stopped the page says "database
/// unreachable since ..." within seconds, on a page already open and on one opened then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_servers_truth_with_a_skewed_browser_clock_and_postgresql_down() {
    if !browser_present() {
        return;
    }
    let server = tokio::task::spawn_blocking(forge_testkit::PgServer::start)
        .await
        .unwrap()
        .unwrap();
    let db = server.create_database().await.unwrap();
    let pool = db.pool().await.unwrap();
    let mut config = served_job_config(db.url(), "web", false);
    config.admin.token = Some(TOKEN.to_owned());
    config.database.connect_timeout = Duration::from_secs(10);
    let every_second = CronJob::new(
        "every_second",
        Schedule::parse("* * * * * *").unwrap(),
        |_ctx: CronContext| async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok::<_, forge::CronError>(())
        },
    );
    let node = forge::Node::builder(config)
        .auto_register(false)
        .cron(every_second)
        .start()
        .await
        .expect("node starts");
    let base = format!("{}/", node.admin_url().unwrap());

    // The aggregator's points, as it writes them (no aggregator runs here): counters at the
    // intervals it rolled up (marked `rollups`; the third was skipped, no aggregator led),
    // samples at every interval, also the newest, which is not rolled up yet.
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let minute = chrono::TimeDelta::minutes(1);
    let first = chrono::DurationRound::duration_trunc(now, minute).unwrap() - minute * 6;
    let at = |i: i32| first + minute * i;
    let mut points: Vec<(chrono::DateTime<chrono::Utc>, &str, &str, f64)> = Vec::new();
    for i in [1, 2, 4, 5] {
        points.push((at(i), "rollups", "", 1.0));
    }
    for (i, runs) in [(1, 3.0), (2, 3.0), (4, 6.0), (5, 3.0)] {
        points.push((at(i), "cron_runs", "synthetic", runs));
    }
    points.push((at(1), "jobs_completed", "synthetic", 7.0));
    for i in 1..=6 {
        points.push((at(i), "queue_depth", "synthetic", 5.0));
    }
    for (at, series, label, value) in &points {
        sqlx::query(
            "INSERT INTO forge.stats (namespace, at, series, label, value) VALUES ('forge', $1, $2, $3, $4)",
        )
        .bind(at)
        .bind(series)
        .bind(label)
        .bind(value)
        .execute(&pool)
        .await
        .unwrap();
    }
    // A role's history with a 10.8 s handoff and a 1.2 ms one.
    let t0 = now - chrono::TimeDelta::minutes(5);
    for (offset_ms, kind, node, epoch, detail) in [
        (
            0,
            "leader_elected",
            "x",
            1,
            json!({ "failover": false, "gap_ms": null }),
        ),
        (60_000, "leader_released", "x", 1, json!({})),
        (
            70_800,
            "leader_elected",
            "y",
            2,
            json!({ "failover": false, "gap_ms": 10800.0, "gap_from": "release" }),
        ),
        (120_000, "leader_released", "y", 2, json!({})),
        (
            120_001,
            "leader_elected",
            "x",
            3,
            json!({ "failover": false, "gap_ms": 1.2, "gap_from": "release" }),
        ),
    ] {
        sqlx::query(
            "INSERT INTO forge.events (at, namespace, kind, node_id, role, epoch, detail)
             VALUES ($1, 'forge', $2, $3, 'demo', $4, $5)",
        )
        .bind(t0 + chrono::TimeDelta::milliseconds(offset_ms))
        .bind(kind)
        .bind(node)
        .bind(epoch)
        .bind(detail)
        .execute(&pool)
        .await
        .unwrap();
    }

    let browser = Browser::start("truth").await;
    browser.skew_clock(90_000).await;

    // Relative times by the server's clock: the per-second cron's next run is within a second
    // (a browser 90 s ahead read it as "1 min 29 s ago").
    browser.open(&format!("{base}#/crons")).await;
    browser.wait_loaded("crons").await;
    let next = browser
        .wait_js(
            "the cron's next run",
            PAGE_DEADLINE,
            "const row = document.querySelector('#page tr[data-cron=every_second]');
             const cell = row && row.cells[3];
             return cell && cell.textContent !== '-' ? cell.textContent : null;",
            vec![],
        )
        .await;
    let next = next.as_str().unwrap();
    // Within a second either way: "in 400 ms", or - on a loaded machine, where the page was
    // drawn from a snapshot some milliseconds old - "47 ms ago"; never a minute and a half.
    let within_a_second = (next.starts_with("in ")
        && (next.ends_with(" ms") || next.ends_with(" s"))
        && !next.contains("min"))
        || (next.ends_with(" ms ago"));
    assert!(
        within_a_second,
        "the next run of a per-second cron, by the server's clock: {next:?}"
    );
    // The header: the server's time, 24-hour (the browser's locale would say "1:02:03 PM").
    let header = browser
        .wait_js(
            "the header's time",
            PAGE_DEADLINE,
            "const text = document.querySelector('#updated').textContent;
             const m = /^updated (\\d\\d):(\\d\\d):(\\d\\d)$/.exec(text);
             if (!m) return { text };
             const real = new window.__realDate();
             const shown = (+m[1]) * 3600 + (+m[2]) * 60 + (+m[3]);
             const actual = real.getHours() * 3600 + real.getMinutes() * 60 + real.getSeconds();
             let off = Math.abs(actual - shown);
             off = Math.min(off, 86400 - off);
             return { text, off };",
            vec![],
        )
        .await;
    assert!(
        header["off"].as_f64().is_some_and(|off| off <= 5.0),
        "the header shows the server's time as HH:MM:SS: {header}"
    );

    // A tick's lag and duration are the API's: the handler's 30 ms, not claim-ahead included.
    browser.open(&format!("{base}#/crons/every_second")).await;
    browser.wait_loaded("crons").await;
    let shown = browser
        .wait_js(
            "succeeded ticks with their lag and duration",
            PAGE_DEADLINE,
            "const rows = [...document.querySelectorAll('#page tr[data-tick][data-state=succeeded]')];
             const ticks = rows.map((r) => ({
               tick: r.dataset.tick,
               lag: r.querySelector('[data-field=lag]')?.dataset.ms,
               duration: r.querySelector('[data-field=duration]')?.dataset.ms }));
             return ticks.length >= 2 ? ticks : null;",
            vec![],
        )
        .await;
    let api: Value = get_json(&format!("{base}api/crons/every_second/ticks?limit=50")).await;
    for tick in shown.as_array().unwrap() {
        let from_api = api["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["scheduled_at"] == tick["tick"])
            .unwrap_or_else(|| panic!("{tick} in {api}"));
        let number = |v: &Value| v.as_str().and_then(|s| s.parse::<f64>().ok());
        let duration = number(&tick["duration"]).unwrap_or_else(|| panic!("{tick}"));
        assert!(
            (duration - from_api["duration_ms"].as_f64().unwrap()).abs() < 1e-6
                && (number(&tick["lag"]).unwrap() - from_api["lag_ms"].as_f64().unwrap()).abs()
                    < 1e-6,
            "the page shows the API's lag and duration: {tick} / {from_api}"
        );
        assert!(duration >= 30.0, "{tick}");
    }

    // The charts: the synthetic cron's runs at the four rolled-up intervals, the last one 3
    // (not a 0 at the newest instant, which holds only samples), the skipped interval not
    // drawn as a 0; the queue's samples at all six.
    browser.open(&format!("{base}#/charts")).await;
    browser.wait_loaded("charts").await;
    let drawn = browser
        .wait_js(
            "the synthetic series drawn",
            PAGE_DEADLINE,
            "const line = (chart, name) => {
               const g = [...document.querySelectorAll(`#page [data-chart=${chart}] svg g.series`)]
                 .find((g) => g.querySelectorAll('circle title')[0]?.textContent.startsWith(name));
               if (!g) return null;
               return { points: g.querySelector('polyline').getAttribute('points').trim().split(' ').length,
                        last: [...g.querySelectorAll('circle title')].pop().textContent };
             };
             const runs = line('cron-runs', 'synthetic');
             const depth = line('queue-depth', 'synthetic');
             const done = line('throughput', 'synthetic');
             return runs && depth && done ? { runs, depth, done } : null;",
            vec![],
        )
        .await;
    assert_eq!(drawn["runs"]["points"], 4, "{drawn}");
    assert!(
        drawn["runs"]["last"].as_str().unwrap().ends_with(": 3"),
        "the last drawn point is the last rolled-up interval's: {drawn}"
    );
    assert_eq!(drawn["depth"]["points"], 6, "{drawn}");
    // A counter that did not move at a rolled-up interval is 0 there: drawn at all four.
    assert_eq!(drawn["done"]["points"], 4, "{drawn}");
    assert!(
        drawn["done"]["last"].as_str().unwrap().ends_with(": 0"),
        "{drawn}"
    );
    browser.screenshot("truth-charts").await;

    // Gaps coloured by their size: the 10.8 s handoff is not green like the 1.2 ms one.
    browser.open(&format!("{base}#/leadership?role=demo")).await;
    browser.wait_loaded("leadership").await;
    let gaps = browser
        .wait_js(
            "the demo role's handoffs",
            PAGE_DEADLINE,
            "const gap = (epoch) => {
               const el = document.querySelector(
                 `#page tr.tenure-row[data-role=demo][data-epoch=\"${epoch}\"] [data-field=gap]`);
               return el && { text: el.textContent, classes: el.className,
                              colour: getComputedStyle(el).color };
             };
             const slow = gap(2);
             const fast = gap(3);
             const markers = [...document.querySelectorAll('.lane[data-role=demo] .marker')]
               .map((m) => ({ text: m.textContent, colour: getComputedStyle(m).color }));
             return slow && fast ? { slow, fast, markers } : null;",
            vec![],
        )
        .await;
    assert_ne!(gaps["slow"]["colour"], gaps["fast"]["colour"], "{gaps}");
    let classes = |gap: &str| gaps[gap]["classes"].as_str().unwrap_or_default().to_owned();
    assert!(
        classes("slow").split(' ').any(|c| c == "bad")
            && classes("fast").split(' ').any(|c| c == "good"),
        "{gaps}"
    );
    let markers = gaps["markers"].as_array().unwrap();
    assert_eq!(markers.len(), 2, "{gaps}");
    assert_ne!(markers[0]["colour"], markers[1]["colour"], "{gaps}");
    // The current tenure (epoch 3) is held for as long as the server's clock says.
    let held = browser
        .text("#page tr.tenure-row[data-role=demo][data-epoch=\"3\"] td:last-child")
        .await;
    let server_now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let expected = (server_now - (t0 + chrono::TimeDelta::milliseconds(120_001))).num_seconds();
    let shown = held
        .strip_suffix(" s")
        .and_then(|rest| rest.split_once(" min "))
        .and_then(|(m, s)| Some(m.parse::<i64>().ok()? * 60 + s.parse::<i64>().ok()?))
        .unwrap_or_else(|| panic!("held for {held:?}"));
    assert!(
        (shown - expected).abs() <= 10,
        "held for {held:?}, by the server's clock {expected} s"
    );
    browser.screenshot("truth-leadership").await;
    browser
        .assert_no_console_errors("with a skewed clock")
        .await;

    // PostgreSQL stops: the open page says so within seconds, with since when.
    browser.open(&format!("{base}#/overview")).await;
    browser.wait_loaded("overview").await;
    tokio::task::block_in_place(|| server.stop()).unwrap();
    let stopped = Instant::now();
    let outage = browser
        .wait_js(
            "the outage banner",
            Duration::from_secs(8),
            "const box = document.querySelector('#outage');
             return box && !box.hidden && box.textContent.includes('Database unreachable since')
               ? box.textContent : null;",
            vec![],
        )
        .await;
    eprintln!(
        "the open page said {outage} {:?} after PostgreSQL stopped",
        stopped.elapsed()
    );
    assert!(
        outage
            .as_str()
            .unwrap()
            .contains("The figures below are from"),
        "{outage}"
    );
    browser.screenshot("truth-outage").await;
    // A page opened now says so just as soon.
    let opened = Instant::now();
    browser.open(&format!("{base}#/jobs")).await;
    browser
        .wait_js(
            "the outage banner on a page opened during the outage",
            Duration::from_secs(6),
            "const box = document.querySelector('#outage');
             return box && !box.hidden && box.textContent.includes('Database unreachable since');",
            vec![],
        )
        .await;
    eprintln!(
        "a page opened during the outage said so after {:?}",
        opened.elapsed()
    );
    tokio::task::block_in_place(|| server.start_again()).unwrap();
    browser
        .wait_js(
            "the banner gone once PostgreSQL is back",
            Duration::from_secs(30),
            "return document.querySelector('#outage').hidden
               && document.querySelector('#page').dataset.loaded === 'true';",
            vec![],
        )
        .await;
    browser.close().await;
    node.shutdown().await;
}

/// GET `url` as JSON (the API's reads need no token here).
async fn get_json(url: &str) -> Value {
    let url: url::Url = url.parse().unwrap();
    let addr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    };
    let request = hyper::Request::builder()
        .uri(path)
        .header("host", addr)
        .body(http_body_util::Full::new(hyper::body::Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

impl Browser {
    /// Replaces the text of the form field `#form-<name>` of the open form dialog.
    async fn fill(&self, name: &str, text: &str) {
        let field = self
            .client
            .find(Locator::Css(&format!("dialog.form #form-{name}")))
            .await
            .unwrap_or_else(|e| panic!("the form field {name}: {e}"));
        field.clear().await.unwrap();
        if !text.is_empty() {
            field.send_keys(text).await.unwrap();
        }
    }

    /// Waits until the open form dialog shows an error naming `expected`; returns the error
    /// and the fields marked invalid.
    async fn form_error(&self, what: &str, expected: &str) -> (String, Vec<String>) {
        let shown = self
            .wait_js(
                what,
                PAGE_DEADLINE,
                "const d = document.querySelector('dialog.form');
                 const e = d && d.open && d.querySelector('[data-field=form-error]');
                 if (!e || !e.textContent.includes(arguments[0])) return null;
                 return [e.textContent, [...d.querySelectorAll('[aria-invalid=true]')].map((f) => f.name)];",
                vec![json!(expected)],
            )
            .await;
        let error = shown[0].as_str().unwrap().to_owned();
        let invalid = shown[1]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .collect();
        (error, invalid)
    }

    /// Drains the console's errors, which must all be the browser's report of an answer the
    /// test provoked (a 400 or 409 the page showed), none an exception or another failure.
    async fn assert_console_shows_only_refusals(&self, when: &str, statuses: &[u16]) {
        for error in self.console_errors().await {
            assert!(
                statuses.iter().any(|status| error
                    .contains(&format!("the server responded with a status of {status}"))),
                "a console error {when}: {error}"
            );
        }
    }

    /// Waits until no form dialog is open (a change was applied).
    async fn form_closed(&self, what: &str) {
        self.wait_js(
            what,
            PAGE_DEADLINE,
            "return document.querySelector('dialog.form') === null;",
            vec![],
        )
        .await;
    }
}

/// A node that works `plain` jobs and serves the dashboard with [`TOKEN`] (see
/// [`served_job_config`]; `charted`: it leads the aggregator too), with `cron`; and the
/// dashboard's URL.
async fn token_node(url: &str, charted: bool, cron: Option<CronJob>) -> (forge::Node, String) {
    token_node_with(url, charted, |builder| match cron {
        Some(cron) => builder.cron(cron),
        None => builder,
    })
    .await
}

/// [`token_node`], its builder given to `more` (other jobs, a cron) before it starts.
async fn token_node_with(
    url: &str,
    charted: bool,
    more: impl FnOnce(forge::NodeBuilder) -> forge::NodeBuilder,
) -> (forge::Node, String) {
    let mut config = served_job_config(url, "web-1", charted);
    config.admin.token = Some(TOKEN.to_owned());
    let builder = more(forge::Node::builder(config).auto_register(false).job(plain));
    let node = builder.start().await.expect("node starts");
    let base = format!(
        "{}/",
        node.admin_url().expect("the node serves the admin API")
    );
    (node, base)
}

/// The admin actions recorded for `subject`, oldest first.
async fn audited(pool: &PgPool, subject: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT detail->>'action' FROM forge.events
          WHERE kind = 'admin_action' AND detail->>'subject' = $1 ORDER BY id",
    )
    .bind(subject)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// What [`stored_limits`] reads: a queue's limits or a job kind's.
enum Limited {
    Queue,
    Kind,
}

/// A queue's or a job kind's limits as stored: (global concurrency, rate count, rate window in
/// ms, rate key, set by); `None` when no row.
type StoredLimits = Option<(
    Option<i32>,
    Option<i32>,
    Option<i64>,
    Option<String>,
    Option<String>,
)>;

async fn stored_limits(pool: &PgPool, limited: Limited, name: &str) -> StoredLimits {
    let sql = match limited {
        Limited::Queue => {
            "SELECT global_concurrency, rate_count, rate_window_ms, rate_key, set_by
               FROM forge.queue_limits WHERE queue = $1"
        }
        Limited::Kind => {
            "SELECT global_concurrency, rate_count, rate_window_ms, rate_key, set_by
               FROM forge.kind_limits WHERE kind = $1"
        }
    };
    sqlx::query_as(sql)
        .bind(name)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// From the Overview's queue table: a queue's jobs waiting for their parents (Pending), and its
/// limits set from the page (the token asked for first), a bad rate refused with the API's
/// message in the form (nothing stored), then set (stored, audited, shown), then reset to
/// forge.toml.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_pending_jobs_show_and_its_limits_are_set_and_reset_from_the_dashboard() {
    if !browser_present() {
        return;
    }
    let (db, pool) = setup().await;
    let (node, base) = token_node(db.url(), false, None).await;
    // No node works `limited`: its parent stays available and its child pending.
    crate::cli::parent_and_children(&pool, "limited", 1).await;

    let browser = Browser::start("queue-limits").await;
    browser.open(&format!("{base}#/overview")).await;
    browser.wait_loaded("overview").await;
    browser
        .wait_js(
            "the queue's pending job in the Pending column",
            PAGE_DEADLINE,
            "const row = document.querySelector('#page tr[data-queue=limited]');
             const pending = row && row.querySelector('[data-field=pending]');
             const heads = [...row.closest('table').querySelectorAll('th')].map((t) => t.textContent);
             return pending && pending.textContent === '1' && heads.includes('Pending');",
            vec![],
        )
        .await;
    assert!(
        browser
            .assert_actions_are_keyboard_buttons("overview")
            .await
            .contains(&"limit-queue".to_owned())
    );

    // A bad rate: the API's message in the form, the field marked, nothing stored.
    browser
        .click("#page tr[data-queue=limited] button[data-action=limit-queue]")
        .await;
    browser.fill("global_concurrency", "4").await;
    browser.fill("rate", "100 per minute").await;
    browser
        .click("dialog.form button[data-action=save-queue-limits]")
        .await;
    browser.give_token().await;
    let (error, invalid) = browser
        .form_error("the API's error about the rate", "100 per minute")
        .await;
    assert!(error.contains("HTTP 400"), "{error}");
    assert_eq!(invalid, ["rate"], "{error}");
    assert_eq!(stored_limits(&pool, Limited::Queue, "limited").await, None);
    browser.screenshot("queue-limits-bad-rate").await;
    browser
        .assert_console_shows_only_refusals("after the bad rate", &[400])
        .await;

    // Corrected: stored as the operator's, audited, shown in the table.
    browser.fill("rate", "100/1m").await;
    browser.fill("rate_key", "customer").await;
    browser
        .click("dialog.form button[data-action=save-queue-limits]")
        .await;
    browser.form_closed("the limits dialog to close").await;
    let stored = stored_limits(&pool, Limited::Queue, "limited")
        .await
        .expect("the operator's limits");
    assert_eq!(
        (stored.0, stored.1, stored.2, stored.3.as_deref()),
        (Some(4), Some(100), Some(60_000), Some("customer"))
    );
    assert!(
        stored.4.as_deref().is_some_and(|by| by.starts_with("api ")),
        "{stored:?}"
    );
    browser
        .wait_js(
            "the limits in the queue's row",
            PAGE_DEADLINE,
            "const row = document.querySelector('#page tr[data-queue=limited]');
             return row && row.textContent.includes('global 4, rate 100/1m per customer');",
            vec![],
        )
        .await;

    // Reset: back to forge.toml (none here).
    browser
        .click("#page tr[data-queue=limited] button[data-action=limit-queue]")
        .await;
    let shown = browser
        .wait_js(
            "the dialog with the current limits",
            SOON,
            "const g = document.querySelector('dialog.form #form-global_concurrency');
             return g && [g.value, document.querySelector('#form-rate').value];",
            vec![],
        )
        .await;
    assert_eq!(shown, json!(["4", "100/1m"]));
    browser
        .click("dialog.form button[data-action=reset-queue-limits]")
        .await;
    browser.form_closed("the limits dialog to close").await;
    assert_eq!(stored_limits(&pool, Limited::Queue, "limited").await, None);
    browser
        .wait_js(
            "no limits in the queue's row",
            PAGE_DEADLINE,
            "const row = document.querySelector('#page tr[data-queue=limited]');
             return row && !row.textContent.includes('global 4');",
            vec![],
        )
        .await;
    assert_eq!(
        audited(&pool, "limited").await,
        ["limit_queue", "reset_queue_limits"]
    );
    browser
        .assert_no_console_errors("while limiting a queue")
        .await;
    browser.close().await;
    node.shutdown().await;
}

/// From the Overview's job kinds' limits: a kind limited by its code is listed as a node's;
/// a kind not listed yet is limited from the page (named in the form, the token asked for
/// first), a bad rate refused with the API's message next to its field (nothing stored), then
/// set (stored as the operator's, audited, listed with what counts against it), then reset to
/// the code's (none: it leaves the list).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_kinds_limits_are_listed_set_and_reset_from_the_dashboard() {
    if !browser_present() {
        return;
    }
    let (db, pool) = setup().await;
    // `capped` declares a global concurrency of 3, which the node writes at start.
    let (node, base) = token_node_with(db.url(), false, |b| b.job(crate::jobs::capped)).await;

    let browser = Browser::start("kind-limits").await;
    browser.open(&format!("{base}#/overview")).await;
    browser.wait_loaded("overview").await;
    let code = browser
        .wait_js(
            "the code's limits of capped",
            PAGE_DEADLINE,
            "const row = document.querySelector('#page tr[data-kind=capped]');
             const f = (name) => row.querySelector(`[data-field=${name}]`).textContent;
             return row && [f('limits'), f('set-by'), f('running')];",
            vec![],
        )
        .await;
    assert_eq!(code, json!(["global 3", "a node", "0 of 3"]));
    let actions = browser
        .assert_actions_are_keyboard_buttons("overview")
        .await;
    assert!(
        actions.contains(&"new-kind-limits".to_owned())
            && actions.contains(&"limit-kind".to_owned()),
        "{actions:?}"
    );
    // The code's limits: the form has nothing to reset.
    browser
        .click("#page tr[data-kind=capped] button[data-action=limit-kind]")
        .await;
    let reset = browser
        .wait_js(
            "the form of capped's limits",
            SOON,
            "const d = document.querySelector('dialog.form');
             return d && [d.querySelector('#form-global_concurrency').value,
                          d.querySelector('[data-action=reset-kind-limits]') !== null];",
            vec![],
        )
        .await;
    assert_eq!(reset, json!(["3", false]));
    browser
        .click("dialog.form button[data-action=cancel-form]")
        .await;
    browser.form_closed("the limits dialog to close").await;

    // A kind not listed yet, with a bad rate: the API's message, the field marked, nothing stored.
    browser
        .click("#page button[data-action=new-kind-limits]")
        .await;
    browser.fill("kind", "send_email").await;
    browser.fill("global_concurrency", "2").await;
    browser.fill("rate", "10 a second").await;
    browser
        .click("dialog.form button[data-action=save-kind-limits]")
        .await;
    browser.give_token().await;
    let (error, invalid) = browser
        .form_error("the API's error about the rate", "10 a second")
        .await;
    assert!(error.contains("HTTP 400"), "{error}");
    assert_eq!(invalid, ["rate"], "{error}");
    assert_eq!(
        stored_limits(&pool, Limited::Kind, "send_email").await,
        None
    );
    browser.screenshot("kind-limits-bad-rate").await;
    browser
        .assert_console_shows_only_refusals("after the bad rate", &[400])
        .await;

    // Corrected: stored as the operator's, audited, listed.
    browser.fill("rate", "10/1s").await;
    browser.fill("rate_key", "customer").await;
    browser
        .click("dialog.form button[data-action=save-kind-limits]")
        .await;
    browser.form_closed("the limits dialog to close").await;
    let stored = stored_limits(&pool, Limited::Kind, "send_email")
        .await
        .expect("the operator's limits");
    assert_eq!(
        (stored.0, stored.1, stored.2, stored.3.as_deref()),
        (Some(2), Some(10), Some(1_000), Some("customer"))
    );
    let by = stored.4.expect("an operator's limits say who set them");
    assert!(by.starts_with("api "), "{by}");
    let listed = browser
        .wait_js(
            "the operator's limits listed",
            PAGE_DEADLINE,
            "const row = document.querySelector('#page tr[data-kind=send_email]');
             const f = (name) => row.querySelector(`[data-field=${name}]`).textContent;
             return row && [f('limits'), f('set-by'), f('running'), f('claims')];",
            vec![],
        )
        .await;
    assert_eq!(
        listed,
        json!(["global 2, rate 10/1s per customer", by, "0 of 2", "0"])
    );
    browser.screenshot("kind-limits-set").await;

    // Reset: back to the code's (none for this kind: it leaves the list).
    browser
        .click("#page tr[data-kind=send_email] button[data-action=limit-kind]")
        .await;
    let shown = browser
        .wait_js(
            "the dialog with the current limits",
            SOON,
            "const g = document.querySelector('dialog.form #form-global_concurrency');
             return g && [g.value, document.querySelector('#form-rate').value,
                          document.querySelector('#form-rate_key').value];",
            vec![],
        )
        .await;
    assert_eq!(shown, json!(["2", "10/1s", "customer"]));
    browser
        .click("dialog.form button[data-action=reset-kind-limits]")
        .await;
    browser.form_closed("the limits dialog to close").await;
    assert_eq!(
        stored_limits(&pool, Limited::Kind, "send_email").await,
        None
    );
    browser
        .wait_js(
            "the kind gone from the list, the code's still there",
            PAGE_DEADLINE,
            "return document.querySelector('#page tr[data-kind=send_email]') === null
                 && document.querySelector('#page tr[data-kind=capped]') !== null;",
            vec![],
        )
        .await;
    assert_eq!(
        audited(&pool, "send_email").await,
        ["limit_kind", "reset_kind_limits"]
    );
    browser
        .assert_no_console_errors("while limiting a job kind")
        .await;
    browser.close().await;
    node.shutdown().await;
}

/// The Crons page creates a stored cron (a bad argument and a bad policy refused in the form,
/// with what is wrong), changes it, pauses and resumes it, and deletes it (confirmed); a cron
/// of code has no Edit or Delete, says why, and its name is refused for a new cron with the
/// API's 409. Every change is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_cron_is_created_changed_paused_and_deleted_from_the_dashboard() {
    if !browser_present() {
        return;
    }
    let (db, pool) = setup().await;
    let in_code = CronJob::new(
        "in_code",
        Schedule::parse("0 * * * *").unwrap(),
        |_ctx: CronContext| async move { Ok::<_, forge::CronError>(()) },
    );
    let (node, base) = token_node(db.url(), false, Some(in_code)).await;
    let browser = Browser::start("stored-crons").await;
    browser.open(&format!("{base}#/crons")).await;
    browser.wait_loaded("crons").await;
    browser
        .wait_js(
            "the cron of code in the list",
            PAGE_DEADLINE,
            "return document.querySelector('#page tr[data-cron=in_code]') !== null;",
            vec![],
        )
        .await;
    assert!(
        browser
            .assert_actions_are_keyboard_buttons("crons")
            .await
            .contains(&"new-cron".to_owned())
    );

    // New: arguments that are not JSON are refused before any request.
    browser.click("#page button[data-action=new-cron]").await;
    browser.fill("name", "nightly").await;
    browser.fill("expression", "0 3 * * *").await;
    browser.fill("kind", "plain").await;
    browser.fill("args", r#"{"tag": "nightly""#).await;
    browser
        .click("dialog.form button[data-action=save-cron]")
        .await;
    let (error, invalid) = browser
        .form_error("the arguments refused", "must be JSON")
        .await;
    assert_eq!(invalid, ["args"], "{error}");
    // A policy the API refuses: its message, the field marked.
    browser.fill("args", r#"{"tag": "nightly"}"#).await;
    browser.fill("catch_up", "sometimes").await;
    browser
        .click("dialog.form button[data-action=save-cron]")
        .await;
    browser.give_token().await;
    let (error, invalid) = browser
        .form_error("the API's error about catch_up", "sometimes")
        .await;
    assert!(
        error.contains("catch_up must be one of") && error.contains("HTTP 400"),
        "{error}"
    );
    assert_eq!(invalid, ["catch_up"], "{error}");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.crons WHERE name = 'nightly'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "nothing stored by a refused form");
    browser
        .assert_console_shows_only_refusals("after the bad catch_up", &[400])
        .await;
    browser.fill("catch_up", "skip").await;
    browser
        .click("dialog.form button[data-action=save-cron]")
        .await;
    browser.form_closed("the new cron's dialog to close").await;
    let row: (String, String, String, Value, Value) = sqlx::query_as(
        "SELECT expression, timezone, job_kind, job_args, options FROM forge.crons WHERE name = 'nightly'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (row.0.as_str(), row.1.as_str(), row.2.as_str(), &row.3),
        ("0 3 * * *", "UTC", "plain", &json!({"tag": "nightly"}))
    );
    assert_eq!(row.4["catch_up"], "skip", "{}", row.4);
    // The page of the new cron.
    browser
        .wait_js(
            "the new cron's page",
            PAGE_DEADLINE,
            "const job = document.querySelector('#page [data-field=job]');
             return location.hash === '#/crons/nightly' && job && job.textContent.includes('plain');",
            vec![],
        )
        .await;
    browser.screenshot("stored-cron").await;

    // Change: the form starts from what is stored.
    browser.click("#page button[data-action=edit-cron]").await;
    let shown = browser
        .wait_js(
            "the stored definition in the form",
            SOON,
            "const v = (n) => document.querySelector(`dialog.form #form-${n}`).value;
             return document.querySelector('dialog.form')
               && [v('name'), v('expression'), v('kind'), v('args'), v('catch_up'), v('interrupted'),
                   document.querySelector('#form-name').readOnly];",
            vec![],
        )
        .await;
    assert_eq!(
        shown,
        json!([
            "nightly",
            "0 3 * * *",
            "plain",
            r#"{"tag":"nightly"}"#,
            "skip",
            "rerun",
            true
        ])
    );
    browser.fill("expression", "30 4 * * *").await;
    browser.fill("timezone", "Europe/Paris").await;
    browser
        .click("dialog.form button[data-action=save-cron]")
        .await;
    browser.form_closed("the change's dialog to close").await;
    let (expression, zone): (String, String) =
        sqlx::query_as("SELECT expression, timezone FROM forge.crons WHERE name = 'nightly'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (expression.as_str(), zone.as_str()),
        ("30 4 * * *", "Europe/Paris")
    );
    browser
        .wait_js(
            "the changed schedule on the page",
            PAGE_DEADLINE,
            "return document.querySelector('#page .facts').textContent.includes('30 4 * * * in Europe/Paris');",
            vec![],
        )
        .await;

    // Pause and resume, as for any cron.
    browser.click("#page button[data-action=pause-cron]").await;
    browser
        .wait_js(
            "the cron paused",
            PAGE_DEADLINE,
            "return document.querySelector('#page button[data-action=resume-cron]') !== null;",
            vec![],
        )
        .await;
    browser.click("#page button[data-action=resume-cron]").await;
    browser
        .wait_js(
            "the cron resumed",
            PAGE_DEADLINE,
            "return document.querySelector('#page button[data-action=pause-cron]') !== null;",
            vec![],
        )
        .await;

    // Delete, confirmed: gone from the database, back to the list.
    browser.click("#page button[data-action=delete-cron]").await;
    browser
        .wait_js(
            "the confirmation of the delete",
            SOON,
            "const d = document.querySelector('dialog.confirm');
             return d && d.open ? d.textContent.includes('nightly') : null;",
            vec![],
        )
        .await;
    browser.click("#confirm-yes").await;
    browser
        .wait_js(
            "the list without the deleted cron",
            PAGE_DEADLINE,
            "return location.hash === '#/crons' && document.querySelector('#page tr[data-cron=in_code]')
               && !document.querySelector('#page tr[data-cron=nightly]');",
            vec![],
        )
        .await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.crons WHERE name = 'nightly'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "the stored cron is deleted");
    assert_eq!(
        audited(&pool, "nightly").await,
        [
            "upsert_cron",
            "upsert_cron",
            "pause_cron",
            "resume_cron",
            "delete_cron"
        ]
    );

    // A cron of code: no Edit or Delete, the page says why; its name is refused (409).
    browser.open(&format!("{base}#/crons/in_code")).await;
    browser.wait_loaded("crons").await;
    let page = browser
        .wait_js(
            "the cron of code's page",
            PAGE_DEADLINE,
            "const job = document.querySelector('#page [data-field=job]');
             return job && document.querySelector('#page button[data-action=pause-cron]')
               && [job.textContent, document.querySelectorAll('#page [data-action=edit-cron], #page [data-action=delete-cron]').length];",
            vec![],
        )
        .await;
    assert!(
        page[0]
            .as_str()
            .unwrap()
            .contains("the API refuses to change or delete it"),
        "{page}"
    );
    assert_eq!(page[1], 0, "no Edit or Delete for a cron of code");
    browser.open(&format!("{base}#/crons")).await;
    browser.wait_loaded("crons").await;
    browser.click("#page button[data-action=new-cron]").await;
    browser.fill("name", "in_code").await;
    browser.fill("expression", "*/5 * * * *").await;
    browser.fill("kind", "plain").await;
    browser
        .click("dialog.form button[data-action=save-cron]")
        .await;
    let (error, _) = browser
        .form_error("the API's refusal of a code cron's name", "a cron of code")
        .await;
    assert!(error.contains("HTTP 409"), "{error}");
    let expression: String =
        sqlx::query_scalar("SELECT expression FROM forge.crons WHERE name = 'in_code'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(expression, "0 * * * *", "the cron of code is unchanged");
    browser
        .assert_console_shows_only_refusals("after the refused name", &[409])
        .await;
    browser
        .click("dialog.form button[data-action=cancel-form]")
        .await;
    browser.form_closed("the dialog to close on Cancel").await;
    browser
        .assert_no_console_errors("while operating stored crons")
        .await;
    browser.close().await;
    node.shutdown().await;
}
