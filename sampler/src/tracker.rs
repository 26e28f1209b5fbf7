//! Tracks the processes seen in samples: reads their facts on first sight and when a sampled
//! address falls outside their known executable mappings (dlopen, exec), notices exits, and
//! produces the protocol messages (with file descriptors: mapped files, and the perf map that a
//! JIT runtime writes, re-checked at those re-reads while it has none) that describe them.
//!
//! File lifetime is the sampler's to say: a file is held while a tracked process maps it, and
//! for [`crate::procfs::FILE_IDLE_GRACE`] after the last one stops (new facts without it, or the
//! process is reaped), so the next start of the same program finds it; then the file is closed
//! and a `filesClosed` naming it is sent. The relay frees exactly those.

use std::{
    collections::{HashMap, HashSet},
    os::fd::OwnedFd,
    path::Path,
    rc::Rc,
    time::{Duration, Instant},
};

use ember_protocol::{
    encode_sampler_message,
    split::{self, file_size, MESSAGE_OVERHEAD},
    transport::MAX_FDS_PER_MESSAGE,
    FileInfo, Mapping, ProcessInfo, SamplerMessage,
};

use crate::{
    cgroups::CgroupCache,
    drain::Drained,
    limits::{
        MAX_CLOSED_PER_MESSAGE, MAX_DATAGRAM_BYTES, MAX_EXITED_WAITING, MAX_EXITS_PER_MESSAGE,
    },
    link::Outgoing,
    procfs::{self, FileTable, Observed},
};

struct Tracked {
    info: ProcessInfo,
    /// Once the process is gone: the last batch sequence that may hold its samples.
    exited_after: Option<u64>,
    refreshed: Instant,
    /// Least time before its mappings are read again for addresses outside them: starts at
    /// [`REFRESH_GAP_MIN`], doubles after each re-read that found nothing new.
    gap: Duration,
    /// Its perf map, passed with each of its `process` messages ([`crate::perfmap`]).
    perf_map: Option<Rc<OwnedFd>>,
}

/// What [`Tracker::describe_now`] did.
pub struct Described {
    pub messages: Vec<Outgoing>,
    /// The facts could be read (the process still ran).
    pub read: bool,
    /// They replace those of another process that had the pid.
    pub reused: bool,
}

/// Least time between two re-reads of one process's mappings, at first: code it maps after its
/// facts were read (a `dlopen`, a JIT) is named from the next interval on.
const REFRESH_GAP_MIN: Duration = Duration::from_secs(1);

/// Most time between two re-reads: frame-pointer walks through code built without frame
/// pointers yield junk addresses that no re-read will cover, so each re-read that finds no new
/// mapping doubles the gap up to this (five re-reads in the first 31 s, then one per 10 s).
const REFRESH_GAP_MAX: Duration = Duration::from_secs(10);

/// The refresh gap after reading `new` over `old`: doubled when nothing changed, reset when the
/// process mapped something new or is another process.
fn next_gap(old: Option<&Tracked>, new: &ProcessInfo) -> Duration {
    match old {
        Some(old)
            if old.exited_after.is_none()
                && old.info.start_time_unix_ns == new.start_time_unix_ns
                && old.info.mappings == new.mappings =>
        {
            (old.gap * 2).min(REFRESH_GAP_MAX)
        }
        _ => REFRESH_GAP_MIN,
    }
}

pub struct Tracker {
    procs: HashMap<u32, Tracked>,
    pub files: FileTable,
    /// Cgroup files by the cgroup id the kernel observed ([`CgroupCache`]).
    pub cgroups: CgroupCache,
    boot_time_unix_ns: u64,
    /// Processes whose facts could not be read (most had exited before the drain).
    pub errors: u64,
    /// Processes whose facts were cut to the caps (`factsTruncated`).
    pub truncated: u64,
    /// Pids whose facts were replaced, and pids forgotten, since the last
    /// [`Tracker::take_changes`] (for the unwinder's per-process mappings).
    changed: Vec<u32>,
    gone: Vec<u32>,
    /// Pids whose facts are re-read at their next samples whatever their addresses (they were
    /// ignored and may have exec'd meanwhile).
    reread: HashSet<u32>,
    /// Whether the start times the eBPF program reads are taken.
    pub start_check: StartCheck,
}

