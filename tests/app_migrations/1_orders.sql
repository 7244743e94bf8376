-- The application's own tables, embedded with forge::migrate!("app_migrations").
CREATE TABLE orders (id bigserial PRIMARY KEY, total numeric NOT NULL);
