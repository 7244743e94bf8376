//! The measurement's server, its databases and node processes, and the figures' arithmetic.

use std::path::{Path, PathBuf};
use std::time::Duration;

use forge_testkit::{NodeProcess, PgServer, TestDatabase};
use sqlx::PgPool;
use tokio::process::Command;
use tokio::time::Instant;

use super::node::NODE_FLAG;
use super::{BoxError, Mode};

pub(super) struct Bench {
    pub(super) server: PgServer,
    pub(super) extra_config: String,
    pub(super) setup_sql: Option<String>,
    pub(super) backlog: u64,
    pub(super) history: u64,
    pub(super) exe: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) next_id: usize,
}

impl Bench {
    /// A fresh database with FORGE's schema, and a forge.toml for it (defaults otherwise, plus
    /// `--extra-config` and `mode`'s settings).
    pub(super) async fn database(
        &self,
        mode: Mode,
    ) -> Result<(TestDatabase, PgPool, PathBuf), BoxError> {
        let db = self.server.create_database().await?;
        let pool = db.pool().await?;
        let mut config = forge::Config::default();
        config.database.url = Some(db.url().to_owned());
        config.node.id = Some("bench-migrator".into());
        forge::Node::builder(config)
            .auto_register(false)
            .start()
            .await?
            .shutdown()
            .await;
        self.seed(&pool).await?;
        if let Some(sql) = &self.setup_sql {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&pool)
                .await
                .map_err(|err| format!("--setup-sql failed: {err}"))?;
        }
        let path = self.dir.join(format!("{}.toml", db.name()));
        std::fs::write(
            &path,
            format!(
                "[database]\nurl = \"{}\"\n{}\n{}",
                db.url(),
                self.extra_config,
                mode.config()
            ),
        )?;
        Ok((db, pool, path))
    }

    /// The `--backlog` and `--history` rows: jobs no node of the benchmark claims, in the
    /// same table and indexes as the measured ones.
    async fn seed(&self, pool: &PgPool) -> Result<(), BoxError> {
        if self.backlog == 0 && self.history == 0 {
            return Ok(());
        }
        let started = Instant::now();
        for (queue, state, n) in [
            ("backlog", "available", self.backlog),
            ("history", "completed", self.history),
        ] {
            // In chunks of a million: one huge statement would hold all its WAL and locks.
            let mut done = 0;
            while done < n {
                let chunk = (n - done).min(1_000_000);
                sqlx::query(
                    "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, attempt,
                                             node_id, attempted_at, finished_at, created_at)
                     SELECT 'forge', $1, 'noop', 'null', $2, now() - interval '1 hour',
                            CASE WHEN $2 = 'completed' THEN 1 ELSE 0 END,
                            CASE WHEN $2 = 'completed' THEN 'gone' END,
                            CASE WHEN $2 = 'completed' THEN now() - interval '1 hour' END,
                            CASE WHEN $2 = 'completed' THEN now() - interval '1 hour' END,
                            now() - interval '1 hour'
                       FROM generate_series(1, $3)",
                )
                .bind(queue)
                .bind(state)
                .bind(chunk as i64)
                .execute(pool)
                .await?;
                done += chunk;
            }
        }
        sqlx::query("VACUUM ANALYZE forge.jobs")
            .execute(pool)
            .await?;
        // The seeding writes gigabytes of WAL: the checkpoints it triggers would otherwise run
        // during the measurement (and every page it touches first would be logged whole), a
        // cost of the seeding, not of the rows kept. (Needs superuser or pg_checkpoint.)
        if let Err(err) = sqlx::query("CHECKPOINT").execute(pool).await {
            println!(
                "  (no CHECKPOINT after seeding: {err}; checkpoints may overlap the measurement)"
            );
        }
        println!(
            "  (seeded {} backlog and {} history jobs in {:.1} s)",
            self.backlog,
            self.history,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    pub(super) fn spawn(&mut self, config: &Path) -> Result<NodeProcess, BoxError> {
        self.next_id += 1;
        let id = format!("n{}", self.next_id);
        let mut command = Command::new(&self.exe);
        command
            .arg(NODE_FLAG)
            .arg(config)
            .env("FORGE_NODE_ID", &id)
            .env_remove("DATABASE_URL")
            .env_remove("FORGE_ROLES")
            .env_remove("FORGE_METRICS_LISTEN");
        Ok(NodeProcess::spawn(command)?.named(&id))
    }

    pub(super) async fn ready(node: &mut NodeProcess) -> Result<(), BoxError> {
        node.wait_for_line("READY", Duration::from_secs(30), |l| {
            l.starts_with("FORGE-BENCH READY")
        })
        .await?;
        Ok(())
    }

    pub(super) async fn stop(mut nodes: Vec<&mut NodeProcess>) -> Result<(), BoxError> {
        for node in &nodes {
            node.terminate()?;
        }
        for node in &mut nodes {
            node.wait_exit(Duration::from_secs(60)).await?;
        }
        Ok(())
    }
}

pub(super) async fn count(pool: &PgPool, sql: &'static str) -> Result<i64, BoxError> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(super) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(&values, 50.0)
}
