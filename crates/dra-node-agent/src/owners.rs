//! One owner per device: which claims already prepared on this node hold a device that a
//! claim is about to be prepared with, where the two allocations may not share it.
//!
//! Two schedulers racing (kube-scheduler beside dra-scheduler), or an allocation written by
//! hand, can give one device to two claims, and the API server does not stop it. Upstream
//! asks drivers to check at prepare time (the release note of kubernetes/kubernetes#136269):
//! the agent is the one place that sees every claim prepared with the node's devices. Pure:
//! [`crate::prepare::Preparer`] finds the holders in its checkpoint with [`holders`], asks
//! the API server which of them still exist, and refuses the claim with [`refusal`] while
//! one does. Kubelet retries a failed prepare by itself, so the claim is prepared once the
//! other claim is unprepared.
//!
//! Two allocations of one device may share it when
//! - either has admin access (`adminAccess: true`): the API allows such an allocation beside
//!   any other, for monitoring;
//! - the device allows multiple allocations (`allowMultipleAllocations: true`, consumable
//!   capacity), every allocation of it has a shareID, and what they consume of each
//!   capacity together fits in the device's capacity.
//!
//! The agent publishes no device with `allowMultipleAllocations` today
//! ([`crate::slices::devices`]), so the second rule never holds for its devices: two
//! allocations with shareIDs of one of them are refused like any other doubled allocation,
//! since no scheduler that read the agent's slices could have written them. The rule is
//! written out (and tested on a device that allows it) so that publishing such a device is
//! the only change needed to share one.

use crate::checkpoint::CheckpointData;
use crate::claim::{ClaimRef, PreparedDevice};
use dra_quantity::Quantity;
use k8s_openapi::api::resource::v1::Device;
use std::collections::BTreeSet;
use std::fmt;

/// Why two allocations of one device may not share it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusive {
    /// Neither has admin access, and the device does not allow multiple allocations.
    NotShareable,
    /// The device allows multiple allocations, but an allocation of it has no shareID.
    NoShareId,
    /// The device allows multiple allocations, but together they consume more of this
    /// capacity than the device has (or one names a capacity the device does not have).
    OverCapacity(String),
}

impl fmt::Display for Exclusive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exclusive::NotShareable => f.write_str(
                "the device does not allow multiple allocations and neither allocation has admin access",
            ),
            Exclusive::NoShareId => f.write_str(
                "the device allows multiple allocations, but not every allocation of it has a shareID",
            ),
            Exclusive::OverCapacity(capacity) => write!(
                f,
                "together the allocations consume more of the device's capacity {capacity:?} than it has"
            ),
        }
    }
}

/// Another prepared claim that holds one of a claim's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub pool: String,
    pub device: String,
    pub why: Exclusive,
}

/// The claims of `checkpoint` other than `uid` (the claim being prepared, which may have an
/// entry of its own from an earlier try) that hold one of `devices` where the allocations
/// may not share it. `published` is what the agent publishes of its devices, for whether a
/// device allows multiple allocations and its capacity; both `Prepared` and
/// `PrepareStarted` entries count, since a crash in the middle leaves the device in use.
pub fn holders(
    checkpoint: &CheckpointData,
    uid: &str,
    devices: &[PreparedDevice],
    published: &[Device],
) -> Vec<Holder> {
    let mut out = Vec::new();
    for want in devices.iter().filter(|d| !d.admin_access) {
        let others: Vec<_> = checkpoint
            .claims
            .iter()
            .filter(|(other, _)| other.as_str() != uid)
            .flat_map(|(other, entry)| {
                entry
                    .devices
                    .iter()
                    .filter(|d| {
                        !d.admin_access
                            && d.pool_name == want.pool_name
                            && d.device_name == want.device_name
                    })
                    .map(move |d| (other, entry, d))
            })
            .collect();
        if others.is_empty() {
            continue;
        }
        let device = published.iter().find(|d| d.name == want.device_name);
        let uses = others.iter().map(|(_, _, d)| *d).chain([want]);
        let Some(why) = why_exclusive(device, uses) else {
            continue;
        };
        for (other, entry, _) in others {
            out.push(Holder {
                uid: other.clone(),
                namespace: entry.namespace.clone(),
                name: entry.name.clone(),
                pool: want.pool_name.clone(),
                device: want.device_name.clone(),
                why: why.clone(),
            });
        }
    }
    out
}