/// The start times of the first-sample events (a group leader's `start_boottime`, read at
/// offsets the loader found in the kernel's BTF) are checked against /proc/PID/stat's before
/// they are used: the first [`START_CHECKS`] processes are read both ways, and any
/// disagreement (a wrong offset, a time namespace) turns them off for good. The start time is
/// the process's identity across pid reuse: one that differs from the /proc one would split or
/// join processes.
#[derive(Debug, Default)]
pub struct StartCheck {
    /// Processes whose two start times agreed.
    pub agreed: u32,
    /// One disagreed: the events' start times are never used.
    pub refused: bool,
}

/// Processes read both ways before the events' start times are used.
const START_CHECKS: u32 = 16;

impl StartCheck {
    fn trusted(&self) -> bool {
        !self.refused && self.agreed >= START_CHECKS
    }

    /// Compares an observed start time with the one read from /proc for the same process.
    fn compare(&mut self, pid: u32, observed: u64, read: u64) {
        if observed == read {
            self.agreed += 1;
            if self.agreed == START_CHECKS {
                tracing::info!(
                    checked = START_CHECKS,
                    "start times from the first-sample events agree with /proc: used from now on"
                );
            }
        } else if !self.refused {
            self.refused = true;
            tracing::warn!(
                pid,
                observed,
                read,
                "a start time from the first-sample event differs from /proc/PID/stat's: \
                 start times are read from /proc from now on"
            );
        }
    }
}

impl Tracker {
    pub fn new(boot_time_unix_ns: u64, max_open_files: usize) -> Self {
        Self {
            procs: HashMap::new(),
            files: FileTable::new(max_open_files),
            cgroups: CgroupCache::new(),
            boot_time_unix_ns,
            errors: 0,
            truncated: 0,
            changed: Vec::new(),
            gone: Vec::new(),
            reread: HashSet::new(),
            start_check: StartCheck::default(),
        }
    }

    /// What was said about the live process described under `pid`, if any.
    pub fn described(&self, pid: u32) -> Option<crate::ignore::Described> {
        let tracked = self.procs.get(&pid)?;
        tracked
            .exited_after
            .is_none()
            .then(|| crate::ignore::Described {
                start_time_unix_ns: tracked.info.start_time_unix_ns,
                executable_path: tracked.info.executable_path.clone(),
            })
    }

    /// Re-reads `pid`'s facts at its next samples (it was ignored; it may have exec'd).
    pub fn reread(&mut self, pid: u32) {
        if self.procs.contains_key(&pid) {
            self.reread.insert(pid);
        }
    }

    /// The pids whose facts changed and the pids forgotten since the last call.
    pub fn take_changes(&mut self) -> (Vec<u32>, Vec<u32>) {
        (
            std::mem::take(&mut self.changed),
            std::mem::take(&mut self.gone),
        )
    }

