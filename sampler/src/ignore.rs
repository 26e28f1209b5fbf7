//! The relay's process filter, pushed down: the processes the relay asked the
//! sampler to ignore, each verified, kept in the program's `IGNORED` map so that their samples
//! are dropped (and counted) before any stack walk.
//!
//! Nothing the relay claims is trusted. An entry is taken only when its pid is a process this
//! sampler described on the connection (the tracker knows it, alive) with the claimed start time,
//! /proc/<pid>/stat, read again now, says the same start time, and /proc/<pid>/exe still names the
//! executable the relay was told about (the relay judged that name: a process that exec'd since
//! is refused). The sampler then records the executable's identity (its path, device and inode).
//! Every drain re-reads them for each ignored pid and forgets the entries whose process exited,
//! whose pid was reused (another start time) or that exec'd (another executable, or the same one
//! under another name): the process is sampled again, its new facts
//! go to the relay, and the relay's filter decides anew. So a relay can only hide processes from
//! itself (which it could anyway, by dropping their samples), never make the sampler ignore a
//! process it did not verify, and a reused pid is sampled again from the next drain on.
//!
//! Bounds: at most [`MAX_IGNORED`] processes (the map's size; more are refused), at most
//! [`ember_protocol::MAX_IGNORE_PER_MESSAGE`] entries read per message (the decoder counts the
//! rest as `excess`, refused here). Every refusal is counted (`Batch.ignoreRefused`). The drain
//! loop forgets every entry when the relay disconnects (a new relay may filter otherwise) and on
//! `forgetAll`.

use std::{collections::HashMap, os::unix::fs::MetadataExt as _};

use ember_protocol::{IgnoreProcesses, IgnoreStats};
pub use ember_sampler_ebpf::MAX_IGNORED;

use crate::procfs;

/// What identifies a process while it is ignored: the start time (pid reuse changes it) and the
/// executable's device, inode and path (exec changes them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub start_time_unix_ns: u64,
    pub exe: (u64, u64),
    /// As the facts give it (`ProcessInfo.executablePath`, cut the same way).
    pub exe_path: String,
}

/// What the sampler told the relay about a live process: the facts the relay judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    pub start_time_unix_ns: u64,
    pub executable_path: String,
}

/// Reads a live process's [`Identity`] (a seam: the tests give their own).
pub trait Probe {
    /// `None` when the process is gone or unreadable.
    fn identity(&self, pid: u32) -> Option<Identity>;
}

/// The real [`Probe`]: /proc/<pid>/stat, a stat and a readlink of /proc/<pid>/exe (openat, read,
/// statx, readlinkat: no syscall beyond the ones reading facts already makes).
pub struct ProcProbe {
    pub boot_time_unix_ns: u64,
}

impl Probe for ProcProbe {
    fn identity(&self, pid: u32) -> Option<Identity> {
        let start = procfs::start_time_unix_ns(pid, self.boot_time_unix_ns)?;
        let link = format!("/proc/{pid}/exe");
        let exe = std::fs::metadata(&link).ok()?;
        let exe_path = procfs::cap_path(std::fs::read_link(&link).ok()?.to_string_lossy().into());
        // Read again: the exe read above belongs to this start time's process, not to one that
        // took the pid in between.
        let again = procfs::start_time_unix_ns(pid, self.boot_time_unix_ns)?;
        (again == start).then_some(Identity {
            start_time_unix_ns: start,
            exe: (exe.dev(), exe.ino()),
            exe_path,
        })
    }
}

/// The program's `IGNORED` map, as this module uses it (a seam for the tests).
pub trait IgnoreMap {
    fn insert(&mut self, pid: u32) -> Result<(), String>;
    fn remove(&mut self, pid: u32);
}

impl IgnoreMap for aya::maps::HashMap<aya::maps::MapData, u32, u8> {
    fn insert(&mut self, pid: u32) -> Result<(), String> {
        aya::maps::HashMap::insert(self, pid, 1, 0).map_err(|err| err.to_string())
    }

    fn remove(&mut self, pid: u32) {
        // Absent is fine: nothing to forget.
        let _ = aya::maps::HashMap::remove(self, &pid);
    }
}

/// The ignored processes and what became of the relay's entries.
#[derive(Debug, Default)]
pub struct Ignored {
    entries: HashMap<u32, Identity>,
    /// Entries refused since start (not verified, over a cap).
    pub refused: u64,
    /// Entries taken since start.
    pub accepted: u64,
    /// Entries forgotten because their process exited, its pid was reused or it exec'd.
    pub released: u64,
}

/// What one `ignoreProcesses` amounted to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Taken {
    pub accepted: u64,
    pub refused: u64,
}

