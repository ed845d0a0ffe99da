//! The checkpoint of prepared claims, so prepare and unprepare stay correct across agent
//! restarts. Written atomically (temp file, fsync, rename, fsync of the directory), with a
//! SHA-256 checksum of its content and the node's boot id: after a reboot everything the
//! agent had prepared is gone (CDI specs live on tmpfs, sharing settings reset), so the
//! checkpoint from the previous boot is discarded.

use crate::cdi;
use crate::claim::{GpuSharing, PreparedDevice};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

pub const CHECKPOINT_VERSION: u32 = 1;

/// Where a claim is in preparation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// Recorded before any side effect: after a crash, prepare redoes the work and
    /// unprepare cleans up whatever was done.
    PrepareStarted,
    /// Everything done; prepare returns the recorded answer.
    Prepared,
}

/// One claim's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEntry {
    pub namespace: String,
    pub name: String,
    pub state: ClaimState,
    pub devices: Vec<PreparedDevice>,
    /// GPUs whose sharing settings this claim changed.
    pub sharing: Vec<GpuSharing>,
    /// The CDI spec, so a lost spec file can be rewritten without the API server.
    pub spec: Option<cdi::Spec>,
    /// MIG partitions created for this claim, destroyed when it is unprepared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<crate::device::MigInstance>,
}

/// What the checkpoint holds, by claim UID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointData {
    pub claims: BTreeMap<String, ClaimEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OnDisk {
    version: u32,
    boot_id: String,
    checksum: String,
    data: CheckpointData,
}

/// What loading found.
#[derive(Debug, PartialEq)]
pub enum Loaded {
    /// No checkpoint yet.
    Missing,
    /// A valid checkpoint from this boot.
    Valid(CheckpointData),
    /// A valid checkpoint from an earlier boot: its claims are no longer prepared.
    PreviousBoot(CheckpointData),
    /// Unreadable, unparsable or failing its checksum; `reason` says which.
    Corrupt { reason: String },
}

fn checksum(data: &CheckpointData) -> String {
    let bytes = serde_json::to_vec(data).expect("checkpoint serialises");
    let digest = Sha256::digest(&bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the node's boot id (changes on every reboot).
pub fn read_boot_id() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string())
}

/// Loads and verifies the checkpoint at `path`.
pub fn load(path: &Path, boot_id: &str) -> Loaded {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::Missing,
        Err(e) => {
            return Loaded::Corrupt {
                reason: format!("cannot read: {e}"),
            };
        }
    };
    let disk: OnDisk = match serde_json::from_slice(&bytes) {
        Ok(d) => d,
        Err(e) => {
            return Loaded::Corrupt {
                reason: format!("not a checkpoint: {e}"),
            };
        }
    };
    if disk.version != CHECKPOINT_VERSION {
        return Loaded::Corrupt {
            reason: format!("unknown version {}", disk.version),
        };
    }
    let actual = checksum(&disk.data);
    if actual != disk.checksum {
        return Loaded::Corrupt {
            reason: format!(
                "checksum mismatch: file says {}, content hashes to {actual}",
                disk.checksum
            ),
        };
    }
    if disk.boot_id != boot_id {
        return Loaded::PreviousBoot(disk.data);
    }
    Loaded::Valid(disk.data)
}

/// Writes the checkpoint atomically and durably.
pub fn store(path: &Path, boot_id: &str, data: &CheckpointData) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let disk = OnDisk {
        version: CHECKPOINT_VERSION,
        boot_id: boot_id.to_string(),
        checksum: checksum(data),
        data: data.clone(),
    };
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(&disk).expect("checkpoint serialises"))?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> CheckpointData {
        let mut d = CheckpointData::default();
        d.claims.insert(
            "u1".into(),
            ClaimEntry {
                namespace: "ns".into(),
                name: "c".into(),
                state: ClaimState::Prepared,
                devices: vec![PreparedDevice {
                    request_names: vec!["gpu".into()],
                    pool_name: "n".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec!["k=u1-gpu-0".into()],
                    share_id: None,
                    admin_access: false,
                    consumed_capacity: Default::default(),
                }],
                mig: vec![],
                sharing: vec![],
                spec: None,
            },
        );
        d
    }

    #[test]
    fn round_trip_same_boot() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        assert_eq!(load(&p, "b1"), Loaded::Missing);
        store(&p, "b1", &data()).unwrap();
        assert_eq!(load(&p, "b1"), Loaded::Valid(data()));
        assert!(!dir.path().join("checkpoint.tmp").exists());
    }

    /// `data()` as the agent stored it before prepared devices recorded admin access and
    /// consumed capacity (commit eea6c9a).
    const BEFORE_OWNERS: &str = r#"{
  "version": 1,
  "bootId": "b1",
  "checksum": "7cc57063b820bca61629b9014a4af1553603095356fd9dea2317b484cb17ca2b",
  "data": {
    "claims": {
      "u1": {
        "namespace": "ns",
        "name": "c",
        "state": "Prepared",
        "devices": [
          {
            "requestNames": [
              "gpu"
            ],
            "poolName": "n",
            "deviceName": "gpu-0",
            "cdiDeviceIds": [
              "k=u1-gpu-0"
            ]
          }
        ],
        "sharing": [],
        "spec": null
      }
    }
  }
}"#;

    #[test]
    fn a_checkpoint_written_before_admin_access_was_recorded_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        std::fs::write(&p, BEFORE_OWNERS).unwrap();
        // Its checksum still matches: a default is not written, so the content hashes as
        // it did.
        assert_eq!(load(&p, "b1"), Loaded::Valid(data()));
    }

    #[test]
    fn admin_access_and_consumed_capacity_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        let mut d = data();
        let device = &mut d.claims.get_mut("u1").unwrap().devices[0];
        device.admin_access = true;
        device.share_id = Some("s1".into());
        device.consumed_capacity = [("memory".to_string(), "10Gi".to_string())].into();
        store(&p, "b1", &d).unwrap();
        assert_eq!(load(&p, "b1"), Loaded::Valid(d));
    }

    #[test]
    fn other_boot_is_reported_with_its_claims() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        store(&p, "b1", &data()).unwrap();
        assert_eq!(load(&p, "b2"), Loaded::PreviousBoot(data()));
    }

    #[test]
    fn tampered_content_fails_the_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        store(&p, "b1", &data()).unwrap();
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("gpu-0", "gpu-1");
        std::fs::write(&p, text).unwrap();
        match load(&p, "b1") {
            Loaded::Corrupt { reason } => {
                assert!(reason.starts_with("checksum mismatch"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn truncated_file_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        store(&p, "b1", &data()).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
        match load(&p, "b1") {
            Loaded::Corrupt { reason } => {
                assert!(reason.starts_with("not a checkpoint"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn boot_id_is_readable_here() {
        assert_eq!(read_boot_id().unwrap().len(), 36);
    }
}