    /// A known process's executable mappings, sorted by start.
    pub fn mappings(&self, pid: u32) -> Option<&[Mapping]> {
        self.procs.get(&pid).map(|t| t.info.mappings.as_slice())
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Reads facts for new processes and for processes with addresses outside their mappings;
    /// returns the messages to send before the batches of `sequence` (this drain's).
    pub fn observe(&mut self, drained: &Drained, sequence: u64) -> Vec<Outgoing> {
        let mut addrs_by_pid: HashMap<u32, Vec<u64>> = HashMap::new();
        for (key, _) in &drained.rows {
            let addrs = addrs_by_pid.entry(key.tgid).or_default();
            if key.user_stack_id >= 0 {
                if let Some(frames) = drained.stacks.get(&(key.user_stack_id as u32)) {
                    addrs.extend(frames.iter().copied());
                }
            }
        }
        let mut out = Vec::new();
        for (pid, addrs) in addrs_by_pid {
            let stale = match self.procs.get(&pid) {
                None => true,
                Some(_) if self.reread.remove(&pid) => true,
                Some(tracked) => {
                    tracked.exited_after.is_none()
                        && tracked.refreshed.elapsed() >= tracked.gap
                        && addrs.iter().any(|&a| {
                            !covers(&tracked.info, a)
                                || (tracked.perf_map.is_none()
                                    && in_anonymous_code(&tracked.info, a))
                        })
                }
            };
            if stale {
                out.extend(self.refresh(pid, sequence, Observed::default(), &|| false));
            }
        }
        out
    }

    /// Reads the facts of a process the program just sampled for the first time (or first since
    /// its exec), at once: a short-lived process is gone by the next drain. Returns the messages
    /// to send (before the batch that holds its samples) and whether its facts could be read.
    /// `reused` when these facts replace another process's (another start time): its samples
    /// not yet in a batch must be sent before them. `observed`: what the kernel saw of it at
    /// that sample; `leader_exited`: whether the process's group leader exited since then (its
    /// observed start time is then not used: the pid may be another process's).
    pub fn describe_now(
        &mut self,
        pid: u32,
        sequence: u64,
        observed: Observed,
        leader_exited: &dyn Fn() -> bool,
    ) -> Described {
        let errors = self.errors;
        let before = self.procs.get(&pid).map(|t| t.info.start_time_unix_ns);
        if before.is_some() && procfs::is_exiting(pid) {
            // Sampled after its exit began (the exit tracepoint reset its entry): its address
            // space is gone, and empty facts must not replace the ones its samples need.
            return Described {
                messages: Vec::new(),
                read: false,
                reused: false,
            };
        }
        let checking = observed
            .start_boottime_ns
            .filter(|_| !self.start_check.trusted() && !self.start_check.refused);
        let observed = Observed {
            start_boottime_ns: observed
                .start_boottime_ns
                .filter(|_| self.start_check.trusted()),
            ..observed
        };
        let messages = self.refresh(pid, sequence, observed, leader_exited);
        self.reread.remove(&pid);
        let read = self.errors == errors;
        let now = self.procs.get(&pid).map(|t| t.info.start_time_unix_ns);
        if let (Some(ns), Some(now), true) = (checking, now, read) {
            // Only when the directory read was the sampled process's (see `read_process_observed`).
            if !leader_exited() {
                let observed = procfs::start_time_from_boottime(self.boot_time_unix_ns, ns);
                self.start_check.compare(pid, observed, now);
            }
        }
        Described {
            messages,
            read,
            reused: read && before.is_some() && before != now,
        }
    }

    fn refresh(
        &mut self,
        pid: u32,
        sequence: u64,
        observed: Observed,
        leader_exited: &dyn Fn() -> bool,
    ) -> Vec<Outgoing> {
        let mut fresh = Vec::new();
        match procfs::read_process_observed(
            pid,
            self.boot_time_unix_ns,
            &mut self.files,
            &mut fresh,
            observed,
            &mut self.cgroups,
            leader_exited,
        ) {
            Ok(read) => {
                self.truncated += u64::from(read.truncated);
                self.replace(read.info, &fresh, read.perf_map.map(Rc::new))
            }
            Err(err) => {
                self.errors += 1;
                tracing::debug!(pid, %err, "cannot read process facts (exited?)");
                // Remember the process so its samples are not retried every drain.
                self.procs.entry(pid).or_insert_with(|| Tracked {
                    info: ProcessInfo {
                        pid,
                        ..ProcessInfo::default()
                    },
                    exited_after: Some(sequence.saturating_add(1)),
                    refreshed: Instant::now(),
                    gap: REFRESH_GAP_MIN,
                    perf_map: None,
                });
                Vec::new()
            }
        }
    }

    /// Takes new facts of a process whose files are interned (`fresh`: those to send); returns
    /// the messages saying so, then `filesClosed` for the files only its old facts mapped.
    fn replace(
        &mut self,
        info: ProcessInfo,
        fresh: &[u64],
        perf_map: Option<Rc<OwnedFd>>,
    ) -> Vec<Outgoing> {
        let mut out = self.files_messages(fresh);
        out.extend(process_messages(&info, perf_map.as_ref()));
        let (pid, refreshed) = (info.pid, Instant::now());
        let gap = next_gap(self.procs.get(&pid), &info);
        let tracked = Tracked {
            info,
            exited_after: None,
            refreshed,
            gap,
            perf_map,
        };
        if let Some(old) = self.procs.insert(pid, tracked) {
            self.files.release(&old.info.mappings);
        }
        self.changed.push(pid);
        out.extend(self.closed_messages());
        out
    }

    /// Files messages for `ids`, each at most [`MAX_DATAGRAM_BYTES`] with at most
    /// [`MAX_FDS_PER_MESSAGE`] descriptors.
    fn files_messages(&self, ids: &[u64]) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let mut infos: Vec<FileInfo> = Vec::new();
        let mut fds: Vec<Rc<OwnedFd>> = Vec::new();
        let mut size = MESSAGE_OVERHEAD;
        for file in ids.iter().filter_map(|&id| self.files.by_id(id)) {
            let added = file_size(&file.info);
            if !infos.is_empty()
                && (infos.len() >= MAX_FDS_PER_MESSAGE || size + added > MAX_DATAGRAM_BYTES)
            {
                out.push(state(
                    SamplerMessage::Files(std::mem::take(&mut infos)),
                    std::mem::take(&mut fds),
                ));
                size = MESSAGE_OVERHEAD;
            }
            let mut info = file.info.clone();
            if let Some(fd) = &file.fd {
                info.fd = i32::try_from(fds.len()).unwrap_or(i32::MAX);
                fds.push(Rc::clone(fd));
            }
            size += added;
            infos.push(info);
        }
        if !infos.is_empty() {
            out.push(state(SamplerMessage::Files(infos), fds));
        }
        out
    }

