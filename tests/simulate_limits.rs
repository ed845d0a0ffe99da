//! `simulate` on input that used to hang, abort or exhaust memory (issue #12), and on values
//! the API server rejects: each is invalid input with a message naming the file, the
//! document, the object and the field.
// FIFOs, devices and symbolic links as Unix has them.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dra_scheduler::simulate::{self, limits, manifests};

/// A fresh, empty directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("simulate_limits")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

fn load_error(paths: &[PathBuf]) -> String {
    match simulate::load(paths) {
        Ok(_) => panic!("{paths:?} loaded, but should be invalid input"),
        Err(e) => e.to_string(),
    }
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(status.success());
}

/// Run the binary; a run that outlives a minute is killed and fails the test (the guard
/// against a read that blocks, which is what these tests are about).
fn run(args: &[&Path]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .arg("simulate")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dra-scheduler");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("dra-scheduler simulate {args:?} still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n\
                    status: {allocatable: {cpu: \"8\", memory: 32Gi, pods: \"110\"}}\n";

fn deployment(name: &str, replicas: i64) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: ml}}\n\
         spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  \
         template:\n    metadata: {{labels: {{app: {name}}}}}\n    \
         spec: {{containers: [{{name: c}}]}}\n"
    )
}

#[test]
fn a_billion_replicas_is_invalid_input_before_any_pod_is_built() {
    let dir = scratch("replicas");
    let file = write(
        &dir.join("big.yaml"),
        &format!("{NODE}---\n{}", deployment("web", 1_000_000_000)),
    );
    let want = format!(
        "{} (document 2): Deployment ml/web: spec.replicas: 1000000000 pods is more than \
         simulate expands from one workload (at most 100000)",
        file.display()
    );
    assert_eq!(load_error(std::slice::from_ref(&file)), want);
    let out = run(&[&file]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stderr(&out), format!("error: {want}"));
    assert!(out.stdout.is_empty());
}

#[test]
fn pods_are_capped_in_total_too() {
    let dir = scratch("total");
    let per = limits::MAX_PODS_PER_WORKLOAD;
    let text = (0..2)
        .map(|i| deployment(&format!("w{i}"), per))
        .collect::<Vec<_>>()
        .join("---\n");
    let file = write(&dir.join("many.yaml"), &text);
    let err = load_error(&[file]);
    assert!(
        err.contains(
            "(document 2): Deployment ml/w1: with this object the input has more than 150000 pods"
        ),
        "{err}"
    );
    // A Job runs min(parallelism, completions) pods at once; that is what counts.
    let job = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  \
               parallelism: 1000000000\n  completions: 3\n  \
               template: {spec: {containers: [{name: c}], restartPolicy: Never}}\n";
    let file = write(&dir.join("job.yaml"), job);
    let input = simulate::load(&[file]).unwrap();
    assert_eq!(input.pods.len(), 3);
}

#[test]
fn symlink_cycles_end_and_every_file_is_read_once() {
    let dir = scratch("symlinks");
    let fleet = dir.join("fleet");
    std::fs::create_dir(&fleet).unwrap();
    write(&fleet.join("node.yaml"), NODE);
    // Two links to their own directory, and one to the parent: each walk of `fleet` finds
    // all three again.
    std::os::unix::fs::symlink(".", fleet.join("again")).unwrap();
    std::os::unix::fs::symlink(".", fleet.join("and-again")).unwrap();
    std::os::unix::fs::symlink("..", fleet.join("up")).unwrap();
    std::os::unix::fs::symlink("node.yaml", fleet.join("alias.yaml")).unwrap();
    let files = manifests::files(&[fleet.clone(), fleet.join("node.yaml"), dir.clone()]).unwrap();
    assert_eq!(files, [fleet.join("alias.yaml")]);
    let input = simulate::load(&[fleet]).unwrap();
    assert_eq!(input.nodes.len(), 1, "the node is read once");
}

#[test]
fn a_dangling_link_with_a_manifest_name_is_an_error() {
    let dir = scratch("dangling");
    std::os::unix::fs::symlink("gone.yaml", dir.join("node.yaml")).unwrap();
    std::os::unix::fs::symlink("gone", dir.join("README")).unwrap();
    let err = load_error(std::slice::from_ref(&dir));
    assert!(
        err.starts_with(&format!("{}: ", dir.join("node.yaml").display())),
        "{err}"
    );
}

#[test]
fn a_fifo_on_the_command_line_is_an_error_not_a_hang() {
    let dir = scratch("fifo");
    let fifo = dir.join("manifests.yaml");
    mkfifo(&fifo);
    let want = format!(
        "{}: a FIFO (named pipe): simulate reads only regular files (a stream could block or \
         never end; save it to a file first)",
        fifo.display()
    );
    assert_eq!(load_error(std::slice::from_ref(&fifo)), want);
    let out = run(&[&fifo]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), format!("error: {want}"));
}

#[test]
fn a_fifo_in_a_directory_is_an_error_when_it_looks_like_a_manifest() {
    let dir = scratch("fifo-dir");
    write(&dir.join("node.yaml"), NODE);
    mkfifo(&dir.join("pipe"));
    // Not a manifest's name: skipped like any other file that is not a manifest.
    assert_eq!(
        simulate::load(std::slice::from_ref(&dir))
            .unwrap()
            .nodes
            .len(),
        1
    );
    mkfifo(&dir.join("pods.yaml"));
    let err = load_error(std::slice::from_ref(&dir));
    assert!(
        err.starts_with(&format!("{}: a FIFO", dir.join("pods.yaml").display())),
        "{err}"
    );
}

