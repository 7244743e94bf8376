-- The example application's table, embedded by forge::migrate!("migrations") (README, "Your tables, your migrations").
CREATE TABLE orders (id bigserial PRIMARY KEY, amount numeric NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