    /// `filesClosed` messages for the files closed since the last call, each at most
    /// [`MAX_CLOSED_PER_MESSAGE`] ids.
    fn closed_messages(&mut self) -> Vec<Outgoing> {
        let closed = self.files.take_closed();
        closed
            .chunks(MAX_CLOSED_PER_MESSAGE)
            .map(|ids| state(SamplerMessage::FilesClosed(ids.to_vec()), Vec::new()))
            .collect()
    }

    /// Marks processes that no longer exist as exited, after the batches of `sequence` were
    /// queued: samples taken before the exit was seen may still be in the next drain.
    pub fn notice_exits(&mut self, sequence: u64) {
        for (pid, tracked) in &mut self.procs {
            if tracked.exited_after.is_none() && !Path::new(&format!("/proc/{pid}")).exists() {
                tracked.exited_after = Some(sequence.saturating_add(1));
            }
        }
    }

    /// Forgets exited processes that no batch still to be sent can refer to: every batch up to
    /// their last possible one was built (`next_sequence` is past it) and none of those is
    /// queued (`oldest_queued`). At most [`MAX_EXITED_WAITING`] wait; beyond, the oldest go.
    /// Works connected or not; returns exit notices and then the `filesClosed` they caused, to
    /// queue only when connected (a relay that connects later gets a snapshot without them).
    pub fn reap(&mut self, oldest_queued: Option<u64>, next_sequence: u64) -> Vec<Outgoing> {
        let mut waiting: Vec<(u64, u32)> = self
            .procs
            .iter()
            .filter_map(|(&pid, t)| Some((t.exited_after?, pid)))
            .collect();
        waiting.sort_unstable();
        let excess = waiting.len().saturating_sub(MAX_EXITED_WAITING);
        let mut forgotten = Vec::new();
        for (i, (after, pid)) in waiting.into_iter().enumerate() {
            let unreferenced = next_sequence > after && oldest_queued.is_none_or(|o| o > after);
            if !(unreferenced || i < excess) {
                continue;
            }
            if let Some(tracked) = self.procs.remove(&pid) {
                self.files.release(&tracked.info.mappings);
                self.reread.remove(&pid);
                self.gone.push(pid);
                forgotten.push(pid);
            }
        }
        // One notice for all of them: each datagram would wake the relay and cost both sides a
        // system call.
        let mut out: Vec<Outgoing> = forgotten
            .chunks(MAX_EXITS_PER_MESSAGE)
            .map(|pids| {
                let pids = pids.to_vec();
                state(SamplerMessage::Exited { pids }, Vec::new())
            })
            .collect();
        self.files.close_idle();
        out.extend(self.closed_messages());
        out
    }

    /// Everything a newly connected relay needs before the backlog: files, then processes.
    pub fn snapshot(&self) -> Vec<Outgoing> {
        let mut ids: Vec<u64> = self.files.all().map(|f| f.id).collect();
        ids.sort_unstable();
        let mut out = self.files_messages(&ids);
        for tracked in self.procs.values() {
            out.extend(process_messages(&tracked.info, tracked.perf_map.as_ref()));
        }
        out
    }
}

/// The messages describing a process, each at most [`MAX_DATAGRAM_BYTES`]; the first carries
/// its perf map's descriptor, if it has one.
fn process_messages(info: &ProcessInfo, perf_map: Option<&Rc<OwnedFd>>) -> Vec<Outgoing> {
    let with_fd;
    let info = match perf_map {
        Some(_) => {
            with_fd = ProcessInfo {
                perf_map_fd: Some(0),
                ..info.clone()
            };
            &with_fd
        }
        None => info,
    };
    let mut fds: Vec<Rc<OwnedFd>> = perf_map.into_iter().cloned().collect();
    split::process_messages(info, MAX_DATAGRAM_BYTES)
        .into_iter()
        .map(|message| state(message, std::mem::take(&mut fds)))
        .collect()
}

