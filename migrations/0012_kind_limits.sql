-- Cluster-wide limits of a job kind, checked by every queue worker's claim of it
-- (forge.jobs_step), whichever queue its jobs sit in: at most global_concurrency of its
-- attempts running at once on all nodes together, and at most rate_count claims in any
-- rate_window_ms (per value of the top-level argument rate_key, when set). Written by
-- forge.kind_limit_set: by each node at start from the kind's declared options (set_by NULL),
-- or by an operator (set_by their name), whose values a node's start leaves alone.
CREATE TABLE forge.kind_limits (
    namespace          text        NOT NULL,
    kind               text        NOT NULL,
    global_concurrency integer     CHECK (global_concurrency > 0),
    rate_count         integer     CHECK (rate_count > 0),
    rate_window_ms     bigint      CHECK (rate_window_ms > 0),
    rate_key           text,
    set_at             timestamptz NOT NULL,
    -- NULL: the code's values, written by a node at start; else the operator who set them.
    set_by             text,
    PRIMARY KEY (namespace, kind),
    CHECK ((rate_count IS NULL) = (rate_window_ms IS NULL)),
    CHECK (rate_key IS NULL OR rate_count IS NOT NULL)
);

COMMENT ON TABLE forge.kind_limits IS
    'Cluster-wide limits of a job kind (global concurrency, rate), checked by every claim of it; set_by NULL: the code''s, else an operator''s.';

-- The claims of a rate-limited kind in its current window (per rate key): a claim counts them
-- and prunes the older ones under the kind's limit lock.
CREATE TABLE forge.kind_claims (
    namespace  text        NOT NULL,
    kind       text        NOT NULL,
    rate_key   text        NOT NULL,
    claimed_at timestamptz NOT NULL
);
CREATE INDEX kind_claims_window ON forge.kind_claims (namespace, kind, rate_key, claimed_at);

COMMENT ON TABLE forge.kind_claims IS
    'The claims of a rate-limited job kind within its window, per rate key; pruned by the claims themselves.';

-- Whether the attempt was claimed under a global concurrency limit of its kind: those are the
-- attempts a claim of the kind counts (a partial index of running ones, over all queues).
ALTER TABLE forge.jobs ADD COLUMN kind_limited boolean NOT NULL DEFAULT false;
CREATE INDEX jobs_kind_limited ON forge.jobs (namespace, kind) WHERE state = 'running' AND kind_limited;