impl Ignored {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The counters a batch reports, with the program's count of ignored samples.
    pub fn stats(&self, ignored_samples: u64) -> IgnoreStats {
        IgnoreStats {
            ignored_samples,
            refused: self.refused,
            processes: u32::try_from(self.entries.len()).unwrap_or(u32::MAX),
        }
    }

    /// Takes the entries of one message that check out. `described(pid)` is what the sampler
    /// told the relay about the live process under `pid` on this connection, if anything.
    pub fn take(
        &mut self,
        message: &IgnoreProcesses,
        described: impl Fn(u32) -> Option<Described>,
        probe: &impl Probe,
        map: &mut impl IgnoreMap,
    ) -> Taken {
        if message.forget_all {
            self.clear(map);
        }
        let mut taken = Taken {
            refused: u64::from(message.excess),
            ..Taken::default()
        };
        for claim in &message.processes {
            let already = self.entries.get(&claim.pid);
            if already.is_some_and(|id| id.start_time_unix_ns == claim.start_time_unix_ns) {
                continue;
            }
            let room = already.is_some() || self.entries.len() < MAX_IGNORED as usize;
            let facts = described(claim.pid)
                .filter(|f| room && f.start_time_unix_ns == claim.start_time_unix_ns)
                .filter(|_| claim.start_time_unix_ns != 0);
            let identity = facts.and_then(|facts| {
                probe.identity(claim.pid).filter(|id| {
                    id.start_time_unix_ns == facts.start_time_unix_ns
                        && id.exe_path == facts.executable_path
                })
            });
            match identity.map(|id| map.insert(claim.pid).map(|()| id)) {
                Some(Ok(id)) => {
                    self.entries.insert(claim.pid, id);
                    taken.accepted += 1;
                }
                Some(Err(err)) => {
                    tracing::debug!(pid = claim.pid, %err, "the IGNORED map refused an entry");
                    taken.refused += 1;
                }
                None => taken.refused += 1,
            }
        }
        self.accepted += taken.accepted;
        self.refused += taken.refused;
        taken
    }

    /// Re-reads the identity of every ignored process and forgets those that exited, whose pid
    /// was reused or that exec'd; returns their pids (to be described again).
    pub fn recheck(&mut self, probe: &impl Probe, map: &mut impl IgnoreMap) -> Vec<u32> {
        let stale: Vec<u32> = self
            .entries
            .iter()
            .filter(|(&pid, id)| probe.identity(pid).as_ref() != Some(*id))
            .map(|(&pid, _)| pid)
            .collect();
        for &pid in &stale {
            map.remove(pid);
            self.entries.remove(&pid);
        }
        self.released += stale.len() as u64;
        stale
    }

