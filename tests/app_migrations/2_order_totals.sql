CREATE TABLE order_totals (at timestamptz PRIMARY KEY, total numeric NOT NULL);
