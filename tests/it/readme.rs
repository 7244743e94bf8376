//! The snippets of the README and of the guide (`docs/src/`): every ```rust block is in the
//! `forge-readme` crate (`examples/readme/`, which the test command builds) word for word, so
//! each one compiles; every ```toml block is a configuration that loads (but a service's
//! `[dependencies]`).

use std::path::PathBuf;

use crate::docs::{guide, repo};

/// The README and the guide's pages, each as its path and text.
fn documents() -> Vec<(PathBuf, String)> {
    let mut paths = vec![repo().join("README.md")];
    paths.extend(guide());
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect()
}

/// The fenced blocks of `lang` in `markdown`, each as its lines.
fn blocks<'a>(markdown: &'a str, lang: &str) -> Vec<Vec<&'a str>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim_end() == format!("```{lang}") => current = Some(Vec::new()),
            Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
            Some(lines) => lines.push(line),
            None => {}
        }
    }
    blocks
}

/// Whether `paragraph`'s lines appear one after another in `file`, each after one same indent.
fn contains(file: &[&str], paragraph: &[&str]) -> bool {
    file.windows(paragraph.len()).any(|window| {
        let Some(indent) = window[0].strip_suffix(paragraph[0]) else {
            return false;
        };
        indent.chars().all(char::is_whitespace)
            && window
                .iter()
                .zip(paragraph)
                .all(|(line, wanted)| line.strip_prefix(indent) == Some(*wanted))
    })
}

#[test]
fn every_rust_snippet_of_the_documents_is_compiled_word_for_word() {
    let crate_dir = repo().join("examples/readme");
    let mut sources = Vec::new();
    for dir in ["src", "examples"] {
        for entry in std::fs::read_dir(crate_dir.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                sources.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let documents = documents();
    let snippets: Vec<(&PathBuf, Vec<&str>)> = documents
        .iter()
        .flat_map(|(path, text)| blocks(text, "rust").into_iter().map(move |b| (path, b)))
        .collect();
    assert!(snippets.len() >= 12, "{} rust blocks", snippets.len());
    for (path, snippet) in snippets {
        // Paragraphs (split at blank lines) may sit in different items of one file, such as a
        // snippet's `use` lines and the function body that follows them.
        let paragraphs: Vec<&[&str]> = snippet
            .split(|line| line.trim().is_empty())
            .filter(|p| !p.is_empty())
            .collect();
        let found = sources.iter().any(|(_, text)| {
            let lines: Vec<&str> = text.lines().collect();
            paragraphs.iter().all(|p| contains(&lines, p))
        });
        assert!(
            found,
            "this snippet of {} is not in examples/readme/ word for word, so nothing compiles \
             it; put it there (in an item that gives it what it names):\n{}",
            path.display(),
            snippet.join("\n")
        );
    }
}

#[test]
fn every_toml_snippet_of_the_documents_is_a_configuration_that_loads() {
    let documents = documents();
    let snippets: Vec<(&PathBuf, Vec<&str>)> = documents
        .iter()
        .flat_map(|(path, text)| blocks(text, "toml").into_iter().map(move |b| (path, b)))
        .collect();
    assert!(snippets.len() >= 3, "{} toml blocks", snippets.len());
    for (path, snippet) in snippets {
        let text = snippet.join("\n");
        // A service's Cargo.toml lines ("Using FORGE"), not a forge.toml.
        if snippet.first() == Some(&"[dependencies]") {
            for dependency in ["forge = ", "tokio = ", "serde = "] {
                assert!(
                    text.contains(dependency),
                    "the Cargo.toml lines lack `{dependency}...`: {text}"
                );
            }
            continue;
        }
        if let Err(err) = forge::Config::from_toml(&text) {
            panic!(
                "this snippet of {} does not load: {err}\n{text}",
                path.display()
            );
        }
    }
}
