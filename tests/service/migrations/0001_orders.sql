CREATE TABLE orders (
    id        bigserial   PRIMARY KEY,
    placed_at timestamptz NOT NULL DEFAULT now()
);

-- One row per shipment. No unique key on order_id on purpose: the job completes in the
-- transaction that writes the row, so an order is shipped once without one (and the test
-- would see a second shipment rather than an error).
CREATE TABLE shipments (
    order_id   bigint      NOT NULL REFERENCES orders,
    job_id     bigint      NOT NULL,
    node       text        NOT NULL,
    shipped_at timestamptz NOT NULL DEFAULT now()
);

-- One row per tick of the `audit` cron, written in the tick's fenced transaction (no unique
-- key either, for the same reason).
CREATE TABLE audits (
    tick    timestamptz NOT NULL,
    node    text        NOT NULL,
    shipped bigint      NOT NULL
);
