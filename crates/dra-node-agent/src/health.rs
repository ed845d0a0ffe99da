//! Device health: turns XID / ECC / lost-GPU events into device taints. Pure: the backend
//! produces [`HealthEvent`]s, [`HealthState`] decides the taints, the slice builder
//! publishes them.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// XIDs caused by applications (a bad kernel, an out-of-range access, a reset from the
/// user's side), not by the GPU. They do not taint the GPU. Same default list as NVIDIA's
/// device plugin.
pub const DEFAULT_IGNORED_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

/// Taint keys published by this agent.
pub const XID_TAINT_KEY: &str = "gpu.nvidia.com/xid";
pub const ECC_TAINT_KEY: &str = "gpu.nvidia.com/ecc";
pub const LOST_TAINT_KEY: &str = "gpu.nvidia.com/lost";

/// Something the backend observed about a GPU's health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum HealthEvent {
    /// A critical XID error.
    Xid { minor: u32, xid: u64 },
    /// An uncorrectable (double-bit) ECC error.
    Ecc { minor: u32 },
    /// The GPU fell off the bus or stopped answering.
    Lost { minor: u32 },
    /// An operator or the backend cleared the GPU's problems (e.g. after a reset).
    Recovered { minor: u32 },
}

impl HealthEvent {
    pub fn minor(&self) -> u32 {
        match self {
            HealthEvent::Xid { minor, .. }
            | HealthEvent::Ecc { minor }
            | HealthEvent::Lost { minor }
            | HealthEvent::Recovered { minor } => *minor,
        }
    }
}

/// One taint to publish on a GPU's devices (and its MIG partitions).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    /// "NoSchedule" or "NoExecute".
    pub effect: String,
    /// When the problem was first seen, RFC 3339 seconds; published as `timeAdded` so the
    /// API server does not set it (which would make every reconcile see a difference).
    pub time_added: String,
}

/// The taints of every GPU, by minor number.
#[derive(Debug, Clone, Default)]
pub struct HealthState {
    ignored_xids: BTreeSet<u64>,
    taints: BTreeMap<u32, BTreeSet<Taint>>,
}

impl HealthState {
    pub fn new(ignored_xids: impl IntoIterator<Item = u64>) -> HealthState {
        HealthState {
            ignored_xids: ignored_xids.into_iter().collect(),
            taints: BTreeMap::new(),
        }
    }

    /// Applies an event observed at `now` (RFC 3339). Returns whether the taints changed.
    pub fn apply(&mut self, event: &HealthEvent, now: &str) -> bool {
        let minor = event.minor();
        let (key, value, effect) = match event {
            HealthEvent::Recovered { .. } => return self.taints.remove(&minor).is_some(),
            HealthEvent::Xid { xid, .. } if self.ignored_xids.contains(xid) => return false,
            HealthEvent::Xid { xid, .. } => (XID_TAINT_KEY, Some(xid.to_string()), "NoSchedule"),
            HealthEvent::Ecc { .. } => (ECC_TAINT_KEY, Some("uncorrectable".into()), "NoSchedule"),
            HealthEvent::Lost { .. } => (LOST_TAINT_KEY, None, "NoExecute"),
        };
        let set = self.taints.entry(minor).or_default();
        // The same problem seen again keeps its first time, so the slice does not churn.
        if set
            .iter()
            .any(|t| t.key == key && t.value == value && t.effect == effect)
        {
            return false;
        }
        // At most one XID taint per GPU: the newest critical XID replaces an older one.
        set.retain(|t| t.key != key);
        set.insert(Taint {
            key: key.to_string(),
            value,
            effect: effect.to_string(),
            time_added: now.to_string(),
        });
        true
    }

    /// The taints for a GPU, in a stable order.
    pub fn taints_for(&self, minor: u32) -> Vec<Taint> {
        self.taints
            .get(&minor)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// GPUs with at least one taint.
    pub fn unhealthy(&self) -> impl Iterator<Item = u32> + '_ {
        self.taints
            .iter()
            .filter(|(_, t)| !t.is_empty())
            .map(|(m, _)| *m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:05:00Z";

    #[test]
    fn critical_xid_taints_noschedule_with_the_xid_as_value() {
        let mut h = HealthState::new(DEFAULT_IGNORED_XIDS.iter().copied());
        assert!(h.apply(&HealthEvent::Xid { minor: 2, xid: 79 }, T0));
        assert_eq!(
            h.taints_for(2),
            vec![Taint {
                key: "gpu.nvidia.com/xid".into(),
                value: Some("79".into()),
                effect: "NoSchedule".into(),
                time_added: T0.into()
            }]
        );
        assert!(h.taints_for(1).is_empty());
    }

    #[test]
    fn application_xids_are_ignored() {
        let mut h = HealthState::new(DEFAULT_IGNORED_XIDS.iter().copied());
        assert!(!h.apply(&HealthEvent::Xid { minor: 0, xid: 13 }, T0));
        assert!(!h.apply(&HealthEvent::Xid { minor: 0, xid: 43 }, T0));
        assert!(h.taints_for(0).is_empty());
        let mut custom = HealthState::new([79]);
        assert!(!custom.apply(&HealthEvent::Xid { minor: 0, xid: 79 }, T0));
        assert!(custom.apply(&HealthEvent::Xid { minor: 0, xid: 13 }, T0));
    }

    #[test]
    fn lost_gpu_is_noexecute_and_repeats_keep_the_first_time() {
        let mut h = HealthState::new([]);
        assert!(h.apply(&HealthEvent::Lost { minor: 5 }, T0));
        assert!(!h.apply(&HealthEvent::Lost { minor: 5 }, T1));
        let t = h.taints_for(5);
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].key.as_str(), t[0].effect.as_str()),
            ("gpu.nvidia.com/lost", "NoExecute")
        );
        assert_eq!(t[0].time_added, T0);
        assert_eq!(h.unhealthy().collect::<Vec<_>>(), vec![5]);
    }

    #[test]
    fn newer_xid_replaces_older_and_recovery_clears_all() {
        let mut h = HealthState::new([]);
        h.apply(&HealthEvent::Xid { minor: 0, xid: 48 }, T0);
        h.apply(&HealthEvent::Ecc { minor: 0 }, T0);
        h.apply(&HealthEvent::Xid { minor: 0, xid: 79 }, T1);
        let keys: Vec<_> = h
            .taints_for(0)
            .into_iter()
            .map(|t| format!("{}={}", t.key, t.value.unwrap_or_default()))
            .collect();
        assert_eq!(
            keys,
            ["gpu.nvidia.com/ecc=uncorrectable", "gpu.nvidia.com/xid=79"]
        );
        assert!(h.apply(&HealthEvent::Recovered { minor: 0 }, T1));
        assert!(h.taints_for(0).is_empty());
    }
}
