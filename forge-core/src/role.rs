//! Leader roles, their advisory-lock keys, epochs and node ids: parsed once at the edge,
//! carried as types afterwards.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use forge_rules::{Name, NameError, check_name};

use crate::sql::sql_text_type;

/// Why [`Role::with_lock_slot`] refused a role.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockSlotError {
    /// The name breaks the rule of role names (see [`Role::new`]).
    #[error(transparent)]
    Name(#[from] NameError),
    /// The slot is one of the built-in roles' (below `0x0100`), or the role is a built-in one.
    #[error(
        "role `{role}`: lock slots below 0x0100 are reserved for built-in roles, and built-in roles keep their slot"
    )]
    Reserved {
        /// The role's name.
        role: String,
    },
}

/// A leader role: a kind of cluster-wide work that exactly one node performs at a time.
///
/// Every role owns one PostgreSQL advisory-lock key; the node holding it is the role's leader.
/// The built-in roles have the fixed keys `0x464F524745_0001..3` ("FORGE" in ASCII, then the
/// role number) in the default namespace. User-defined roles get a key derived from their name
/// (see [`Role::lock_key`]).
///
/// ```
/// use forge_core::Role;
///
/// let reports = Role::new("reports").unwrap();
/// assert_eq!(reports.name(), "reports");
/// assert_eq!(Role::SCHEDULER.name(), "scheduler");
/// assert!(Role::new("Bad Name").is_err());
/// ```
#[derive(Clone)]
pub struct Role {
    name: Cow<'static, str>,
    slot: Option<u16>,
}

impl Role {
    /// Job assignment, queue maintenance and cron triggering.
    pub const SCHEDULER: Role = Role::builtin("scheduler", 1);
    /// Aggregation of per-node figures into cluster-wide ones.
    pub const METRICS_AGGREGATOR: Role = Role::builtin("metrics_aggregator", 2);
    /// Pruning and compaction of events, finished jobs and the tick ledger.
    pub const LOG_COMPACTOR: Role = Role::builtin("log_compactor", 3);

    /// The three built-in roles.
    pub const BUILTIN: [Role; 3] = [
        Role::SCHEDULER,
        Role::METRICS_AGGREGATOR,
        Role::LOG_COMPACTOR,
    ];

    const fn builtin(name: &'static str, slot: u16) -> Role {
        Role {
            name: Cow::Borrowed(name),
            slot: Some(slot),
        }
    }

    /// A role by name: a built-in one (`scheduler`, `metrics_aggregator`, `log_compactor`) or a
    /// user-defined one. Names are 1-48 characters of lowercase ASCII letters, digits and `_`,
    /// starting with a letter, so that they are safe as metric labels and in `application_name`.
    ///
    /// The error names the role (callers show it as it is); `?` makes it a `forge::Error`
    /// (`InvalidInput`).
    pub fn new(name: &str) -> Result<Role, NameError> {
        check_name(Name::Role, name)?;
        Ok(Role::BUILTIN
            .into_iter()
            .find(|role| role.name() == name)
            .unwrap_or_else(|| Role {
                name: Cow::Owned(name.to_owned()),
                slot: None,
            }))
    }

    /// A user-defined role with an explicit 16-bit key slot (`0x0100..=0xFFFF`), for when two
    /// role names happen to derive the same key.
    /// `?` makes its error a `forge::Error` (`InvalidInput` for the name, `Config` of the key
    /// `role` for the slot).
    pub fn with_lock_slot(name: &str, slot: u16) -> Result<Role, LockSlotError> {
        let mut role = Role::new(name)?;
        if role.is_builtin() || slot < 0x0100 {
            return Err(LockSlotError::Reserved {
                role: name.to_owned(),
            });
        }
        role.slot = Some(slot);
        Ok(role)
    }

    /// The role's name, as used in config, metrics labels and the `forge.leaders` table.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn as_str(&self) -> &str {
        &self.name
    }

    /// Whether this is one of [`Role::BUILTIN`].
    pub fn is_builtin(&self) -> bool {
        Role::BUILTIN.iter().any(|role| role.name == self.name)
    }

    /// The role's advisory-lock key in a namespace.
    pub fn lock_key(&self, namespace: &LockNamespace) -> LockKey {
        let slot = self.slot.unwrap_or_else(|| derived_slot(&self.name));
        LockKey((namespace.prefix() << 16 | u64::from(slot)) as i64)
    }
}

// A role is identified by its name alone; the slot only decides its key.
impl PartialEq for Role {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Role {}

impl std::hash::Hash for Role {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl PartialOrd for Role {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Role {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name.cmp(&other.name)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Debug for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Role({})", self.name)
    }
}

sql_text_type!(Role, Role::new);

/// 64-bit FNV-1a: small, stable across releases and platforms (unlike `std`'s hasher).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

fn derived_slot(name: &str) -> u16 {
    // Slots 0x0000-0x00FF are reserved for built-in roles.
    (0x0100 + fnv1a(name.as_bytes()) % 0xFF00) as u16
}

/// The namespace that keeps FORGE's advisory-lock keys apart from other applications (and from
/// other FORGE clusters) sharing the database.
///
/// Keys are `prefix << 16 | slot`, where the 40-bit prefix is `0x464F524745` ("FORGE") for the
/// default namespace `forge` and the low 40 bits of the FNV-1a hash of the name otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockNamespace(Arc<str>);

impl LockNamespace {
    /// The default namespace, `forge`.
    pub fn default_namespace() -> LockNamespace {
        LockNamespace("forge".into())
    }

