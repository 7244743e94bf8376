-- The tables of the README's leader task (invoices, issued by the billing leader) and of its job example (users).
CREATE TABLE invoices (id bigserial PRIMARY KEY, issued_at timestamptz);
CREATE TABLE users (id bigserial PRIMARY KEY, name text NOT NULL);
