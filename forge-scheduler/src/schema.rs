//! The scheduler's part of FORGE's schema: its tables (the tick ledger, the job queue, paused
//! queues) and the functions crons and jobs call, one file each (`schema/functions/<name>.sql`).
//! Both components install it (a node applies it once).

use forge_core::Schema;

/// The scheduler's migrations and function files, applied by every node with the core's.
pub const SCHEMA: Schema = Schema {
    migrations: &[
        (
            2,
            "scheduler",
            include_str!("../../schema/migrations/0002_scheduler.sql"),
        ),
        (
            4,
            "tick_timing",
            include_str!("../../schema/migrations/0004_tick_timing.sql"),
        ),
    ],
    functions: forge_core::function_files![
        "cron_set_paused",
        "cron_trigger",
        "jobs_cancel",
        "jobs_complete",
        "jobs_enqueue",
        "jobs_figures",
        "jobs_maintain",
        "jobs_promote",
        "jobs_prune",
        "jobs_reconcile",
        "jobs_rescue",
        "jobs_rescue_own",
        "jobs_retry_now",
        "jobs_step",
        "prune_dead_jobs",
        "prune_finished_jobs",
        "prune_ticks",
        "queue_known",
        "queue_set_paused",
        "tick_claim",
        "tick_claim_ahead_many",
        "tick_claim_manual",
        "tick_complete",
        "tick_finish_many",
        "tick_gate",
        "tick_reclaim",
        "tick_unclaim",
        "tick_unclaim_unstarted",
        "tx_mark",
        "tx_marked",
    ],
};

/// For tests: the SQL of the function `forge.<name>` (its file), and the text literals it
/// exchanges with Rust, so that a test can check that every value the SQL writes parses as the
/// enum that reads it (where no `CHECK` list says what the values are).
#[cfg(test)]
pub(crate) mod source {
    /// The text of `schema/functions/<name>.sql`, one of the scheduler's function files.
    pub(crate) fn function(name: &str) -> &'static str {
        super::SCHEMA
            .functions
            .iter()
            .find(|(file, _)| *file == name)
            .map(|(_, sql)| *sql)
            .unwrap_or_else(|| panic!("the scheduler has no function file {name}.sql"))
    }

    /// The text literals that follow `prefix` in `sql` (`prefix` ends with the opening quote):
    /// `literals_after("RETURN 'a'; RETURN 'b:' || x", "RETURN '")` is `["a", "b:"]`.
    pub(crate) fn literals_after<'a>(sql: &'a str, prefix: &str) -> Vec<&'a str> {
        sql.match_indices(prefix)
            .filter_map(|(at, _)| {
                let rest = &sql[at + prefix.len()..];
                rest.find('\'').map(|end| &rest[..end])
            })
            .collect()
    }

    #[test]
    fn finds_a_function_by_its_file() {
        let maintain = function("jobs_maintain");
        assert!(maintain.contains("forge.fence("), "{maintain}");
        assert!(maintain.trim_end().ends_with("$$;"), "{maintain}");
        assert_eq!(
            literals_after("RETURN 'a'; RETURN 'b:' || x", "RETURN '"),
            ["a", "b:"]
        );
    }
}
