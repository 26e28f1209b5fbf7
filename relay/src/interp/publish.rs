//! Tells each sampler where the interpreters of the processes it described keep their frames:
//! an `interpreterProcess` control message (docs/design/interpreters.md) per process that maps
//! a recognized CPython with a usable layout, sent once per (pid, start time, file, root) on the
//! connection's control channel. The sampler checks it and its eBPF program walks the frames.
//!
//! Addresses: the relay knows anchors as ELF virtual addresses of the interpreter file; in the
//! process they are at `base + (v - first_vaddr)`, where `base` is the start of the file's
//! lowest-offset executable mapping minus its file offset (the sampler sends executable
//! mappings only). That holds when the executable segment's `p_vaddr - p_offset` equals the
//! first segment's `p_vaddr` (its offset being 0), as GNU ld lays out every CPython tested:
//! Debian's non-PIE `/usr/bin/python3.11` (0x400000) and pyenv's PIE `libpython3.X.so` (0);
//! the tests check it against where the process really loaded the file.
//!
//! Sends never block the driver's thread: what the socket does not take stays queued per
//! connection (at most [`MAX_PENDING`]; more are dropped and counted) and is retried with the
//! connection's next batch.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    os::fd::{AsFd as _, OwnedFd},
    sync::Arc,
};

use ember_protocol::{
    encode_relay_message, transport, InterpreterProcess, ProcessInfo, RelayMessage,
    INTERP_LAYOUT_ABSENT, INTERP_LAYOUT_LEN, INTERP_MAX_HEAD_OFFSET, INTERP_MAX_OFFSET,
    INTERP_RUNTIME_CPYTHON,
};
use nix::errno::Errno;

use super::{
    cpython::{splice, Interpreter},
    Recognized,
};
use crate::source::ConnectionId;

/// Messages queued per connection at most.
pub(crate) const MAX_PENDING: usize = 4096;

/// Offset of `tid` in glibc's `struct pthread` on x86-64 (a `pthread_t` is its address): how a
/// thread state without `native_thread_id` (to 3.10) is matched to a kernel thread.
pub const GLIBC_PTHREAD_TID_X86_64: u16 = 0x2d0;

/// Where the frames of `info`'s interpreter are: the message for the sampler, from `file_id`
/// (a file the process maps, recognized as `interpreter`), or why there is none.
pub fn interpreter_process(
    info: &ProcessInfo,
    file_id: u64,
    interpreter: &Interpreter,
) -> Result<InterpreterProcess, String> {
    let layout = interpreter.layout.as_ref().map_err(Clone::clone)?;
    let lowest = info
        .mappings
        .iter()
        .filter(|m| file_id != 0 && m.file_id == file_id)
        .min_by_key(|m| m.file_offset)
        .ok_or("the process does not map the interpreter file")?;
    let base = lowest
        .start
        .checked_sub(lowest.file_offset)
        .ok_or("a mapping whose file offset is past its start")?;
    let address = |vaddr: u64| {
        vaddr
            .checked_sub(interpreter.first_vaddr)
            .and_then(|rel| base.checked_add(rel))
            .ok_or("an anchor below the file's first segment")
    };
    let version = interpreter.version;
    let root = if version.minor >= 7 {
        let (Some(runtime), Some(head)) =
            (layout.anchors.runtime, layout.runtime.interpreters_head)
        else {
            return Err(format!(
                "CPython {version}: no _PyRuntime interpreters list"
            ));
        };
        address(runtime.checked_add(head).ok_or("_PyRuntime overflows")?)?
    } else {
        let head = layout.anchors.interp_head.ok_or_else(|| {
            format!(
                "CPython {version}: no interp_head symbol (a stripped file): its interpreter \
                 list cannot be found"
            )
        })?;
        address(head)?
    };
    let code_type = address(layout.anchors.code_type.ok_or("no PyCode_Type symbol")?)?;
    Ok(InterpreterProcess {
        pid: info.pid,
        start_time_unix_ns: info.start_time_unix_ns,
        file_id,
        runtime: INTERP_RUNTIME_CPYTHON,
        root,
        code_type,
        layout: layout_offsets(interpreter)?,
        forget: false,
    })
}

