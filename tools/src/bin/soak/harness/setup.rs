//! Start-up: the throwaway primary and its standby, the nodes' role and tables, the proxies
//! and configs, and the harness that runs them.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr as _;
use std::sync::Arc;

use chrono::Utc;
use forge::Config;
use forge_testkit::{PgOptions, PgProxy, PgServer, faketime_library};
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::Instant;

use super::stored::STORED_SQL;
use super::{Harness, Phase, Slot, Verdict, as_node_role, build_standby};
use crate::node::node_config;
use crate::options::{FaultKind, Options, Rng};
use crate::{
    ADMIN_TIMEOUT, BoxError, DOWN_AFTER, LEASE, MAX_CONNECTIONS, NODE_IDS, NODE_ROLE, POOL_SIZE,
};

/// The application's tables, made by the harness before the nodes start. Their times are true
/// times (`soak_now()`: the server's clock less the offset the harness stepped it by, kept in
/// `soak_clock`), so that the ledger can compare them across the database's clock steps. No unique key on
/// the effects: a repeated effect is a second row, so duplicates can be counted. The deferred
/// constraint triggers make a COMMIT sleep on the server while a flag names the committing
/// node (lost replies), and record the commit's key in the same transaction, so that a commit
/// that completed after its node died can be found afterwards.
const SETUP_SQL: &str = r#"
CREATE TABLE soak_clock (offset_us bigint NOT NULL);
INSERT INTO soak_clock VALUES (0);

CREATE FUNCTION soak_now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT clock_timestamp() - (SELECT offset_us FROM soak_clock) * interval '1 microsecond'
$$;

CREATE TABLE soak_cron_effects (
    id           bigserial   PRIMARY KEY,
    cron         text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    attempt      integer     NOT NULL,
    node         text        NOT NULL,
    epoch        bigint      NOT NULL,
    tenure       bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT soak_now()
);
CREATE INDEX soak_cron_effects_tick ON soak_cron_effects (cron, scheduled_at);

CREATE TABLE soak_job_effects (
    id      bigserial   PRIMARY KEY,
    job_id  bigint      NOT NULL,
    kind    text        NOT NULL,
    attempt integer     NOT NULL,
    node    text        NOT NULL,
    tick_us bigint      NOT NULL,
    at      timestamptz NOT NULL DEFAULT soak_now()
);
CREATE INDEX soak_job_effects_job ON soak_job_effects (job_id);

-- The handlers' runs of the limited and rated queues' jobs and of the workflows' steps: the
-- handler's own attempt, its start (written by the handler) and its end (written in the
-- transaction that completes the job, so a rescued attempt's end never lands), stamped with
-- the node's host clock less the skew the harness gave it: true times, which the database's
-- clock steps do not move.
CREATE TABLE soak_runs (
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    what        text        NOT NULL,
    node        text        NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    PRIMARY KEY (job_id, attempt)
);

CREATE TABLE soak_leader_work (
    id     bigserial   PRIMARY KEY,
    role   text        NOT NULL,
    epoch  bigint      NOT NULL,
    tenure bigint      NOT NULL,
    node   text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT soak_now()
);

CREATE TABLE soak_flags (
    kind text NOT NULL,
    node text NOT NULL,
    PRIMARY KEY (kind, node)
);

CREATE TABLE soak_lost_replies (
    kind        text        NOT NULL,
    node        text        NOT NULL,
    key         bigint      NOT NULL,
    backend_pid integer     NOT NULL,
    at          timestamptz NOT NULL DEFAULT soak_now()
);

CREATE FUNCTION soak_slow_cron_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.cron = 'soak_tick'
       AND EXISTS (SELECT 1 FROM soak_flags f WHERE f.kind = 'cron' AND f.node = NEW.node) THEN
        INSERT INTO soak_lost_replies (kind, node, key, backend_pid)
        VALUES ('cron', NEW.node, (extract(epoch FROM NEW.scheduled_at) * 1000000)::bigint,
                pg_backend_pid());
        PERFORM pg_sleep(1.5);
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER soak_slow_cron_commit AFTER INSERT ON soak_cron_effects
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION soak_slow_cron_commit();

CREATE FUNCTION soak_slow_job_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM soak_flags f WHERE f.kind = 'tx_job' AND f.node = NEW.node) THEN
        INSERT INTO soak_lost_replies (kind, node, key, backend_pid)
        VALUES ('tx_job', NEW.node, NEW.job_id, pg_backend_pid());
        PERFORM pg_sleep(1.5);
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER soak_slow_job_commit AFTER INSERT ON soak_job_effects
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.kind = 'tx')
    EXECUTE FUNCTION soak_slow_job_commit();
"#;

