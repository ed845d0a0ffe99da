//! Container Device Interface specs: one JSON file per prepared claim, telling the container
//! runtime which device nodes and environment a container gets. Own serde structs (CDI spec
//! 0.6); see the architecture notes for why not the `container-device-interface` crate.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const CDI_VERSION: &str = "0.6.0";

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    /// `vendor/class`, e.g. `k8s.gpu.nvidia.com/claim`.
    pub kind: String,
    pub devices: Vec<CdiDevice>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
}

/// The CDI kind for a driver's claims: `k8s.<driver>/claim`.
pub fn claim_kind(driver: &str) -> String {
    format!("k8s.{driver}/claim")
}

/// The CDI device name of one device of a claim: `<claimUID>-<device>`.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI device id a runtime resolves: `<kind>=<name>`.
pub fn device_id(kind: &str, claim_uid: &str, device: &str) -> String {
    format!("{kind}={}", device_name(claim_uid, device))
}

/// The file name of a claim's spec: `<kind with / as _>_<claimUID>.json`, so all of this
/// driver's specs share a prefix that cleanup can recognise.
pub fn spec_file_name(kind: &str, claim_uid: &str) -> String {
    format!("{}_{claim_uid}.json", kind.replace('/', "_"))
}

pub fn spec_path(dir: &Path, kind: &str, claim_uid: &str) -> PathBuf {
    dir.join(spec_file_name(kind, claim_uid))
}

/// Writes a spec atomically (temp file, fsync, rename), so a runtime never reads half a file.
pub fn write_spec(dir: &Path, claim_uid: &str, spec: &Spec) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = spec_path(dir, &spec.kind, claim_uid);
    let tmp = path.with_extension("json.tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(spec).expect("spec serialises"))?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Removes a claim's spec; a missing file is fine.
pub fn remove_spec(dir: &Path, kind: &str, claim_uid: &str) -> std::io::Result<()> {
    match std::fs::remove_file(spec_path(dir, kind, claim_uid)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Claim UIDs of all of this kind's spec files in `dir`.
pub fn list_spec_claims(dir: &Path, kind: &str) -> std::io::Result<Vec<String>> {
    let prefix = format!("{}_", kind.replace('/', "_"));
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(uid) = name
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".json"))
        {
            out.push(uid.to_string());
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_kubelet_convention() {
        let kind = claim_kind("gpu.nvidia.com");
        assert_eq!(kind, "k8s.gpu.nvidia.com/claim");
        assert_eq!(
            device_id(&kind, "u1", "gpu-0"),
            "k8s.gpu.nvidia.com/claim=u1-gpu-0"
        );
        assert_eq!(
            spec_file_name(&kind, "u1"),
            "k8s.gpu.nvidia.com_claim_u1.json"
        );
    }

    #[test]
    fn write_list_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let kind = claim_kind("gpu.nvidia.com");
        let spec = Spec {
            cdi_version: CDI_VERSION.into(),
            kind: kind.clone(),
            devices: vec![CdiDevice {
                name: "u1-gpu-0".into(),
                container_edits: ContainerEdits {
                    env: vec![],
                    device_nodes: vec![DeviceNode {
                        path: "/dev/nvidia0".into(),
                    }],
                },
            }],
            container_edits: ContainerEdits::default(),
        };
        let path = write_spec(dir.path(), "u1", &spec).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["cdiVersion"], "0.6.0");
        assert_eq!(
            v["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/nvidia0"
        );
        assert!(v.get("containerEdits").is_none());
        std::fs::write(dir.path().join("other-vendor_x.json"), "{}").unwrap();
        assert_eq!(list_spec_claims(dir.path(), &kind).unwrap(), vec!["u1"]);
        remove_spec(dir.path(), &kind, "u1").unwrap();
        remove_spec(dir.path(), &kind, "u1").unwrap();
        assert!(list_spec_claims(dir.path(), &kind).unwrap().is_empty());
    }
}