/// The layout's offsets in the order of docs/design/interpreters.md.
fn layout_offsets(interpreter: &Interpreter) -> Result<[u16; INTERP_LAYOUT_LEN], String> {
    let layout = interpreter.layout.as_ref().map_err(Clone::clone)?;
    let (t, f, c) = (&layout.thread, &layout.frame, &layout.code);
    let native = t.native_thread_id;
    // 3.11 marks the first frame of an eval loop call with `is_entry`, 3.12 on with a frame
    // the C stack owns; to 3.10 one frame is one call (no marker).
    let marker = splice::marker_offset(interpreter.version, layout);
    let fields: [Option<u64>; INTERP_LAYOUT_LEN] = [
        Some(layout.interpreter.threads_head),
        Some(t.next),
        native,
        Some(t.thread_id),
        native
            .is_none()
            .then_some(u64::from(GLIBC_PTHREAD_TID_X86_64)),
        Some(t.frame),
        t.cframe_current_frame,
        Some(f.previous),
        Some(f.code),
        Some(f.instruction),
        marker,
        Some(f.code_tag_mask),
        Some(c.qualname.unwrap_or(c.name)),
        Some(c.filename),
        Some(c.firstlineno),
        Some(c.linetable),
        // `ob_type` in every object (after `ob_refcnt`).
        Some(8),
    ];
    let mut out = [INTERP_LAYOUT_ABSENT; INTERP_LAYOUT_LEN];
    for (i, (slot, field)) in out.iter_mut().zip(fields).enumerate() {
        // The sampler's bounds (sampler/src/interp.rs): refused here with a reason rather than
        // there with a count.
        let max = if i == 0 {
            INTERP_MAX_HEAD_OFFSET
        } else {
            INTERP_MAX_OFFSET
        };
        if let Some(offset) = field {
            *slot = u16::try_from(offset)
                .ok()
                .filter(|&o| o <= max)
                .ok_or_else(|| {
                    format!("layout field {i} is {offset} bytes in, over the sampler's {max}")
                })?;
        }
    }
    Ok(out)
}

/// The CPython among a process's recognized files to describe: a shared library's first (an
/// executable linked against libpython may be recognized too, but the frames are libpython's).
pub fn choose(runtimes: &[(u64, Arc<Recognized>)]) -> Option<(u64, &Interpreter)> {
    let cpythons = runtimes.iter().map(|(id, r)| match r.as_ref() {
        Recognized::CPython(i) => (*id, i),
    });
    let mut best: Option<(u64, &Interpreter)> = None;
    for (id, interpreter) in cpythons {
        let better = match best {
            None => true,
            Some((_, b)) => interpreter.shared_library && !b.shared_library,
        };
        if better {
            best = Some((id, interpreter));
        }
    }
    best
}

/// One connection's queue, and what it was sent, by pid.
struct Outbox {
    control: Arc<OwnedFd>,
    pending: VecDeque<InterpreterProcess>,
    described: HashMap<u32, InterpreterProcess>,
}

/// Every connection's `interpreterProcess` messages, and what became of them.
#[derive(Default)]
pub(crate) struct InterpPublisher {
    outboxes: HashMap<ConnectionId, Outbox>,
    /// Reasons already logged (each once per relay run).
    logged: HashSet<String>,
    /// Messages handed to a socket, since start.
    pub(crate) sent: u64,
    /// Messages dropped: over [`MAX_PENDING`], or the socket failed.
    pub(crate) dropped: u64,
    /// `--interpreters off`: no sampler is told of any interpreter, so none is walked.
    pub(crate) off: bool,
}

