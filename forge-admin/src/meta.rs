//! `GET /api/meta`: the vocabulary the API speaks - the event kinds (grouped as the dashboard
//! filters them), the job states, and each operator action on jobs with the states it
//! applies to - taken from the Rust enums, so that a client (the dashboard) keeps no copy of
//! them. It holds no data of the cluster and needs no token.

use axum::Json;
use forge_core::inspect::EventKind;
use forge_scheduler::jobs::{JobAction, JobState};
use serde_json::{Value, json};

/// Which filter group an event kind belongs to. Exhaustive: a new kind must be placed.
fn group(kind: EventKind) -> &'static str {
    use EventKind::*;
    match kind {
        LeaderElected | LeaderReleased | LeaderFenced | LeaderLost | LeaderRebalanced => {
            "leadership"
        }
        NodeJoined | NodeLeft | NodeDrifted | NodeRecovered | NodeDown | NodeRejoined
        | NodeForgotten => "membership",
        AdminAction => "operators",
    }
}

/// The vocabulary, as JSON.
pub(crate) fn vocabulary() -> Value {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for kind in EventKind::ALL {
        let name = group(*kind);
        match groups.iter_mut().find(|(group, _)| *group == name) {
            Some((_, kinds)) => kinds.push(kind.as_str()),
            None => groups.push((name, vec![kind.as_str()])),
        }
    }
    json!({
        "event_kinds": EventKind::ALL.iter().map(|kind| kind.as_str()).collect::<Vec<_>>(),
        "event_groups": groups
            .into_iter()
            .map(|(group, kinds)| json!({ "group": group, "kinds": kinds }))
            .collect::<Vec<_>>(),
        "job_states": JobState::ALL.iter().map(|state| state.as_str()).collect::<Vec<_>>(),
        "job_actions": JobAction::ALL
            .iter()
            .map(|action| json!({
                "action": action.as_str(),
                "states": action.states().iter().map(|state| state.as_str()).collect::<Vec<_>>(),
            }))
            .collect::<Vec<_>>(),
    })
}

pub(crate) async fn meta() -> Json<Value> {
    Json(vocabulary())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind is in exactly one group, in declaration order within it.
    #[test]
    fn every_event_kind_is_in_one_group() {
        let meta = vocabulary();
        let mut grouped: Vec<&str> = Vec::new();
        for group in meta["event_groups"].as_array().unwrap() {
            for kind in group["kinds"].as_array().unwrap() {
                grouped.push(kind.as_str().unwrap());
            }
        }
        let kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        let mut sorted = grouped.clone();
        sorted.sort_unstable();
        let mut expected = kinds.clone();
        expected.sort_unstable();
        assert_eq!(sorted, expected, "{meta}");
        assert_eq!(
            meta["job_states"].as_array().unwrap().len(),
            JobState::ALL.len()
        );
    }

    /// The dashboard takes the vocabulary from `GET /api/meta`: no script spells out lists of
    /// event kinds or job states (a script may name one or two values it renders specially).
    #[test]
    fn no_dashboard_script_keeps_a_copy_of_the_vocabulary() {
        let assets = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
        let kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        let states: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        let mut scripts = 0;
        for entry in std::fs::read_dir(&assets).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "js") {
                continue;
            }
            scripts += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            for (what, values) in [("event kinds", &kinds), ("job states", &states)] {
                let named: Vec<&&str> = values
                    .iter()
                    .filter(|value| text.contains(&format!("'{value}'")))
                    .collect();
                assert!(
                    named.len() <= 2,
                    "{} names the {what} {named:?}: take them from GET /api/meta",
                    path.display()
                );
            }
        }
        assert!(scripts >= 5, "{scripts} scripts in {}", assets.display());
    }
}
