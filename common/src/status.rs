//! Small /proc files read bounded, and `/proc/<pid>/status` among them: the kernel formats
//! them, but a process name (and so the text) is whatever the process chose, and a reader must
//! never take more than it needs.

use std::{fs::File, io::Read as _, path::Path};

/// Reads at most `limit` bytes of `path` as text (bytes that are not UTF-8 replaced; a longer
/// file is cut). Only `openat` (read-only), `read` and `close`: allowed in the sampler after
/// seccomp.
pub fn read_bounded(path: impl AsRef<Path>, limit: u64) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    File::open(path)?.take(limit).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Most bytes read of one status file: every field ember reads is in the first kilobytes (the
/// relay's copy read without a bound, the sampler's at most 64 KiB; the stricter one is kept).
pub const STATUS_READ_LIMIT: u64 = 16 << 10;

/// The text of one `/proc/<pid>/status` (or `/proc/self/status`) file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcStatus {
    text: String,
}

impl ProcStatus {
    /// Reads at most [`STATUS_READ_LIMIT`] bytes of `path` (`/proc/self/status`, ...).
    pub fn read(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let text = read_bounded(path, STATUS_READ_LIMIT)?;
        Ok(Self { text })
    }

    /// This process's status; empty (every field "") when it cannot be read.
    pub fn read_self() -> Self {
        Self::read("/proc/self/status").unwrap_or_default()
    }

    /// Takes a status text; bytes that are not UTF-8 (a process name can be any bytes) are
    /// replaced.
    pub fn parse(bytes: &[u8]) -> Self {
        Self {
            text: String::from_utf8_lossy(bytes).into_owned(),
        }
    }

    /// The value of the line `name:` (e.g. `"CapEff"`), trimmed; "" when there is none.
    pub fn field(&self, name: &str) -> &str {
        self.text
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map_or("", str::trim)
    }

    /// The numbers of the `Uid:` line: real, effective, saved, filesystem.
    pub fn uids(&self) -> Vec<u32> {
        self.field("Uid")
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tcat\nUmask:\t0022\nUid:\t1000\t1000\t0\t1000\n\
                          Gid:\t5\t5\t5\t5\nCapEff:\t0000010000080004\nNoNewPrivs:\t1\n";

    #[test]
    fn fields_and_uids_are_read() {
        let status = ProcStatus::parse(STATUS.as_bytes());
        assert_eq!(status.field("CapEff"), "0000010000080004");
        assert_eq!(status.field("NoNewPrivs"), "1");
        assert_eq!(status.field("Uid"), "1000\t1000\t0\t1000");
        assert_eq!(status.uids(), vec![1000, 1000, 0, 1000]);
        // A missing field is empty, and a prefix of another field's name is not a match
        assert_eq!(status.field("Seccomp"), "");
        assert_eq!(status.field("Cap"), "");
        assert!(ProcStatus::parse(b"Name:\tx\n").uids().is_empty());
    }

    #[test]
    fn a_name_of_any_bytes_does_not_hide_the_fields() {
        let mut bytes = b"Name:\t\xff\xfe\n".to_vec();
        bytes.extend_from_slice(b"Uid:\t7\t7\t7\t7\n");
        assert_eq!(ProcStatus::parse(&bytes).uids(), vec![7, 7, 7, 7]);
    }

    #[test]
    fn this_process_is_read_within_the_bound() {
        let status = ProcStatus::read_self();
        let me = nix::unistd::getuid().as_raw();
        assert_eq!(status.uids().first(), Some(&me));
        assert!(status.text.len() as u64 <= STATUS_READ_LIMIT);
    }
}
