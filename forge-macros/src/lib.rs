//! FORGE's attribute macros, `#[cron]` and `#[job]`. Use them through the `forge` facade, as
//! `#[forge::cron(...)]` and `#[forge::job(...)]`: the generated code names `::forge` paths.
//!
//! Both attributes go on an `async fn` and turn it into a value that can be registered on a
//! node, while keeping it callable:
//!
//! ```
//! # use forge::CronContext;
//! #[forge::cron("0 * * * *")]
//! async fn compact(ctx: CronContext) { /* ... */ }
//! ```
//!
//! becomes a unit struct `compact` (same name and visibility, the fn's doc comments) with the
//! body as an associated fn, `compact::run(ctx).await`, plus an implementation of the trait the
//! node registers (`forge::crons::IntoCron`, `forge::jobs::Job`). Everything in the attribute is checked at
//! compile time, with the same parsers the runtime uses: a mistake is a compile error on the
//! offending literal that says what is valid.
//!
//! # `#[cron]`
//!
//! ```
//! use forge::{CronContext, CronError};
//!
//! /// Compacts the event log every hour (on the leader of the `scheduler` role).
//! #[forge::cron("0 * * * *")]
//! async fn compact(ctx: CronContext) -> Result<(), CronError> {
//!     let mut tx = ctx.fenced_transaction().await?;
//!     // ... leader-only writes: applied only if this node still leads at commit ...
//!     tx.commit().await?;
//!     Ok(())
//! }
//!
//! #[forge::cron("*/5 * * * * *", name = "heartbeat", role = "reports", tz = "Europe/Berlin",
//!               catch_up = "all", catch_up_window = "1h", overlap = "wait",
//!               interrupted = "abandon", timeout = "30s")]
//! async fn beat() {}
//! ```
//!
//! The expression comes first: 5 fields (`minute hour day-of-month month day-of-week`, with the
//! meaning of Vixie cron and `crontab(5)`), 6 fields with seconds first, or an alias (`@yearly`,
//! `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`). See the `forge-cron`
//! crate for the full syntax and its daylight-saving rules.
//!
//! The function takes either nothing or one `forge::CronContext`, and returns `()` or
//! `Result<(), E>` where `E: Into<forge::CronError>` (any `std::error::Error` is, so `?` works).
//!
//! Each option is the builder method of the same name of `forge::crons::CronJob`, whose
//! documentation says its values and default (a word of a choice, such as `catch_up = "all"`,
//! is the variant of the enum named after the option, `CatchUp::All`); the guide's crons chapter
//! (docs/src/crons.md, "Options") lists them all. The attribute checks each value at compile time with the
//! runtime's own parsers; durations are written as in `forge.toml`, a number with a unit such
//! as `"5s"`, `"1m 30s"` or `"2h"`.
//!
//! # `#[job]`
//!
//! ```
//! use forge::{JobContext, JobError};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct SendEmail {
//!     to: String,
//! }
//!
//! #[forge::job(queue = "mailers", max_attempts = 5, backoff = "exponential", backoff_base = "2s",
//!              backoff_max = "10m", timeout = "30s", priority = 1, unique = true,
//!              role = "reports", name = "send_email")]
//! async fn send_email(ctx: JobContext, args: SendEmail) -> Result<(), JobError> {
//!     println!("sending to {} (attempt {})", args.to, ctx.attempt());
//!     Ok(())
//! }
//!
//! #[forge::job]
//! async fn reindex(table: String) {}
//! ```
//!
//! The function takes the job's arguments, `(args: T)` or `(ctx: forge::JobContext, args: T)`,
//! where `T` is an owned `serde::Serialize + serde::Deserialize` type (stored as JSON; a `pub`
//! job needs a `pub` arguments type), and returns `()` or `Result<(), E>` where
//! `E: Into<forge::JobError>` (any `std::error::Error` is: such a failure is retried).
//!
//! | option         | value                                                                  | default          |
//! |----------------|------------------------------------------------------------------------|------------------|
//! | `name`         | the job's kind, stored with every job: 1-64 ASCII letters, digits, `_`, `-`, `.` and `:`, starting with a letter; unique among the job types of a cluster. Set it to keep queued jobs working when the fn is renamed | the fn's name |
//! | `queue`        | the queue it is enqueued on: 1-63 ASCII letters, digits, `_`, `-` or `.`; nodes whose binary declares it work it, or those listing it in `[node] queues` | `"default"` |
//! | `role`         | run it only on the leader of this role (1-48 lowercase letters, digits and `_`, starting with a letter) | any node working the queue |
//! | `max_attempts` | attempts before the job is dead-lettered, the first included: 1 or more | `[jobs] default_max_attempts` (20) |
//! | `backoff`      | the delay before a retry: `"exponential"` (`backoff_base` doubled after each failed attempt, at most `backoff_max`, ±25 % jitter) or `"fixed"` (`backoff_base` every time; then `backoff_base` is required) | `"exponential"` |
//! | `backoff_base` | the first delay (every delay with `"fixed"`), a duration               | `"1s"`           |
//! | `backoff_max`  | the longest delay of `"exponential"`, a duration not below `backoff_base` | `"1h"`        |
//! | `timeout`      | fails an attempt that runs longer (retried per the backoff), a duration | none            |
//! | `priority`     | an `i16` (-32768 to 32767); lower runs first, like Oban               | 0                |
//! | `unique`       | `true`: enqueueing a job whose arguments equal those of an unfinished job of the same kind reports a duplicate instead of inserting | `false` |
//! | `unique_period` | a unique key holds this long after its job was enqueued, finished jobs counted, a duration | none |
//! | `unique_mode`  | what a duplicate does: `"keep"`, `"replace"` (debounce) or `"keep_earliest_run_at"` | `"keep"` |
//! | `unique_states` | the states of the job holding a unique key that block a duplicate, a non-empty list such as `["scheduled", "completed"]` | the unfinished ones (and `completed` with a period) |
//! | `max_snoozes`  | snoozes (`JobError::snooze`) before the next one dead-letters the job  | `[jobs] max_snoozes` (100) |
//!
//! Every option can be overridden per job when enqueueing (`forge::jobs::NewJob`).
//!
//! # Registration
//!
//! By default every `#[cron]` and `#[job]` linked into the binary is registered on every node
//! the binary builds, through the `inventory` crate, which collects them at link time:
//!
//! * a `#[cron]` or `#[job]` in a library crate is only linked if the binary uses something
//!   from that crate: register such ones explicitly,
//!   `Node::builder(config).cron(compact).job(send_email)` (registering one both ways is fine);
//! * `NodeBuilder::auto_register(false)` turns automatic registration off, for a node that
//!   should run only what is registered explicitly (for example in tests that start
//!   differently equipped nodes in one process).
//!
//! Two different crons with the same name (or two jobs with the same kind) are an error when
//! the node starts.