/// Why `uses` (none with admin access) of `device` may not all have it at once; `None` when
/// they may.
fn why_exclusive<'a>(
    device: Option<&Device>,
    uses: impl Iterator<Item = &'a PreparedDevice>,
) -> Option<Exclusive> {
    let Some(device) = device.filter(|d| d.allow_multiple_allocations == Some(true)) else {
        return Some(Exclusive::NotShareable);
    };
    let uses: Vec<&PreparedDevice> = uses.collect();
    if uses.iter().any(|u| u.share_id.is_none()) {
        return Some(Exclusive::NoShareId);
    }
    // A capacity an allocation does not name is one it does not consume: the scheduler
    // records every capacity it counts against the device.
    let named: BTreeSet<&String> = uses
        .iter()
        .flat_map(|u| u.consumed_capacity.keys())
        .collect();
    for capacity in named {
        let total = uses
            .iter()
            .filter_map(|u| u.consumed_capacity.get(capacity))
            .try_fold(Quantity::ZERO, |sum, q| {
                sum.checked_add(&q.parse::<Quantity>().ok()?)
            });
        let has = device
            .capacity
            .as_ref()
            .and_then(|c| c.get(capacity))
            .and_then(|c| Quantity::from_openapi(&c.value).ok());
        let fits = matches!((total, has), (Some(total), Some(has)) if total <= has);
        if !fits {
            return Some(Exclusive::OverCapacity(capacity.clone()));
        }
    }
    None
}

