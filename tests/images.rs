//! The container images: `images/build-local.sh` builds both targets of the Dockerfile with
//! buildah from this test build's binaries, without a registry; the OCI archives it writes
//! name the images as the chart does, carry the user and entry point the chart relies on,
//! and each binary runs inside its image's root filesystem alone (chroot), so the image
//! holds every library it needs. A second build with nothing changed keeps the archives.
//!
//! Needs root and buildah (scripts/test.sh installs buildah), like the build script.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod common;
use common::{repo, run};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A folder of this test process, removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("dra-images-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An image read back from an OCI archive: its reference, config and layers unpacked.
struct Image {
    reference: String,
    config: Value,
    layers: Vec<String>,
    rootfs: PathBuf,
}

fn blob(dir: &Path, digest: &Value) -> PathBuf {
    let digest = digest.as_str().unwrap();
    dir.join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn unpack(archive: &Path, dir: &Path) -> Image {
    let layout = dir.join("layout");
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&layout).unwrap();
    std::fs::create_dir_all(&rootfs).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout));
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    let reference = manifests[0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .expect("the archive names its image")
        .to_string();
    let manifest = json(&blob(&layout, &manifests[0]["digest"]));
    let config = json(&blob(&layout, &manifest["config"]["digest"]));
    let mut layers = Vec::new();
    for layer in manifest["layers"].as_array().unwrap() {
        run(Command::new("tar")
            .arg("-xzf")
            .arg(blob(&layout, &layer["digest"]))
            .arg("-C")
            .arg(&rootfs));
        layers.push(layer["digest"].as_str().unwrap().to_string());
    }
    Image {
        reference,
        config,
        layers,
        rootfs,
    }
}

/// `chroot [--userspec USER] ROOTFS ARGS...`: the binary sees only the image's files.
fn in_image(image: &Image, user: Option<&str>, args: &[&str]) -> String {
    let mut cmd = Command::new("chroot");
    if let Some(user) = user {
        cmd.arg(format!("--userspec={user}"));
    }
    stdout(&run(cmd.arg(&image.rootfs).args(args)))
}

#[test]
fn the_local_build_makes_both_images_and_they_run() {
    let uid = stdout(&run(Command::new("id").arg("-u")));
    assert_eq!(
        uid.trim(),
        "0",
        "images/build-local.sh and this test need root (buildah's storage, chroot)"
    );
    assert!(
        Command::new("buildah")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        "buildah is missing: apt-get install buildah (scripts/test.sh installs it)"
    );
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .parent()
        .unwrap();
    assert!(
        bin_dir.join("dra-node-agent").exists(),
        "{} is missing: cargo build -p dra-node-agent (cargo test --workspace builds it)",
        bin_dir.join("dra-node-agent").display()
    );

    let scratch = Scratch::new();
    let out = scratch.0.join("out");
    let build = || {
        run(Command::new("bash")
            .arg(repo().join("images/build-local.sh"))
            .arg("--binaries")
            .arg(bin_dir)
            .arg("--out")
            .arg(&out))
    };
    let first = build();
    let archives: Vec<PathBuf> = stdout(&first).lines().map(PathBuf::from).collect();
    let references = stdout(&run(Command::new("bash")
        .arg(repo().join("images/build-local.sh"))
        .arg("--list")));
    let references: Vec<&str> = references.lines().collect();
    assert_eq!(archives.len(), 2, "{archives:?}");
    assert_eq!(references.len(), 2, "{references:?}");

    let scheduler = unpack(&archives[0], &scratch.0.join("scheduler"));
    let agent = unpack(&archives[1], &scratch.0.join("agent"));
    assert_eq!(scheduler.reference, references[0]);
    assert_eq!(agent.reference, references[1]);
    assert!(scheduler.reference.contains("/dra-scheduler:"));
    assert!(agent.reference.contains("/dra-node-agent:"));
    // One layer per COPY; the root filesystem's is the same in both.
    assert_eq!(scheduler.layers.len(), 2, "{:?}", scheduler.layers);
    assert_eq!(agent.layers.len(), 3, "{:?}", agent.layers);
    assert_eq!(scheduler.layers[0], agent.layers[0]);

    // The scheduler: non-root by number (runAsNonRoot can check it), its binary as the entry
    // point (the chart gives only arguments).
    let c = &scheduler.config["config"];
    assert_eq!(c["User"], "65532:65532");
    assert_eq!(
        c["Entrypoint"],
        serde_json::json!(["/usr/local/bin/dra-scheduler"])
    );
    let version = in_image(
        &scheduler,
        Some("65532:65532"),
        &["/usr/local/bin/dra-scheduler", "--version"],
    );
    assert_eq!(
        version.trim(),
        format!("dra-scheduler {}", env!("CARGO_PKG_VERSION"))
    );

    // The agent: root, and the fake backend's profiles where the chart's README says.
    let c = &agent.config["config"];
    assert_eq!(c["User"], "0:0");
    assert_eq!(
        c["Entrypoint"],
        serde_json::json!(["/usr/local/bin/dra-node-agent"])
    );
    let devices = in_image(
        &agent,
        None,
        &[
            "/usr/local/bin/dra-node-agent",
            "--node-name=n1",
            "--backend=fake",
            "--fake-profile=/usr/share/dra-node-agent/profiles/1x-a5000-2x-t10.yaml",
            "discover",
        ],
    );
    // The ResourceSlice it would publish: the profile's A5000 and two T10s.
    assert_eq!(
        devices.matches("string: NVIDIA RTX A5000").count(),
        1,
        "{devices}"
    );
    assert_eq!(
        devices.matches("string: NVIDIA T10").count(),
        2,
        "{devices}"
    );

    // Nothing changed: the archives are kept as they are.
    let modified = |p: &PathBuf| std::fs::metadata(p).unwrap().modified().unwrap();
    let before: Vec<_> = archives.iter().map(modified).collect();
    let second = build();
    assert_eq!(stdout(&second), stdout(&first));
    assert_eq!(archives.iter().map(modified).collect::<Vec<_>>(), before);
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("unchanged"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
}
