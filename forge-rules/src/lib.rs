//! The rules for what FORGE accepts as a name, a duration or a rate, in one place.
//!
//! The configuration (`forge.toml`), the runtime (`Role::new`, job and cron registration) and
//! the proc-macros (`#[cron]`, `#[job]`, checked at compile time) all validate with these
//! functions, so a name the macro accepts is a name the runtime accepts, and every message
//! says the same thing. The crate has no FORGE dependencies so that the proc-macro crate can
//! use it.
//!
//! ```
//! use forge_rules::{Name, check_name, parse_duration};
//!
//! assert!(check_name(Name::Role, "billing_reports").is_ok());
//! let err = check_name(Name::Role, "Billing").unwrap_err();
//! assert!(err.to_string().starts_with("invalid role name \"Billing\""));
//! assert_eq!(parse_duration("1m 30s").unwrap().as_secs(), 90);
//! assert!(parse_duration("300000y").is_err()); // longer than any FORGE timing can use
//! ```

mod duration;
mod name;
mod rate;

pub use duration::{MAX_DURATION, check_duration, format_duration, parse_duration};
pub use name::{Name, NameError, RESERVED_ROLES, check_name};
pub use rate::{MAX_LIMIT, parse_rate};
