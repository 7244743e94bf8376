//! forge-cron's tests: the standard meaning, errors, DST, bounds, and croner as an oracle.

mod bounds;
mod dst;
mod errors;
mod meaning;
mod oracle;
