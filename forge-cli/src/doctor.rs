//! `doctor`: what would make the cluster misbehave, with what to do; exits 1 when something is
//! wrong, so that a deploy can wait for it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::inspect::{NodeState, WorkKind};
use forge::migrate::MigrationState;
use forge::sqlx::{self, FromRow, Row};
use forge::{LockKey, NodeId, Role};
use serde::Serialize;

use crate::ctx::{Ctx, Settings};
use crate::fail::{Fail, Outcome, PROBLEM};
use crate::out::{self, Table};

/// Clock skew beyond this is a warning (beyond `--max-clock-skew`, a problem).
const SKEW_WARN_MS: f64 = 1000.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
enum Level {
    Ok,
    Warn,
    Fail,
    /// Not checked (an earlier check failed).
    Skip,
}

#[derive(Debug, Serialize)]
struct Finding {
    check: &'static str,
    status: Level,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
}

#[derive(Default)]
struct Report {
    findings: Vec<Finding>,
}

impl Report {
    fn add(&mut self, check: &'static str, status: Level, detail: impl Into<String>) {
        self.findings.push(Finding {
            check,
            status,
            detail: detail.into(),
            hint: None,
        });
    }

    fn hint(
        &mut self,
        check: &'static str,
        status: Level,
        detail: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.findings.push(Finding {
            check,
            status,
            detail: detail.into(),
            hint: Some(hint.into()),
        });
    }

    fn ok(&self, strict: bool) -> bool {
        self.findings.iter().all(|f| match f.status {
            Level::Ok | Level::Skip => true,
            Level::Warn => !strict,
            Level::Fail => false,
        })
    }

    fn print(&self, json: bool, strict: bool) {
        let ok = self.ok(strict);
        if json {
            out::print_json(&serde_json::json!({
                "ok": ok,
                "strict": strict,
                "checks": self.findings,
            }));
            return;
        }
        let mut table = Table::new(&["CHECK", "STATUS", "DETAIL"]);
        for f in &self.findings {
            let status = match f.status {
                Level::Ok => "ok",
                Level::Warn => "WARN",
                Level::Fail => "FAIL",
                Level::Skip => "skipped",
            };
            table.row(vec![
                f.check.to_owned(),
                status.to_owned(),
                f.detail.clone(),
            ]);
        }
        table.print();
        let hints: Vec<&Finding> = self
            .findings
            .iter()
            .filter(|f| f.hint.is_some() && matches!(f.status, Level::Warn | Level::Fail))
            .collect();
        if !hints.is_empty() {
            outln!();
            for f in hints {
                outln!("{}: {}", f.check, f.hint.as_deref().unwrap_or_default());
            }
        }
        let fails = self
            .findings
            .iter()
            .filter(|f| f.status == Level::Fail)
            .count();
        let warns = self
            .findings
            .iter()
            .filter(|f| f.status == Level::Warn)
            .count();
        outln!();
        outln!(
            "{}: {fails} problems, {warns} warnings{}",
            if ok { "healthy" } else { "NOT HEALTHY" },
            if strict {
                " (--strict: warnings count)"
            } else {
                ""
            }
        );
    }
}

pub(crate) async fn run(
    settings: Settings,
    strict: bool,
    max_clock_skew: Duration,
    json: bool,
) -> Outcome {
    let mut report = Report::default();
    let ctx = match Ctx::connect(settings).await {
        Ok(ctx) => ctx,
        Err(fail) if fail.code == PROBLEM => {
            report.hint(
                "connection",
                Level::Fail,
                fail.message,
                "start PostgreSQL or fix the URL (DATABASE_URL or [database] url of --config)",
            );
            report.print(json, strict);
            return Ok(PROBLEM);
        }
        Err(fail) => return Err(fail),
    };
    connection(&ctx, &mut report).await;
    if !pooler(&ctx, &mut report).await {
        // Nothing else can be trusted through a transaction pooler.
        for check in [
            "migrations",
            "lock keys",
            "leaders",
            "work",
            "nodes",
            "clock",
        ] {
            report.add(check, Level::Skip, "a transaction pooler is in the way");
        }
        report.print(json, strict);
        return Ok(PROBLEM);
    }
    let schema = migrations(&ctx, &mut report).await;
    if schema {
        if let Err(fail) = cluster(&ctx, &mut report).await {
            report.add("cluster", Level::Fail, fail.message);
        }
    } else {
        for check in ["lock keys", "leaders", "work", "nodes"] {
            report.add(check, Level::Skip, "FORGE's schema is not in place");
        }
    }
    clock(&ctx, &mut report, max_clock_skew).await;
    report.print(json, strict);
    Ok(if report.ok(strict) { 0 } else { PROBLEM })
}