    /// A namespace by name (1-48 characters of lowercase letters, digits and `_`).
    pub fn new(name: &str) -> Result<LockNamespace, NameError> {
        check_name(Name::Namespace, name)?;
        Ok(LockNamespace(name.into()))
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    fn prefix(&self) -> u64 {
        if &*self.0 == "forge" {
            0x46_4F52_4745
        } else {
            fnv1a(self.0.as_bytes()) & 0xFF_FFFF_FFFF
        }
    }
}

impl Default for LockNamespace {
    fn default() -> Self {
        LockNamespace::default_namespace()
    }
}

impl LockNamespace {
    fn as_str(&self) -> &str {
        &self.0
    }
}

sql_text_type!(LockNamespace, LockNamespace::new);

impl fmt::Display for LockNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A PostgreSQL advisory-lock key (the `bigint` form of `pg_advisory_lock`).
///
/// In `pg_locks` it appears as `classid = key >> 32`, `objid = key & 0xFFFFFFFF`, `objsubid = 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockKey(pub i64);

impl LockKey {
    /// The key a node's session holds while the node runs, so that two live nodes never share
    /// an id: the 64-bit FNV-1a hash of the namespace and the node id (a different key space
    /// from the roles' `prefix << 16 | slot` keys in practice: a collision needs a 64-bit hash
    /// to land on one of a few hundred role keys).
    pub fn for_node(namespace: &LockNamespace, node: &NodeId) -> LockKey {
        let text = format!("forge-node\0{}\0{}", namespace.name(), node.as_str());
        LockKey(fnv1a(text.as_bytes()) as i64)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A leadership epoch: the fencing token of one tenure of one role.
///
/// Each acquisition of a role's lock increments the role's epoch in the logged table
/// `forge.leaders`, so epochs strictly increase, also across PostgreSQL crashes.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub i64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

crate::sql_bigint_newtype!(Epoch);

/// The identity of a node in the cluster (`FORGE_NODE_ID`, `[node] id`, `$HOSTNAME`, or
/// generated).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(Arc<str>);

impl NodeId {
    /// A node id: 1-128 printable ASCII characters without spaces.
    pub fn new(id: &str) -> Result<NodeId, NameError> {
        check_name(Name::NodeId, id)?;
        Ok(NodeId(id.into()))
    }

    /// A random id such as `node-3f9a1c7e`, for nodes that have no configured id and no
    /// `$HOSTNAME`.
    pub fn generate() -> NodeId {
        NodeId(format!("node-{:08x}", fastrand::u32(..)).into())
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

sql_text_type!(NodeId, NodeId::new);

#[cfg(test)]
// The keys are written as in the design documents: "FORGE" in hex, then the role number.
#[allow(clippy::unusual_byte_groupings)]
mod tests {
    use super::*;

    #[test]
    fn builtin_keys_are_the_documented_constants() {
        let ns = LockNamespace::default();
        assert_eq!(Role::SCHEDULER.lock_key(&ns).0, 0x464F524745_0001);
        assert_eq!(Role::METRICS_AGGREGATOR.lock_key(&ns).0, 0x464F524745_0002);
        assert_eq!(Role::LOG_COMPACTOR.lock_key(&ns).0, 0x464F524745_0003);
        assert_eq!(Role::new("scheduler").unwrap(), Role::SCHEDULER);
    }

    #[test]
    fn user_roles_get_stable_keys_outside_the_builtin_slots() {
        let ns = LockNamespace::default();
        let key = Role::new("billing_reports").unwrap().lock_key(&ns).0;
        // Stable across releases: this exact value is part of the on-disk contract.
        assert_eq!(
            key,
            0x464F524745_0000 | i64::from(derived_slot("billing_reports"))
        );
        assert!(key & 0xFFFF >= 0x0100);
        let other_ns = LockNamespace::new("tenant_a").unwrap();
        assert_ne!(
            Role::SCHEDULER.lock_key(&other_ns),
            Role::SCHEDULER.lock_key(&ns)
        );
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c, "FNV-1a reference vector");
    }

    #[test]
    fn names_are_validated() {
        for bad in [
            "",
            "Scheduler",
            "1abc",
            "has space",
            "dash-ed",
            &"x".repeat(49),
        ] {
            assert!(Role::new(bad).is_err(), "{bad:?} should be rejected");
        }
        let err = Role::new("x'y").unwrap_err().to_string();
        assert!(err.contains("use 1-48 lowercase letters"), "{err}");
        assert_eq!(
            err.matches("x'y").count(),
            1,
            "the message names the role once: {err}"
        );
        assert!(err.starts_with("invalid role name \"x'y\""), "{err}");
        assert!(Role::with_lock_slot("mine", 0x0001).is_err());
        assert_eq!(
            Role::with_lock_slot("mine", 0x1234)
                .unwrap()
                .lock_key(&LockNamespace::default())
                .0,
            0x464F524745_1234
        );
        assert!(NodeId::new("node 1").is_err());
        assert!(NodeId::new("pod-0.svc").is_ok());
    }
}
