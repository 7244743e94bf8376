-- FORGE scheduler tables: the crons the cluster knows and the tick ledger that makes each tick
-- run once, the durable job queue, and paused queues. The functions that write them are in
-- schema/functions/, one file each, applied after the migrations.
--
-- Who writes which job transition (see ARCHITECTURE.md, "Jobs"):
--   enqueuer        -> available | scheduled                  forge.jobs_enqueue
--   any worker      available -> running                      forge.jobs_step (claim, SKIP LOCKED)
--   that worker     running -> completed | retryable | available | dead | cancelled
--                                                             forge.jobs_step (outcomes, guarded by
--                                                             id + attempt + node + state),
--                                                             forge.jobs_complete (in the handler's
--                                                             transaction)
--   scheduler lead  scheduled | retryable -> available        forge.jobs_promote
--   scheduler lead  running (node gone) -> available | dead | cancelled    forge.jobs_maintain
--   anyone          available | scheduled | retryable -> cancelled;
--                   running -> cancel_requested (+ NOTIFY)    forge.jobs_cancel
--
-- Notifications (payloads are space-separated, namespace first):
--   forge_jobs         '<ns> <queue>' or '<ns> @<role>': jobs became available
--   forge_jobs_due     '<ns> <unix ms>': a scheduled job or retry is due then
--   forge_jobs_cancel  '<ns> <node> <job id>': cancel a running job on that node
--   forge_crons        '<ns> <cron>': a cron was paused, resumed or triggered

------------------------------------------------------------------------------------------------
-- Crons
------------------------------------------------------------------------------------------------

CREATE TABLE forge.crons (
    namespace            text        NOT NULL,
    name                 text        NOT NULL,
    role                 text        NOT NULL,
    expression           text        NOT NULL,
    timezone             text        NOT NULL,
    first_seen_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_by         text        NOT NULL,
    paused_at            timestamptz,
    paused_by            text,
    -- "Trigger now": a pending request, which whichever node leads the cron's role runs once as
    -- a manual tick (cron_ticks.manual) at the requested instant; the claim clears it.
    trigger_requested_at timestamptz,
    trigger_requested_by text,
    PRIMARY KEY (namespace, name)
);

COMMENT ON TABLE forge.crons IS
    'Every cron some node has registered; a leader warns about crons here that its binary lacks.';

COMMENT ON COLUMN forge.crons.paused_at IS
    'Set while the cron is paused: whichever node leads its role records its ticks as skipped (error ''paused'') instead of running them.';

-- One row per claimed tick. The primary key is the exactly-once guarantee: a tick is claimed by
-- one INSERT, fenced by the claiming leader's tenure (epoch, tenure), before its handler runs.
CREATE TABLE forge.cron_ticks (
    namespace    text        NOT NULL,
    cron         text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    role         text        NOT NULL,
    epoch        bigint      NOT NULL,
    node_id      text        NOT NULL,
    attempt      integer     NOT NULL DEFAULT 1,
    state        text        NOT NULL
                 CHECK (state IN ('running', 'succeeded', 'failed', 'timed_out', 'skipped', 'abandoned')),
    claimed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    error        text,
    tenure       bigint      NOT NULL,
    manual       boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (namespace, cron, scheduled_at)
);

CREATE INDEX cron_ticks_running ON forge.cron_ticks (namespace, role) WHERE state = 'running';
CREATE INDEX cron_ticks_finished_at ON forge.cron_ticks (finished_at) WHERE finished_at IS NOT NULL;

COMMENT ON TABLE forge.cron_ticks IS
    'The tick ledger: one row per claimed tick. A row still running under another tenure than the current leader''s = a run cut short by its leader''s death. A handler that completes its tick in its own transaction (CronContext::complete) commits its effects and the succeeded state together.';

COMMENT ON COLUMN forge.cron_ticks.manual IS
    'A run asked for by an operator ("trigger now"), not a tick of the schedule: it does not move the catch-up frontier.';

------------------------------------------------------------------------------------------------
-- Jobs
------------------------------------------------------------------------------------------------

CREATE TABLE forge.jobs (
    id               bigserial   PRIMARY KEY,
    namespace        text        NOT NULL,
    queue            text        NOT NULL,
    kind             text        NOT NULL,
    args             jsonb       NOT NULL,
    state            text        NOT NULL
                     CHECK (state IN ('available', 'scheduled', 'running', 'retryable',
                                      'completed', 'dead', 'cancelled')),
    priority         smallint    NOT NULL DEFAULT 0,
    -- When the job is (or was) due: enqueue time, the requested run-at, or the end of a backoff.
    run_at           timestamptz NOT NULL,
    -- Attempts started so far; the running attempt's number while running.
    attempt          integer     NOT NULL DEFAULT 0,
    -- NULL: [jobs] default_max_attempts of the node that handles it.
    max_attempts     integer     CHECK (max_attempts > 0),
    timeout_ms       bigint      CHECK (timeout_ms > 0),
    -- Jobs with a role run only on that role's leader, under the tenure (epoch, tenure)
    -- recorded at claim.
    role             text,
    epoch            bigint,
    unique_key       text,
    -- The node of the current (or last) attempt.
    node_id          text,
    attempted_at     timestamptz,
    finished_at      timestamptz,
    -- One object per failed, interrupted or rescued attempt: {at, attempt, node, reason, error}.
    errors           jsonb       NOT NULL DEFAULT '[]',
    cancel_requested boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    tenure           bigint,
    -- When the running attempt started; NULL while a job claimed ahead waits for a free slot on
    -- its node (such an attempt never counts when it is rescued).
    started_at       timestamptz
);

-- Claiming: the next jobs of a queue in (priority, run_at, id) order, without role. Each index
-- the queue figures count from carries what they return (kind; queue, kind and state), so
-- forge.jobs_figures reads no heap page the visibility map marks all-visible.
CREATE INDEX jobs_claim ON forge.jobs (namespace, queue, priority, run_at, id) INCLUDE (kind)
    WHERE state = 'available' AND role IS NULL;
-- Claiming by a role's leader.
CREATE INDEX jobs_claim_role ON forge.jobs (namespace, role, queue, priority, run_at, id)
    INCLUDE (kind)
    WHERE state = 'available' AND role IS NOT NULL;
-- Promotion: the earliest due scheduled job or retry.
CREATE INDEX jobs_due ON forge.jobs (namespace, run_at) INCLUDE (queue, kind, state)
    WHERE state IN ('scheduled', 'retryable');
-- Rescue: running jobs by node.
CREATE INDEX jobs_running ON forge.jobs (namespace, node_id) WHERE state = 'running';
-- Pruning by retention.
CREATE INDEX jobs_finished ON forge.jobs (namespace, state, finished_at) WHERE finished_at IS NOT NULL;
-- Dead jobs for the queue figures (pruning goes by jobs_finished).
CREATE INDEX jobs_dead ON forge.jobs (namespace, queue, kind) INCLUDE (run_at)
    WHERE state = 'dead';
-- Unique jobs: one unfinished job per (kind, key).
CREATE UNIQUE INDEX jobs_unique ON forge.jobs (namespace, kind, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable');

COMMENT ON TABLE forge.jobs IS
    'FORGE''s durable jobs. state: available, scheduled, running, retryable -> completed, dead (the dead-letter state), cancelled.';

-- Paused queues: no node claims their jobs until resumed.
CREATE TABLE forge.queues (
    namespace text        NOT NULL,
    queue     text        NOT NULL,
    paused_at timestamptz,
    paused_by text,
    PRIMARY KEY (namespace, queue)
);
