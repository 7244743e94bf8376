//! What a measurement cost the database: CPU, WAL and row writes, per job.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::{Instant, sleep};

use super::BoxError;

/// A reading of what the database has done so far: PostgreSQL's CPU (every process of the
/// server, from `/proc`, when it runs on this machine), the WAL position and records
/// (`pg_current_wal_insert_lsn()`, `pg_stat_wal`: the whole server), and the row writes of the
/// job tables (`pg_stat_user_tables` of the measurement's database).
pub(super) struct Meter {
    server_cpu: Option<f64>,
    wal_lsn: i64,
    wal_records: i64,
    wal_fpi: i64,
    /// (table, [inserted, updated, of which HOT, deleted]).
    rows: BTreeMap<String, [i64; 4]>,
}

impl Meter {
    /// PostgreSQL's CPU so far (every live process of the server), without waiting: read it
    /// before the sessions of a measurement end (an ended process takes its time with it).
    pub(super) async fn server_cpu(pool: &PgPool) -> Result<Option<f64>, BoxError> {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(pool)
            .await?;
        Ok(forge_testkit::stats::parent_pid(pid as u32)
            .and_then(forge_testkit::stats::tree_cpu_seconds))
    }

    pub(super) async fn read(pool: &PgPool) -> Result<Meter, BoxError> {
        // Backends publish their row and WAL counts when idle, at most once a second: wait
        // for the ones of the statements just run.
        sleep(Duration::from_millis(1200)).await;
        let (pid, lsn, records, fpi): (i32, i64, i64, i64) = sqlx::query_as(
            "SELECT pg_backend_pid(), (pg_current_wal_insert_lsn() - '0/0')::bigint,
                    wal_records, wal_fpi
               FROM pg_stat_wal",
        )
        .fetch_one(pool)
        .await?;
        let server_cpu = forge_testkit::stats::parent_pid(pid as u32)
            .and_then(forge_testkit::stats::tree_cpu_seconds);
        let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
               FROM pg_stat_user_tables
              WHERE (schemaname = 'forge' AND relname LIKE 'jobs%') OR schemaname = 'minimal'",
        )
        .fetch_all(pool)
        .await?;
        Ok(Meter {
            server_cpu,
            wal_lsn: lsn,
            wal_records: records,
            wal_fpi: fpi,
            rows: rows
                .into_iter()
                .map(|(t, i, u, h, d)| (t, [i, u, h, d]))
                .collect(),
        })
    }

    /// What happened since `before`, per job of `jobs`.
    pub(super) fn since(&self, before: &Meter, jobs: usize) -> Cost {
        let n = jobs.max(1) as f64;
        Cost {
            server_cpu_us: self
                .server_cpu
                .zip(before.server_cpu)
                .map(|(a, b)| (a - b) * 1e6 / n),
            wal_bytes: (self.wal_lsn - before.wal_lsn) as f64 / n,
            wal_records: (self.wal_records - before.wal_records) as f64 / n,
            wal_fpi: (self.wal_fpi - before.wal_fpi) as f64 / n,
            rows: self
                .rows
                .iter()
                .map(|(t, now)| {
                    let was = before.rows.get(t).copied().unwrap_or_default();
                    let per = |i: usize| (now[i] - was[i]) as f64 / n;
                    (t.clone(), [per(0), per(1), per(2), per(3)])
                })
                .filter(|(_, r)| r.iter().any(|v| *v > 0.0))
                .collect(),
            ..Cost::default()
        }
    }
}

/// PostgreSQL's CPU per job between `before` and a reading `now` taken while the measurement's
/// sessions still lived, in microseconds.
pub(super) fn cpu_per_job(now: Option<f64>, before: &Meter, jobs: usize) -> Option<f64> {
    now.zip(before.server_cpu)
        .map(|(a, b)| (a - b) * 1e6 / jobs.max(1) as f64)
}

/// Waits for the loops of a limit measurement and reads what they cost: PostgreSQL's CPU while
/// their sessions (`loopers`) live, the rest once they have ended. Returns the seconds since
/// `began` and the cost per job since `m0`.
pub(super) async fn loops_done(
    loops: Vec<tokio::task::JoinHandle<Result<(), BoxError>>>,
    began: Instant,
    pool: &PgPool,
    loopers: PgPool,
    m0: &Meter,
    total: usize,
) -> Result<(f64, Cost), BoxError> {
    for l in loops {
        l.await??;
    }
    let wall = began.elapsed().as_secs_f64();
    let cpu = Meter::server_cpu(pool).await?;
    loopers.close().await;
    let mut cost = Meter::read(pool).await?.since(m0, total);
    cost.server_cpu_us = cpu_per_job(cpu, m0, total);
    Ok((wall, cost))
}

/// What a measurement cost the database, per job (see [`Meter`]): the drain's (or the loop's)
/// CPU and WAL, the enqueue's, and the rows written from enqueue to completion.
#[derive(Default)]
pub(super) struct Cost {
    server_cpu_us: Option<f64>,
    pub(super) nodes_cpu_us: Option<f64>,
    pub(super) enqueue_cpu_us: Option<f64>,
    pub(super) enqueue_wal_bytes: f64,
    pub(super) wal_bytes: f64,
    pub(super) wal_records: f64,
    pub(super) wal_fpi: f64,
    pub(super) rows: BTreeMap<String, [f64; 4]>,
}

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(cpu) = self.server_cpu_us {
            write!(f, "PostgreSQL CPU {cpu:.1} us, ")?;
        }
        if let Some(cpu) = self.nodes_cpu_us {
            write!(f, "nodes' CPU {cpu:.1} us, ")?;
        }
        write!(
            f,
            "WAL {:.0} bytes in {:.2} records ({:.3} full pages)",
            self.wal_bytes, self.wal_records, self.wal_fpi
        )?;
        if self.enqueue_wal_bytes > 0.0 {
            write!(f, "; enqueue: WAL {:.0} bytes", self.enqueue_wal_bytes)?;
            if let Some(cpu) = self.enqueue_cpu_us {
                write!(f, ", PostgreSQL CPU {cpu:.1} us")?;
            }
        }
        for (table, [ins, upd, hot, del]) in &self.rows {
            write!(
                f,
                "; {table}: {ins:.2} inserted, {upd:.2} updated ({hot:.2} HOT), {del:.2} deleted"
            )?;
        }
        Ok(())
    }
}