/// The error for `claim`, refused because the live `holders` hold its devices: names each
/// device and claim, and says that kubelet's retry prepares it once they are unprepared.
pub fn refusal(claim: &ClaimRef, holders: &[Holder]) -> String {
    let each: Vec<String> = holders
        .iter()
        .map(|h| {
            format!(
                "device {}/{} is already prepared for claim {}/{} (UID {}), and {}",
                h.pool, h.device, h.namespace, h.name, h.uid, h.why
            )
        })
        .collect();
    let mut owners: Vec<String> = Vec::new();
    for h in holders {
        let owner = format!("{}/{}", h.namespace, h.name);
        if !owners.contains(&owner) {
            owners.push(owner);
        }
    }
    let verb = if owners.len() == 1 { "is" } else { "are" };
    format!(
        "claim {}/{}: {}; kubelet retries the prepare, which succeeds once {} {verb} unprepared",
        claim.namespace,
        claim.name,
        each.join("; "),
        owners.join(" and ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{ClaimEntry, ClaimState};
    use crate::claim::tests::{U1, U2, U3};
    use k8s_openapi::api::resource::v1::DeviceCapacity;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    /// An allocation of `device` in pool node-a.
    fn using(device: &str) -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: device.into(),
            cdi_device_ids: vec![],
            share_id: None,
            admin_access: false,
            consumed_capacity: Default::default(),
        }
    }

    /// The same allocation with a shareID, consuming `memory`.
    fn sharing(device: &str, share: &str, memory: &str) -> PreparedDevice {
        PreparedDevice {
            share_id: Some(share.into()),
            consumed_capacity: [("memory".to_string(), memory.to_string())].into(),
            ..using(device)
        }
    }

    fn prepared(claims: &[(&str, &str, PreparedDevice)]) -> CheckpointData {
        let mut data = CheckpointData::default();
        for (uid, name, device) in claims {
            data.claims.insert(
                uid.to_string(),
                ClaimEntry {
                    namespace: "ns".into(),
                    name: name.to_string(),
                    state: ClaimState::Prepared,
                    devices: vec![device.clone()],
                    sharing: vec![],
                    spec: None,
                    mig: vec![],
                },
            );
        }
        data
    }

    /// gpu-1 with 80Gi of memory, allowing multiple allocations.
    fn shareable() -> Device {
        Device {
            name: "gpu-1".into(),
            allow_multiple_allocations: Some(true),
            capacity: Some(
                [(
                    "memory".to_string(),
                    DeviceCapacity {
                        value: ApiQuantity("80Gi".into()),
                        ..Default::default()
                    },
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    fn whys(holders: &[Holder]) -> Vec<(&str, &str, Exclusive)> {
        holders
            .iter()
            .map(|h| (h.uid.as_str(), h.device.as_str(), h.why.clone()))
            .collect()
    }

    #[test]
    fn another_claim_on_the_same_device_holds_it_and_the_message_names_it() {
        let data = prepared(&[(U1, "a", using("gpu-1")), (U3, "c", using("gpu-2"))]);
        let held = holders(&data, U2, &[using("gpu-1"), using("gpu-3")], &[]);
        assert_eq!(whys(&held), [(U1, "gpu-1", Exclusive::NotShareable)]);
        let b = ClaimRef {
            namespace: "ns".into(),
            uid: U2.into(),
            name: "b".into(),
        };
        assert_eq!(
            refusal(&b, &held),
            format!(
                "claim ns/b: device node-a/gpu-1 is already prepared for claim ns/a (UID {U1}), \
                 and the device does not allow multiple allocations and neither allocation has \
                 admin access; kubelet retries the prepare, which succeeds once ns/a is unprepared"
            )
        );
    }

    #[test]
    fn the_claims_own_entry_and_other_pools_do_not_hold_its_devices() {
        let mut elsewhere = using("gpu-1");
        elsewhere.pool_name = "node-b".into();
        let data = prepared(&[(U1, "a", using("gpu-1")), (U2, "b", elsewhere)]);
        assert!(holders(&data, U1, &[using("gpu-1")], &[]).is_empty());
    }

    #[test]
    fn admin_access_on_either_side_shares_the_device() {
        let admin = PreparedDevice {
            admin_access: true,
            ..using("gpu-1")
        };
        let data = prepared(&[(U1, "monitor", admin.clone())]);
        assert!(holders(&data, U2, &[using("gpu-1")], &[]).is_empty());
        let data = prepared(&[(U1, "a", using("gpu-1"))]);
        assert!(holders(&data, U2, &[admin], &[]).is_empty());
    }

    #[test]
    fn shareids_share_a_device_that_allows_it_while_their_capacity_fits() {
        let data = prepared(&[
            (U1, "a", sharing("gpu-1", "s1", "40Gi")),
            (U3, "c", sharing("gpu-1", "s3", "20Gi")),
        ]);
        let device = [shareable()];
        assert!(holders(&data, U2, &[sharing("gpu-1", "s2", "20Gi")], &device).is_empty());
        let over = Exclusive::OverCapacity("memory".into());
        assert_eq!(
            whys(&holders(
                &data,
                U2,
                &[sharing("gpu-1", "s2", "21Gi")],
                &device
            )),
            [(U1, "gpu-1", over.clone()), (U3, "gpu-1", over)]
        );
        // A capacity the device does not have never fits.
        let mut cores = sharing("gpu-1", "s2", "1Gi");
        cores.consumed_capacity.insert("cores".into(), "1".into());
        assert_eq!(
            whys(&holders(&data, U2, &[cores], &device))[0].2,
            Exclusive::OverCapacity("cores".into())
        );
        // Without a shareID, not even a device that allows it is shared.
        assert_eq!(
            whys(&holders(&data, U2, &[using("gpu-1")], &device))[0].2,
            Exclusive::NoShareId
        );
    }

    #[test]
    fn shareids_do_not_share_a_device_as_the_agent_publishes_it() {
        let data = prepared(&[(U1, "a", sharing("gpu-1", "s1", "1Gi"))]);
        let published = crate::slices::devices(
            &crate::claim::tests::gpus("8x-h100-80gb-2numa-2nic.yaml"),
            &Default::default(),
        );
        assert!(
            published
                .iter()
                .all(|d| d.allow_multiple_allocations.is_none())
        );
        assert_eq!(
            whys(&holders(
                &data,
                U2,
                &[sharing("gpu-1", "s2", "1Gi")],
                &published
            )),
            [(U1, "gpu-1", Exclusive::NotShareable)]
        );
    }
}
