//! Placement benchmark: how fast roles spread across nodes, how many moves it takes, how long
//! each move leaves a role without a leader, whether a per-second cron misses or doubles a tick
//! meanwhile, and what the placement check costs the database.
//!
//! ```text
//! cargo run --release --example bench_placement              # 5 rounds of 3 nodes, 6 nodes joining
//! cargo run --release --example bench_placement -- --quick   # 2 rounds
//! ```
//!
//! It starts its own throwaway PostgreSQL (fsync on) and runs the nodes in this process, with the
//! default timings (placement moves at most one role per heartbeat interval, 5 s). Every node
//! campaigns for the three built-in roles and registers `bench_tick`, a per-second cron of the
//! scheduler role (`catch_up = "all"`) that records its tick and completes it in one fenced
//! transaction: a tick missing or recorded twice would show in `bench_ticks`.
//!
//! Scenarios: (a) three nodes started at once: time until every node leads at most its share
//! (one role), the moves, the gap of each move (`leader_released` to the next
//! `leader_elected`); (b) six nodes joining one by one, each after the cluster settled; (c) the
//! cost of `forge.placement_move`, which rides on a leading node's heartbeat statement (no
//! statement of its own).

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::crons::{CatchUp, CronJob};
use forge::{Config, CronContext, CronError, Node, Schedule};
use forge_testkit::{PgOptions, PgServer};
use sqlx::PgPool;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    let quick = std::env::args().any(|a| a == "--quick");
    match bench(quick).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn bench_tick(ctx: CronContext) -> Result<(), CronError> {
    let mut tx = ctx.fenced_transaction().await?;
    sqlx::query("INSERT INTO bench_ticks (scheduled_at, node) VALUES ($1, $2)")
        .bind(ctx.scheduled_at())
        .bind(ctx.leadership().node_id().as_str())
        .execute(&mut *tx)
        .await?;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

async fn start(url: &str, id: &str) -> Result<Node, BoxError> {
    let mut config = Config::default();
    config.database.url = Some(url.to_owned());
    config.node.id = Some(id.to_owned());
    let tick = CronJob::new("bench_tick", Schedule::parse("* * * * * *")?, bench_tick)
        .catch_up(CatchUp::All);
    Ok(Node::builder(config)
        .auto_register(false)
        .cron(tick)
        .start()
        .await?)
}

/// Roles led per live node, from `forge.leaders`.
async fn leads(pool: &PgPool) -> Result<Vec<(String, i64)>, BoxError> {
    Ok(sqlx::query_as(
        "SELECT n.node_id, count(l.role) FROM forge.nodes n
           LEFT JOIN forge.leaders l ON l.node_id = n.node_id AND l.released_at IS NULL
                                    AND l.lease_until > now()
          WHERE n.stopped_at IS NULL AND n.down_at IS NULL GROUP BY n.node_id ORDER BY 1",
    )
    .fetch_all(pool)
    .await?)
}

/// Waits until every role is led and no live node leads more than its share.
async fn settled(pool: &PgPool, nodes: usize, roles: i64) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let share = (roles as usize).div_ceil(nodes) as i64;
    loop {
        let leads = leads(pool).await?;
        let total: i64 = leads.iter().map(|(_, n)| n).sum();
        if leads.len() == nodes && total == roles && leads.iter().all(|(_, n)| *n <= share) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!("not settled after 120 s: {leads:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The moves since `after` (an event id), with the gap each left: (role, from, to, gap ms).
async fn moves(pool: &PgPool, after: i64) -> Result<Vec<(String, String, String, f64)>, BoxError> {
    Ok(sqlx::query_as(
        "SELECT m.role, m.node_id, m.detail->>'to',
                (extract(epoch FROM e.at - m.at) * 1000)::float8
           FROM forge.events m
           JOIN forge.events e ON e.kind = 'leader_elected' AND e.role = m.role
                              AND e.epoch = m.epoch + 1
          WHERE m.kind = 'leader_rebalanced' AND m.id > $1 ORDER BY m.id",
    )
    .bind(after)
    .fetch_all(pool)
    .await?)
}

async fn last_event(pool: &PgPool) -> Result<i64, BoxError> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM forge.events")
            .fetch_one(pool)
            .await?,
    )
}

/// Seconds in (from, to] whose tick is missing or recorded more than once.
async fn tick_faults(
    pool: &PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<(i64, i64), BoxError> {
    Ok(sqlx::query_as(
        "SELECT count(*) FILTER (WHERE coalesce(t.n, 0) = 0), count(*) FILTER (WHERE t.n > 1)
           FROM generate_series(date_trunc('second', $1::timestamptz) + interval '1 s',
                                date_trunc('second', $2::timestamptz), interval '1 s') s
           LEFT JOIN (SELECT scheduled_at, count(*) AS n FROM bench_ticks GROUP BY 1) t
             ON t.scheduled_at = s",
    )
    .bind(from)
    .bind(to)
    .fetch_one(pool)
    .await?)
}

async fn shutdown(nodes: Vec<Node>) {
    for node in nodes {
        node.shutdown().await;
    }
}

fn pct(values: &[f64], p: f64) -> f64 {
    forge_testkit::stats::percentile(values, p).unwrap_or(f64::NAN)
}

async fn bench(quick: bool) -> Result<(), BoxError> {
    let server =
        tokio::task::spawn_blocking(|| PgServer::start_with(PgOptions::default())).await??;
    let rounds = if quick { 2 } else { 5 };
    let mut settle_ms = Vec::new();
    let mut move_counts = Vec::new();
    let mut gaps = Vec::new();
    let (mut missing, mut doubled) = (0, 0);

    println!("(a) three nodes x three roles started together, {rounds} rounds");
    for round in 1..=rounds {
        let db = server.create_database().await?;
        let pool = db.pool().await?;
        sqlx::raw_sql(
            "CREATE TABLE bench_ticks (scheduled_at timestamptz NOT NULL, node text NOT NULL)",
        )
        .execute(&pool)
        .await?;
        let from = Utc::now();
        let (a, b, c) = tokio::join!(
            start(db.url(), "n1"),
            start(db.url(), "n2"),
            start(db.url(), "n3")
        );
        let nodes = vec![a?, b?, c?];
        let took = settled(&pool, 3, 3).await?;
        // Let the ticks of the moves' seconds be recorded, then look at them.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let made = moves(&pool, 0).await?;
        let (m, d) = tick_faults(
            &pool,
            from + chrono::TimeDelta::seconds(2),
            Utc::now() - chrono::TimeDelta::seconds(2),
        )
        .await?;
        println!(
            "  round {round}: settled in {} ms, {} moves, gaps {:?} ms, ticks missing {m}, twice {d}",
            took.as_millis(),
            made.len(),
            made.iter()
                .map(|g| (g.3 * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
        settle_ms.push(took.as_secs_f64() * 1000.0);
        move_counts.push(made.len());
        gaps.extend(made.iter().map(|g| g.3));
        missing += m;
        doubled += d;
        shutdown(nodes).await;
    }

    println!("(b) six nodes joining one by one");
    let db = server.create_database().await?;
    let pool = db.pool().await?;
    sqlx::raw_sql(
        "CREATE TABLE bench_ticks (scheduled_at timestamptz NOT NULL, node text NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let from = Utc::now();
    let mut nodes = Vec::new();
    let mut join_moves = 0;
    for k in 1..=6 {
        // (FORGE's tables exist once the first node has started.)
        let before = if k == 1 { 0 } else { last_event(&pool).await? };
        nodes.push(start(db.url(), &format!("j{k}")).await?);
        let took = settled(&pool, k, 3).await?;
        // A join can start a move after the count already fits: give placement two rounds.
        tokio::time::sleep(Duration::from_secs(11)).await;
        let made = moves(&pool, before).await?;
        gaps.extend(made.iter().map(|g| g.3));
        join_moves += made.len();
        println!(
            "  node {k} joined: every node at or under its share (ceil(3/{k}) = {}) {} ms after the join, {} moves {:?}",
            3usize.div_ceil(k),
            took.as_millis(),
            made.len(),
            made.iter()
                .map(|g| format!("{} {}->{} {:.1} ms", g.0, g.1, g.2, g.3))
                .collect::<Vec<_>>()
        );
    }
    let (m, d) = tick_faults(
        &pool,
        from + chrono::TimeDelta::seconds(2),
        Utc::now() - chrono::TimeDelta::seconds(2),
    )
    .await?;
    missing += m;
    doubled += d;

    println!("(c) the placement check on a settled six-node cluster");
    let leader: String = sqlx::query_scalar(
        "SELECT node_id FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
    )
    .fetch_one(&pool)
    .await?;
    let calls = 1000;
    let began = Instant::now();
    for _ in 0..calls {
        let _: Option<Vec<String>> =
            sqlx::query_scalar("SELECT forge.placement_move('forge', $1, true, 5000, 50000)")
                .bind(&leader)
                .fetch_one(&pool)
                .await?;
    }
    let per_call_us = began.elapsed().as_secs_f64() * 1e6 / calls as f64;
    shutdown(nodes).await;

    settle_ms.sort_by(f64::total_cmp);
    gaps.sort_by(f64::total_cmp);
    println!();
    println!(
        "3 nodes started together: settled in p50 {:.0} ms, max {:.0} ms; moves per round {:?} (at most 2 needed)",
        pct(&settle_ms, 50.0),
        settle_ms.last().copied().unwrap_or_default(),
        move_counts
    );
    println!("6 nodes joining one by one: {join_moves} moves in all");
    if !gaps.is_empty() {
        println!(
            "gap of a move (release to the named standby's election): p50 {:.1} ms, max {:.1} ms over {} moves",
            pct(&gaps, 50.0),
            gaps.last().copied().unwrap_or_default(),
            gaps.len()
        );
    }
    println!(
        "per-second cron across every move: {missing} ticks missing, {doubled} recorded twice"
    );
    println!(
        "placement check: {per_call_us:.0} us per call (a round trip included), once per heartbeat of a node that leads; no statement of its own"
    );
    if missing > 0 || doubled > 0 {
        return Err("ticks missing or doubled".into());
    }
    Ok(())
}
