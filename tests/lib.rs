//! What FORGE's integration tests share with the node binaries they run and with the
//! benchmarks: the probe node ([`probe`]), a FORGE node whose leader-only work is observable
//! from outside. It lives here, beside the tests, so that `forge-testkit` (PostgreSQL,
//! processes, proxies) depends on no FORGE crate.

pub mod probe;
