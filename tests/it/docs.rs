//! The documents hold together: every relative link and `#anchor` of the README,
//! ARCHITECTURE.md and the guide (`docs/src/`) resolves, the guide's configuration table is
//! `forge.toml`'s keys and defaults, and the README and ARCHITECTURE.md stay short. (Their
//! snippets are compiled and loaded by `readme`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The guide's pages (`docs/src/**/*.md`), by path.
pub(crate) fn guide() -> Vec<PathBuf> {
    fn walk(dir: &Path, pages: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, pages);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut pages = Vec::new();
    walk(&repo().join("docs/src"), &mut pages);
    pages.sort();
    assert!(pages.len() >= 15, "the guide has {} pages", pages.len());
    pages
}

/// Each line of `markdown` outside fenced code blocks, with its number (from 1).
fn prose(markdown: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// `line` without its code spans, which hold text such as `[x](y)` that is no link.
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// The targets of the inline links and images of `line`: `[text](target)`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_owned());
        rest = &after[end..];
    }
    targets
}

/// The anchor mdBook (and GitHub) gives a heading: its text without markup, lowercase, each
/// space a `-`, other punctuation dropped.
fn anchor(heading: &str) -> String {
    let text = heading
        .trim_start_matches('#')
        .trim()
        .trim_end_matches('#')
        .trim();
    // A link in a heading keeps its text only.
    let mut plain = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        plain.push_str(&rest[..open]);
        let inner = &rest[open + 1..];
        match inner
            .find("](")
            .and_then(|mid| Some((mid, inner[mid..].find(')')? + mid)))
        {
            Some((mid, close)) => {
                plain.push_str(&inner[..mid]);
                rest = &inner[close + 1..];
            }
            None => {
                plain.push('[');
                rest = inner;
            }
        }
    }
    plain.push_str(rest);
    plain
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of `markdown`'s headings; a repeated one gets `-1`, `-2`, ... as mdBook does.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose(markdown) {
        if !line.starts_with('#') {
            continue;
        }
        let id = anchor(line);
        let count = seen.entry(id.clone()).or_default();
        anchors.insert(if *count == 0 {
            id.clone()
        } else {
            format!("{id}-{count}")
        });
        *count += 1;
    }
    anchors
}

#[test]
fn every_relative_link_and_anchor_of_the_documents_resolves() {
    let mut documents = vec![repo().join("README.md"), repo().join("ARCHITECTURE.md")];
    documents.extend(guide());
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        let name = document.strip_prefix(repo()).unwrap().display().to_string();
        for (number, line) in prose(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, fragment) = match target.split_once('#') {
                    Some((path, fragment)) => (path, Some(fragment)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    document.clone()
                } else {
                    document.parent().unwrap().join(path)
                };
                if !file.exists() {
                    broken.push(format!("{name}:{number}: {target}: no such file"));
                    continue;
                }
                let Some(fragment) = fragment else { continue };
                let Ok(target_text) = std::fs::read_to_string(&file) else {
                    broken.push(format!(
                        "{name}:{number}: {target}: an anchor in no text file"
                    ));
                    continue;
                };
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!(
                        "{name}:{number}: {target}: no heading makes #{fragment}"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the link parser broken?"
    );
    assert!(
        broken.is_empty(),
        "links that lead nowhere (fix the link or the heading):\n{}",
        broken.join("\n")
    );
}

#[test]
fn anchors_are_made_as_mdbook_makes_them() {
    assert_eq!(
        anchor("## Jobs: why 1.5x graphile_worker is out of reach"),
        "jobs-why-15x-graphile_worker-is-out-of-reach"
    );
    assert_eq!(
        anchor("### `forge.jobs_step` (`migrations/functions/jobs_step.sql`)"),
        "forgejobs_step-migrationsfunctionsjobs_stepsql"
    );
    assert_eq!(
        anchor("## The [runbook](runbook.md) and more"),
        "the-runbook-and-more"
    );
    let text = "# A\n```sh\n# not a heading\n```\n## A\n";
    assert_eq!(
        anchors(text),
        BTreeSet::from(["a".to_owned(), "a-1".to_owned()])
    );
}

/// `forge.toml`'s keys with their defaults as written there: `section.key` -> the value, or
/// `unset` for a key shown commented out (absent by default). `[jobs.queues]` (queue names) and
/// `[[alerts]]` (rules) are tables of the user's own entries: each is one key, unset.
fn reference_keys() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo().join("forge.toml")).unwrap();
    let mut keys = BTreeMap::new();
    let mut section = String::new();
    let mut user_table = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            // (Tables of the user's names: their example keys are not forge.toml's.)
            user_table = section == "jobs.queues" || section == "jobs.kinds";
            if user_table {
                keys.insert(section.clone(), "unset".to_owned());
            }
            continue;
        }
        if line == "# [[alerts]]" || line == "[[alerts]]" {
            keys.insert("alerts".to_owned(), "unset".to_owned());
            user_table = true;
            continue;
        }
        if user_table || section.is_empty() {
            continue;
        }
        let (commented, assignment) = match line.strip_prefix("# ") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let Some((key, value)) = assignment.split_once(" = ") else {
            continue;
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        let default = if commented { "unset" } else { value.trim() };
        keys.insert(format!("{section}.{key}"), default.to_owned());
    }
    keys
}

