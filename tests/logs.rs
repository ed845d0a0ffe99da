//! What an operator reads from `dra-scheduler run` before any API server answers: log lines
//! on stderr (JSON: one object a line with one `message`; text: no colour codes when
//! stderr is not a terminal) and a `/metrics` that follows Prometheus' conventions and says
//! which build is running. The live side, with decisions, is in `tests/daemon.rs`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

mod common;
use common::{get, json_log};
use test_cluster::{free_port, promlint};

/// A kubeconfig whose API server never answers (a port nothing listens on).
fn unreachable_kubeconfig(dir: &Path) -> PathBuf {
    kubeconfig_for(dir, free_port())
}

/// A kubeconfig for an API server at `port` on loopback.
fn kubeconfig_for(dir: &Path, port: u16) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}'}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
        ),
    )
    .unwrap();
    path
}

/// A scheduler, its stderr read line by line as it comes.
struct Scheduler {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    metrics: String,
}

impl Scheduler {
    fn start(dir: &Path, log_format: &str) -> Scheduler {
        Scheduler::start_with(&unreachable_kubeconfig(dir), log_format)
    }

    fn start_with(kubeconfig: &Path, log_format: &str) -> Scheduler {
        let port = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
            .args(["run", "--leader-elect=false", "--log-format", log_format])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
            // The default level, whatever the caller's environment says.
            .env("RUST_LOG", "")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dra-scheduler run");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Scheduler {
            child,
            lines,
            seen: Vec::new(),
            metrics: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Wait (at most 30 s) for a line containing `text`, and at least `more` lines after it.
    fn wait_for(&mut self, text: &str, more: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let done = |seen: &[String]| {
            seen.iter()
                .position(|l| l.contains(text))
                .is_some_and(|i| seen.len() > i + more)
        };
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!(
                    "no line with {text:?} and {more} after it in 30 s; the log:\n{}",
                    self.log()
                ),
            }
        }
    }

    /// SIGTERM, then everything it wrote.
    fn stop(self) -> String {
        self.stop_with_status().1
    }

    /// SIGTERM, then how it exited and everything it wrote.
    fn stop_with_status(mut self) -> (std::process::ExitStatus, String) {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            self.seen.extend(self.lines.try_iter());
            assert!(
                Instant::now() < deadline,
                "no exit 30 s after SIGTERM; the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        self.seen.extend(self.lines.try_iter());
        (status, self.log())
    }

    fn log(&self) -> String {
        self.seen.iter().map(|l| format!("{l}\n")).collect()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("logs-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn json_logs_are_one_object_a_line_with_one_message_and_fields_as_keys() {
    let dir = scratch("json");
    let mut scheduler = Scheduler::start(&dir, "json");
    // Then the failures of talking to nobody, from this crate and from the kube client.
    scheduler.wait_for("serving /metrics", 2);
    let metrics = scheduler.metrics.clone();
    let log = scheduler.stop();
    std::fs::remove_dir_all(&dir).unwrap();

    let lines = json_log(&log);
    assert!(lines.len() >= 2, "{log}");
    let serving = lines
        .iter()
        .find(|l| l["message"] == "serving /metrics, /healthz and /readyz")
        .unwrap_or_else(|| panic!("{log}"));
    assert_eq!(
        serving["address"].as_str(),
        metrics.strip_prefix("http://"),
        "a field is a key of its own: {serving:?}"
    );
    assert_eq!(serving["level"], "INFO");
    assert_eq!(serving["target"], "dra_scheduler::run");
}

/// A port on loopback that takes TCP connections and never says a word on them (not even
/// TLS's hello), so that a request to it waits for the client's 30 s connect timeout.
/// Until [`Mute::hold`], it closes each connection at once, so that a request fails fast.
struct Mute {
    port: u16,
    hold: Arc<AtomicBool>,
}

impl Mute {
    fn start(holding: bool) -> Mute {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = Arc::new(AtomicBool::new(holding));
        let holds = hold.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for connection in listener.incoming().map_while(Result::ok) {
                if holds.load(Ordering::SeqCst) {
                    held.push(connection);
                }
            }
        });
        Mute { port, hold }
    }

    fn hold(&self) {
        self.hold.store(true, Ordering::SeqCst);
    }
}

