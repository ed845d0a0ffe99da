//! MPS control daemons: a claim that asks for `sharing.strategy: MPS` gets its own
//! `nvidia-cuda-mps-control` daemon, limited to the claim's GPUs, with its pipe and log
//! directories under `<mps dir>/<claim UID>` (the CDI spec points the containers there).
//! Unprepare tells the daemon to quit and removes the directories.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use std::collections::BTreeMap;

use crate::config::{MemoryLimit, Percentage};

/// What a claim's daemon is started with: its GPUs and its MPS defaults, resolved and
/// checked against the claim's allocation by [`crate::claim::plan_claim`]. Only typed
/// values: the control commands are formatted from them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MpsSettings {
    /// The GPUs the daemon may use (from discovery), in `CUDA_VISIBLE_DEVICES` order; the
    /// device indexes below are positions in this list.
    pub gpu_uuids: Vec<String>,
    pub active_thread_percentage: Option<Percentage>,
    /// Applies to every device.
    pub default_pinned_memory_limit: Option<MemoryLimit>,
    /// Overrides of the default, by device index.
    pub pinned_memory_limits: BTreeMap<usize, MemoryLimit>,
}

/// Runs `nvidia-cuda-mps-control` (or a stand-in, in tests).
#[derive(Debug, Clone)]
pub struct MpsControl {
    pub binary: PathBuf,
}

impl MpsControl {
    fn command(&self, dir: &Path) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.env("CUDA_MPS_PIPE_DIRECTORY", dir.join("pipe"))
            .env("CUDA_MPS_LOG_DIRECTORY", dir.join("log"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    fn run(&self, mut cmd: Command, input: Option<&str>) -> Result<(), String> {
        let name = self.binary.display();
        cmd.stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = cmd.spawn().map_err(|e| format!("{name}: {e}"))?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| format!("{name}: writing commands: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("{name}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{name} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Start the claim's daemon on its GPUs and apply its MPS defaults. On failure nothing
    /// is left behind: a daemon that started is told to quit and the directories are removed.
    pub fn start(&self, dir: &Path, settings: &MpsSettings) -> Result<(), String> {
        for sub in ["pipe", "log"] {
            if let Err(e) = std::fs::create_dir_all(dir.join(sub)) {
                let _ = std::fs::remove_dir_all(dir);
                return Err(format!("creating {}: {e}", dir.join(sub).display()));
            }
        }
        let mut daemon = self.command(dir);
        daemon
            .arg("-d")
            .env("CUDA_VISIBLE_DEVICES", settings.gpu_uuids.join(","));
        if let Err(e) = self.run(daemon, None) {
            let _ = std::fs::remove_dir_all(dir);
            return Err(format!("starting the MPS control daemon: {e}"));
        }
        let commands = commands(settings);
        if !commands.is_empty()
            && let Err(e) = self.run(self.command(dir), Some(&commands))
        {
            let _ = self.stop(dir);
            return Err(format!("configuring the MPS control daemon: {e}"));
        }
        Ok(())
    }

    /// Tell the claim's daemon to quit and remove its directories. No daemon: nothing to do.
    pub fn stop(&self, dir: &Path) -> Result<(), String> {
        if !dir.exists() {
            return Ok(());
        }
        self.run(self.command(dir), Some("quit\n"))
            .map_err(|e| format!("stopping the MPS control daemon: {e}"))?;
        std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))
    }
}

/// The control commands for a claim's MPS defaults, one per line: the thread percentage,
/// the default pinned-memory limit on every device, then the per-device overrides.
fn commands(settings: &MpsSettings) -> String {
    let mut out = String::new();
    if let Some(p) = settings.active_thread_percentage {
        out.push_str(&format!("set_default_active_thread_percentage {p}\n"));
    }
    if let Some(limit) = &settings.default_pinned_memory_limit {
        for device in 0..settings.gpu_uuids.len() {
            out.push_str(&format!(
                "set_default_device_pinned_mem_limit {device} {}\n",
                limit.mps_value()
            ));
        }
    }
    for (device, limit) in &settings.pinned_memory_limits {
        out.push_str(&format!(
            "set_default_device_pinned_mem_limit {device} {}\n",
            limit.mps_value()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(text: &str) -> MemoryLimit {
        MemoryLimit::parse(text).unwrap()
    }

    #[test]
    fn defaults_become_control_commands_in_mebibytes() {
        let settings = MpsSettings {
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            active_thread_percentage: Percentage::new(50),
            default_pinned_memory_limit: Some(limit("10Gi")),
            pinned_memory_limits: [(1, limit("4096Mi"))].into(),
        };
        assert_eq!(
            commands(&settings),
            "set_default_active_thread_percentage 50\n\
             set_default_device_pinned_mem_limit 0 10240M\n\
             set_default_device_pinned_mem_limit 1 10240M\n\
             set_default_device_pinned_mem_limit 1 4096M\n"
        );
        assert_eq!(commands(&MpsSettings::default()), "");
    }

    #[test]
    fn a_decimal_quantity_is_rounded_down_to_whole_mebibytes() {
        // 10G = 10^10 bytes = 9536.7 MiB: the limit is never raised.
        let settings = MpsSettings {
            gpu_uuids: vec!["GPU-a".into()],
            default_pinned_memory_limit: Some(limit("10G")),
            ..Default::default()
        };
        assert_eq!(
            commands(&settings),
            "set_default_device_pinned_mem_limit 0 9536M\n"
        );
    }
}
