-- Cluster-wide limits of a queue, checked by every claim of it (forge.jobs_step): at most
-- global_concurrency of its jobs running at once on all nodes together, and at most rate_count
-- claims in any rate_window_ms (per value of the top-level argument rate_key, when set). Written
-- by forge.queue_limit_set: by each node at start from forge.toml (set_by NULL), or by an
-- operator (set_by their name), whose values a node's start leaves alone.
CREATE TABLE forge.queue_limits (
    namespace          text        NOT NULL,
    queue              text        NOT NULL,
    global_concurrency integer     CHECK (global_concurrency > 0),
    rate_count         integer     CHECK (rate_count > 0),
    rate_window_ms     bigint      CHECK (rate_window_ms > 0),
    rate_key           text,
    set_at             timestamptz NOT NULL,
    -- NULL: forge.toml's values, written by a node at start; else the operator who set them.
    set_by             text,
    PRIMARY KEY (namespace, queue),
    CHECK ((rate_count IS NULL) = (rate_window_ms IS NULL)),
    CHECK (rate_key IS NULL OR rate_count IS NOT NULL)
);

COMMENT ON TABLE forge.queue_limits IS
    'Cluster-wide limits of a queue (global concurrency, rate), checked by every claim; set_by NULL: forge.toml''s, else an operator''s.';

-- The claims of a rate-limited queue in its current window (per rate key): a claim counts them
-- and prunes the older ones under the queue's limit lock.
CREATE TABLE forge.queue_claims (
    namespace  text        NOT NULL,
    queue      text        NOT NULL,
    rate_key   text        NOT NULL,
    claimed_at timestamptz NOT NULL
);
CREATE INDEX queue_claims_window ON forge.queue_claims (namespace, queue, rate_key, claimed_at);

COMMENT ON TABLE forge.queue_claims IS
    'The claims of a rate-limited queue within its window, per rate key; pruned by the claims themselves.';

-- Whether the attempt was claimed under a global concurrency limit of its queue: those are the
-- attempts a claim counts (a partial index of running ones), so a queue without limits writes
-- no entry of it.
ALTER TABLE forge.jobs ADD COLUMN limited boolean NOT NULL DEFAULT false;
CREATE INDEX jobs_limited ON forge.jobs (namespace, queue) WHERE state = 'running' AND limited;
