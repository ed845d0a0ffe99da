//! The opaque device configuration a claim (or its class) passes to this driver:
//! `resource.nvidia.com/v1beta1` `GpuConfig`, decoded strictly: an unknown field, a wrong
//! kind, an unknown strategy or a value outside its type (a memory limit that is not a
//! Kubernetes quantity, a percentage outside 1..=100, a device key outside a small ASCII
//! alphabet) is an error for that claim only, which names the field and the cause. Values
//! are kept typed, so nothing the claim wrote reaches a process or a path as raw text.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";
pub const GPU_CONFIG_KIND: &str = "GpuConfig";

/// `GpuConfig` as NVIDIA's driver defines it (the sharing part).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// How the GPUs of a request are shared between containers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sharing {
    pub strategy: SharingStrategy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingStrategy {
    TimeSlicing,
    #[serde(rename = "MPS")]
    Mps,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicingConfig {
    #[serde(default)]
    pub interval: TimeSliceInterval,
}

/// The time-slice lengths NVML offers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    #[default]
    Default,
    Short,
    Medium,
    Long,
}

impl TimeSliceInterval {
    /// The value `nvidia-smi compute-policy --set-timeslice` takes.
    pub fn nvml_value(self) -> u32 {
        match self {
            TimeSliceInterval::Default => 0,
            TimeSliceInterval::Short => 1,
            TimeSliceInterval::Medium => 2,
            TimeSliceInterval::Long => 3,
        }
    }
}

/// The MPS defaults of a claim's control daemon, validated when decoded: every value has
/// its type here, and what reaches `nvidia-cuda-mps-control` is formatted from these types
/// (see [`crate::mps`]), never copied from the claim.
///
/// It is written back (to the checkpoint) in the form it was read, so a checkpoint's
/// checksum survives loading and storing again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawMpsConfig", into = "RawMpsConfig")]
pub struct MpsConfig {
    pub default_active_thread_percentage: Option<Percentage>,
    pub default_pinned_device_memory_limit: Option<MemoryLimit>,
    /// Per-device overrides of the default, by device index, GPU UUID or device name; which
    /// GPU each key means is resolved against the claim's allocation when it is planned.
    pub default_per_device_pinned_memory_limit: Option<BTreeMap<DeviceSelector, MemoryLimit>>,
}

/// `mpsConfig` as it is written, before its values are checked.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawMpsConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default_active_thread_percentage: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default_pinned_device_memory_limit: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default_per_device_pinned_memory_limit: Option<BTreeMap<String, serde_json::Value>>,
}

const PERCENTAGE_FIELD: &str = "mpsConfig.defaultActiveThreadPercentage";
const LIMIT_FIELD: &str = "mpsConfig.defaultPinnedDeviceMemoryLimit";
const PER_DEVICE_FIELD: &str = "mpsConfig.defaultPerDevicePinnedMemoryLimit";

/// A JSON value for an error message: strings quoted with control characters escaped.
fn shown(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn memory_limit(field: &str, v: &serde_json::Value) -> Result<MemoryLimit, String> {
    let serde_json::Value::String(text) = v else {
        return Err(format!(
            "{field} {}: not a quantity string such as \"4Gi\"",
            shown(v)
        ));
    };
    MemoryLimit::parse(text).map_err(|cause| format!("{field} {text:?}: {cause}"))
}

impl TryFrom<RawMpsConfig> for MpsConfig {
    type Error = String;

    fn try_from(raw: RawMpsConfig) -> Result<MpsConfig, String> {
        let default_active_thread_percentage = raw
            .default_active_thread_percentage
            .as_ref()
            .map(|v| {
                v.as_u64().and_then(Percentage::new).ok_or_else(|| {
                    format!("{PERCENTAGE_FIELD} {}: not an integer in 1..=100", shown(v))
                })
            })
            .transpose()?;
        let default_pinned_device_memory_limit = raw
            .default_pinned_device_memory_limit
            .as_ref()
            .map(|v| memory_limit(LIMIT_FIELD, v))
            .transpose()?;
        let default_per_device_pinned_memory_limit = raw
            .default_per_device_pinned_memory_limit
            .map(|map| {
                map.iter()
                    .map(|(key, v)| {
                        let device = DeviceSelector::parse(key)
                            .map_err(|cause| format!("{PER_DEVICE_FIELD} key {key:?}: {cause}"))?;
                        let limit = memory_limit(&format!("{PER_DEVICE_FIELD}[{key}]"), v)?;
                        Ok((device, limit))
                    })
                    .collect::<Result<BTreeMap<_, _>, String>>()
            })
            .transpose()?;
        Ok(MpsConfig {
            default_active_thread_percentage,
            default_pinned_device_memory_limit,
            default_per_device_pinned_memory_limit,
        })
    }
}

impl From<MpsConfig> for RawMpsConfig {
    fn from(c: MpsConfig) -> RawMpsConfig {
        RawMpsConfig {
            default_active_thread_percentage: c
                .default_active_thread_percentage
                .map(|p| p.get().into()),
            default_pinned_device_memory_limit: c
                .default_pinned_device_memory_limit
                .map(|l| l.text.into()),
            default_per_device_pinned_memory_limit: c.default_per_device_pinned_memory_limit.map(
                |map| {
                    map.into_iter()
                        .map(|(device, limit)| (device.to_string(), limit.text.into()))
                        .collect()
                },
            ),
        }
    }
}

/// The share of a GPU's threads an MPS client gets by default: an integer in 1..=100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Percentage(u8);

impl Percentage {
    pub fn new(value: u64) -> Option<Percentage> {
        (1..=100)
            .contains(&value)
            .then_some(Percentage(value as u8))
    }

    pub fn get(self) -> u8 {
        self.0
    }
}

impl fmt::Display for Percentage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

const MIB: u64 = 1 << 20;

/// The largest pinned-memory limit a config may hold (1Pi, far above any GPU); the plan
/// then checks each limit against the memory of the GPU it applies to.
pub const MAX_MEMORY_LIMIT_BYTES: u64 = 1 << 50;

/// A pinned device-memory limit: a Kubernetes quantity of bytes, at least 1Mi (the unit
/// MPS counts in) and at most [`MAX_MEMORY_LIMIT_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The quantity as written; it passed the strict quantity grammar.
    text: String,
    bytes: u64,
}