/// The history of every job's (state, attempt, node), recorded at each commit that changes
/// one (deferred constraint triggers on `forge.jobs`, made after FORGE's migrations; the
/// product's statements are unchanged, each commit adds a row here): which jobs were running
/// on a node when it was marked down, and when each left `running`. `at` is the time of the
/// COMMIT (`clock_timestamp()` in a deferred trigger), so a completion written inside a
/// transaction that stays open counts from its commit.
const MOVES_SQL: &str = r#"
CREATE TABLE soak_job_moves (
    id      bigserial   PRIMARY KEY,
    job_id  bigint      NOT NULL,
    kind    text        NOT NULL,
    state   text        NOT NULL,
    attempt integer     NOT NULL,
    node    text,
    -- The job's attempted_at: for a claim, the claim's instant by the database's clock (the
    -- one a queue's rate counts).
    attempted_at timestamptz,
    at      timestamptz NOT NULL DEFAULT soak_now()
);

CREATE FUNCTION soak_job_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM forge.jobs j WHERE j.id = OLD.id) THEN
        -- The row moved between forge.jobs's partitions (a kept completion, a retry of a
        -- completed job): its insert on the other side records the new state.
        NULL;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO soak_job_moves (job_id, kind, state, attempt, node, attempted_at)
        VALUES (OLD.id, OLD.kind, 'deleted', OLD.attempt, OLD.node_id, OLD.attempted_at);
    ELSE
        INSERT INTO soak_job_moves (job_id, kind, state, attempt, node, attempted_at)
        VALUES (NEW.id, NEW.kind, NEW.state, NEW.attempt, NEW.node_id, NEW.attempted_at);
    END IF;
    RETURN NULL;
END $$;

-- The true time of each cluster event (forge.events.at is the server's clock, stepped by the
-- clock faults); the soak reads events through the view soak_events.
CREATE TABLE soak_event_times (
    id bigint      PRIMARY KEY,
    at timestamptz NOT NULL
);

CREATE FUNCTION soak_event_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO soak_event_times (id, at)
    VALUES (NEW.id, NEW.at - (SELECT offset_us FROM soak_clock) * interval '1 microsecond');
    RETURN NULL;
END $$;

CREATE TRIGGER soak_event_seen AFTER INSERT ON forge.events
    FOR EACH ROW EXECUTE FUNCTION soak_event_seen();

CREATE VIEW soak_events AS
    SELECT e.id, coalesce(t.at, e.at) AS at, e.namespace, e.kind, e.node_id, e.role, e.epoch,
           e.detail, e.at - coalesce(t.at, e.at) AS server_ahead
      FROM forge.events e LEFT JOIN soak_event_times t ON t.id = e.id;

CREATE CONSTRAINT TRIGGER soak_job_inserted AFTER INSERT OR DELETE ON forge.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION soak_job_moved();
CREATE CONSTRAINT TRIGGER soak_job_updated AFTER UPDATE ON forge.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.attempt IS DISTINCT FROM NEW.attempt
          OR OLD.node_id IS DISTINCT FROM NEW.node_id)
    EXECUTE FUNCTION soak_job_moved();
"#;