/// SIGTERM, then how the daemon ended: it stops waiting on discovery at once, exits 0
/// and says why, and never got as far as a discovery failure after the one it was shown.
fn sigterm_during_discovery(scheduler: Scheduler, failures_before: usize) {
    let (status, log) = scheduler.stop_with_status();
    assert!(
        log.contains("shut down before API discovery succeeded"),
        "{log}"
    );
    assert_eq!(
        log.matches("API discovery failed").count(),
        failures_before,
        "the signal came before the connect timeout: {log}"
    );
    assert!(
        status.success(),
        "a requested shutdown exits 0: {status:?}\n{log}"
    );
}

#[test]
fn sigterm_while_the_first_discovery_waits_on_a_mute_api_server_ends_the_daemon() {
    let dir = scratch("mute-first");
    let mute = Mute::start(true);
    let mut scheduler = Scheduler::start_with(&kubeconfig_for(&dir, mute.port), "text");
    scheduler.wait_for("serving /metrics", 0);
    // Discovery starts right after; give its request time to be under way.
    std::thread::sleep(Duration::from_secs(1));
    sigterm_during_discovery(scheduler, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The SIGTERM that once went unseen: one listener was made per wait between discovery's
/// attempts, so a signal during an attempt after the first reached none, and the daemon
/// never exited (a CI run waited 30 s for it in the JSON log test).
#[test]
fn sigterm_while_a_later_discovery_waits_on_a_mute_api_server_ends_the_daemon() {
    let dir = scratch("mute-later");
    let mute = Mute::start(false);
    let mut scheduler = Scheduler::start_with(&kubeconfig_for(&dir, mute.port), "text");
    scheduler.wait_for("API discovery failed", 0);
    mute.hold();
    // The next attempt comes 0.5 s after the first failure, and waits on the mute port.
    std::thread::sleep(Duration::from_millis(1500));
    sigterm_during_discovery(scheduler, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn text_logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let dir = scratch("text");
    let mut scheduler = Scheduler::start(&dir, "text");
    scheduler.wait_for("serving /metrics", 0);
    let log = scheduler.stop();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains(" INFO ") && l.contains("serving /metrics")),
        "{log}"
    );
    assert!(!log.contains('\x1b'), "colour codes in a pipe: {log:?}");
}

#[test]
fn metrics_follow_prometheus_conventions_and_name_the_build() {
    let dir = scratch("metrics");
    let mut scheduler = Scheduler::start(&dir, "text");
    scheduler.wait_for("serving /metrics", 0);
    let (code, text) = get(&scheduler.metrics, "/metrics").expect("/metrics answers");
    scheduler.stop();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 200);
    assert_eq!(promlint(&text), Vec::<String>::new(), "{text}");
    let build_info: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("dra_scheduler_build_info{"))
        .collect();
    assert_eq!(build_info.len(), 1, "{text}");
    let line = build_info[0];
    assert!(line.ends_with("} 1"), "{line}");
    assert!(
        line.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{line}"
    );
    assert!(line.contains("rustc_version=\"rustc 1."), "{line}");
    assert!(line.contains("git_commit=\""), "{line}");
    // The queue-to-bound histogram reaches hours (kube-scheduler's SLI buckets and more).
    let top = text
        .lines()
        .filter(|l| l.starts_with("dra_scheduler_pod_scheduling_duration_seconds_bucket{le=\""))
        .filter_map(|l| l.split('"').nth(1)?.parse::<f64>().ok())
        .fold(0.0, f64::max);
    assert!(top >= 20.0 * 3600.0, "largest finite bucket {top} s");
}
