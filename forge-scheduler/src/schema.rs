//! For the scheduler's unit tests: the SQL of FORGE's functions (the `forge` crate embeds it from
//! the repository's `migrations/` folder, and hands it to the node), and the text literals it
//! exchanges with Rust, so that a test can check that every value the SQL writes parses as the
//! enum that reads it (where no `CHECK` list says what the values are).

pub(crate) mod source {
    /// The text of `migrations/functions/<name>.sql` (read from the repository's folder).
    pub(crate) fn function(name: &str) -> &'static str {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../migrations/functions")
            .join(format!("{name}.sql"));
        let sql = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("no function file {}: {e}", path.display()));
        // Tests only: a few files, read once per test.
        Box::leak(sql.into_boxed_str())
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