pub(crate) async fn soak(options: Options) -> Result<Verdict, BoxError> {
    println!(
        "FORGE soak: {} node processes, {} min of random faults every {}-{} s",
        NODE_IDS.len(),
        options.minutes,
        options.interval.0,
        options.interval.1
    );
    println!(
        "seed {} (rerun with --seed {} to replay the same fault choices and timings)",
        options.seed, options.seed
    );
    // The clock faults need libfaketime: PostgreSQL (primary and standbys) runs under it, and
    // so do node processes with a skewed clock. Without it those kinds leave the deck, loudly.
    let library = faketime_library();
    let faketime = library.is_some();
    if let Some(library) = &library {
        println!("libfaketime: {}", library.display());
    } else {
        let kinds: Vec<&str> = FaultKind::ALL
            .iter()
            .filter(|k| k.needs_faketime())
            .map(|k| k.key())
            .collect();
        println!(
            "libfaketime NOT found (Debian/Ubuntu: apt-get install libfaketime, or set FORGE_FAKETIME_LIB): the fault kinds {} are left out of this run",
            kinds.join(", ")
        );
        if options
            .only
            .as_ref()
            .is_some_and(|only| only.iter().all(|k| k.needs_faketime()))
        {
            return Err("--only names clock faults alone, and libfaketime is missing".into());
        }
    }
    let primary = tokio::task::spawn_blocking(move || {
        let options = PgOptions::default()
            .durable(true)
            .max_connections(MAX_CONNECTIONS);
        PgServer::start_with(if faketime {
            options.steppable_clock()
        } else {
            options
        })
    })
    .await??;
    let primary = Arc::new(primary);
    let db = primary.create_database().await?;
    let db_name = db.name().to_owned();
    // The nodes log in as an ordinary role owning the database (FORGE's migrations, the
    // soak's tables and the job history triggers are made as that role, before the nodes
    // start: `forge::migrate` applies what a node would); the harness is the superuser.
    let mut setup = sqlx::PgConnection::connect(&primary.url()).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {NODE_ROLE} LOGIN; ALTER DATABASE \"{db_name}\" OWNER TO {NODE_ROLE};"
    )))
    .execute(&mut setup)
    .await?;
    setup.close().await?;
    let mut setup = sqlx::PgConnection::connect(&as_node_role(&primary.url_for(&db_name))?).await?;
    forge::migrate::up(&mut setup).await?;
    sqlx::raw_sql(SETUP_SQL).execute(&mut setup).await?;
    sqlx::raw_sql(MOVES_SQL).execute(&mut setup).await?;
    sqlx::raw_sql(STORED_SQL).execute(&mut setup).await?;
    setup.close().await?;
    let admin_proxy = PgProxy::start(primary.host(), primary.port())?;
    let admin_url = format!(
        "{}?application_name=forge-soak-harness",
        admin_proxy.url_for(&primary, &db_name)
    );
    // A lock wait of the harness's own (behind its LOCK TABLE, a frozen transaction) ends
    // on the server, not only in the client.
    let admin_options = PgConnectOptions::from_str(&admin_url)?.options([("lock_timeout", "3s")]);
    let admin = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(ADMIN_TIMEOUT)
        .connect_lazy_with(admin_options);
    let source = primary.clone();
    let (standby, repl_proxy) =
        tokio::task::spawn_blocking(move || build_standby(&source)).await??;

    let dir = std::env::temp_dir().join(format!("forge-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut slots = Vec::new();
    for id in NODE_IDS {
        let proxy = PgProxy::start(primary.host(), primary.port())?;
        let text = node_config(&as_node_role(&proxy.url_for(&primary, &db_name))?, id);
        Config::from_toml(&text)?;
        let config = dir.join(format!("{id}.toml"));
        std::fs::write(&config, text)?;
        slots.push(Slot {
            id: id.to_owned(),
            proxy,
            config,
            phase: Phase::Dead {
                restart_at: Instant::now(),
            },
            incarnation: 0,
            started: Instant::now(),
            blackhole_until: None,
            busy_until: None,
            starve_check_at: None,
            start_failures: 0,
            unexpected_exits: 0,
            hold_until: None,
            cursor: 0,
            open: HashMap::new(),
            paused_since_us: None,
            blackhole_since_us: None,
            skew: None,
            clock_us: 0,
        });
    }
    println!(
        "PostgreSQL primary on 127.0.0.1:{} (fsync on), streaming standby on 127.0.0.1:{}, one proxy per node{}",
        primary.port(),
        standby.port(),
        if faketime {
            "; both under libfaketime (a wall clock the harness steps)"
        } else {
            ""
        }
    );
    println!(
        "timings: lease {} s, refresh 1 s, lock_timeout 1 s, check 500 ms, drain 2 s, heartbeat 500 ms, drift 1.5 s, down {} s, pool {}",
        LEASE.as_secs(),
        DOWN_AFTER.as_secs(),
        POOL_SIZE
    );
    println!("run directory (node configs and logs): {}\n", dir.display());

    let mut harness = Harness {
        t0: Instant::now(),
        rng: Rng(options.seed),
        interval: options.interval,
        dir,
        primary,
        standby: Some(Arc::new(standby)),
        repl_proxy: Some(repl_proxy),
        standby_build: None,
        standby_retry_at: None,
        pending_failover: None,
        failover_losses: Vec::new(),
        admin_proxy,
        admin,
        slots,
        deck: Vec::new(),
        faults: Vec::new(),
        findings: Vec::new(),
        armed: None,
        lost_reply_pids: Vec::new(),
        failovers: 0,
        term_exits: Vec::new(),
        rss: Vec::new(),
        error_lines: 0,
        error_examples: Vec::new(),
        t0_utc: Utc::now(),
        db_name,
        only: options.only,
        spans: Vec::new(),
        pauses: Vec::new(),
        blackholes: Vec::new(),
        stalls: Vec::new(),
        handlerless: HashMap::new(),
        stranded: BTreeMap::new(),
        max_handlerless: 0.0,
        samples: 0,
        sample_failures: 0,
        next_sample: Instant::now(),
        freeze: None,
        table_lock: None,
        write_stall: None,
        fill: None,
        storm: None,
        step_downs: Vec::new(),
        fill_reports: Vec::new(),
        stop_began: None,
        faketime,
        db_clock: None,
        skew: None,
        skews: 0,
        down_after_steps: 0,
        large_claim: None,
        delayed: None,
        outcomes: Vec::new(),
        next_flow: Instant::now(),
        flows_tried: 0,
        flow_errors: Vec::new(),
        stored_change: None,
        crashes: Default::default(),
    };
    harness.store_cron().await?;
    harness.run(options.minutes).await
}
