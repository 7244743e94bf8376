//! The macros as users meet them, through trybuild: `tests/ui/fail/*.rs` must fail to compile
//! with exactly the committed `.stderr` (each reviewed by hand: read it as a user would), and
//! `tests/ui/pass/*.rs` must compile and run. The pass cases also check, at run time, the
//! definitions the attributes produce (name, schedule, role, policies, job options) and their
//! automatic registration.
//!
//! No `#[cron]` or `#[job]` is declared in this test binary itself: automatic registration
//! would add it to every node the other tests start.
//!
//! After changing a diagnostic, regenerate with
//! `TRYBUILD=overwrite cargo test -p forge-tests -- ui` and review the diff.

#[test]
fn trybuild_cases() {
    let cases = trybuild::TestCases::new();
    cases.pass("ui/pass/*.rs");
    cases.compile_fail("ui/fail/*.rs");
}
