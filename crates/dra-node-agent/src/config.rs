//! The opaque device configuration a claim (or its class) passes to this driver:
//! `resource.nvidia.com/v1beta1` `GpuConfig`, decoded strictly: an unknown field, a wrong
//! kind or an unknown strategy is an error for that claim only.

use serde::{Deserialize, Serialize};

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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_per_device_pinned_memory_limit: Option<std::collections::BTreeMap<String, String>>,
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
        if let Some(p) = s
            .mps_config
            .as_ref()
            .and_then(|m| m.default_active_thread_percentage)
            && !(1..=100).contains(&p)
        {
            return Err(format!(
                "invalid GpuConfig: defaultActiveThreadPercentage {p} is not in 1..=100"
            ));
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
}