/// The configuration chapter's table: key -> default, each without its backticks.
fn guide_keys() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo().join("docs/src/configuration.md")).unwrap();
    let heading = "## Every key and its default";
    let table = text
        .split_once(heading)
        .unwrap_or_else(|| panic!("docs/src/configuration.md lost its section {heading:?}"))
        .1;
    let mut keys = BTreeMap::new();
    for line in table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (key, default) = (cells[1].trim_matches('`'), cells[2].trim_matches('`'));
        if key == "key" || key.starts_with("---") {
            continue;
        }
        keys.insert(key.to_owned(), default.to_owned());
    }
    keys
}

#[test]
fn the_configuration_table_is_forge_toml() {
    let reference = reference_keys();
    assert!(
        reference.len() >= 40,
        "forge.toml's keys as parsed: {reference:?}"
    );
    // Spot checks that the parser reads forge.toml as it is meant.
    assert_eq!(
        reference["cluster.leader_election.lease_duration"],
        "\"15s\""
    );
    assert_eq!(reference["database.url"], "unset");
    assert_eq!(reference["node.prefer_roles"], "[]");
    let guide = guide_keys();
    let missing: Vec<_> = reference
        .keys()
        .filter(|k| !guide.contains_key(*k))
        .collect();
    let extra: Vec<_> = guide
        .keys()
        .filter(|k| !reference.contains_key(*k))
        .collect();
    let wrong: Vec<_> = reference
        .iter()
        .filter(|(k, v)| guide.get(*k).is_some_and(|g| g != *v))
        .map(|(k, v)| format!("{k}: forge.toml says {v}, the guide {}", guide[k]))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && wrong.is_empty(),
        "docs/src/configuration.md's table must list every key of forge.toml with its default \
         there (`unset` for a key shown commented out), and no other key.\nmissing: {missing:?}\n\
         not in forge.toml: {extra:?}\nother defaults: {wrong:#?}"
    );
}

#[test]
fn the_readme_and_the_architecture_stay_short() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let architecture = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    assert!(
        readme.lines().count() <= 300,
        "README.md: {} lines",
        readme.lines().count()
    );
    let long: Vec<usize> = readme
        .lines()
        .enumerate()
        .filter(|(_, line)| line.chars().count() > 100)
        .map(|(index, _)| index + 1)
        .collect();
    assert!(
        long.is_empty(),
        "README.md lines over 100 characters: {long:?}"
    );
    assert!(
        architecture.lines().count() <= 250,
        "ARCHITECTURE.md: {} lines (the details belong in docs/src/architecture/)",
        architecture.lines().count()
    );
}

#[test]
fn no_document_names_a_migration_that_does_not_exist() {
    let migrations: BTreeSet<String> = std::fs::read_dir(repo().join("migrations"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let number = name.get(..4)?;
            number
                .chars()
                .all(|c| c.is_ascii_digit())
                .then(|| number.to_owned())
        })
        .collect();
    assert!(migrations.contains("0001"), "{migrations:?}");
    let mut documents = vec![
        repo().join("README.md"),
        repo().join("ARCHITECTURE.md"),
        repo().join("CHANGELOG.md"),
    ];
    documents.extend(guide());
    let mut wrong = Vec::new();
    for document in documents {
        let text = std::fs::read_to_string(&document).unwrap();
        for (number, line) in text.lines().enumerate() {
            // A migration's number: four digits with a leading zero, as a word of its own
            // ("migration 0013", "0012-0016"; not "0001_core", which is a file's name).
            for word in line.split(|c: char| !c.is_ascii_alphanumeric() && c != '_') {
                let is_number = word.len() == 4
                    && word.starts_with('0')
                    && word.chars().all(|c| c.is_ascii_digit());
                if is_number && !migrations.contains(word) {
                    let name = document.strip_prefix(repo()).unwrap().display().to_string();
                    wrong.push(format!("{name}:{}: {word}", number + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "documents name migrations that migrations/ does not hold (say what the change did):\n{}",
        wrong.join("\n")
    );
}
