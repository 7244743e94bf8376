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
//! * `actions`: operators' writes (step-down, trigger now, job retry / cancel / delete one by
//!   one and by filter, queue pause) and their audit trail.
//! * `admin`: the admin HTTP API over real HTTP: every endpoint, tokens and read-only mode,
//!   bad input, readiness while PostgreSQL is unreachable, the node serving `[admin] listen`.
//! * `cli`: the `forge` command as a process against a real cluster: every command, tables
//!   and JSON, doctor, migrations, bad input and exit codes.
//! * `dashboard`: the dashboard in headless Chromium (WebDriver): every page, each role's
//!   leader, a SIGKILLed leader's failover and a step-down's handoff on the page, the nodes,
//!   a dead job retried, a cron operated by mouse and keyboard, the charts' points.
//! * `exactly_once`: transactional completion, catch-up, failed claims and outcomes, lost
//!   replies, refused fences, a clock that runs ahead.
//! * `claim_ahead`: ticks claimed before their instant, with their leader cut off unaware,
//!   SIGKILLed with and without a follower, and handing over before the instant.
//! * `readme`: every Rust snippet of the README and the guide is compiled (in
//!   `examples/readme/`, word for word), every TOML snippet loads.
//! * `docs`: every relative link and anchor of the documents resolves, the guide's
//!   configuration table is forge.toml's, the README and ARCHITECTURE.md stay short, and no
//!   document names a migration that does not exist.
//! * `skew`: crons led by a node process whose wall clock runs 5 minutes ahead or behind
//!   (libfaketime): every tick runs, on time by the database's clock.
//! * `clocks`: steps of the database's wall clock (PostgreSQL under libfaketime): no healthy
//!   leader deposed, no live node marked down, no rescue delayed, a frozen leader still replaced.
//! * `module_graph`: no import cycles between the modules of any crate of the workspace.
//! * `schema`: the function files (applied once, again when changed, never over a newer
//!   release's; one function each, every body compiles), stale functions with migrations off,
//!   a database from before the pre-1.0 squash.

mod actions;
mod admin;
mod alerts;
mod bad_input;
mod claim_ahead;
mod claims;
mod cli;
mod clocks;
mod cron;
mod dashboard;
mod docs;
mod election;
mod exactly_once;
mod faults;
mod flow;
mod history;
mod jobs;
mod kind_limits;
mod limits;
mod model;
mod module_graph;
mod observability;
mod placement;
mod processes;
mod readme;
mod routing;
mod schema;
mod skew;
mod snooze;
mod stalls;
mod stored_crons;
mod support;
mod testing_kit;
mod ui;
mod unique;
