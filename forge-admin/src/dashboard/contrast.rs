//! The dashboard's colours against WCAG 2.1 AA, computed from its style sheet in both colour
//! schemes: 4.5:1 for text (1.4.3), 3:1 for the focus outline (1.4.11).
//!
//! Checked: every rule that sets both `color` and a `background` (badges, banners, buttons,
//! the current page's link, markers, ...), the tenure blocks' white text on their colours, and
//! the text colours that sit on the page and on its cards without a background of their own.
//! A translucent background is laid over what it sits on (a card) first.

use std::collections::BTreeMap;

const CSS: &str = include_str!("../../assets/style.css");

/// Text that inherits the background it sits on: (colour, background) variable names.
const INHERITED: &[(&str, &str)] = &[
    ("text", "card"),
    ("text", "bg"),
    ("text", "neutral-bg"),
    ("muted", "card"),
    ("muted", "bg"),
    ("accent", "card"),
    ("accent", "bg"),
    ("bad", "card"),
    ("warn", "card"),
    ("good", "card"),
    ("c0", "card"),
    ("c1", "card"),
    ("c2", "card"),
    ("c3", "card"),
    ("c4", "card"),
    ("c5", "card"),
    ("c6", "card"),
    ("c7", "card"),
];

const TEXT: f64 = 4.5;
const NON_TEXT: f64 = 3.0;

/// A rule: its selector (with the `@media` it is in, if any) and its declarations.
struct Rule {
    media: Option<String>,
    selector: String,
    declarations: BTreeMap<String, String>,
}

/// The style sheet's rules, one level of `@media` deep (comments removed).
fn rules(css: &str) -> Vec<Rule> {
    let mut text = String::new();
    let mut rest = css;
    while let Some(start) = rest.find("/*") {
        text.push_str(&rest[..start]);
        rest = rest[start..]
            .split_once("*/")
            .map_or("", |(_, after)| after);
    }
    text.push_str(rest);
    let mut rules = Vec::new();
    let mut media: Option<String> = None;
    let mut pending = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '{' if pending.trim().starts_with('@') => {
                media = Some(pending.trim().to_owned());
                pending.clear();
            }
            '{' => {
                let body: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let declarations = body
                    .split(';')
                    .filter_map(|d| d.split_once(':'))
                    .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                    .collect();
                rules.push(Rule {
                    media: media.clone(),
                    selector: pending.trim().to_owned(),
                    declarations,
                });
                pending.clear();
            }
            '}' => media = None,
            _ => pending.push(c),
        }
    }
    rules
}

/// The custom properties of a scheme: `:root`'s, then the dark scheme's over them.
fn variables(rules: &[Rule], dark: bool) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for rule in rules.iter().filter(|r| r.selector == ":root") {
        let is_dark = rule
            .media
            .as_deref()
            .is_some_and(|m| m.contains("prefers-color-scheme: dark"));
        if rule.media.is_some() && !is_dark || is_dark && !dark {
            continue;
        }
        for (key, value) in &rule.declarations {
            if let Some(name) = key.strip_prefix("--") {
                vars.insert(name.to_owned(), value.clone());
            }
        }
    }
    vars
}

type Rgba = [f64; 4];

/// `#rgb`, `#rrggbb`, `#rrggbbaa` or `var(--name)`; `None` for anything else (gradients,
/// `transparent`, `color-mix`), which the check leaves out.
fn colour(value: &str, vars: &BTreeMap<String, String>) -> Option<Rgba> {
    let value = value.trim_end_matches("!important").trim();
    if let Some(name) = value
        .strip_prefix("var(--")
        .and_then(|v| v.strip_suffix(')'))
    {
        return colour(vars.get(name)?, vars);
    }
    let hex = value.strip_prefix('#')?;
    let hex: String = if hex.len() == 3 {
        hex.chars().flat_map(|c| [c, c]).collect()
    } else {
        hex.to_owned()
    };
    let byte = |i: usize| {
        hex.get(i..i + 2)
            .and_then(|b| u8::from_str_radix(b, 16).ok())
            .map(|b| f64::from(b) / 255.0)
    };
    let alpha = if hex.len() == 8 { byte(6)? } else { 1.0 };
    (hex.len() == 6 || hex.len() == 8).then_some([byte(0)?, byte(2)?, byte(4)?, alpha])
}

