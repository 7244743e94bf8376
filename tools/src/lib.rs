//! What FORGE's tools share (the tools are this crate's binaries; `tools/README.md` says what
//! each does): the job queue's measurements, run by `bench_jobs` and, at the defaults, by
//! `bench_scale`.

pub mod bench_jobs;