mod cron;
mod handler;
mod job;
mod migrate;
mod options;

use proc_macro::TokenStream;

/// Declares a leader-only cron: `#[forge::cron("0 * * * *", options...)]` on an
/// `async fn(ctx: forge::CronContext)` (the context is optional) returning `()` or
/// `Result<(), E: Into<forge::CronError>>`.
///
/// The fn becomes a unit struct of the same name that implements `forge::crons::IntoCron`, with the body
/// callable as `name::run(ctx)`. The expression and every option are checked at compile time
/// with the runtime's own parsers.
///
/// ```
/// #[forge::cron("30 2 * * *", tz = "Europe/Berlin", catch_up = "all")]
/// async fn nightly(ctx: forge::CronContext) -> Result<(), forge::CronError> {
///     println!("tick for {}", ctx.scheduled_at());
///     Ok(())
/// }
///
/// # fn register(config: forge::Config) -> forge::NodeBuilder {
/// forge::Node::builder(config).cron(nightly) // or automatically: see below
/// # }
/// ```
///
/// The expression: 5 fields `minute hour day-of-month month day-of-week` (Vixie cron meaning),
/// 6 fields with seconds first, or an alias (`@yearly`, `@annually`, `@monthly`, `@weekly`,
/// `@daily`, `@midnight`, `@hourly`).
///
/// Options (all `key = "literal"`):
///
/// * `name`: the cron's key in the tick ledger, unique in the cluster (default: the fn's
///   name); 1-64 ASCII letters, digits, `_`, `-`, `.` and `:`, starting with a letter.
/// * `role`: the role whose leader runs it (default `"scheduler"`).
/// * `tz`: the IANA time zone the expression is read in (default `"UTC"`), such as
///   `"Europe/Berlin"`.
/// * `catch_up`: ticks missed while the role had no leader: `"skip"`, `"latest"` (default:
///   the most recent one, once) or `"all"`.
/// * `catch_up_window`: how far back catching up looks (default `"24h"`).
/// * `overlap`: a tick due while the previous run is still going: `"skip"` (the default, but
///   `"wait"` under `catch_up = "all"`), `"wait"` or `"allow"`.
/// * `interrupted`: a run cut short by its leader's death: `"rerun"` (default) or
///   `"abandon"`.
/// * `timeout`: cancels a run that takes longer (default: none).
///
/// Durations are a number with a unit: `"5s"`, `"250ms"`, `"1m 30s"`.
///
/// # Registration
///
/// Every `#[cron]` linked into the binary is registered automatically (through the
/// `inventory` crate, at link time). A `#[cron]` in a library crate that the binary never
/// references may not be linked at all: register such crons explicitly with
/// `NodeBuilder::cron`. `NodeBuilder::auto_register(false)` turns automatic registration off.
#[proc_macro_attribute]
pub fn cron(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = item.clone();
    cron::expand(args.into(), item.into())
        .unwrap_or_else(|err| with_error(original.into(), err))
        .into()
}