impl MemoryLimit {
    pub fn parse(text: &str) -> Result<MemoryLimit, String> {
        let bytes = crate::quantity::parse_units(text).map_err(|e| e.to_string())?;
        if bytes < u128::from(MIB) {
            return Err(format!(
                "{bytes} bytes is less than 1Mi, the smallest limit MPS takes"
            ));
        }
        if bytes > u128::from(MAX_MEMORY_LIMIT_BYTES) {
            return Err("more than 1Pi, larger than any GPU's memory".into());
        }
        Ok(MemoryLimit {
            text: text.to_string(),
            bytes: bytes as u64,
        })
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The value `nvidia-cuda-mps-control` takes: whole mebibytes (rounded down, so the limit
    /// is never raised) with its `M` suffix.
    pub fn mps_value(&self) -> String {
        format!("{}M", self.bytes / MIB)
    }
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A key of `defaultPerDevicePinnedMemoryLimit`: which of the claim's GPUs a limit is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceSelector {
    /// The position among the claim's MPS GPUs: the daemon's `CUDA_VISIBLE_DEVICES` order.
    Index(usize),
    /// A GPU UUID as NVML writes it: `GPU-` and letters, digits and dashes.
    Uuid(String),
    /// The name of one of the claim's allocated devices (`gpu-3`, `gpu-1-mig-3g20gb-9-4`).
    Name(String),
}

impl DeviceSelector {
    pub fn parse(key: &str) -> Result<DeviceSelector, String> {
        if !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) {
            if key.len() > 1 && key.starts_with('0') {
                return Err("a device index has no leading zeros".into());
            }
            return key
                .parse()
                .ok()
                .filter(|i| *i < 1024)
                .map(DeviceSelector::Index)
                .ok_or_else(|| "device index out of range".into());
        }
        if let Some(rest) = key.strip_prefix("GPU-") {
            return if !rest.is_empty()
                && key.len() <= 64
                && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            {
                Ok(DeviceSelector::Uuid(key.to_string()))
            } else {
                Err("not a GPU UUID (GPU- and up to 60 letters, digits or dashes)".into())
            };
        }
        if crate::validate::is_dns1123_label(key) {
            return Ok(DeviceSelector::Name(key.to_string()));
        }
        Err("not a device index, a GPU UUID or a device name".into())
    }
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Index(i) => write!(f, "{i}"),
            DeviceSelector::Uuid(s) | DeviceSelector::Name(s) => f.write_str(s),
        }
    }
}