async fn connection(ctx: &Ctx, report: &mut Report) {
    // Simple protocol: works even through a transaction pooler (checked next).
    match sqlx::raw_sql("SELECT current_setting('server_version') AS v, current_setting('server_version_num')::int AS n")
        .fetch_one(&ctx.pool)
        .await
    {
        Ok(row) => {
            // (v, n): raw SQL answers rows, decoded here.
            let (version, num): (String, i32) = FromRow::from_row(&row).unwrap_or_default();
            if num < 140000 {
                report.hint(
                    "connection",
                    Level::Warn,
                    format!("{}, PostgreSQL {version}", ctx.url),
                    "PostgreSQL older than 14 has no idle_session_timeout: a frozen leader is fenced by its followers a lock wait later; upgrade to 14 or newer",
                );
            } else {
                report.add("connection", Level::Ok, format!("{}, PostgreSQL {version}", ctx.url));
            }
        }
        Err(err) => report.add("connection", Level::Fail, Fail::database(&err).message),
    }
}

/// The node's own check: over a direct connection (or a session pooler) a session keeps one
/// backend for its life and two sessions never share one. False when a pooler is in the way.
async fn pooler(ctx: &Ctx, report: &mut Report) -> bool {
    async fn pid(conn: &mut sqlx::PgConnection) -> Result<i32, sqlx::Error> {
        let row = sqlx::raw_sql("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await?;
        row.try_get(0)
    }
    let result = async {
        let mut a = ctx.connection().await?;
        let mut b = ctx.connection().await?;
        let db = |e: sqlx::Error| Fail::database(&e);
        let a1 = pid(&mut a).await.map_err(db)?;
        let b1 = pid(&mut b).await.map_err(db)?;
        let a2 = pid(&mut a).await.map_err(db)?;
        Ok::<_, Fail>((a1, b1, a2))
    }
    .await;
    let hint = "FORGE's session advisory locks need a direct connection or a pooler in session mode: give FORGE its own DATABASE_URL that bypasses the pooler (or set PgBouncer pool_mode = session)";
    let evidence = match result {
        Ok((a1, _, a2)) if a1 != a2 => {
            format!("one connection was served by backend {a1}, then by backend {a2}")
        }
        Ok((a1, b1, _)) if a1 == b1 => {
            format!("two open connections were both served by backend {a1}")
        }
        Ok(_) => {
            report.add(
                "pooler",
                Level::Ok,
                "sessions keep their own backend (no transaction pooler)",
            );
            return true;
        }
        Err(fail) => {
            report.add("pooler", Level::Fail, fail.message);
            return false;
        }
    };
    report.hint(
        "pooler",
        Level::Fail,
        format!("a transaction-mode pooler is in the way: {evidence}"),
        hint,
    );
    false
}

/// FORGE's migrations; true when the schema is complete enough to read the cluster.
async fn migrations(ctx: &Ctx, report: &mut Report) -> bool {
    let status = match crate::migrate::forge_status(ctx).await {
        Ok(status) => status,
        Err(fail) => {
            report.add("migrations", Level::Fail, fail.message);
            return false;
        }
    };
    let named = |state: MigrationState| -> Vec<String> {
        status
            .iter()
            .filter(|m| m.state == state)
            .map(|m| format!("{:04}_{}", m.version, m.description))
            .collect()
    };
    let pending = named(MigrationState::Pending);
    let broken: Vec<String> = named(MigrationState::Changed)
        .into_iter()
        .chain(named(MigrationState::Failed))
        .collect();
    let unknown = named(MigrationState::Unknown);
    let applied = named(MigrationState::Applied);
    if !broken.is_empty() {
        report.hint(
            "migrations",
            Level::Fail,
            format!("changed or failed: {}", broken.join(", ")),
            "see `forge migrate status`",
        );
    }
    if !pending.is_empty() {
        report.hint(
            "migrations",
            Level::Fail,
            format!("{} pending: {}", pending.len(), pending.join(", ")),
            "apply them: `forge migrate up` (or start a node with [database] migrate = true)",
        );
    }
    if !unknown.is_empty() {
        report.hint(
            "migrations",
            Level::Warn,
            format!("applied but unknown to this CLI: {}", unknown.join(", ")),
            "the database was migrated by a newer FORGE: use a forge CLI of that version",
        );
    }
    let functions = match crate::migrate::forge_functions(ctx).await {
        Ok(functions) => functions,
        Err(fail) => {
            report.add("migrations", Level::Fail, fail.message);
            return false;
        }
    };
    let due = functions.iter().filter(|f| f.state.is_due()).count();
    if due > 0 {
        report.hint(
            "migrations",
            Level::Fail,
            crate::migrate::functions_line(&functions),
            "apply them: `forge migrate up` (or start a node with [database] migrate = true)",
        );
    }
    if broken.is_empty() && pending.is_empty() && due == 0 {
        report.add(
            "migrations",
            Level::Ok,
            format!(
                "{} applied, none pending; {} function files applied",
                applied.len(),
                functions.len()
            ),
        );
    }
    // Reading the cluster needs every table; a partial schema is reported above.
    pending.is_empty() && broken.is_empty()
}

async fn cluster(ctx: &Ctx, report: &mut Report) -> Result<(), Fail> {
    let cluster = ctx.cluster();
    let workload = ctx.workload();
    // The same status the admin API and the dashboard show: what fails here is what they
    // call a problem, what warns here their warnings.
    let status = cluster.status().await?;
    let leaders = cluster.leaders().await?;
    let nodes = cluster.nodes().await?;
    let crons = workload.crons().await?;

    // Every role FORGE may use in this namespace, for the lock-key check.
    let configured: BTreeSet<String> = ctx.config.node.roles.iter().flatten().cloned().collect();
    let mut known: BTreeSet<String> = Role::BUILTIN.iter().map(|r| r.name().to_owned()).collect();
    known.extend(configured.iter().cloned());
    known.extend(nodes.iter().flat_map(|n| n.roles.clone()));
    known.extend(leaders.iter().map(|l| l.role.clone()));
    known.extend(crons.iter().map(|c| c.role.clone()));
    lock_keys(ctx, report, &known, &nodes).await?;

    let unserved_role = |name: &str| {
        status
            .unserved
            .iter()
            .any(|work| work.work == WorkKind::Role && work.name == name)
    };
    for role in &status.roles {
        if unserved_role(&role.role) {
            // Reported under "work", with what to do.
            continue;
        }
        if role.led {
            report.add(
                "leaders",
                Level::Ok,
                format!(
                    "{}: {} (epoch {}, lease {} left)",
                    role.role,
                    role.leader.as_deref().unwrap_or("?"),
                    out::or_dash(role.epoch),
                    out::ms(role.lease_remaining_ms.unwrap_or_default())
                ),
            );
            continue;
        }
        let name = &role.role;
        let last = match leaders.iter().find(|l| l.role == *name) {
            Some(l) => format!(
                " (last: {} at epoch {}, {})",
                l.node_id,
                l.epoch,
                l.state.as_str()
            ),
            None => String::new(),
        };
        let hint = if role.candidates > 0 {
            format!(
                "active nodes campaign for {name} but none holds it: look for a foreign holder of its key (above), and at `forge events --role {name}`"
            )
        } else if !role.down_candidates.is_empty() {
            format!(
                "the nodes that campaign for {name} are down ({}): restart them, or start another node with {name} in [node] roles",
                role.down_candidates.join(", ")
            )
        } else {
            format!(
                "no active node campaigns for {name}: start a node whose binary has work for {name} (with {name} in its [node] roles, if it sets them)"
            )
        };
        report.hint(
            "leaders",
            Level::Fail,
            format!("{name}: no leader{last}"),
            hint,
        );
    }
    // Roles this configuration lists that no node campaigns for: not deployed yet, or the
    // nodes have no work for them.
    let expected: BTreeSet<&str> = status.roles.iter().map(|r| r.role.as_str()).collect();
    for role in configured.iter().filter(|r| !expected.contains(r.as_str())) {
        report.hint(
            "leaders",
            Level::Warn,
            format!("{role}: listed in [node] roles here, but no node campaigns for it"),
            format!(
                "no node in the cluster campaigns for {role}: start a node whose binary has work for {role} (with {role} in its [node] roles, if it sets them), or drop it from this configuration"
            ),
        );
    }

    // Work with nowhere to run: the status' problems, each with what to do.
    for work in &status.unserved {
        report.hint("work", Level::Fail, &work.problem, &work.remedy);
    }
    if status.unserved.is_empty() {
        report.add(
            "work",
            Level::Ok,
            "every queue with waiting jobs is worked, every role with work is campaigned for",
        );
    }

    let counts = status.nodes;
    if counts.active == 0 {
        report.hint(
            "nodes",
            Level::Fail,
            "no active node",
            "start the service's nodes; `forge nodes` lists the known ones",
        );
    } else {
        report.add("nodes", Level::Ok, format!("{} active", counts.active));
    }
    let named = |state: NodeState| -> Vec<&str> {
        nodes
            .iter()
            .filter(|n| n.state == state)
            .map(|n| n.node_id.as_str())
            .collect()
    };
    let drifted = named(NodeState::Drifted);
    if !drifted.is_empty() {
        report.hint(
            "nodes",
            Level::Warn,
            format!("drifted (no heartbeat for drift_after): {}", drifted.join(", ")),
            "a drifted node is frozen, starved or cut off from PostgreSQL: check its process and network",
        );
    }
    let down = named(NodeState::Down);
    if !down.is_empty() {
        report.hint(
            "nodes",
            Level::Warn,
            format!("down: {}", down.join(", ")),
            "their running jobs were rescued; restart them, or they are forgotten after forget_after",
        );
    }
    Ok(())
}

/// Advisory locks on FORGE's keys held by sessions that are not the FORGE sessions owning them.
async fn lock_keys(
    ctx: &Ctx,
    report: &mut Report,
    roles: &BTreeSet<String>,
    nodes: &[forge::inspect::NodeView],
) -> Result<(), Fail> {
    // key -> (what it is, the application_name prefix of its rightful holder)
    let mut keys: BTreeMap<i64, (String, String)> = BTreeMap::new();
    for name in roles {
        if let Ok(role) = Role::new(name) {
            keys.insert(
                role.lock_key(&ctx.namespace).0,
                (format!("role {name}"), format!("forge:{name}:")),
            );
        }
    }
    for node in nodes {
        if let Ok(id) = NodeId::new(&node.node_id) {
            keys.insert(
                LockKey::for_node(&ctx.namespace, &id).0,
                (
                    format!("node id {}", node.node_id),
                    format!("forge:node:{}", node.node_id),
                ),
            );
        }
    }
    // (pid, hi, lo, application_name, client, backend_start); pid is NULL for a prepared
    // transaction's lock, and pg_stat_activity may have no row for it.
    type Held = (
        Option<i32>,
        i64,
        i64,
        Option<String>,
        Option<String>,
        Option<DateTime<Utc>>,
    );
    let rows: Vec<Held> = sqlx::query_as(
        "SELECT l.pid, l.classid::bigint AS hi, l.objid::bigint AS lo, a.application_name,
                host(a.client_addr) AS client, a.backend_start
           FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_all(&ctx.pool)
    .await
    .map_err(|e| Fail::database(&e))?;
    let mut foreign = 0;
    for (pid, hi, lo, application, client, since) in rows {
        let key = (((hi as u64) << 32) | (lo as u64 & 0xFFFF_FFFF)) as i64;
        let Some((what, owner)) = keys.get(&key) else {
            continue;
        };
        let app = application.unwrap_or_default();
        let rightful = app.starts_with(owner.as_str()) && (owner.ends_with(':') || app == *owner);
        if rightful {
            continue;
        }
        foreign += 1;
        let pid = pid.unwrap_or_default();
        report.hint(
            "lock keys",
            Level::Fail,
            format!(
                "key {} of {what} is held by pid {pid} (application_name {app:?}, client {}, connected {})",
                LockKey(key),
                client.as_deref().unwrap_or("local"),
                out::opt_time(since)
            ),
            if app.starts_with("forge:") {
                "two FORGE roles or clusters share a key: give the roles distinct names or slots (Role::with_lock_slot), or the clusters distinct [cluster] lock_namespace values".to_owned()
            } else {
                format!(
                    "another application uses FORGE's advisory lock keys: set [cluster] lock_namespace (now {:?}) to a value of your own, or end that session (SELECT pg_terminate_backend({pid}))",
                    ctx.namespace.name()
                )
            },
        );
    }
    if foreign == 0 {
        report.add(
            "lock keys",
            Level::Ok,
            format!("{} keys, held only by FORGE sessions", keys.len()),
        );
    }
    Ok(())
}

/// This host's clock against the database's: a problem beyond `max_skew`, a warning over 1 s.
/// The skew is measured at the middle of one round trip (so it is known within half of it).
async fn clock(ctx: &Ctx, report: &mut Report, max_skew: Duration) {
    let sent = Utc::now();
    let db: Result<DateTime<Utc>, _> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&ctx.pool)
        .await;
    let received = Utc::now();
    match db {
        Ok(db) => {
            let round_trip = (received - sent).num_microseconds().unwrap_or(0) as f64 / 1000.0;
            let here = sent + (received - sent) / 2;
            let skew = (here - db).num_microseconds().unwrap_or(0) as f64 / 1000.0;
            let detail = format!(
                "this host is {} {} the database (round trip {})",
                out::ms(skew.abs()),
                if skew >= 0.0 { "ahead of" } else { "behind" },
                out::ms(round_trip)
            );
            let max_ms = max_skew.as_secs_f64() * 1000.0;
            let hint = "leases and claims run on the database's clock, but cron schedules and logs on the host's: a host behind the database runs its crons late by as much (one ahead has its claims refused until they are due); run NTP (chrony) on every host";
            if skew.abs() > max_ms {
                report.hint(
                    "clock",
                    Level::Fail,
                    format!("{detail}: more than --max-clock-skew {}", out::ms(max_ms)),
                    hint,
                );
            } else if skew.abs() > SKEW_WARN_MS {
                report.hint("clock", Level::Warn, detail, hint);
            } else {
                report.add("clock", Level::Ok, detail);
            }
        }
        Err(err) => report.add("clock", Level::Fail, Fail::database(&err).message),
    }
}
