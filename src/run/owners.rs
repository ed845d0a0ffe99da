//! Who holds each device, as the claim informer shows it, and which claim got it first.
//!
//! Beside another scheduler (kube-scheduler, or a second dra-scheduler without leader
//! election) two claims can be allocated the same device: each scheduler decides on what
//! its own cache has seen, and nothing in the API server refuses the second write
//! (kubernetes/kubernetes#128980). Without the chart's ownership mode, which lets only
//! this scheduler write allocations of the devices it owns, the rule here is **first
//! writer wins**:
//!
//! - every claim allocation the informer shows is recorded with the resourceVersion of
//!   the event that first showed it: the revision at which it was written;
//! - after this scheduler's status write of an allocation lands, and before the pod is
//!   bound, the binder waits until the informer has shown that write (and so every write
//!   before it) and asks [`DeviceOwners::first_writer`]: when another claim holds one of
//!   the devices with an earlier write, this claim's writes are undone and the pod is
//!   tried again, on what the informer now shows;
//! - a claim allocated one of our devices after our write (the other scheduler wrote
//!   second) cannot be undone from here: [`DeviceOwners::observe`] reports it as
//!   [`Doubled`], and the daemon tells both pods and counts it.
//!
//! Devices that may be shared are not counted: results with admin access, and results
//! with a `shareID` (consumable capacity).
//!
//! resourceVersions are compared as numbers: Kubernetes documents them as opaque, but
//! every API server backed by etcd gives the store's revision, and since 1.35 they are
//! comparable by contract (KEP-5504). A version that is not a number disables the check
//! (with a warning) rather than guessing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use dra_engine::ObjectKey;

/// How long the binder waits for the informer to show its own write.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// One device: driver, pool and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A claim that holds devices no other claim may hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub claim: ObjectKey,
    pub uid: String,
    /// The resourceVersion its allocation was written at.
    pub written: u64,
    /// The pods it is reserved for, by name (in the claim's namespace).
    pub pods: Vec<String>,
    devices: BTreeSet<DeviceId>,
}

/// A device two claims hold: `first` was written before `second`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doubled {
    pub device: DeviceId,
    pub first: Holder,
    pub second: Holder,
}

/// Why an allocation this scheduler wrote may not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotFirst {
    /// Another claim held one of the devices with an earlier write.
    #[error(
        "device {device} of ResourceClaim {ours} was allocated first to ResourceClaim {theirs} (another scheduler's write landed before this one's): this allocation is undone and the pod is tried again"
    )]
    Earlier {
        device: DeviceId,
        ours: ObjectKey,
        theirs: ObjectKey,
    },
    /// The informer did not show the write in time: the check could not be made.
    #[error(
        "the claim informer had not shown ResourceClaim {claim} at resourceVersion {version} after {}s: not binding on a view that may miss another scheduler's write",
        waited.as_secs()
    )]
    NotSeen {
        claim: ObjectKey,
        version: u64,
        waited: Duration,
    },
}

/// An allocation this scheduler has just written.
#[derive(Clone, Debug)]
pub struct Written {
    pub claim: ObjectKey,
    /// The claim's resourceVersion after the write.
    pub resource_version: String,
    pub devices: BTreeSet<DeviceId>,
}

impl Written {
    /// The allocation in `stored`, the claim as the API server returned it after the write.
    pub fn of(stored: &ResourceClaim) -> Written {
        Written {
            claim: ObjectKey::of(&stored.metadata),
            resource_version: stored.metadata.resource_version.clone().unwrap_or_default(),
            devices: exclusive_devices(stored),
        }
    }
}

/// The devices of a claim's allocation that no other claim may hold.
pub fn exclusive_devices(claim: &ResourceClaim) -> BTreeSet<DeviceId> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.admin_access != Some(true) && r.share_id.is_none())
        .map(|r| DeviceId {
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
        })
        .collect()
}

fn revision(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok()
}

