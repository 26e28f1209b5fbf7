//! Tracks the processes seen in samples: reads their facts on first sight and when a sampled
//! address falls outside their known executable mappings (dlopen, exec), notices exits, and
//! produces the protocol messages (with file descriptors) that describe them.

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    path::Path,
    rc::Rc,
    time::{Duration, Instant},
};

use ember_protocol::{
    encode_sampler_message, transport::MAX_FDS_PER_MESSAGE, FileInfo, ProcessInfo, SamplerMessage,
};

use crate::{
    drain::Drained,
    link::Outgoing,
    procfs::{self, FileTable},
};

struct Tracked {
    info: ProcessInfo,
    exited: bool,
    refreshed: Instant,
}

/// Least time between two re-reads of one process's mappings: frame-pointer walks through code
/// built without frame pointers yield junk addresses that no re-read will cover.
const REFRESH_MIN_GAP: Duration = Duration::from_secs(10);

pub struct Tracker {
    procs: HashMap<u32, Tracked>,
    pub files: FileTable,
    boot_time_unix_ns: u64,
    /// Processes whose facts could not be read (most had exited before the drain).
    pub errors: u64,
}

impl Tracker {
    pub fn new(boot_time_unix_ns: u64) -> Self {
        Self {
            procs: HashMap::new(),
            files: FileTable::default(),
            boot_time_unix_ns,
            errors: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Reads facts for new processes and for processes with addresses outside their mappings;
    /// returns the messages to send before this drain's batches.
    pub fn observe(&mut self, drained: &Drained) -> Vec<Outgoing> {
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
                Some(tracked) => {
                    !tracked.exited
                        && tracked.refreshed.elapsed() >= REFRESH_MIN_GAP
                        && addrs.iter().any(|&a| !covers(&tracked.info, a))
                }
            };
            if stale {
                out.extend(self.refresh(pid));
            }
        }
        out
    }

    fn refresh(&mut self, pid: u32) -> Vec<Outgoing> {
        let mut fresh = Vec::new();
        match procfs::read_process(pid, self.boot_time_unix_ns, &mut self.files, &mut fresh) {
            Ok(info) => {
                let mut out = self.files_messages(&fresh);
                out.push(state(SamplerMessage::Process(info.clone()), Vec::new()));
                if let Some(old) = self.procs.insert(
                    pid,
                    Tracked {
                        info,
                        exited: false,
                        refreshed: Instant::now(),
                    },
                ) {
                    self.files.release(&old.info.mappings);
                }
                out
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
                    exited: true,
                    refreshed: Instant::now(),
                });
                Vec::new()
            }
        }
    }

    /// Files messages for `ids`, each carrying at most [`MAX_FDS_PER_MESSAGE`] descriptors.
    fn files_messages(&self, ids: &[u64]) -> Vec<Outgoing> {
        let mut out = Vec::new();
        for chunk in ids.chunks(MAX_FDS_PER_MESSAGE) {
            let mut infos: Vec<FileInfo> = Vec::with_capacity(chunk.len());
            let mut fds: Vec<Rc<OwnedFd>> = Vec::new();
            for &id in chunk {
                let Some(file) = self.files.by_id(id) else {
                    continue;
                };
                let mut info = file.info.clone();
                if let Some(fd) = &file.fd {
                    info.fd = fds.len() as i32;
                    fds.push(Rc::clone(fd));
                }
                infos.push(info);
            }
            if !infos.is_empty() {
                out.push(state(SamplerMessage::Files(infos), fds));
            }
        }
        out
    }

    /// Marks processes that no longer exist as exited.
    pub fn notice_exits(&mut self) {
        for (pid, tracked) in &mut self.procs {
            if !tracked.exited && !Path::new(&format!("/proc/{pid}")).exists() {
                tracked.exited = true;
            }
        }
    }

    /// Forgets exited processes once no queued batch can refer to them; returns exit notices.
    pub fn reap(&mut self) -> Vec<Outgoing> {
        let gone: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, t)| t.exited)
            .map(|(&pid, _)| pid)
            .collect();
        let mut out = Vec::new();
        for pid in gone {
            if let Some(tracked) = self.procs.remove(&pid) {
                self.files.release(&tracked.info.mappings);
                out.push(state(SamplerMessage::Exited { pid }, Vec::new()));
            }
        }
        out
    }

    /// Everything a newly connected relay needs before the backlog: files, then processes.
    pub fn snapshot(&self) -> Vec<Outgoing> {
        let mut ids: Vec<u64> = self.files.all().map(|f| f.id).collect();
        ids.sort_unstable();
        let mut out = self.files_messages(&ids);
        for tracked in self.procs.values() {
            out.push(state(
                SamplerMessage::Process(tracked.info.clone()),
                Vec::new(),
            ));
        }
        out
    }
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
        batch_samples: None,
    }
}
