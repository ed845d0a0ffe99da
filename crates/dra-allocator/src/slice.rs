//! A ResourceSlice as the allocator and the scheduler keep it in memory.
//!
//! The API type holds each device's attributes and capacity in `BTreeMap`s. A map's first
//! node has room for eleven entries whatever it holds, and an attribute value (with the
//! list-typed fields of 1.37) is about 170 bytes, so a GPU with a dozen attributes and two
//! capacities costs some 8 KiB in maps: 40 MiB for 5,000 devices, the largest part of the
//! scheduler's memory. A [`Slice`] moves the maps out of the devices, when the slice is
//! received, into sorted boxed slices ([`DeviceMaps`]) about a third of that size.
//!
//! A [`Slice`] dereferences to the API object for everything else (names, pool, node,
//! counters, taints); its devices' `attributes` and `capacity` are `None` there and must be
//! read from [`Slice::maps`]. [`Slice::to_resource_slice`] gives the API object back whole.
//!
//! A [`Slice`] also holds its [`SliceFacts`], worked out when the slice is received, so that
//! a snapshot built from it copies them instead of working them out again for every device.

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity, ResourceSlice};

use crate::facts::SliceFacts;
use crate::intern::Numbering;

/// One device's attributes and capacity, each sorted by name (the API maps' order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceMaps {
    pub attributes: Box<[(String, DeviceAttribute)]>,
    pub capacity: Box<[(String, DeviceCapacity)]>,
}

impl DeviceMaps {
    /// Move the maps out of `device`, leaving `None` in their place.
    pub(crate) fn take(device: &mut Device) -> DeviceMaps {
        DeviceMaps {
            attributes: dra_cel::sorted(device.attributes.take()),
            capacity: dra_cel::sorted(device.capacity.take()),
        }
    }

    fn put_back(&self, device: &mut Device) {
        device.attributes = non_empty(&self.attributes);
        device.capacity = non_empty(&self.capacity);
    }

    /// The attribute `name` (as the API map keys it).
    pub fn attribute(&self, name: &str) -> Option<&DeviceAttribute> {
        get(&self.attributes, name)
    }

    /// The capacity `name` (as the API map keys it).
    pub fn capacity(&self, name: &str) -> Option<&DeviceCapacity> {
        get(&self.capacity, name)
    }

    /// What CEL sees of `device` (of a slice of `driver`) with these maps.
    pub fn device_ref<'a>(&'a self, driver: &'a str, device: &Device) -> dra_cel::DeviceRef<'a> {
        dra_cel::DeviceRef {
            driver,
            attributes: &self.attributes,
            capacity: &self.capacity,
            allow_multiple_allocations: device.allow_multiple_allocations.unwrap_or(false),
        }
    }
}

fn get<'a, T>(entries: &'a [(String, T)], name: &str) -> Option<&'a T> {
    entries
        .binary_search_by(|(k, _)| k.as_str().cmp(name))
        .ok()
        .map(|i| &entries[i].1)
}

/// A ResourceSlice with its devices' attribute and capacity maps held compactly beside it,
/// and its facts.
#[derive(Default)]
pub struct Slice {
    object: ResourceSlice,
    /// One per device of `object.spec.devices`, in order.
    maps: Box<[DeviceMaps]>,
    /// In the numbering they were last asked for in (worked out again when that changes).
    facts: Mutex<Option<Arc<SliceFacts>>>,
}

impl From<ResourceSlice> for Slice {
    /// Works out the slice's facts, in the process's current numbering: the work of
    /// receiving a slice, done once, not once per snapshot.
    fn from(mut object: ResourceSlice) -> Slice {
        let maps = object
            .spec
            .devices
            .iter_mut()
            .flatten()
            .map(DeviceMaps::take)
            .collect();
        let slice = Slice {
            object,
            maps,
            facts: Mutex::default(),
        };
        slice.facts(&Numbering::current());
        slice
    }
}

impl Clone for Slice {
    fn clone(&self) -> Slice {
        Slice {
            object: self.object.clone(),
            maps: self.maps.clone(),
            facts: Mutex::new(self.facts.lock().expect("not poisoned").clone()),
        }
    }
}

/// Equal when the objects are: the facts follow from them.
impl PartialEq for Slice {
    fn eq(&self, other: &Slice) -> bool {
        self.object == other.object && self.maps == other.maps
    }
}

impl std::fmt::Debug for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slice")
            .field("object", &self.object)
            .field("maps", &self.maps)
            .finish_non_exhaustive()
    }
}

impl Deref for Slice {
    type Target = ResourceSlice;

    fn deref(&self) -> &ResourceSlice {
        &self.object
    }
}

