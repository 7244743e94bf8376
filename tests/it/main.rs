//! FORGE's integration tests, against a real PostgreSQL (the shared throwaway cluster of
//! `forge-testkit`, or `DATABASE_URL`; tests that restart PostgreSQL start their own).
//!
//! * `election`: in-process nodes - one leader per role, independence of roles, handoff,
//!   terminated lock sessions, fencing, task cancellation.
//! * `processes`: node processes that really get SIGKILLed, SIGSTOPped and SIGTERMed, and a
//!   PostgreSQL crash-restart.
//! * `bad_input`: broken config, bad URLs, unreachable database, transaction pooler, foreign
//!   lock holders.
//! * `observability`: the Prometheus endpoint and the leadership history.
//! * `model`: membership states, read models, the built-in roles' duties, cron pause,
//!   namespaces, application migrations, the SQL CHECK lists.
//! * `faults`: database restarts and primary failover, long drains, half-open sessions,
//!   duplicate node ids, undecodable rows, starved pools, cancels at shutdown.
//! * `exactly_once`: transactional completion, catch-up, failed claims and outcomes, lost
//!   replies, refused fences, a clock that runs ahead.

mod bad_input;
mod cron;
mod election;
mod exactly_once;
mod faults;
mod jobs;
mod model;
mod observability;
mod processes;
mod support;
mod ui;