/// Whether two messages are the same claim: (pid, start time, file, root).
fn same_claim(a: &InterpreterProcess, b: &InterpreterProcess) -> bool {
    (a.pid, a.start_time_unix_ns, a.file_id, a.root)
        == (b.pid, b.start_time_unix_ns, b.file_id, b.root)
}

impl InterpPublisher {
    /// A sampler connected; `control` is its sending side.
    pub(crate) fn connected(&mut self, conn: ConnectionId, control: Arc<OwnedFd>) {
        if self.off {
            return;
        }
        self.outboxes.insert(
            conn,
            Outbox {
                control,
                pending: VecDeque::new(),
                described: HashMap::new(),
            },
        );
    }

    /// The connection ended (the sampler forgets its entries itself).
    pub(crate) fn closed(&mut self, conn: ConnectionId) {
        self.outboxes.remove(&conn);
    }

    /// The process exited (the sampler forgets its entry itself).
    pub(crate) fn exited(&mut self, conn: ConnectionId, pid: u32) {
        if let Some(outbox) = self.outboxes.get_mut(&conn) {
            outbox.described.remove(&pid);
        }
    }

    /// New facts of a process (`runtimes`: its recognized files): describes its interpreter if
    /// it has one not described yet, withdraws the one described before if it has none now.
    pub(crate) fn process(
        &mut self,
        conn: ConnectionId,
        info: &ProcessInfo,
        runtimes: &[(u64, Arc<Recognized>)],
    ) {
        let Some(outbox) = self.outboxes.get_mut(&conn) else {
            return;
        };
        let message = choose(runtimes).map(|(id, i)| interpreter_process(info, id, i));
        let before = outbox.described.get(&info.pid).copied();
        match message {
            Some(Ok(message)) => {
                if before.is_some_and(|b| same_claim(&b, &message)) {
                    return;
                }
                outbox.described.insert(info.pid, message);
                if outbox.pending.len() < MAX_PENDING {
                    outbox.pending.push_back(message);
                } else {
                    self.dropped += 1;
                }
            }
            Some(Err(reason)) => {
                if self.logged.insert(reason.clone()) {
                    tracing::info!(
                        pid = info.pid,
                        name = %info.executable_name,
                        %reason,
                        "a recognized CPython whose frames the kernel cannot walk (logged once \
                         per reason): its samples keep the interpreter's C frames"
                    );
                }
                outbox.described.remove(&info.pid);
            }
            None => {
                outbox.described.remove(&info.pid);
            }
        }
        let stale = before.filter(|b| {
            b.start_time_unix_ns == info.start_time_unix_ns
                && !outbox.described.contains_key(&info.pid)
        });
        if let Some(before) = stale {
            if outbox.pending.len() < MAX_PENDING {
                outbox.pending.push_back(InterpreterProcess {
                    forget: true,
                    ..before
                });
            } else {
                self.dropped += 1;
            }
        }
        self.flush(conn);
    }

    /// Sends `conn`'s queue, oldest first, without waiting: on EAGAIN the rest stays queued.
    pub(crate) fn flush(&mut self, conn: ConnectionId) {
        let Some(outbox) = self.outboxes.get_mut(&conn) else {
            return;
        };
        while let Some(message) = outbox.pending.front() {
            let bytes = encode_relay_message(&RelayMessage::InterpreterProcess(*message));
            match transport::send(outbox.control.as_fd(), &bytes, &[], true) {
                Ok(()) => {
                    tracing::debug!(
                        connection = conn,
                        pid = message.pid,
                        file_id = message.file_id,
                        root = format_args!("{:#x}", message.root),
                        forget = message.forget,
                        "interpreter described to the sampler"
                    );
                    outbox.pending.pop_front();
                    self.sent += 1;
                }
                Err(Errno::EAGAIN) => return,
                Err(err) => {
                    // The connection is ending; the source will report it.
                    self.dropped += outbox.pending.len() as u64;
                    outbox.pending.clear();
                    tracing::debug!(connection = conn, %err, "could not send interpreterProcess");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
