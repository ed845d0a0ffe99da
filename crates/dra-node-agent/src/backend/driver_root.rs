//! Finding the NVIDIA driver's files in a driver root: the host's file tree (or the GPU
//! Operator's driver container's) mounted somewhere inside the agent's container, e.g. at
//! `/driver-root`. Symbolic links there were made for the host: an absolute target means
//! "from the driver root", so links are followed here component by component with the
//! root standing in for `/`, never by the kernel from the container's `/`.

use std::path::{Component, Path, PathBuf};

/// Library folders, relative to a driver root, in the order they are searched: the
/// distributions' multiarch and lib64 folders first, the plain ones last.
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
];

/// Links followed in one resolution before giving up (a loop), as Linux's limit.
const MAX_LINKS: usize = 40;

/// The file `name` in the first of [`LIBRARY_DIRS`] under `root` that holds it, with every
/// link resolved inside `root`: a path that names the file itself, for dlopen.
pub fn find_library(root: &Path, name: &str) -> Option<PathBuf> {
    LIBRARY_DIRS
        .iter()
        .filter_map(|dir| resolve_in_root(root, &Path::new(dir).join(name)))
        .find(|path| path.is_file())
}

/// `path` (taken relative to `root`, a leading `/` ignored) with every symbolic link in it
/// followed as if `root` were `/`: absolute link targets start again at `root`, and `..`
/// never climbs above it. None when a component does not exist or links loop.
pub fn resolve_in_root(root: &Path, path: &Path) -> Option<PathBuf> {
    // What is left to walk, last component first, and the real path walked so far.
    let mut todo: Vec<PathBuf> = relative_components(path).into_iter().rev().collect();
    let mut walked = root.to_path_buf();
    let mut links = 0;
    while let Some(part) = todo.pop() {
        if part == Path::new("..") {
            if walked != root {
                walked.pop();
            }
            continue;
        }
        let next = walked.join(&part);
        let meta = std::fs::symlink_metadata(&next).ok()?;
        if !meta.file_type().is_symlink() {
            walked = next;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return None;
        }
        let target = std::fs::read_link(&next).ok()?;
        if target.is_absolute() {
            walked = root.to_path_buf();
        }
        todo.extend(relative_components(&target).into_iter().rev());
    }
    Some(walked)
}

/// The normal and `..` components of `path`; `/` and `.` say nothing here.
fn relative_components(path: &Path) -> Vec<PathBuf> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(PathBuf::from(s)),
            Component::ParentDir => Some(PathBuf::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const NVML: &str = "libnvidia-ml.so.1";

    /// A driver root with the library's real file at `real` (relative to the root).
    fn root_with(real: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join(real);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"\x7fELF").unwrap();
        root
    }

    #[test]
    fn a_debian_host_has_it_in_the_multiarch_folder_behind_a_relative_link() {
        let root = root_with("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15");
        let dir = root.path().join("usr/lib/x86_64-linux-gnu");
        symlink("libnvidia-ml.so.550.54.15", dir.join(NVML)).unwrap();
        assert_eq!(
            find_library(root.path(), NVML),
            Some(dir.join("libnvidia-ml.so.550.54.15"))
        );
    }

    #[test]
    fn an_absolute_link_is_followed_inside_the_root_not_from_the_containers_slash() {
        // The GPU Operator's driver container, mounted from /run/nvidia/driver: its links
        // name paths from its own /.
        let root = root_with("usr/lib64/libnvidia-ml.so.570.86.15");
        symlink(
            "/usr/lib64/libnvidia-ml.so.570.86.15",
            root.path().join("usr/lib64").join(NVML),
        )
        .unwrap();
        assert_eq!(
            find_library(root.path(), NVML),
            Some(root.path().join("usr/lib64/libnvidia-ml.so.570.86.15"))
        );
    }

    #[test]
    fn a_merged_usr_host_links_lib_to_usr_lib() {
        // /lib64 -> /usr/lib64 given absolutely, the file only under usr/lib64.
        let root = root_with("usr/lib64/libnvidia-ml.so.1");
        symlink("/usr/lib64", root.path().join("lib64")).unwrap();
        assert_eq!(
            resolve_in_root(root.path(), Path::new("/lib64/libnvidia-ml.so.1")),
            Some(root.path().join("usr/lib64/libnvidia-ml.so.1"))
        );
        // The search takes the first folder that has it: usr/lib64 itself.
        assert_eq!(
            find_library(root.path(), NVML),
            Some(root.path().join("usr/lib64/libnvidia-ml.so.1"))
        );
    }

    #[test]
    fn the_first_library_folder_wins() {
        let root = root_with("usr/lib/libnvidia-ml.so.1");
        std::fs::create_dir_all(root.path().join("usr/lib/aarch64-linux-gnu")).unwrap();
        std::fs::write(
            root.path().join("usr/lib/aarch64-linux-gnu").join(NVML),
            b"",
        )
        .unwrap();
        assert_eq!(
            find_library(root.path(), NVML),
            Some(root.path().join("usr/lib/aarch64-linux-gnu").join(NVML))
        );
    }

    #[test]
    fn dot_dot_and_links_never_leave_the_root() {
        let root = root_with("usr/lib/x86_64-linux-gnu/real.so");
        let dir = root.path().join("usr/lib/x86_64-linux-gnu");
        // A link that climbs far above the root ends at the root, as `..` at `/` does.
        symlink(
            "../../../../../../../usr/lib/x86_64-linux-gnu/real.so",
            dir.join(NVML),
        )
        .unwrap();
        assert_eq!(find_library(root.path(), NVML), Some(dir.join("real.so")));
    }

    #[test]
    fn missing_files_dangling_links_and_loops_find_nothing() {
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(find_library(empty.path(), NVML), None);

        let dangling = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dangling.path().join("usr/lib64")).unwrap();
        symlink(
            "libnvidia-ml.so.999",
            dangling.path().join("usr/lib64").join(NVML),
        )
        .unwrap();
        assert_eq!(find_library(dangling.path(), NVML), None);

        let looping = tempfile::tempdir().unwrap();
        let dir = looping.path().join("usr/lib64");
        std::fs::create_dir_all(&dir).unwrap();
        symlink("a", dir.join(NVML)).unwrap();
        symlink(NVML, dir.join("a")).unwrap();
        assert_eq!(find_library(looping.path(), NVML), None);
    }

    #[test]
    fn a_folder_named_like_the_library_is_not_it() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("usr/lib64").join(NVML)).unwrap();
        assert_eq!(find_library(root.path(), NVML), None);
    }
}