/// Whether a user address lies in anonymous executable memory (JIT code, not a file's).
fn in_anonymous_code(info: &ProcessInfo, addr: u64) -> bool {
    let i = info.mappings.partition_point(|m| m.start <= addr);
    i > 0 && addr < info.mappings[i - 1].end && procfs::is_anonymous(&info.mappings[i - 1])
}

/// Whether a user address lies in one of the process's executable mappings.
fn covers(info: &ProcessInfo, addr: u64) -> bool {
    let i = info.mappings.partition_point(|m| m.start <= addr);
    i > 0 && addr < info.mappings[i - 1].end
}

/// A per-connection message (not part of the backlog).
pub fn state(message: SamplerMessage, fds: Vec<Rc<OwnedFd>>) -> Outgoing {
    Outgoing {
        bytes: encode_sampler_message(&message),
        fds,
        batch: None,
    }
}

#[cfg(test)]
mod tests {
    use ember_protocol::{decode_sampler_message, Limits};

    use super::*;
    use crate::{
        limits::{MAX_MAPPINGS_PER_PROCESS, PATH_CUT_MARK},
        procfs::tests::{mapping_of, TempFile},
    };

    /// Decodes what was sent and checks every datagram's bounds.
    fn decode_all(out: &[Outgoing]) -> Vec<SamplerMessage> {
        out.iter()
            .map(|o| {
                assert!(
                    o.bytes.len() <= MAX_DATAGRAM_BYTES,
                    "a datagram of {} bytes",
                    o.bytes.len()
                );
                assert!(o.fds.len() <= MAX_FDS_PER_MESSAGE);
                decode_sampler_message(&o.bytes, &Limits::default()).expect("decodes")
            })
            .collect()
    }

    #[test]
    fn a_process_with_1200_long_mappings_fits_in_bounded_datagrams() {
        // Given a process with 1,200 executable mappings of distinct files under 3.9 KB paths
        // (attack 1 in SECURITY.md)
        let dir = format!("/{}", "d".repeat(3_900));
        let mut maps = String::new();
        for i in 0..1_200u64 {
            let start = 0x1000_0000 + i * 0x2000;
            maps.push_str(&format!(
                "{start:x}-{:x} r-xp 00000000 08:01 {} {dir}/lib{i}.so\n",
                start + 0x1000,
                1_000 + i
            ));
        }
        // (4 MiB of maps hold 1,060 of these lines: the rest is cut, counted as truncated)
        let parsed = procfs::parse_maps(
            maps.as_bytes(),
            crate::limits::MAPS_MAX_BYTES,
            MAX_MAPPINGS_PER_PROCESS,
        )
        .expect("parses");
        let mut tracker = Tracker::new(0, 64);
        let mut mappings = parsed.mappings;
        let mut fresh = Vec::new();
        // A pid that cannot exist: nothing is opened, every file is described without an fd.
        tracker
            .files
            .intern_mappings(u32::MAX, &mut mappings, &mut fresh);
        let info = ProcessInfo {
            pid: 4242,
            start_time_unix_ns: 99,
            executable_path: format!("{dir}/app"),
            executable_name: "app".into(),
            cgroup: "/user.slice".into(),
            mappings,
            ..ProcessInfo::default()
        };
        let before = encode_sampler_message(&SamplerMessage::Process(ProcessInfo {
            mappings: (0..1_200u64)
                .map(|i| Mapping {
                    start: 0x1000_0000 + i * 0x2000,
                    end: 0x1000_1000 + i * 0x2000,
                    path: format!("{dir}/lib{i}.so"),
                    device: 2049,
                    inode: 1_000 + i,
                    file_id: i + 1,
                    ..Mapping::default()
                })
                .collect(),
            ..info.clone()
        }))
        .len();

        // When its facts are turned into datagrams
        let mut out = tracker.files_messages(&fresh);
        let files_datagrams = out.len();
        out.extend(process_messages(&info, None));
        let sizes: Vec<usize> = out.iter().map(|o| o.bytes.len()).collect();
        eprintln!(
            "uncapped process datagram: {before} bytes; now {} datagrams ({files_datagrams} files), largest {} bytes, total {} bytes",
            sizes.len(),
            sizes.iter().max().copied().unwrap_or(0),
            sizes.iter().sum::<usize>()
        );

        // Then every datagram is within bounds and together they carry every (capped) fact
        let decoded = decode_all(&out);
        let mut files = Vec::new();
        let mut process: Option<ProcessInfo> = None;
        for message in decoded {
            match message {
                SamplerMessage::Files(more) => files.extend(more),
                SamplerMessage::Process(p) => process = Some(p),
                SamplerMessage::ProcessMappings(more) => {
                    let p = process.as_mut().expect("process first");
                    assert_eq!(
                        (more.pid, more.start_time_unix_ns),
                        (p.pid, p.start_time_unix_ns)
                    );
                    p.mappings.extend(more.mappings);
                }
                other => panic!("unexpected {}", other.kind()),
            }
        }
        assert!(parsed.cut);
        assert_eq!(files.len(), info.mappings.len());
        assert!(files
            .iter()
            .all(|f| f.fd == ember_protocol::NO_FD && !f.open_error.is_empty()));
        assert!(files.iter().all(|f| f.path.ends_with(PATH_CUT_MARK)));
        let process = process.expect("a process message");
        assert_eq!(process.mappings, info.mappings);
    }