/// Declares a durable job type: `#[forge::job(options...)]` on an
/// `async fn(ctx: forge::JobContext, args: T)` (the context is optional) returning `()` or
/// `Result<(), E: Into<forge::JobError>>`, where `T` is the job's arguments, an owned
/// `serde::Serialize + serde::Deserialize` type.
///
/// The fn becomes a unit struct of the same name that implements `forge::jobs::Job`, with the
/// body callable as `name::run(ctx, args)`. Every option is checked at compile time.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail {
///     to: String,
/// }
///
/// #[forge::job(queue = "mailers", max_attempts = 5, timeout = "30s")]
/// async fn send_email(args: SendEmail) -> Result<(), forge::JobError> {
///     println!("sending to {}", args.to);
///     Ok(())
/// }
///
/// # fn register(config: forge::Config) -> forge::NodeBuilder {
/// forge::Node::builder(config).job(send_email) // or automatically: see below
/// # }
/// ```
///
/// Options (all `key = literal`):
///
/// * `name`: the job's kind, stored with every job (default: the fn's name; set it to keep
///   queued jobs working across a rename); 1-64 ASCII letters, digits, `_`, `-`, `.` and `:`,
///   starting with a letter.
/// * `queue`: the queue (default `"default"`); nodes work the queues their job types declare
///   (or those `[node] queues` lists).
/// * `role`: run only on the leader of this role (default: any node working the queue).
/// * `max_attempts`: 1 or more, the first attempt included (default:
///   `[jobs] default_max_attempts`, 20).
/// * `backoff`: `"exponential"` (default) or `"fixed"`. `backoff_base` is the first delay
///   (default `"1s"`), or every delay with `"fixed"` (then required); `backoff_max` caps
///   exponential delays (default `"1h"`).
/// * `timeout`: fails an attempt that runs longer (default: none).
/// * `priority`: an `i16`, lower runs first (default 0).
/// * `unique`: `true` makes enqueueing a job equal to an unfinished one (same kind and
///   arguments) report a duplicate instead of inserting (default `false`).
/// * `unique_period`, `unique_mode` (`"keep"`, `"replace"`, `"keep_earliest_run_at"`) and
///   `unique_states` (a list of job states, such as `["scheduled", "completed"]`): how long a
///   unique key holds, what a duplicate does, and which states of the job holding it block one.
/// * `max_snoozes`: snoozes before the next one dead-letters the job (default:
///   `[jobs] max_snoozes`).
///
/// Durations are a number with a unit: `"5s"`, `"250ms"`, `"1m 30s"`.
///
/// # Registration
///
/// Every `#[job]` linked into the binary is registered automatically (through the
/// `inventory` crate, at link time). A `#[job]` in a library crate that the binary never
/// references may not be linked at all: register such jobs explicitly with
/// `NodeBuilder::job`. `NodeBuilder::auto_register(false)` turns automatic registration off.
#[proc_macro_attribute]
pub fn job(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = item.clone();
    job::expand(args.into(), item.into())
        .unwrap_or_else(|err| with_error(original.into(), err))
        .into()
}