/// `top` laid over the opaque `under`.
fn over(top: Rgba, under: Rgba) -> Rgba {
    let a = top[3];
    [
        top[0] * a + under[0] * (1.0 - a),
        top[1] * a + under[1] * (1.0 - a),
        top[2] * a + under[2] * (1.0 - a),
        1.0,
    ]
}

fn luminance(c: Rgba) -> f64 {
    let linear = |v: f64| {
        if v <= 0.039_28 {
            v / 12.92
        } else {
            ((v + 0.055) / 1.055).powf(2.4)
        }
    };
    0.2126 * linear(c[0]) + 0.7152 * linear(c[1]) + 0.0722 * linear(c[2])
}

/// The contrast ratio of `fg` on `bg` (laid over `under` when translucent).
fn ratio(fg: Rgba, bg: Rgba, under: Rgba) -> f64 {
    let bg = over(bg, under);
    let fg = over(fg, bg);
    let (a, b) = (luminance(fg), luminance(bg));
    (a.max(b) + 0.05) / (a.min(b) + 0.05)
}

#[test]
fn text_and_focus_colours_meet_wcag_aa_in_both_schemes() {
    let rules = rules(CSS);
    let tenure_text = rules
        .iter()
        .find(|r| r.selector == ".tenure")
        .and_then(|r| r.declarations.get("color"))
        .expect("the .tenure rule sets the text colour");
    let mut checked = 0;
    let mut failures = Vec::new();
    for dark in [false, true] {
        let scheme = if dark { "dark" } else { "light" };
        let vars = variables(&rules, dark);
        let var = |name: &str| {
            colour(&format!("var(--{name})"), &vars)
                .unwrap_or_else(|| panic!("--{name} is not a colour in the {scheme} scheme"))
        };
        let card = var("card");
        let mut check = |what: String, fg: Rgba, bg: Rgba, min: f64| {
            let r = ratio(fg, bg, card);
            checked += 1;
            if r < min {
                failures.push(format!("{scheme}: {what}: {r:.2}:1 < {min}:1"));
            }
        };
        for (fg, bg) in INHERITED {
            check(format!("--{fg} on --{bg}"), var(fg), var(bg), TEXT);
        }
        for bg in ["card", "bg"] {
            check(
                format!("focus outline on --{bg}"),
                var("focus"),
                var(bg),
                NON_TEXT,
            );
        }
        for rule in &rules {
            let get = |key: &str| rule.declarations.get(key);
            let fg = if rule.selector.starts_with(".tenure.c") {
                Some(tenure_text)
            } else {
                get("color")
            };
            let bg = get("background").or_else(|| get("background-color"));
            let (Some(fg), Some(bg)) = (fg, bg) else {
                continue;
            };
            if let (Some(fg), Some(bg)) = (colour(fg, &vars), colour(bg, &vars)) {
                check(format!("`{}`", rule.selector), fg, bg, TEXT);
            }
        }
    }
    assert!(
        checked > 60,
        "only {checked} pairs found: is the parser lost?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_parser_reads_rules_media_and_colours() {
    let rules = rules(
        "/* c */ :root { --a: #fff; --b: #00000080; }\n\
         @media (prefers-color-scheme: dark) { :root { --a: #000; } }\n\
         .x, .y { color: var(--a); background: #123; }",
    );
    assert_eq!(rules.len(), 3);
    assert_eq!(rules[2].selector, ".x, .y");
    let light = variables(&rules, false);
    let dark = variables(&rules, true);
    assert_eq!(light["a"], "#fff");
    assert_eq!(dark["a"], "#000");
    assert_eq!(colour("var(--a)", &light), Some([1.0, 1.0, 1.0, 1.0]));
    assert_eq!(colour("#123", &light).map(|c| c[3]), Some(1.0));
    assert!((colour("var(--b)", &light).unwrap()[3] - 128.0 / 255.0).abs() < 1e-9);
    assert_eq!(colour("transparent", &light), None);
    let white = [1.0, 1.0, 1.0, 1.0];
    let black = [0.0, 0.0, 0.0, 1.0];
    assert!((ratio(black, white, white) - 21.0).abs() < 1e-9);
    assert!((ratio(white, white, white) - 1.0).abs() < 1e-9);
}
