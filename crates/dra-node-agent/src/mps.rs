//! MPS control daemons: a claim that asks for `sharing.strategy: MPS` gets its own
//! `nvidia-cuda-mps-control` daemon, limited to the claim's GPUs, with its pipe and log
//! directories under `<mps dir>/<claim UID>` (the CDI spec points the containers there).
//! Unprepare tells the daemon to quit and removes the directories.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::config::MpsConfig;

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

    /// Start the claim's daemon on `gpu_uuids` and apply the claim's MPS defaults.
    pub fn start(
        &self,
        dir: &Path,
        gpu_uuids: &[String],
        config: Option<&MpsConfig>,
    ) -> Result<(), String> {
        for sub in ["pipe", "log"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("creating {}: {e}", dir.join(sub).display()))?;
        }
        let mut daemon = self.command(dir);
        daemon
            .arg("-d")
            .env("CUDA_VISIBLE_DEVICES", gpu_uuids.join(","));
        self.run(daemon, None)
            .map_err(|e| format!("starting the MPS control daemon: {e}"))?;
        let commands = commands(gpu_uuids.len(), config);
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

/// The control commands for a claim's MPS defaults, one per line.
fn commands(devices: usize, config: Option<&MpsConfig>) -> String {
    let mut out = String::new();
    let Some(config) = config else {
        return out;
    };
    if let Some(p) = config.default_active_thread_percentage {
        out.push_str(&format!("set_default_active_thread_percentage {p}\n"));
    }
    if let Some(limit) = &config.default_pinned_device_memory_limit {
        for device in 0..devices {
            out.push_str(&format!(
                "set_default_device_pinned_mem_limit {device} {limit}\n"
            ));
        }
    }
    for (device, limit) in config
        .default_per_device_pinned_memory_limit
        .iter()
        .flatten()
    {
        out.push_str(&format!(
            "set_default_device_pinned_mem_limit {device} {limit}\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_become_control_commands() {
        let config = MpsConfig {
            default_active_thread_percentage: Some(50),
            default_pinned_device_memory_limit: Some("10G".into()),
            default_per_device_pinned_memory_limit: Some([("1".into(), "4G".into())].into()),
        };
        assert_eq!(
            commands(2, Some(&config)),
            "set_default_active_thread_percentage 50\n\
             set_default_device_pinned_mem_limit 0 10G\n\
             set_default_device_pinned_mem_limit 1 10G\n\
             set_default_device_pinned_mem_limit 1 4G\n"
        );
        assert_eq!(commands(2, None), "");
    }
}
