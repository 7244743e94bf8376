//! Names: roles, lock namespaces, node ids, queues, crons and job kinds.

use std::fmt;

/// The kinds of names FORGE validates, each with its own rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Name {
    /// A leader role (`scheduler`, `billing_reports`): a metric label, part of
    /// `application_name`, a key in `forge.leaders`.
    Role,
    /// A lock namespace (`[cluster] lock_namespace`).
    Namespace,
    /// A node id (`FORGE_NODE_ID`, `[node] id`, `$HOSTNAME`).
    NodeId,
    /// A job queue (`[node] queues`, `[jobs.queues]`, `#[job(queue = ...)]`): in notifications
    /// and metric labels.
    Queue,
    /// A cron's name: its key in the tick ledger and a metric label.
    Cron,
    /// A job kind: its name in `forge.jobs` and a metric label.
    JobKind,
}

impl Name {
    /// What the name is called in messages.
    pub fn noun(self) -> &'static str {
        match self {
            Name::Role => "role name",
            Name::Namespace => "lock namespace",
            Name::NodeId => "node id",
            Name::Queue => "queue name",
            Name::Cron => "cron name",
            Name::JobKind => "job kind",
        }
    }

    /// The longest valid name, in bytes.
    pub fn max_len(self) -> usize {
        match self {
            Name::Role | Name::Namespace => 48,
            Name::NodeId => 128,
            Name::Queue => 63,
            Name::Cron | Name::JobKind => 64,
        }
    }

    /// The rule, as a sentence fragment that follows "use".
    pub fn rule(self) -> &'static str {
        match self {
            Name::Role => {
                "1-48 lowercase letters, digits and `_`, starting with a letter (for example `scheduler` or `billing_reports`)"
            }
            Name::Namespace => "1-48 lowercase letters, digits and `_`, starting with a letter",
            Name::NodeId => "1-128 printable ASCII characters without spaces",
            Name::Queue => "1-63 ASCII letters, digits, `_`, `-` or `.`",
            Name::Cron | Name::JobKind => {
                "1-64 ASCII letters, digits, `_`, `-`, `.` or `:`, starting with a letter"
            }
        }
    }

    fn allows(self, name: &str) -> bool {
        if name.is_empty() || name.len() > self.max_len() {
            return false;
        }
        let first = name.chars().next().unwrap_or(' ');
        match self {
            Name::Role if RESERVED_ROLES.contains(&name) => false,
            Name::Role | Name::Namespace => {
                first.is_ascii_lowercase()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            }
            Name::NodeId => name.chars().all(|c| c.is_ascii_graphic()),
            Name::Queue => name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')),
            Name::Cron | Name::JobKind => {
                first.is_ascii_alphabetic()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
            }
        }
    }
}

/// Role names FORGE keeps for its own sessions (`application_name` is
/// `forge:<role or purpose>:<node>`): a role with one of these names would be mistaken for them.
pub const RESERVED_ROLES: &[&str] = &["node", "pool", "setup", "listen", "admin", "cli"];

/// A name that breaks its rule. `Display` is the whole message: what was wrong and what is
/// valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameError {
    /// Which kind of name.
    pub kind: Name,
    /// The name as given.
    pub name: String,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == Name::Role && RESERVED_ROLES.contains(&self.name.as_str()) {
            return write!(
                f,
                "the role name {:?} is reserved for FORGE's own sessions ({}): choose another name",
                self.name,
                RESERVED_ROLES.join(", ")
            );
        }
        write!(
            f,
            "invalid {} {:?}: use {}",
            self.kind.noun(),
            self.name,
            self.kind.rule()
        )
    }
}

impl std::error::Error for NameError {}

/// Checks `name` against the rule of `kind`.
pub fn check_name(kind: Name, name: &str) -> Result<(), NameError> {
    if kind.allows(name) {
        Ok(())
    } else {
        Err(NameError {
            kind,
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_accepts_and_rejects_what_it_says() {
        let cases: &[(Name, &[&str], &[&str])] = &[
            (
                Name::Role,
                &["scheduler", "billing_reports", "r2"],
                &[
                    "",
                    "Scheduler",
                    "1abc",
                    "has space",
                    "dash-ed",
                    &"x".repeat(49),
                ],
            ),
            (Name::Namespace, &["forge", "tenant_a"], &["Forge", "a-b"]),
            (
                Name::NodeId,
                &["pod-0.svc", "node_1", "10.0.0.7", "a:b"],
                &["", "node 1", "tab\t", &"n".repeat(129)],
            ),
            (
                Name::Queue,
                &["default", "mail-ers.v2", "_x"],
                &["", "mail ers", &"q".repeat(64)],
            ),
            (
                Name::Cron,
                &["send_email", "billing.invoice:v2-eu"],
                &["", "_private", "daily report", &"a".repeat(65)],
            ),
            (Name::JobKind, &["a", &"a".repeat(64)], &["9lives", "ü"]),
        ];
        for (kind, good, bad) in cases {
            for name in *good {
                assert!(check_name(*kind, name).is_ok(), "{kind:?} {name:?}");
            }
            for name in *bad {
                let err = check_name(*kind, name).unwrap_err().to_string();
                assert!(err.contains(kind.noun()), "{err}");
            }
        }
    }
}

#[cfg(test)]
mod reserved {
    use super::*;

    #[test]
    fn reserved_role_names_say_so() {
        let err = check_name(Name::Role, "node").unwrap_err().to_string();
        assert!(err.contains("reserved for FORGE's own sessions"), "{err}");
        assert!(check_name(Name::Namespace, "node").is_ok());
    }
}
