-- FORGE crons: the crons the cluster knows, and the tick ledger that makes each tick run once.

CREATE TABLE forge.crons (
    namespace     text        NOT NULL,
    name          text        NOT NULL,
    role          text        NOT NULL,
    expression    text        NOT NULL,
    timezone      text        NOT NULL,
    first_seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_by  text        NOT NULL,
    PRIMARY KEY (namespace, name)
);

COMMENT ON TABLE forge.crons IS
    'Every cron some node has registered; a leader warns about crons here that its binary lacks.';

-- One row per claimed tick. The primary key is the exactly-once guarantee: a tick is claimed by
-- one INSERT, fenced by the claiming leader''s epoch, before its handler runs.
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
    PRIMARY KEY (namespace, cron, scheduled_at)
);

CREATE INDEX cron_ticks_running ON forge.cron_ticks (namespace, role) WHERE state = 'running';
CREATE INDEX cron_ticks_finished_at ON forge.cron_ticks (finished_at) WHERE finished_at IS NOT NULL;

COMMENT ON TABLE forge.cron_ticks IS
    'The tick ledger: state running with an older epoch than the current leader''s = a run cut short by its leader''s death.';