#[derive(Default)]
struct Inner {
    claims: HashMap<ObjectKey, Holder>,
    /// The claims holding each device.
    holders: BTreeMap<DeviceId, Vec<ObjectKey>>,
    /// How many devices have more than one holder.
    doubled: usize,
    /// During a relist: the claims listed so far, and the highest version among them.
    listing: Option<(HashSet<ObjectKey>, u64)>,
    warned_unordered: bool,
}

/// The devices every claim holds, kept by the daemon's event loop from the claim
/// informer and read by the binder.
pub struct DeviceOwners {
    inner: Mutex<Inner>,
    /// The highest resourceVersion the informer has shown outside a relist: every write
    /// up to it has been observed.
    seen: watch::Sender<u64>,
}

impl Default for DeviceOwners {
    fn default() -> Self {
        DeviceOwners {
            inner: Mutex::default(),
            seen: watch::Sender::new(0),
        }
    }
}

impl DeviceOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take in one event of the claim informer; returns the devices that it made doubled
    /// (a claim's new allocation holds a device another claim holds).
    pub fn observe(&self, event: &Event<ResourceClaim>) -> Vec<Doubled> {
        let mut inner = self.lock();
        match event {
            Event::Init => {
                inner.listing = Some((HashSet::new(), 0));
                Vec::new()
            }
            Event::InitApply(claim) => {
                let version = revision(claim.metadata.resource_version.as_deref());
                if let Some((listed, max)) = inner.listing.as_mut() {
                    listed.insert(ObjectKey::of(&claim.metadata));
                    *max = (*max).max(version.unwrap_or(0));
                }
                inner.upsert(claim, version)
            }
            Event::InitDone => {
                if let Some((listed, max)) = inner.listing.take() {
                    let gone: Vec<ObjectKey> = inner
                        .claims
                        .keys()
                        .filter(|k| !listed.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        inner.remove(&key);
                    }
                    self.seen.send_if_modified(|s| raise(s, max));
                }
                Vec::new()
            }
            Event::Apply(claim) | Event::Delete(claim) => {
                let version = revision(claim.metadata.resource_version.as_deref());
                let doubled = match event {
                    Event::Delete(_) => {
                        inner.remove(&ObjectKey::of(&claim.metadata));
                        Vec::new()
                    }
                    _ => inner.upsert(claim, version),
                };
                if inner.listing.is_none()
                    && let Some(version) = version
                {
                    self.seen.send_if_modified(|s| raise(s, version));
                }
                doubled
            }
        }
    }

    /// How many devices more than one claim holds now.
    pub fn doubled_devices(&self) -> usize {
        self.lock().doubled
    }

    /// The devices held by more than one claim, with every holder.
    pub fn doubled(&self) -> Vec<(DeviceId, Vec<ObjectKey>)> {
        self.lock()
            .holders
            .iter()
            .filter(|(_, claims)| claims.len() > 1)
            .map(|(d, claims)| (d.clone(), claims.clone()))
            .collect()
    }

    /// Whether our just-written allocations were first on every device: waits (at most
    /// `timeout`) until the informer has shown the writes, then looks for another claim
    /// holding one of their devices with an earlier write. The error names the device,
    /// both claims, and says what happens next.
    pub async fn first_writer(&self, ours: &[Written], timeout: Duration) -> Result<(), NotFirst> {
        let mut versions = Vec::new();
        for w in ours {
            match revision(Some(&w.resource_version)) {
                Some(v) => versions.push(v),
                None => {
                    let mut inner = self.lock();
                    if !std::mem::replace(&mut inner.warned_unordered, true) {
                        tracing::warn!(claim = %w.claim, resource_version = %w.resource_version, "resourceVersions are not numbers here: claims written by two schedulers cannot be ordered, so the first-writer check is off");
                    }
                    return Ok(());
                }
            }
        }
        let Some((last, &version)) = ours.iter().zip(&versions).max_by_key(|(_, v)| **v) else {
            return Ok(());
        };
        let mut seen = self.seen.subscribe();
        if tokio::time::timeout(timeout, seen.wait_for(|s| *s >= version))
            .await
            .is_err()
        {
            return Err(NotFirst::NotSeen {
                claim: last.claim.clone(),
                version,
                waited: timeout,
            });
        }
        let inner = self.lock();
        for (w, written) in ours.iter().zip(versions) {
            for device in &w.devices {
                let earlier = inner
                    .holders
                    .get(device)
                    .into_iter()
                    .flatten()
                    .filter(|k| **k != w.claim)
                    .filter_map(|k| inner.claims.get(k))
                    .find(|h| h.written < written);
                if let Some(other) = earlier {
                    return Err(NotFirst::Earlier {
                        device: device.clone(),
                        ours: w.claim.clone(),
                        theirs: other.claim.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn raise(seen: &mut u64, to: u64) -> bool {
    if to > *seen {
        *seen = to;
        true
    } else {
        false
    }
}

impl Inner {
    /// Record `claim` as the informer shows it at `version`.
    fn upsert(&mut self, claim: &ResourceClaim, version: Option<u64>) -> Vec<Doubled> {
        let key = ObjectKey::of(&claim.metadata);
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let devices = exclusive_devices(claim);
        let pods = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.resource == "pods")
            .map(|r| r.name.clone())
            .collect();
        if let Some(held) = self.claims.get_mut(&key)
            && held.uid == uid
            && held.devices == devices
            && !devices.is_empty()
        {
            held.pods = pods;
            return Vec::new();
        }
        self.remove(&key);
        if devices.is_empty() {
            return Vec::new();
        }
        let holder = Holder {
            claim: key.clone(),
            uid,
            written: version.unwrap_or(u64::MAX),
            pods,
            devices,
        };
        let mut doubled = Vec::new();
        for device in &holder.devices {
            let claims = self.holders.entry(device.clone()).or_default();
            for other in claims.iter().filter_map(|k| self.claims.get(k)) {
                let (first, second) = if other.written <= holder.written {
                    (other.clone(), holder.clone())
                } else {
                    (holder.clone(), other.clone())
                };
                doubled.push(Doubled {
                    device: device.clone(),
                    first,
                    second,
                });
            }
            claims.push(key.clone());
            if claims.len() == 2 {
                self.doubled += 1;
            }
        }
        self.claims.insert(key, holder);
        doubled
    }

    fn remove(&mut self, key: &ObjectKey) {
        let Some(held) = self.claims.remove(key) else {
            return;
        };
        for device in &held.devices {
            if let Some(claims) = self.holders.get_mut(device) {
                let before = claims.len();
                claims.retain(|k| k != key);
                if before == 2 && claims.len() == 1 {
                    self.doubled -= 1;
                }
                if claims.is_empty() {
                    self.holders.remove(device);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, rv: u64, devices: &[&str]) -> ResourceClaim {
        let results: Vec<_> = devices
            .iter()
            .map(|d| serde_json::json!({"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": d}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                "resourceVersion": rv.to_string()},
            "spec": {},
            "status": if devices.is_empty() { serde_json::json!({}) } else { serde_json::json!({
                "allocation": {"devices": {"results": results}},
                "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"), "uid": "u"}]}) },
        }))
        .unwrap()
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("default", name)
    }

    fn written(c: &ResourceClaim) -> Vec<Written> {
        vec![Written::of(c)]
    }

    const SOON: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn our_write_that_came_second_is_refused_naming_the_first_claim() {
        let owners = DeviceOwners::default();
        let theirs = claim("theirs", 10, &["gpu-0"]);
        let ours = claim("ours", 12, &["gpu-0", "gpu-1"]);
        assert!(owners.observe(&Event::Apply(theirs)).is_empty());
        let doubled = owners.observe(&Event::Apply(ours.clone()));
        assert_eq!(doubled.len(), 1);
        assert_eq!(doubled[0].first.claim, key("theirs"));
        assert_eq!(doubled[0].second.claim, key("ours"));
        let refused = owners
            .first_writer(&written(&ours), SOON)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with("device gpu.example.com/n1/gpu-0 of ResourceClaim default/ours was allocated first to ResourceClaim default/theirs"),
            "{refused}"
        );
        assert_eq!(owners.doubled_devices(), 1);
    }

    #[tokio::test]
    async fn our_write_that_came_first_stands_and_theirs_is_reported_as_second() {
        let owners = DeviceOwners::default();
        let ours = claim("ours", 12, &["gpu-0"]);
        owners.observe(&Event::Apply(ours.clone()));
        let doubled = owners.observe(&Event::Apply(claim("theirs", 13, &["gpu-0"])));
        assert_eq!(
            (
                doubled[0].first.claim.clone(),
                doubled[0].second.claim.clone()
            ),
            (key("ours"), key("theirs"))
        );
        assert_eq!(doubled[0].first.pods, ["pod-ours"]);
        owners.first_writer(&written(&ours), SOON).await.unwrap();
        owners.observe(&Event::Delete(claim("theirs", 14, &["gpu-0"])));
        assert_eq!(owners.doubled_devices(), 0, "the later claim went away");
    }

    #[tokio::test]
    async fn the_check_waits_until_the_informer_has_shown_our_write() {
        let owners = std::sync::Arc::new(DeviceOwners::default());
        let ours = claim("ours", 20, &["gpu-0"]);
        let check = tokio::spawn({
            let (owners, ours) = (owners.clone(), ours.clone());
            async move { owners.first_writer(&written(&ours), SOON).await }
        });
        tokio::task::yield_now().await;
        // The other scheduler's earlier write arrives first, then ours.
        owners.observe(&Event::Apply(claim("theirs", 19, &["gpu-0"])));
        owners.observe(&Event::Apply(ours));
        assert!(
            check.await.unwrap().is_err(),
            "it saw theirs before deciding"
        );
        let late = claim("late", 30, &["gpu-5"]);
        let out_of_time = owners
            .first_writer(&written(&late), Duration::from_millis(50))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            out_of_time.contains("had not shown ResourceClaim default/late at resourceVersion 30"),
            "{out_of_time}"
        );
    }

    #[tokio::test]
    async fn shared_devices_and_updates_of_the_same_allocation_are_not_doubled() {
        let owners = DeviceOwners::default();
        let mut admin = claim("admin", 5, &["gpu-0"]);
        admin
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap()[0]
            .admin_access = Some(true);
        owners.observe(&Event::Apply(admin));
        owners.observe(&Event::Apply(claim("a", 6, &["gpu-0"])));
        let again = owners.observe(&Event::Apply(claim("a", 9, &["gpu-0"])));
        assert!(
            again.is_empty(),
            "a reservedFor update keeps the first write's version"
        );
        owners
            .first_writer(&written(&claim("a", 6, &["gpu-0"])), SOON)
            .await
            .unwrap();
        assert_eq!(owners.doubled_devices(), 0);
        owners.observe(&Event::Apply(claim("a", 10, &[])));
        assert!(owners.lock().holders.is_empty(), "deallocated");
    }

    #[tokio::test]
    async fn a_relist_drops_what_was_deleted_and_counts_only_once_it_is_complete() {
        let owners = DeviceOwners::default();
        owners.observe(&Event::Apply(claim("gone", 3, &["gpu-0"])));
        owners.observe(&Event::Init);
        owners.observe(&Event::InitApply(claim("kept", 40, &["gpu-1"])));
        assert_eq!(
            *owners.seen.borrow(),
            3,
            "not caught up in the middle of a list"
        );
        owners.observe(&Event::InitDone);
        assert_eq!(*owners.seen.borrow(), 40);
        let holders: Vec<_> = owners
            .lock()
            .holders
            .keys()
            .map(|d| d.device.clone())
            .collect();
        assert_eq!(holders, ["gpu-1"]);
    }
}
