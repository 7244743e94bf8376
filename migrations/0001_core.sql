-- FORGE's core tables: leadership (one row per role, the fencing token), the cluster's history,
-- membership, the cluster series, and the record of the function files applied. The functions
-- that write them are in schema/functions/, one file each, applied after the migrations.
--
-- Who writes what:
--   the lock session holding a role's key   forge.leaders row (campaign, renew, release)
--   a node's own node session               its forge.nodes row (join, heartbeat, leave)
--   the scheduler leader (fenced)           forge.nodes drift/down marks (forge.nodes_watch)
--   all of the above                        forge.events (in the same transactions)
--   the metrics_aggregator leader (fenced)  forge.stats, forge.stats_cursor
--   the log_compactor leader (fenced)       prunes forge.events, forge.nodes, forge.stats

-- forge.leaders is a logged table on purpose: an epoch, once handed out, is durable, so epochs
-- never go backwards, even across a PostgreSQL crash.
--
-- A tenure is identified by (epoch, tenure): the epoch orders tenures, the random tenure id
-- tells two tenures apart even when a promoted asynchronous standby hands out an epoch a second
-- time (the bump that used it had not reached the standby). backend_start and backend_pid name
-- the lock session, so the fence can check that the session is alive on this very server.
CREATE TABLE forge.leaders (
    namespace     text        NOT NULL,
    role          text        NOT NULL,
    lock_key      bigint      NOT NULL,
    epoch         bigint      NOT NULL CHECK (epoch > 0),
    node_id       text        NOT NULL,
    backend_pid   integer     NOT NULL,
    acquired_at   timestamptz NOT NULL,
    renewed_at    timestamptz NOT NULL,
    lease_until   timestamptz NOT NULL,
    released_at   timestamptz,
    tenure        bigint      NOT NULL,
    backend_start timestamptz NOT NULL,
    lease_ms      bigint      NOT NULL,
    PRIMARY KEY (namespace, role),
    CONSTRAINT leaders_lock_key_unique UNIQUE (lock_key)
);

COMMENT ON TABLE forge.leaders IS
    'Current leadership of each FORGE role. epoch is the fencing token: leader-only writes check it.';

-- The cluster's history: leadership changes, membership changes, operator actions.
CREATE TABLE forge.events (
    id        bigserial   PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    namespace text        NOT NULL,
    kind      text        NOT NULL CHECK (kind IN (
                  'leader_elected', 'leader_released', 'leader_fenced', 'leader_lost',
                  'node_joined', 'node_left', 'node_drifted', 'node_recovered', 'node_down',
                  'node_rejoined', 'node_forgotten', 'admin_action')),
    node_id   text,
    role      text,
    epoch     bigint,
    detail    jsonb       NOT NULL DEFAULT '{}'
);

CREATE INDEX events_namespace_id ON forge.events (namespace, id);
CREATE INDEX events_role ON forge.events (namespace, role, id) WHERE role IS NOT NULL;
CREATE INDEX events_at ON forge.events (at);

COMMENT ON TABLE forge.events IS
    'Cluster history: leader_elected (detail.failover: the previous leader did not hand over; detail.gap_ms), leader_released (graceful handoff), leader_fenced (an expired holder was terminated), node_joined, node_left, node_drifted, node_recovered, node_down (detail.reason), node_rejoined, node_forgotten, admin_action (an operator''s write: detail.action, subject, by), leader_lost (a leader that lost its leadership without handing over, as it saw it: detail.reason).';

-- Membership: the registry of every node: identity, its node session, heartbeat, what it
-- campaigns for and leads, and the marks the scheduler leader sets when it has evidence the
-- node is gone.
CREATE TABLE forge.nodes (
    namespace         text        NOT NULL,
    node_id           text        NOT NULL,
    started_at        timestamptz NOT NULL,
    heartbeat_at      timestamptz NOT NULL,
    stopped_at        timestamptz,
    -- The queues the node works, with their concurrency (for operators).
    queues            jsonb       NOT NULL DEFAULT '{}',
    incarnation       bigint,
    hostname          text,
    pid               integer,
    version           text,
    roles             text[]      NOT NULL DEFAULT '{}',
    leads             text[]      NOT NULL DEFAULT '{}',
    admin_url         text,
    -- The node session: its backend, when it started, and the server process it is on.
    session_pid       integer,
    session_start     timestamptz,
    server_started_at timestamptz,
    -- Set by the scheduler leader.
    session_lost_at   timestamptz,
    drifted_at        timestamptz,
    down_at           timestamptz,
    down_reason       text,
    -- The node's counters, cumulative since it started ({"<series>|<label>": value}), sent with
    -- heartbeats for the metrics_aggregator leader's rollups.
    tally             jsonb       NOT NULL DEFAULT '{}',
    PRIMARY KEY (namespace, node_id)
);

COMMENT ON TABLE forge.nodes IS
    'Cluster membership: every node registers (node_join), heartbeats on its node session, and records its stop. The scheduler leader marks drifted and down nodes (with evidence); the running jobs of down and stopped nodes are rescued.';

-- Cluster series, one point per [metrics] rollup_interval starting at `at`: counters summed
-- over the nodes (differences between looks), and gauges sampled once per interval.
CREATE TABLE forge.stats (
    namespace text             NOT NULL,
    at        timestamptz      NOT NULL,
    series    text             NOT NULL,
    label     text             NOT NULL DEFAULT '',
    value     double precision NOT NULL,
    PRIMARY KEY (namespace, series, label, at)
);

CREATE INDEX stats_at ON forge.stats (namespace, at);

COMMENT ON TABLE forge.stats IS
    'Cluster series written by the metrics_aggregator leader, one point per [metrics] rollup_interval: job and cron counters summed over all nodes, queue depths; pruned by the log_compactor leader after [metrics] rollup_retention.';

-- The aggregator's last look at each node's counters.
CREATE TABLE forge.stats_cursor (
    namespace   text        NOT NULL,
    node_id     text        NOT NULL,
    incarnation bigint      NOT NULL,
    tally       jsonb       NOT NULL,
    at          timestamptz NOT NULL,
    PRIMARY KEY (namespace, node_id)
);

-- The function files (schema/functions/<name>.sql) as applied, written by the step that runs
-- after the migrations at a node's start (and by `forge migrate up`): a file is applied again
-- when its SQL changed, unless a newer FORGE release applied it (see ARCHITECTURE.md,
-- "Changing the schema").
CREATE TABLE forge.schema_functions (
    name          text        PRIMARY KEY,
    checksum      bytea       NOT NULL,
    forge_version text        NOT NULL,
    applied_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE forge.schema_functions IS
    'The function files applied: name (schema/functions/<name>.sql), the SHA-256 of its SQL, the FORGE version that applied it.';