/// Decodes and validates a GpuConfig from a claim's opaque parameters.
pub fn decode_gpu_config(parameters: &serde_json::Value) -> Result<GpuConfig, String> {
    let config: GpuConfig = serde_json::from_value(parameters.clone())
        .map_err(|e| format!("invalid GpuConfig: {e}"))?;
    if config.api_version != API_VERSION {
        return Err(format!(
            "invalid GpuConfig: apiVersion {:?} is not {API_VERSION:?}",
            config.api_version
        ));
    }
    if config.kind != GPU_CONFIG_KIND {
        return Err(format!(
            "invalid GpuConfig: kind {:?} is not {GPU_CONFIG_KIND:?}",
            config.kind
        ));
    }
    if let Some(s) = &config.sharing {
        match s.strategy {
            SharingStrategy::TimeSlicing if s.mps_config.is_some() => {
                return Err("invalid GpuConfig: mpsConfig given with strategy TimeSlicing".into());
            }
            SharingStrategy::Mps if s.time_slicing_config.is_some() => {
                return Err("invalid GpuConfig: timeSlicingConfig given with strategy MPS".into());
            }
            _ => {}
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn time_slicing_decodes() {
        let c = decode_gpu_config(&json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
        }))
        .unwrap();
        let s = c.sharing.unwrap();
        assert_eq!(s.strategy, SharingStrategy::TimeSlicing);
        assert_eq!(
            s.time_slicing_config.unwrap().interval,
            TimeSliceInterval::Long
        );
    }

    #[test]
    fn mps_decodes() {
        let c = decode_gpu_config(&json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}
        }))
        .unwrap();
        assert_eq!(c.sharing.unwrap().strategy, SharingStrategy::Mps);
    }

    #[test]
    fn unknown_field_is_an_error_naming_it() {
        let err = decode_gpu_config(&json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long", "burst": 3}}
        }))
        .unwrap_err();
        assert!(err.contains("unknown field `burst`"), "{err}");
    }

    #[test]
    fn unknown_interval_and_strategy_and_kind_are_errors() {
        let base = |sharing: serde_json::Value| json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing});
        let e = decode_gpu_config(&base(
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
        ))
        .unwrap_err();
        assert!(e.contains("Forever"), "{e}");
        let e = decode_gpu_config(&base(json!({"strategy": "Exclusive"}))).unwrap_err();
        assert!(e.contains("Exclusive"), "{e}");
        let e = decode_gpu_config(
            &json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}),
        )
        .unwrap_err();
        assert!(e.contains("kind \"MigDeviceConfig\""), "{e}");
        let e = decode_gpu_config(&base(json!({"strategy": "TimeSlicing", "mpsConfig": {}})))
            .unwrap_err();
        assert!(
            e.contains("mpsConfig given with strategy TimeSlicing"),
            "{e}"
        );
    }

    fn mps(config: serde_json::Value) -> Result<MpsConfig, String> {
        decode_gpu_config(&json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": config}
        }))
        .map(|c| c.sharing.unwrap().mps_config.unwrap())
    }

    #[test]
    fn mps_values_are_decoded_into_their_types() {
        let c = mps(json!({
            "defaultActiveThreadPercentage": 100,
            "defaultPinnedDeviceMemoryLimit": "1.5Gi",
            "defaultPerDevicePinnedMemoryLimit": {"0": "512Mi", "GPU-1b2c-t10": "1e9", "gpu-3": "+2G"}
        }))
        .unwrap();
        assert_eq!(c.default_active_thread_percentage.unwrap().get(), 100);
        let limit = c.default_pinned_device_memory_limit.unwrap();
        assert_eq!(limit.bytes(), 1536 << 20);
        assert_eq!(limit.mps_value(), "1536M");
        let per_device: Vec<(DeviceSelector, u64)> = c
            .default_per_device_pinned_memory_limit
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, v.bytes()))
            .collect();
        assert_eq!(
            per_device,
            [
                (DeviceSelector::Index(0), 512 << 20),
                (DeviceSelector::Uuid("GPU-1b2c-t10".into()), 1_000_000_000),
                (DeviceSelector::Name("gpu-3".into()), 2_000_000_000),
            ]
        );
    }

    #[test]
    fn control_characters_in_mps_strings_are_refused_and_shown_escaped() {
        for (config, want) in [
            (
                json!({"defaultPinnedDeviceMemoryLimit": "4Gi\nquit"}),
                "mpsConfig.defaultPinnedDeviceMemoryLimit \"4Gi\\nquit\": not a Kubernetes quantity: unexpected character '\\n'",
            ),
            (
                json!({"defaultPinnedDeviceMemoryLimit": "4Gi\r"}),
                "mpsConfig.defaultPinnedDeviceMemoryLimit \"4Gi\\r\": not a Kubernetes quantity: unexpected character '\\r'",
            ),
            (
                json!({"defaultPerDevicePinnedMemoryLimit": {"0\nquit": "4Gi"}}),
                "mpsConfig.defaultPerDevicePinnedMemoryLimit key \"0\\nquit\": not a device index, a GPU UUID or a device name",
            ),
            (
                json!({"defaultPerDevicePinnedMemoryLimit": {"GPU-1234\u{0}": "4Gi"}}),
                "mpsConfig.defaultPerDevicePinnedMemoryLimit key \"GPU-1234\\0\": not a GPU UUID (GPU- and up to 60 letters, digits or dashes)",
            ),
            (
                json!({"defaultPerDevicePinnedMemoryLimit": {"0": "4Gi\nset_default_active_thread_percentage 100"}}),
                "mpsConfig.defaultPerDevicePinnedMemoryLimit[0] \"4Gi\\nset_default_active_thread_percentage 100\": not a Kubernetes quantity: unexpected character '\\n'",
            ),
        ] {
            let err = mps(config).unwrap_err();
            assert_eq!(err, format!("invalid GpuConfig: {want}"));
            assert!(!err.contains(['\n', '\r', '\0']), "{err:?}");
        }
    }

    #[test]
    fn device_keys_with_path_characters_are_refused() {
        for key in [
            "../0", "gpu-0/..", "..", "", "GPU-", "GPU-a/b", "Gpu-0", "01", "1024", " 0",
        ] {
            let err = mps(json!({"defaultPerDevicePinnedMemoryLimit": {key: "1Gi"}})).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "invalid GpuConfig: mpsConfig.defaultPerDevicePinnedMemoryLimit key {key:?}: "
                )),
                "{key:?}: {err}"
            );
        }
    }

    #[test]
    fn memory_limits_must_be_quantities_within_what_a_gpu_can_have() {
        let field = "invalid GpuConfig: mpsConfig.defaultPinnedDeviceMemoryLimit";
        for (value, cause) in [
            (json!("-1Gi"), "\"-1Gi\": negative"),
            (
                json!("lots"),
                "\"lots\": not a Kubernetes quantity: no digits",
            ),
            (
                json!("4GB"),
                "\"4GB\": not a Kubernetes quantity: unknown suffix \"GB\"",
            ),
            (json!(""), "\"\": not a Kubernetes quantity: empty"),
            (
                json!("0"),
                "\"0\": 0 bytes is less than 1Mi, the smallest limit MPS takes",
            ),
            (
                json!("0.5Mi"),
                "\"0.5Mi\": 524288 bytes is less than 1Mi, the smallest limit MPS takes",
            ),
            (
                json!("2Pi"),
                "\"2Pi\": more than 1Pi, larger than any GPU's memory",
            ),
            (json!("1e40"), "\"1e40\": out of range"),
            (
                json!(4294967296u64),
                "4294967296: not a quantity string such as \"4Gi\"",
            ),
            (
                json!(["4Gi"]),
                "[\"4Gi\"]: not a quantity string such as \"4Gi\"",
            ),
        ] {
            assert_eq!(
                mps(json!({"defaultPinnedDeviceMemoryLimit": value})).unwrap_err(),
                format!("{field} {cause}")
            );
        }
        let err = mps(json!({"defaultPerDevicePinnedMemoryLimit": {"1": "-4Gi"}})).unwrap_err();
        assert_eq!(
            err,
            "invalid GpuConfig: mpsConfig.defaultPerDevicePinnedMemoryLimit[1] \"-4Gi\": negative"
        );
    }

    #[test]
    fn thread_percentages_are_integers_from_1_to_100() {
        for (value, shown) in [
            (json!(0), "0"),
            (json!(101), "101"),
            (json!(-5), "-5"),
            (json!(50.5), "50.5"),
            (json!("50%x"), "\"50%x\""),
            (json!("50"), "\"50\""),
            (json!(u64::MAX), "18446744073709551615"),
        ] {
            assert_eq!(
                mps(json!({"defaultActiveThreadPercentage": value})).unwrap_err(),
                format!(
                    "invalid GpuConfig: mpsConfig.defaultActiveThreadPercentage {shown}: not an integer in 1..=100"
                )
            );
        }
        for ok in [1, 100] {
            let c = mps(json!({"defaultActiveThreadPercentage": ok})).unwrap();
            assert_eq!(
                u64::from(c.default_active_thread_percentage.unwrap().get()),
                ok
            );
        }
    }

    #[test]
    fn unknown_mps_fields_are_refused() {
        let err = mps(json!({"defaultPinnedMemoryLimit": "1Gi"})).unwrap_err();
        assert!(
            err.contains("unknown field `defaultPinnedMemoryLimit`"),
            "{err}"
        );
    }

    #[test]
    fn an_mps_config_is_written_back_as_it_was_read() {
        // The checkpoint stores configs and checks a checksum of what it re-serialises: the
        // form written by earlier versions (raw strings) must come back byte for byte.
        let text = r#"{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":25,"defaultPinnedDeviceMemoryLimit":"10G","defaultPerDevicePinnedMemoryLimit":{"0":"4Gi","GPU-abc":"1.5Gi","gpu-1":"2048Mi"}}}"#;
        let sharing: Sharing = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&sharing).unwrap(), text);
        let empty = r#"{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{}}}"#;
        let sharing: Sharing = serde_json::from_str(empty).unwrap();
        assert_eq!(serde_json::to_string(&sharing).unwrap(), empty);
    }
}