    /// Forgets every entry (the relay went away, or asked to).
    pub fn clear(&mut self, map: &mut impl IgnoreMap) {
        for (pid, _) in self.entries.drain() {
            map.remove(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use ember_protocol::IgnoredProcess;

    use super::*;

    /// Processes by pid: (start time, exe inode).
    #[derive(Default)]
    struct FakeProcs(HashMap<u32, (u64, u64)>);

    impl Probe for FakeProcs {
        fn identity(&self, pid: u32) -> Option<Identity> {
            self.0.get(&pid).map(|&(start, ino)| Identity {
                start_time_unix_ns: start,
                exe: (1, ino),
                exe_path: format!("/bin/{ino}"),
            })
        }
    }

    #[derive(Default)]
    struct FakeMap(BTreeSet<u32>);

    impl IgnoreMap for FakeMap {
        fn insert(&mut self, pid: u32) -> Result<(), String> {
            if self.0.len() >= MAX_IGNORED as usize && !self.0.contains(&pid) {
                return Err("map full".into());
            }
            self.0.insert(pid);
            Ok(())
        }

        fn remove(&mut self, pid: u32) {
            self.0.remove(&pid);
        }
    }

    /// What the sampler said about a process started at `start` running `/bin/<ino>`.
    fn facts(start: u64, ino: u64) -> Option<Described> {
        Some(Described {
            start_time_unix_ns: start,
            executable_path: format!("/bin/{ino}"),
        })
    }

    fn message(claims: &[(u32, u64)]) -> IgnoreProcesses {
        IgnoreProcesses {
            processes: claims
                .iter()
                .map(|&(pid, start_time_unix_ns)| IgnoredProcess {
                    pid,
                    start_time_unix_ns,
                })
                .collect(),
            ..IgnoreProcesses::default()
        }
    }

    #[test]
    fn only_described_live_processes_with_their_start_time_are_ignored() {
        // Given processes 10 and 11 alive and described, 12 alive but never described, 13
        // described but gone, 14 described but it exec'd /bin/41 since
        let procs = FakeProcs(
            [
                (10, (100, 1)),
                (11, (110, 2)),
                (12, (120, 3)),
                (14, (140, 41)),
            ]
            .into(),
        );
        let described = |pid: u32| match pid {
            10 => facts(100, 1),
            11 => facts(110, 2),
            13 => facts(130, 3),
            14 => facts(140, 4),
            _ => None,
        };
        let (mut ignored, mut map) = (Ignored::default(), FakeMap::default());
        // When the relay claims 10 rightly, 11 with a wrong start time, 12, 13, 14, a
        // nonexistent pid, pid 0 and start 0, with 5 more entries the decoder left unread
        let mut claims = message(&[
            (10, 100),
            (11, 111),
            (12, 120),
            (13, 130),
            (14, 140),
            (99, 1),
            (0, 0),
        ]);
        claims.excess = 5;
        let taken = ignored.take(&claims, described, &procs, &mut map);
        // Then only 10 is ignored; the other six and the excess are refused and counted
        assert_eq!(
            taken,
            Taken {
                accepted: 1,
                refused: 11
            }
        );
        assert_eq!(map.0, BTreeSet::from([10]));
        assert_eq!((ignored.len(), ignored.refused), (1, 11));
        // And claiming it again changes nothing and is no refusal
        let again = ignored.take(&message(&[(10, 100)]), described, &procs, &mut map);
        assert_eq!(again, Taken::default());
    }

    #[test]
    fn exit_pid_reuse_and_exec_end_the_ignoring() {
        // Given four ignored processes
        let mut procs = FakeProcs([(1, (10, 1)), (2, (20, 2)), (3, (30, 3)), (4, (40, 4))].into());
        let starts = [(1, 10), (2, 20), (3, 30), (4, 40)];
        let described = |pid: u32| facts(u64::from(pid) * 10, u64::from(pid));
        let (mut ignored, mut map) = (Ignored::default(), FakeMap::default());
        ignored.take(&message(&starts), described, &procs, &mut map);
        assert_eq!(map.0.len(), 4);
        // When 1 exits, 2's pid is reused, 3 execs another file, 4 stays
        procs.0.remove(&1);
        procs.0.insert(2, (21, 2));
        procs.0.insert(3, (30, 33));
        let mut released = ignored.recheck(&procs, &mut map);
        released.sort_unstable();
        // Then the first three are sampled again (and reported to be described again)
        assert_eq!(released, [1, 2, 3]);
        assert_eq!(map.0, BTreeSet::from([4]));
        assert_eq!(ignored.released, 3);
        // And a disconnect forgets the rest
        ignored.clear(&mut map);
        assert!(map.0.is_empty() && ignored.len() == 0);
    }

    #[test]
    fn at_most_max_ignored_processes_and_forget_all_starts_over() {
        // Given MAX_IGNORED + 10 live, described processes
        let count = MAX_IGNORED + 10;
        let procs = FakeProcs((1..=count).map(|pid| (pid, (u64::from(pid), 7))).collect());
        let described = |pid: u32| facts(u64::from(pid), 7);
        let (mut ignored, mut map) = (Ignored::default(), FakeMap::default());
        // When the relay claims all of them, 1024 per message
        let claims: Vec<(u32, u64)> = (1..=count).map(|pid| (pid, u64::from(pid))).collect();
        for chunk in claims.chunks(1024) {
            ignored.take(&message(chunk), described, &procs, &mut map);
        }
        // Then the cap's worth are ignored, the excess refused and counted
        assert_eq!(ignored.len(), MAX_IGNORED as usize);
        assert_eq!(map.0.len(), MAX_IGNORED as usize);
        assert_eq!(ignored.refused, 10);
        // And forgetAll empties the map before taking the new entries
        let mut fresh = message(&[(count, u64::from(count))]);
        fresh.forget_all = true;
        let taken = ignored.take(&fresh, described, &procs, &mut map);
        assert_eq!(taken.accepted, 1);
        assert_eq!(map.0, BTreeSet::from([count]));
    }

    #[test]
    fn the_real_probe_reads_this_process_as_its_facts_do() {
        // Given this test process, When probed and its facts read, Then the start times agree
        // (the relay's claim is the facts' number) and the exe is this binary
        let boot = procfs::boot_time_unix_ns();
        let pid = std::process::id();
        let probe = ProcProbe {
            boot_time_unix_ns: boot,
        };
        let identity = probe.identity(pid).expect("own identity");
        let mut files = procfs::FileTable::new(64);
        let facts = procfs::read_process(pid, boot, &mut files, &mut Vec::new()).expect("facts");
        assert_eq!(identity.start_time_unix_ns, facts.info.start_time_unix_ns);
        assert_eq!(identity.exe_path, facts.info.executable_path);
        let exe = std::fs::metadata("/proc/self/exe").expect("own exe");
        assert_eq!(identity.exe, (exe.dev(), exe.ino()));
        assert_eq!(probe.identity(u32::MAX), None);
    }
}
