//! For tests: the SQL functions as the migrations finally define them, and the text literals
//! they exchange with Rust, so that a test can check that every value the SQL writes parses
//! as the enum that reads it (where no `CHECK` list says what the values are).

/// The text of the last definition of `forge.<name>(...)` in FORGE's migrations (the core's
/// and the scheduler's, in version order): from `CREATE` to the end of its `$$` body.
pub(crate) fn function(name: &str) -> &'static str {
    let mut sources: Vec<_> = forge_core::MIGRATIONS
        .iter()
        .chain(crate::MIGRATIONS)
        .collect();
    sources.sort_by_key(|(version, _, _)| *version);
    let head = format!("FUNCTION forge.{name}(");
    let mut found = None;
    for (_, _, sql) in sources {
        for (at, _) in sql.match_indices(&head) {
            let before = sql[..at].trim_end();
            if before.ends_with("CREATE") || before.ends_with("CREATE OR REPLACE") {
                let body = sql[at..].find("$$").map(|open| at + open + 2);
                let end =
                    body.and_then(|body| sql[body..].find("$$").map(|close| body + close + 2));
                found = end.map(|end| &sql[at..end]);
            }
        }
    }
    found.unwrap_or_else(|| panic!("no migration defines forge.{name}"))
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
fn finds_the_last_definition() {
    // Defined in 0003, replaced in 0005 (with the fence).
    let maintain = function("jobs_maintain");
    assert!(maintain.contains("forge.fence("), "{maintain}");
    assert!(maintain.ends_with("$$"), "{maintain}");
    assert_eq!(
        literals_after("RETURN 'a'; RETURN 'b:' || x", "RETURN '"),
        ["a", "b:"]
    );
}
