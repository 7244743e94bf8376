CREATE TABLE totals (hour timestamptz PRIMARY KEY, amount numeric);
CREATE TABLE rollups (at timestamptz PRIMARY KEY);
CREATE TABLE outbox (job_id bigint PRIMARY KEY, user_id bigint NOT NULL);
