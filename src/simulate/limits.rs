//! The bounds on what `simulate` reads and builds. Input past any of them is invalid input
//! (exit status 1, a message naming the file, the document and the object), never a hang,
//! an abort or a machine out of memory. Each bound is far above what a real cluster's
//! manifests need; the README lists them.

/// Pods one workload (Deployment, ReplicaSet, StatefulSet, Job) may expand to. A tenth of
/// [`MAX_PODS`]: no single workload of a cluster Kubernetes supports comes near it, and a
/// mistyped `replicas: 1000000000` fails before a single pod is built.
pub const MAX_PODS_PER_WORKLOAD: i64 = 100_000;

/// Pods in one simulation, written ones and expanded ones together: Kubernetes'
/// scalability thresholds stop at 150,000 pods a cluster. A pod costs a few KiB here, so
/// this also keeps the simulation under a GiB or so of pods.
pub const MAX_PODS: usize = 150_000;

/// Bytes in one manifest file, checked from its metadata and again while reading (a file
/// that grows is cut off there, not read to the end). Larger fleets split into files.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Bytes of all manifest files together: with [`MAX_FILE_BYTES`] it bounds the memory the
/// parsed objects take (a few times their text).
pub const MAX_TOTAL_BYTES: u64 = 256 << 20;

/// Bytes in one YAML document (`---` to `---`). The YAML parser holds a whole document's
/// event stream at once, about 40 times the document's text, so this bounds one parse to
/// well under a GiB. A single Kubernetes object is at most 3 MiB (the API server's request
/// limit); only a `List` comes near this, and it can be written as separate documents.
pub const MAX_DOCUMENT_BYTES: usize = 16 << 20;

/// Documents in one file: an endless run of `---` separators costs time but no bytes.
pub const MAX_DOCUMENTS_PER_FILE: usize = 200_000;

/// Nesting of mappings and sequences in one document. A Kubernetes object nests about a
/// dozen levels (a `List` of Deployments with node affinity), opaque driver parameters a few
/// more; the YAML parser's own limit is 128. Flow collections (`[[[`) are counted before the
/// parser runs, because the parser's cost grows with the square of their depth.
pub const MAX_DEPTH: usize = 100;

/// Values (scalars, keys, mappings, sequences) a document may expand to, per byte of its
/// text. Without aliases a document cannot reach this; with aliases (`*name` repeating an
/// anchored part) it stops a few lines of YAML from expanding to gigabytes.
pub const MAX_VALUES_PER_BYTE: usize = 2;