/// The application's migrations, embedded at compile time: `forge::migrate!("migrations")`
/// (the folder relative to the crate's `Cargo.toml`; `forge::migrate!()` means
/// `"migrations"`) is a `sqlx::migrate::Migrator` for `NodeBuilder::migrations`, built from the
/// folder's files as sqlx's own `migrate!` builds it (same versions, descriptions and
/// checksums), for a crate that depends on `forge` only.
///
/// Files are `<VERSION>_<DESCRIPTION>.sql` (or `.up.sql` / `.down.sql` for reversible ones);
/// others are ignored. Each is included with `include_str!`: a changed migration rebuilds the
/// crate; a new file is seen at the next build of the crate (a build script with
/// `println!("cargo:rerun-if-changed=migrations");` makes that automatic).
///
/// ```text
/// let node = forge::Node::builder(config)
///     .migrations(forge::migrate!("migrations"))
///     .start()
///     .await?;
/// ```
#[proc_macro]
pub fn migrate(input: TokenStream) -> TokenStream {
    migrate::expand(input.into())
        .unwrap_or_else(|err| err.into_compile_error())
        .into()
}

/// The item unchanged, and the error: what to emit when nothing better can be generated.
fn with_error(item: proc_macro2::TokenStream, err: syn::Error) -> proc_macro2::TokenStream {
    let mut tokens = item;
    tokens.extend(err.into_compile_error());
    tokens
}

#[cfg(test)]
mod tests {
    use quote::quote;

    /// What the attributes expand to refers to FORGE only through `::forge::__private`, the
    /// one module that may change whenever the macros do.
    #[test]
    fn generated_code_names_only_the_private_module() {
        let expansions = [
            crate::cron::expand(
                quote!("0 * * * *", catch_up = "all", timeout = "30s"),
                quote!(
                    async fn tick(ctx: forge::CronContext) {}
                ),
            ),
            // A cron with a compile error still expands to a `Cron`.
            crate::cron::expand(
                quote!("not a schedule"),
                quote!(
                    async fn broken() {}
                ),
            ),
            crate::job::expand(
                quote!(queue = "mailers", max_attempts = 5, timeout = "30s"),
                quote!(
                    async fn mail(args: String) {}
                ),
            ),
            // This crate's own source folder: `lib.rs` is no migration, `migrate.rs` neither.
            crate::migrate::expand(quote!("src")),
        ];
        for expansion in expansions {
            let text = expansion.unwrap().to_string();
            assert!(text.contains(":: forge :: __private ::"), "{text}");
            for (at, _) in text.match_indices(":: forge ::") {
                assert!(
                    text[at..].starts_with(":: forge :: __private ::"),
                    "{}",
                    &text[at..]
                );
            }
        }
    }
}