impl Slice {
    /// The maps of device `index` of `spec.devices`.
    pub fn maps(&self, index: usize) -> &DeviceMaps {
        &self.maps[index]
    }

    /// The slice's facts in `numbering`: those worked out before, or new ones (kept for
    /// next time) if they were of another numbering.
    pub(crate) fn facts(&self, numbering: &Arc<Numbering>) -> Arc<SliceFacts> {
        let mut facts = self.facts.lock().expect("not poisoned");
        if let Some(f) = &*facts
            && Arc::ptr_eq(&f.numbering, numbering)
        {
            return Arc::clone(f);
        }
        let fresh = Arc::new(SliceFacts::new(numbering, self));
        *facts = Some(Arc::clone(&fresh));
        fresh
    }

    /// The devices with their maps, in slice order.
    pub fn devices(&self) -> impl Iterator<Item = (&Device, &DeviceMaps)> {
        self.object.spec.devices.iter().flatten().zip(&self.maps)
    }

    /// Device `index` of `spec.devices` as the API has it, its maps put back.
    pub fn device(&self, index: usize) -> Device {
        let mut device = self.object.spec.devices.as_ref().expect("a device")[index].clone();
        self.maps[index].put_back(&mut device);
        device
    }

    /// The API object, its devices' maps put back.
    pub fn to_resource_slice(&self) -> ResourceSlice {
        let mut object = self.object.clone();
        for (device, maps) in object.spec.devices.iter_mut().flatten().zip(&self.maps) {
            maps.put_back(device);
        }
        object
    }
}

fn non_empty<T: Clone>(entries: &[(String, T)]) -> Option<std::collections::BTreeMap<String, T>> {
    (!entries.is_empty()).then(|| entries.iter().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSliceSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn gpu(name: &str, model: &str) -> Device {
        Device {
            name: name.into(),
            attributes: Some(
                [
                    ("model", model),
                    ("resource.kubernetes.io/pciBusID", "0000:3b:00.0"),
                ]
                .into_iter()
                .map(|(k, v)| {
                    let value = DeviceAttribute {
                        string: Some(v.into()),
                        ..Default::default()
                    };
                    (k.to_string(), value)
                })
                .collect(),
            ),
            capacity: Some(
                [(
                    "memory".to_string(),
                    DeviceCapacity {
                        value: Quantity("80Gi".into()),
                        ..Default::default()
                    },
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    fn slice(devices: Vec<Device>) -> ResourceSlice {
        ResourceSlice {
            spec: ResourceSliceSpec {
                driver: "gpu.example.com".into(),
                pool: ResourcePool {
                    name: "node-1".into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(devices),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn maps_move_out_of_the_devices_and_back() {
        let api = slice(vec![
            gpu("gpu-0", "A100"),
            Device::default(),
            gpu("gpu-1", "H100"),
        ]);
        let kept = Slice::from(api.clone());
        assert!(
            kept.spec
                .devices
                .iter()
                .flatten()
                .all(|d| d.attributes.is_none())
        );
        assert_eq!(
            kept.maps(0).attribute("model").unwrap().string.as_deref(),
            Some("A100")
        );
        assert_eq!(
            kept.maps(2).attribute("model").unwrap().string.as_deref(),
            Some("H100")
        );
        assert_eq!(kept.maps(2).capacity("memory").unwrap().value.0, "80Gi");
        assert!(kept.maps(1).attribute("model").is_none());
        assert_eq!(
            kept.maps(0)
                .attribute("resource.kubernetes.io/pciBusID")
                .unwrap()
                .string
                .as_deref(),
            Some("0000:3b:00.0")
        );
        let names: Vec<&str> = kept.devices().map(|(d, _)| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-0", "", "gpu-1"]);
        assert_eq!(kept.to_resource_slice(), api);
        assert_eq!(kept.device(2), api.spec.devices.as_ref().unwrap()[2]);
    }

    #[test]
    fn a_slice_asked_for_another_numbering_is_renumbered_and_keeps_those_numbers() {
        let kept = Slice::from(slice(vec![
            gpu("gpu-0", "A100"),
            gpu("gpu-1", "A100"),
            gpu("gpu-2", "H100"),
        ]));
        let received = kept.facts(&Numbering::current());
        let other = Numbering::new(crate::intern::LIMIT);
        let renumbered = kept.facts(&other);
        assert!(Arc::ptr_eq(&renumbered.numbering, &other));
        assert!(!Arc::ptr_eq(&renumbered, &received));
        assert!(
            Arc::ptr_eq(&kept.facts(&other), &renumbered),
            "numbered once per numbering"
        );
        let views: Vec<u32> = renumbered.devices.iter().map(|d| d.view.id).collect();
        assert_eq!(views, [0, 0, 1], "gpu-0 and gpu-1 differ in name only");
    }
}