#[test]
fn devices_are_not_read() {
    let err = load_error(&[PathBuf::from("/dev/urandom")]);
    assert!(
        err.starts_with("/dev/urandom: a character device: simulate reads only regular files"),
        "{err}"
    );
    let out = run(&[Path::new("/dev/zero")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("error: /dev/zero: a character device"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_file_over_the_size_limit_is_not_read() {
    let dir = scratch("size");
    let file = dir.join("huge.yaml");
    // Sparse: the size is in the metadata, the limit is checked before any read.
    let f = std::fs::File::create(&file).unwrap();
    f.set_len(limits::MAX_FILE_BYTES + 1).unwrap();
    let err = load_error(std::slice::from_ref(&file));
    assert_eq!(
        err,
        format!(
            "{}: the file is 67108865 bytes, more than simulate reads from one file (64 MiB); \
             split it into several files",
            file.display()
        )
    );
}

#[test]
fn documents_are_limited_in_size_and_number() {
    let mut m = manifests::Manifests::default();
    let big = format!(
        "{NODE}---\nkind: x\nhuge: {}\n",
        "x".repeat(limits::MAX_DOCUMENT_BYTES)
    );
    let err = manifests::parse_file(Path::new("big.yaml"), &big, &mut m).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("big.yaml (document 2): the document (from line 5) is ")
            && err
                .to_string()
                .contains("bytes, more than simulate parses at once (16 MiB)"),
        "{err}"
    );
    let many = "---\n".repeat(limits::MAX_DOCUMENTS_PER_FILE + 1);
    let err = manifests::parse_file(Path::new("many.yaml"), &many, &mut m).unwrap_err();
    assert_eq!(
        err.to_string(),
        "many.yaml: 200001 documents, more than simulate reads from one file (200000)"
    );
}

#[test]
fn yaml_nested_100k_deep_fails_at_once_naming_the_file() {
    let dir = scratch("deep");
    for (name, text) in [
        (
            "flow.yaml",
            format!("{NODE}---\nitems: {}\n", "[".repeat(100_000)),
        ),
        ("flow.json", "{\"a\": ".repeat(100_000)),
        (
            "block.yaml",
            format!("{NODE}---\n{}x\n", "- ".repeat(100_000)),
        ),
    ] {
        let file = write(&dir.join(name), &text);
        let err = load_error(std::slice::from_ref(&file));
        assert!(
            err.starts_with(&format!("{} (document ", file.display()))
                && err.contains(
                    "not valid YAML: mappings and sequences are nested more than 100 levels deep"
                ),
            "{err}"
        );
    }
}

#[test]
fn aliases_cannot_blow_a_document_up() {
    let mut laughs = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\n");
    laughs += "data:\n  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
    for i in 1..10 {
        let p = format!("*a{}", i - 1);
        laughs += &format!("  a{i}: &a{i} [{}]\n", [p.as_str(); 10].join(", "));
    }
    let mut m = manifests::Manifests::default();
    let err = manifests::parse_file(Path::new("lol.yaml"), &laughs, &mut m).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("lol.yaml (document 1): not valid YAML: the document expands to more"),
        "{err}"
    );
}

#[test]
fn text_that_is_not_utf8_is_an_error() {
    let dir = scratch("binary");
    let file = dir.join("blob.yaml");
    std::fs::write(&file, b"kind: \xff\xfe\n").unwrap();
    assert_eq!(
        load_error(std::slice::from_ref(&file)),
        format!(
            "{}: not UTF-8 text (invalid byte at offset 6)",
            file.display()
        )
    );
}

#[test]
fn values_the_api_server_rejects_name_the_field() {
    let dir = scratch("invalid");
    let cases = [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ml}\nspec:\n  \
             containers:\n  - name: c\n    resources: {requests: {cpu: \"-500m\"}}\n",
            "Pod ml/p: spec.containers[0].resources.requests[cpu]: invalid value \"-500m\": \
             must be greater than or equal to 0",
        ),
        (
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec:\n  \
             taints: [{key: gpu, effect: Bogus}]\n",
            "Node n1: spec.taints[0].effect: unsupported value \"Bogus\": must be one of \
             NoSchedule, PreferNoSchedule, NoExecute",
        ),
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\nspec:\n  \
             driver: gpu.example.com\n  nodeName: n1\n  allNodes: true\n  \
             pool: {name: p, generation: 1, resourceSliceCount: 1}\n",
            "ResourceSlice s: spec: exactly one of nodeName, nodeSelector, allNodes and \
             perDeviceNodeSelection is required (set: nodeName, allNodes)",
        ),
    ];
    for (i, (text, want)) in cases.into_iter().enumerate() {
        let file = write(
            &dir.join(format!("{i}.yaml")),
            &format!("{NODE}---\n{text}"),
        );
        let err = load_error(std::slice::from_ref(&file));
        assert_eq!(err, format!("{} (document 2): {want}", file.display()));
        if i == 0 {
            let out = run(&[&file]);
            assert_eq!(out.status.code(), Some(1));
            assert_eq!(stderr(&out), format!("error: {err}"));
        }
    }
}
