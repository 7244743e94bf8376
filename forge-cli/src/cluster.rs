//! `status`, `leaders`, `events`, `nodes`, `step-down`.

use forge::Role;
use forge::inspect::{
    EventFilter, EventKind, EventView, LeaderView, LeadershipState, NodeState, NodeView,
    PageRequest, StepDown,
};
use serde_json::json;
use tokio::time::Instant;

use crate::args::{EventsArgs, LeadersArgs, StepDownArgs};
use crate::ctx::Ctx;
use crate::fail::{Fail, Outcome};
use crate::out::{self, Table};

pub(crate) async fn status(ctx: &Ctx, json: bool) -> Outcome {
    let cluster = ctx.cluster();
    let workload = ctx.workload();
    let status = cluster.status().await?;
    let leaders = cluster.leaders().await?;
    let crons = workload.crons().await?;
    let queues = workload.queues().await?;
    let migrations = crate::migrate::forge_status(ctx).await?;
    let functions = crate::migrate::forge_functions(ctx).await?;
    let functions_due = functions.iter().filter(|f| f.state.is_due()).count();
    let server: String = forge::sqlx::query_scalar("SHOW server_version")
        .fetch_one(&ctx.pool)
        .await
        .map_err(|err| Fail::database(&err))?;
    let pending = migrations
        .iter()
        .filter(|m| m.state != forge::migrate::MigrationState::Applied)
        .count();
    let paused = crons.iter().filter(|c| c.paused_at.is_some()).count();
    if json {
        out::print_json(&json!({
            "namespace": ctx.namespace.name(),
            "database": ctx.url,
            "server_version": server,
            "migrations": { "applied": migrations.len() - pending, "pending": pending },
            "functions": { "total": functions.len(), "due": functions_due },
            "healthy": status.healthy,
            "problems": status.problems,
            "warnings": status.warnings,
            "nodes": status.nodes,
            "roles": status.roles,
            "leaderless": status.leaderless,
            "unserved": status.unserved,
            "leaders": leaders,
            "crons": { "total": crons.len(), "paused": paused },
            "queues": queues,
        }));
        return Ok(0);
    }
    let sum = |f: fn(&forge::inspect::QueueView) -> i64| queues.iter().map(f).sum::<i64>();
    out::print_fields(&[
        ("namespace", ctx.namespace.name().to_owned()),
        ("database", format!("{} (PostgreSQL {server})", ctx.url)),
        (
            "migrations",
            format!("{} applied, {pending} pending", migrations.len() - pending),
        ),
        (
            "functions",
            format!(
                "{} applied, {functions_due} pending",
                functions.len() - functions_due
            ),
        ),
        (
            "health",
            if status.healthy {
                "healthy".to_owned()
            } else {
                format!("NOT HEALTHY: {}", status.problems.join("; "))
            },
        ),
        (
            "nodes",
            NodeState::ALL
                .iter()
                .map(|state| format!("{} {state}", status.nodes.get(*state)))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("crons", format!("{} ({paused} paused)", crons.len())),
        (
            "jobs",
            format!(
                "{} available, {} running, {} scheduled, {} pending, {} retryable, {} dead in {} queues",
                sum(|q| q.available),
                sum(|q| q.running),
                sum(|q| q.scheduled),
                sum(|q| q.pending),
                sum(|q| q.retryable),
                sum(|q| q.dead),
                queues.len()
            ),
        ),
    ]);
    for warning in &status.warnings {
        outln!("warning: {warning}");
    }
    outln!();
    if leaders.is_empty() {
        outln!("no role has had a leader yet");
    } else {
        leaders_table(&leaders).print();
    }
    Ok(0)
}

fn leaders_table(leaders: &[LeaderView]) -> Table {
    let mut table = Table::new(&["ROLE", "NODE", "EPOCH", "STATE", "LEASE LEFT", "SINCE"]);
    for leader in leaders {
        let state = match leader.state {
            LeadershipState::Led => "leading",
            other => other.as_str(),
        };
        table.row(vec![
            leader.role.clone(),
            leader.node_id.clone(),
            leader.epoch.to_string(),
            state.to_owned(),
            if leader.is_led() {
                out::ms(leader.lease_remaining_ms)
            } else {
                "-".to_owned()
            },
            format!(
                "{} ({})",
                out::time(leader.acquired_at),
                out::ago(leader.acquired_at)
            ),
        ]);
    }
    table
}

pub(crate) async fn leaders(ctx: &Ctx, args: &LeadersArgs, json: bool) -> Outcome {
    let cluster = ctx.cluster();
    if !args.history {
        let leaders = cluster.leaders().await?;
        if json {
            out::print_json(&leaders);
        } else if leaders.is_empty() {
            outln!("no role has had a leader in namespace {}", ctx.namespace);
        } else {
            leaders_table(&leaders).print();
        }
        return Ok(0);
    }
    let role = args.role.as_deref().map(parse_role).transpose()?;
    let page = cluster
        .history(
            role.as_ref(),
            PageRequest {
                limit: args.limit,
                before: args.before,
            },
        )
        .await?;
    if json {
        out::print_json(&page);
        return Ok(0);
    }
    let mut table = Table::new(&[
        "ID", "ROLE", "EPOCH", "NODE", "SINCE", "FAILOVER", "GAP", "GAP FROM", "ENDED", "HOW",
    ]);
    for t in &page.items {
        table.row(vec![
            t.id.to_string(),
            t.role.clone(),
            t.epoch.to_string(),
            t.node_id.clone(),
            out::time(t.acquired_at),
            if t.failover { "yes" } else { "no" }.to_owned(),
            t.gap_ms.map_or_else(|| "-".to_owned(), out::ms),
            out::or_dash(t.gap_from.map(|g| g.as_str())),
            out::opt_time(t.ended_at),
            serde_json::to_value(t.end)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        ]);
    }
    table.print();
    print_next(page.next);
    Ok(0)
}

/// The cursor line under a page that has more.
pub(crate) fn print_next(next: Option<i64>) {
    if let Some(next) = next {
        outln!("(more: --before {next})");
    }
}

pub(crate) fn parse_role(name: &str) -> Result<Role, Fail> {
    Role::new(name).map_err(|err| Fail::usage(err.to_string()))
}

fn parse_kinds(kinds: &[String]) -> Result<Vec<EventKind>, Fail> {
    kinds
        .iter()
        .map(|kind| {
            EventKind::parse(kind).ok_or_else(|| {
                Fail::usage(format!(
                    "unknown event kind {kind:?}; known kinds: {}",
                    EventKind::ALL
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect()
}

fn event_row(event: &EventView) -> Vec<String> {
    // The fields that say something (no nulls), compact.
    let detail = match &event.detail {
        serde_json::Value::Object(map) => {
            let shown: serde_json::Map<String, serde_json::Value> = map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if shown.is_empty() {
                String::new()
            } else {
                serde_json::Value::Object(shown).to_string()
            }
        }
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    vec![
        event.id.to_string(),
        out::time(event.at),
        event.kind.as_str().to_owned(),
        out::or_dash(event.node_id.as_deref()),
        out::or_dash(event.role.as_deref()),
        out::or_dash(event.epoch),
        out::cut(&detail, 100),
    ]
}

const EVENT_HEADERS: &[&str] = &["ID", "AT", "KIND", "NODE", "ROLE", "EPOCH", "DETAIL"];

pub(crate) async fn events(ctx: &Ctx, args: &EventsArgs, json: bool) -> Outcome {
    let cluster = ctx.cluster();
    // Listen for SIGTERM / SIGINT before the first page is printed, so that a signal after
    // it ends the command cleanly (exit 0).
    let mut stop = args.follow.then(Stop::listen).transpose()?;
    let mut filter = EventFilter {
        kinds: parse_kinds(&args.kinds)?,
        node_id: args.node.clone(),
        role: args.role.as_deref().map(parse_role).transpose()?,
        after: None,
    };
    let page = cluster
        .events(
            &filter,
            PageRequest {
                limit: args.limit,
                before: args.before,
            },
        )
        .await?;
    if !args.follow {
        if json {
            out::print_json(&page);
        } else if page.items.is_empty() {
            outln!("no events");
        } else {
            let mut table = Table::new(EVENT_HEADERS);
            for event in &page.items {
                table.row(event_row(event));
            }
            table.print();
            print_next(page.next);
        }
        return Ok(0);
    }
    // Following: the newest page oldest first, then whatever comes after it, as it comes.
    let mut last = page.items.first().map(|e| e.id);
    let mut pending: Vec<EventView> = page.items.into_iter().rev().collect();
    let mut header = !json;
    let widths = [8, 20, 15, 12, 18, 6];
    let Some(stop) = stop.as_mut() else {
        return Ok(0);
    };
    loop {
        for event in pending.drain(..) {
            if json {
                out::print_json_line(&event);
            } else {
                if header {
                    print_follow_line(EVENT_HEADERS.iter().map(|h| (*h).to_owned()), &widths);
                    header = false;
                }
                print_follow_line(event_row(&event).into_iter(), &widths);
            }
        }
        let until = Instant::now() + args.interval;
        tokio::select! {
            _ = stop.recv() => return Ok(0),
            _ = tokio::time::sleep_until(until) => {}
        }
        filter.after = Some(last.unwrap_or(0));
        let page = cluster
            .events(
                &filter,
                PageRequest {
                    limit: 500,
                    before: None,
                },
            )
            .await?;
        if let Some(newest) = page.items.last() {
            last = Some(newest.id);
        }
        pending = page.items;
    }
}

/// A line of a followed table: fixed widths, since later rows are not known yet.
fn print_follow_line(cells: impl Iterator<Item = String>, widths: &[usize]) {
    use std::io::Write;
    let mut line = String::new();
    for (i, cell) in cells.enumerate() {
        match widths.get(i) {
            Some(width) => line.push_str(&format!("{cell:width$}  ")),
            None => line.push_str(&cell),
        }
    }
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", line.trim_end());
    let _ = stdout.flush();
}

fn node_json(node: &NodeView) -> serde_json::Value {
    serde_json::to_value(node).unwrap_or_default()
}

pub(crate) async fn nodes(ctx: &Ctx, node: Option<&str>, json: bool) -> Outcome {
    let cluster = ctx.cluster();
    if let Some(id) = node {
        let Some(node) = cluster.node(id).await? else {
            return Err(Fail::problem(format!(
                "no node {id:?} in namespace {} (forgotten, or never joined): see `forge nodes`",
                ctx.namespace
            )));
        };
        if json {
            out::print_json(&node_json(&node));
            return Ok(0);
        }
        out::print_fields(&[
            ("node", node.node_id.clone()),
            ("state", node.state.as_str().to_owned()),
            ("host", out::or_dash(node.hostname.as_deref())),
            ("pid", out::or_dash(node.pid)),
            ("version", out::or_dash(node.version.as_deref())),
            (
                "started",
                format!(
                    "{} ({})",
                    out::time(node.started_at),
                    out::ago(node.started_at)
                ),
            ),
            (
                "heartbeat",
                format!(
                    "{} ({} ago)",
                    out::time(node.heartbeat_at),
                    out::ms(node.heartbeat_age_ms)
                ),
            ),
            ("roles", out::list(&node.roles)),
            ("work roles", out::list(&node.work_roles)),
            ("leads", out::list(&node.leads)),
            ("queues", node.queues.to_string()),
            ("admin", out::or_dash(node.admin_url.as_deref())),
            ("stopped", out::opt_time(node.stopped_at)),
            (
                "down",
                match (node.down_at, &node.down_reason) {
                    (Some(at), Some(why)) => format!("{} ({why})", out::time(at)),
                    (at, _) => out::opt_time(at),
                },
            ),
        ]);
        return Ok(0);
    }
    let nodes = cluster.nodes().await?;
    if json {
        out::print_json(&nodes.iter().map(node_json).collect::<Vec<_>>());
        return Ok(0);
    }
    if nodes.is_empty() {
        outln!("no nodes in namespace {}", ctx.namespace);
        return Ok(0);
    }
    let mut table = Table::new(&[
        "NODE",
        "STATE",
        "HOST",
        "PID",
        "VERSION",
        "HEARTBEAT",
        "ROLES",
        "LEADS",
    ]);
    for node in &nodes {
        table.row(vec![
            node.node_id.clone(),
            node.state.as_str().to_owned(),
            out::or_dash(node.hostname.as_deref()),
            out::or_dash(node.pid),
            out::or_dash(node.version.as_deref()),
            format!("{} ago", out::ms(node.heartbeat_age_ms)),
            out::list(&node.roles),
            out::list(&node.leads),
        ]);
    }
    table.print();
    Ok(0)
}

pub(crate) async fn step_down(ctx: &Ctx, args: &StepDownArgs, json: bool) -> Outcome {
    let role = parse_role(&args.role)?;
    let cluster = ctx.cluster();
    let (epoch, from) = match cluster.step_down(&role, &ctx.by, args.force).await? {
        StepDown::Asked { epoch, node_id, .. } => (epoch, node_id),
        StepDown::NoStandby { epoch, node_id } => {
            return Err(Fail::problem(format!(
                "refused: no standby is waiting for role {role}; if {node_id} (epoch {epoch}) stepped down, \
                 the role would have no leader until a node campaigned again. Start or wait for another \
                 eligible node (see `forge leaders`), or pass --force to step down anyway"
            )));
        }
        StepDown::NoLeader => {
            return Err(Fail::problem(format!(
                "role {role} has no live leader in namespace {}: nothing to step down (see `forge leaders`)",
                ctx.namespace
            )));
        }
    };
    let mut successor: Option<LeaderView> = None;
    if args.wait {
        let deadline = Instant::now() + args.timeout;
        loop {
            successor = cluster
                .leaders()
                .await?
                .into_iter()
                .find(|l| l.role == role.name() && l.is_led() && l.epoch > epoch);
            if successor.is_some() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Fail::problem(format!(
                    "asked the leader of {role} (epoch {epoch}) to step down, but no new leader within {}: \
                     see `forge leaders` and `forge events --role {role}`",
                    humantime::format_duration(args.timeout)
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    if json {
        out::print_json(&json!({
            "role": role.name(),
            "epoch": epoch,
            "node_id": from,
            "new_leader": successor,
        }));
    } else {
        outln!(
            "asked {} (leader of {role}, epoch {epoch}) to hand over",
            if from.is_empty() { "the leader" } else { &from }
        );
        if let Some(next) = successor {
            outln!(
                "{role} is now led by {} (epoch {})",
                next.node_id,
                next.epoch
            );
        }
    }
    Ok(0)
}

/// SIGTERM and SIGINT (ctrl-c), listened for from creation on.
struct Stop {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn listen() -> Result<Stop, Fail> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let fail =
                |err: std::io::Error| Fail::problem(format!("cannot listen for signals: {err}"));
            Ok(Stop {
                term: signal(SignalKind::terminate()).map_err(fail)?,
                int: signal(SignalKind::interrupt()).map_err(fail)?,
            })
        }
        #[cfg(not(unix))]
        Ok(Stop {})
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