    fn exited(tracker: &mut Tracker, pid: u32, after: u64) {
        tracker.procs.insert(
            pid,
            Tracked {
                info: ProcessInfo {
                    pid,
                    ..ProcessInfo::default()
                },
                exited_after: Some(after),
                refreshed: Instant::now(),
                gap: REFRESH_GAP_MIN,
                perf_map: None,
            },
        );
    }

    #[test]
    fn re_reads_back_off_while_nothing_new_is_mapped() {
        // Given a process whose re-reads keep finding the same mappings
        let info = ProcessInfo {
            pid: 7,
            start_time_unix_ns: 100,
            mappings: vec![Mapping {
                start: 0x1000,
                end: 0x2000,
                ..Mapping::default()
            }],
            ..ProcessInfo::default()
        };
        let mut tracked = Tracked {
            info: info.clone(),
            exited_after: None,
            refreshed: Instant::now(),
            gap: REFRESH_GAP_MIN,
            perf_map: None,
        };
        // Then the gap doubles up to the most
        let mut gaps = Vec::new();
        for _ in 0..6 {
            tracked.gap = next_gap(Some(&tracked), &info);
            gaps.push(tracked.gap.as_secs());
        }
        assert_eq!(gaps, [2, 4, 8, 10, 10, 10]);
        // When it maps something new, the next re-read may come after the least gap again
        let mut mapped = info.clone();
        mapped.mappings.push(Mapping {
            start: 0x8000,
            end: 0x9000,
            ..Mapping::default()
        });
        assert_eq!(next_gap(Some(&tracked), &mapped), REFRESH_GAP_MIN);
        // And so does another process under the same pid, and a process seen first
        let other = ProcessInfo {
            start_time_unix_ns: 200,
            ..info.clone()
        };
        assert_eq!(next_gap(Some(&tracked), &other), REFRESH_GAP_MIN);
        assert_eq!(next_gap(None, &info), REFRESH_GAP_MIN);
    }

    fn pids(tracker: &Tracker) -> Vec<u32> {
        let mut pids: Vec<u32> = tracker.procs.keys().copied().collect();
        pids.sort_unstable();
        pids
    }

    #[test]
    fn exited_processes_go_once_no_queued_batch_can_refer_to_them() {
        // Given processes whose last possible batches are 3 and 5
        let mut tracker = Tracker::new(0, 16);
        exited(&mut tracker, 10, 3);
        exited(&mut tracker, 11, 5);
        // When batch 3 is still queued, nothing goes
        assert!(tracker.reap(Some(3), 6).is_empty());
        // When batch 5 was not built yet, only the first goes even with nothing queued
        // (a disconnected sampler whose backlog moved past 3)
        assert_eq!(exit_notices(&tracker.reap(Some(4), 5)), [vec![10]]);
        assert_eq!(pids(&tracker), [11]);
        // When every batch up to 5 was built and sent, the second goes too
        assert_eq!(exit_notices(&tracker.reap(None, 6)), [vec![11]]);
        assert!(pids(&tracker).is_empty());
    }

