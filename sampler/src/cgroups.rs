//! The text of `/proc/<pid>/cgroup` by cgroup id, on hosts with cgroup v2 only: a process whose
//! first sample came with its cgroup's id (observed by the kernel, `ProcessEvent::cgroup_id`)
//! costs no open and read of its cgroup file when a process of the same cgroup was read before.
//! Most new processes start where many did before (a shell's, a service's, a build's cgroup).
//!
//! Trust: a cgroup file is the kernel's text, but the process chooses where it lives, and can
//! move itself between cgroups it was delegated between its sample and the read. So an entry is
//! kept only when the file is the single `0::<path>` line of a cgroup-v2-only host and the
//! directory that path names under [`CGROUP_ROOT`], on the cgroup2 mount, has the observed id as
//! its inode number (cgroupfs numbers a cgroup's directory with its id, Linux 5.5+; older
//! kernels never match, and nothing is kept). A process that moved read a path whose directory
//! has another id: nothing is kept, so no process can make the cache name another cgroup for
//! the processes that follow. A cgroup renamed keeps its id: entries are read again after
//! [`MAX_AGE`]. At most [`MAX_ENTRIES`] (all forgotten when full: they refill at one read each).

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    time::{Duration, Instant},
};

/// Where the cgroup2 hierarchy is mounted in the sampler's mount namespace.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Most cgroups remembered.
const MAX_ENTRIES: usize = 4096;
/// How long an entry serves before its cgroup's file is read again.
const MAX_AGE: Duration = Duration::from_secs(30);

pub struct CgroupCache {
    /// Where the cgroup2 hierarchy is read ([`CGROUP_ROOT`]; another in tests).
    root: String,
    /// Device of the cgroup2 mount at [`CGROUP_ROOT`]; `None` (nothing is cached) when the
    /// host has no cgroup2 hierarchy there (cgroup v1 or hybrid).
    root_dev: Option<u64>,
    entries: HashMap<u64, (String, Instant)>,
    /// Cgroup files not read thanks to an entry, since start.
    pub hits: u64,
}

impl CgroupCache {
    /// A cache for this host: active only when [`CGROUP_ROOT`] is a cgroup2 root (it has
    /// `cgroup.controllers`).
    pub fn new() -> Self {
        Self::at(CGROUP_ROOT)
    }

    /// A cache checking paths against the cgroup2 root mounted at `root`, if it is one.
    fn at(root: &str) -> Self {
        let root_dev = std::fs::metadata(format!("{root}/cgroup.controllers"))
            .ok()
            .map(|meta| meta.dev());
        Self {
            root: root.to_owned(),
            ..Self::with_root(root_dev)
        }
    }

    /// A cache that keeps nothing (a reading without kernel observations).
    #[cfg(test)]
    pub fn with_nothing() -> Self {
        Self::with_root(None)
    }

    fn with_root(root_dev: Option<u64>) -> Self {
        Self {
            root: CGROUP_ROOT.to_owned(),
            root_dev,
            entries: HashMap::new(),
            hits: 0,
        }
    }

    /// The cgroup file of a process in cgroup `id`, if one was read and checked lately.
    pub fn get(&mut self, id: u64) -> Option<String> {
        let (text, at) = self.entries.get(&id)?;
        if at.elapsed() >= MAX_AGE {
            return None;
        }
        self.hits += 1;
        Some(text.clone())
    }

    /// Keeps `text`, the cgroup file of a process sampled in cgroup `id`, when it checks out
    /// (see the module's comment).
    pub fn offer(&mut self, id: u64, text: &str) {
        let Some(root_dev) = self.root_dev else {
            return;
        };
        if id == 0 || !self.names(root_dev, id, text) {
            return;
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.clear();
        }
        self.entries.insert(id, (text.to_owned(), Instant::now()));
    }

    /// Whether `text` is one `0::<path>` line whose path is the cgroup2 directory numbered `id`.
    fn names(&self, root_dev: u64, id: u64, text: &str) -> bool {
        let Some(path) = text
            .strip_prefix("0::/")
            .and_then(|rest| rest.strip_suffix('\n'))
        else {
            return false;
        };
        // One line only, and no step out of the root (a path outside the sampler's cgroup
        // namespace reads as `/../..`).
        if path.contains('\n') || path.split('/').any(|part| part == "..") {
            return false;
        }
        std::fs::metadata(format!("{}/{path}", self.root))
            .is_ok_and(|meta| meta.dev() == root_dev && meta.ino() == id && meta.is_dir())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's cgroup2 root (`/sys/fs/cgroup`, or `unified/` below it on a hybrid host),
    /// and our own cgroup's file as a v2-only host writes it and its id.
    fn ours() -> (CgroupCache, String, u64) {
        let cache = [CGROUP_ROOT, "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(CgroupCache::at)
            .find(|cache| cache.root_dev.is_some())
            .expect("a cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified");
        let file = std::fs::read_to_string("/proc/self/cgroup").expect("our cgroup file");
        let path = file
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .expect("a 0:: line");
        let id = std::fs::metadata(format!("{}{path}", cache.root))
            .expect("our cgroup's directory")
            .ino();
        (cache, format!("0::{path}\n"), id)
    }

    #[test]
    fn only_a_file_naming_the_observed_cgroup_is_kept() {
        // Given this host's cgroup2 root and our own cgroup's file and id
        let (mut cache, text, id) = ours();
        // When a process observed in another cgroup (it moved before its file was read)
        // offers our file, Then nothing is kept
        cache.offer(id + 1, &text);
        assert_eq!(cache.get(id + 1), None);
        // When a v1 or hybrid file, or a path out of the root, is offered, Then nothing either
        cache.offer(id, &format!("1:name=systemd:/x\n{text}"));
        cache.offer(id, "0::/../../etc\n");
        assert_eq!(cache.get(id), None);
        // When the file names the observed cgroup, Then it serves the next process of that id
        cache.offer(id, &text);
        assert_eq!(cache.get(id).as_deref(), Some(text.as_str()));
        assert_eq!(cache.hits, 1);
        // And without a cgroup2 root nothing is ever kept
        let mut v1 = CgroupCache::with_root(None);
        v1.offer(id, &text);
        assert_eq!(v1.get(id), None);
    }
}