    /// The pids of each `exited` datagram in `out`.
    fn exit_notices(out: &[Outgoing]) -> Vec<Vec<u32>> {
        decode_all(out)
            .into_iter()
            .filter_map(|m| match m {
                SamplerMessage::Exited { pids } => Some(pids),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_exits_of_one_reap_go_in_one_datagram() {
        // Given 500 processes that exited in one interval (five seconds of 100 starts a second)
        let mut tracker = Tracker::new(0, 16);
        for pid in 1..=500 {
            exited(&mut tracker, pid, 3);
        }
        // When they are reaped
        let out = tracker.reap(None, 4);
        // Then one datagram names them all, oldest first: one wake-up of the relay, one send
        let notices = exit_notices(&out);
        assert_eq!(out.len(), 1);
        assert_eq!(notices, [(1..=500).collect::<Vec<u32>>()]);
        assert_eq!(tracker.len(), 0);
    }

    #[test]
    fn replaced_and_reaped_processes_are_reported_once_for_the_unwinder() {
        // Given a process whose facts were taken, and an exited one
        let mut tracker = Tracker::new(0, 16);
        let info = ProcessInfo {
            pid: 20,
            ..ProcessInfo::default()
        };
        tracker.replace(info, &[], None);
        exited(&mut tracker, 21, 0);
        assert_eq!(tracker.mappings(20), Some(&[][..]));
        // When the exited one is reaped, Then the changes name 20 as changed and 21 as gone,
        // once
        tracker.reap(None, 1);
        assert_eq!(tracker.take_changes(), (vec![20], vec![21]));
        assert_eq!(tracker.take_changes(), (vec![], vec![]));
        assert_eq!(tracker.mappings(21), None);
    }

    #[test]
    fn the_files_the_relay_holds_are_the_files_the_sampler_holds() {
        // Given two files, and a relay-side ledger that holds what `files` passes until a
        // `filesClosed` names it (as the relay's session does, with no counts of its own)
        let files = [TempFile::new("a"), TempFile::new("b")];
        let [a, b] = files
            .each_ref()
            .map(|f| mapping_of(f.path(), f.dev_ino().0, f.dev_ino().1));
        let mut tracker = Tracker::new(0, 16);
        // (closed as soon as unreferenced: the grace has its own test)
        tracker.files.idle_grace = Duration::ZERO;
        let mut relay = std::collections::BTreeSet::new();
        // When process 1 maps a and b, process 2 maps b, process 1's new facts map only a, then
        // process 2 exits (b goes), then process 1 (a goes)
        type Step<'a> = (u32, Option<Vec<Mapping>>, &'a [u64]);
        let steps: [Step<'_>; 5] = [
            (1, Some(vec![a.clone(), b.clone()]), &[]),
            (2, Some(vec![b]), &[]),
            (1, Some(vec![a]), &[]),
            (2, None, &[2]),
            (1, None, &[1]),
        ];
        for (pid, facts, closed) in steps {
            let out = if let Some(mut mappings) = facts {
                let mut fresh = Vec::new();
                (tracker.files).intern_mappings(std::process::id(), &mut mappings, &mut fresh);
                let info = ProcessInfo {
                    pid,
                    mappings,
                    ..ProcessInfo::default()
                };
                tracker.replace(info, &fresh, None)
            } else {
                tracker.procs.get_mut(&pid).expect("tracked").exited_after = Some(0);
                tracker.reap(None, 1)
            };
            let mut seen = Vec::new();
            for message in decode_all(&out) {
                match message {
                    SamplerMessage::Files(files) => relay.extend(files.iter().map(|f| f.file_id)),
                    SamplerMessage::FilesClosed(ids) => {
                        assert!(
                            ids.iter().all(|id| relay.remove(id)),
                            "an unknown file closed"
                        );
                        seen.extend(ids);
                    }
                    _ => {}
                }
            }
            // Then after every step the relay holds exactly what the sampler holds open
            let held: std::collections::BTreeSet<u64> = tracker.files.all().map(|f| f.id).collect();
            assert_eq!((&relay, &seen[..]), (&held, closed), "pid {pid}'s step");
            assert_eq!(
                tracker.files.open_count(),
                held.len(),
                "opened through /proc/self/root"
            );
        }
    }

    /// Interns `mappings` for `pid` and takes them as its facts: the decoded messages.
    fn take_facts(
        tracker: &mut Tracker,
        pid: u32,
        mut mappings: Vec<Mapping>,
    ) -> Vec<SamplerMessage> {
        let mut fresh = Vec::new();
        (tracker.files).intern_mappings(std::process::id(), &mut mappings, &mut fresh);
        let info = ProcessInfo {
            pid,
            mappings,
            ..ProcessInfo::default()
        };
        decode_all(&tracker.replace(info, &fresh, None))
    }

    /// Marks `pid` exited and reaps it: the decoded messages.
    fn exit_and_reap(tracker: &mut Tracker, pid: u32) -> Vec<SamplerMessage> {
        tracker.procs.get_mut(&pid).expect("tracked").exited_after = Some(0);
        decode_all(&tracker.reap(None, 1))
    }

    fn closed(messages: &[SamplerMessage]) -> Vec<u64> {
        messages
            .iter()
            .filter_map(|m| match m {
                SamplerMessage::FilesClosed(ids) => Some(ids.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn a_file_nobody_maps_stays_open_for_the_grace_so_the_next_start_reuses_it() {
        // Given a process that mapped a file and exited, with a short grace
        let files = [TempFile::new("grace-a"), TempFile::new("grace-b")];
        let [a, b] = files
            .each_ref()
            .map(|f| mapping_of(f.path(), f.dev_ino().0, f.dev_ino().1));
        let mut tracker = Tracker::new(0, 1);
        tracker.files.idle_grace = Duration::from_millis(200);
        let first = take_facts(&mut tracker, 1, vec![a.clone()]);
        assert!(matches!(&first[0], SamplerMessage::Files(f) if f.len() == 1));
        let id = tracker.mappings(1).expect("tracked")[0].file_id;
        // When it is reaped, Then its file is not closed yet: still open, still known
        assert_eq!(closed(&exit_and_reap(&mut tracker, 1)), Vec::<u64>::new());
        assert!(tracker.files.has_id(id));
        assert_eq!(tracker.files.open_count(), 1);
        // When the same program starts again, Then it gets the same file: no files message,
        // no new open
        let again = take_facts(&mut tracker, 2, vec![a.clone()]);
        assert!(again.iter().all(|m| !matches!(m, SamplerMessage::Files(_))));
        assert_eq!(tracker.mappings(2).expect("tracked")[0].file_id, id);
        assert_eq!(tracker.files.open_count(), 1);
        // When that one exits too and the grace passes, Then the file is closed, said once
        assert_eq!(closed(&exit_and_reap(&mut tracker, 2)), Vec::<u64>::new());
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(closed(&decode_all(&tracker.reap(None, 1))), vec![id]);
        assert_eq!(
            closed(&decode_all(&tracker.reap(None, 1))),
            Vec::<u64>::new()
        );
        assert!(!tracker.files.has_id(id));
        assert_eq!(tracker.files.open_count(), 0);
        // When the open-file cap (1 here) is reached, Then an idle file makes room at once
        tracker.files.idle_grace = Duration::from_secs(3600);
        take_facts(&mut tracker, 3, vec![a]);
        let id_a = tracker.mappings(3).expect("tracked")[0].file_id;
        exit_and_reap(&mut tracker, 3);
        let messages = take_facts(&mut tracker, 4, vec![b]);
        assert_eq!(closed(&messages), vec![id_a]);
        assert!(messages
            .iter()
            .any(|m| matches!(m, SamplerMessage::Files(f) if f[0].fd != ember_protocol::NO_FD)));
        assert_eq!(tracker.files.unopened, 0);
    }

    #[test]
    fn at_most_the_cap_of_exited_processes_wait() {
        // Given more exited processes than may wait, all still referable by a queued batch
        let mut tracker = Tracker::new(0, 16);
        for pid in 0..(MAX_EXITED_WAITING as u32 + 3) {
            exited(&mut tracker, pid + 1, u64::from(pid) + 10);
        }
        // When reaping with the oldest batch still queued
        let notices = exit_notices(&tracker.reap(Some(0), 1));
        // Then the oldest three went, the cap's worth wait
        assert_eq!(notices, [vec![1, 2, 3]]);
        assert_eq!(tracker.len(), MAX_EXITED_WAITING);
        assert!(!tracker.procs.contains_key(&1) && !tracker.procs.contains_key(&3));
        assert!(tracker.procs.contains_key(&4));
    }

    #[test]
    fn file_caps_leave_files_unopened_and_counted() {
        // Given a table allowing no open file
        let mut table = FileTable::new(0);
        let mut mappings = vec![Mapping {
            start: 0x1000,
            end: 0x2000,
            path: "/usr/lib/x.so".into(),
            device: 1,
            inode: 2,
            ..Mapping::default()
        }];
        let mut fresh = Vec::new();
        // When a process maps a file
        table.intern_mappings(1, &mut mappings, &mut fresh);
        // Then the file is described without an fd, the cap named and counted
        let file = table.by_id(mappings[0].file_id).expect("interned");
        assert!(file.fd.is_none());
        assert!(
            file.info.open_error.contains("cap of 0 open files"),
            "{}",
            file.info.open_error
        );
        assert_eq!(table.unopened, 1);
    }
}
