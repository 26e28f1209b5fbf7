//! Interpreter frames walked at sample time (docs/design/interpreters.md): for a process the
//! sampler put in `INTERP_PROCS`, find the sampled thread's interpreter state, walk its frame
//! chain leaf first with the layout's fixed offsets, store the frames under the hash of their
//! contents and copy each code object they name once per generation.
//!
//! Invariants: every read of the sampled process's memory is a `bpf_probe_read_user` of a fixed
//! or verifier-bounded size at an address computed from the process's own pointers and offsets
//! the sampler checked (all below 4096); the walks are bounded by `bpf_loop` (64 threads,
//! [`MAX_INTERP_FRAMES`] frames). Nothing is parsed here: the relay decodes the raw copies. Each
//! way a walk ends is counted in one `COUNTERS` slot.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_loop, bpf_probe_read_user, bpf_probe_read_user_buf, generated as gen},
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use ember_sampler_ebpf::{
    counter, interp_end, interp_field as field, InterpCode, InterpCodeKey, InterpFrame, InterpProc,
    InterpStack, ERRNO_EEXIST, INTERP_ABSENT, MAX_INTERP_FRAMES, MAX_INTERP_THREADS,
};

use crate::program::bump;

/// Default sizes (the loader keeps them): 4096 processes; 16,384 threads; per generation
/// 2,048 stacks (1,544 bytes each) and 4,096 code objects (776 bytes each).
const PROCS_ENTRIES: u32 = 4096;
const THREADS_ENTRIES: u32 = 16384;
const STACKS_ENTRIES: u32 = 2048;
const CODES_ENTRIES: u32 = 4096;

/// Interpreters to walk, by tgid: written only by the sampler, after its checks.
#[map]
static INTERP_PROCS: HashMap<u32, InterpProc> = HashMap::with_max_entries(PROCS_ENTRIES, 0);
/// tid -> the address of its interpreter thread state, checked on each use.
#[map]
static INTERP_THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(THREADS_ENTRIES, 0);
#[map]
static INTERP_STACKS_0: HashMap<u64, InterpStack> = HashMap::with_max_entries(STACKS_ENTRIES, 0);
#[map]
static INTERP_STACKS_1: HashMap<u64, InterpStack> = HashMap::with_max_entries(STACKS_ENTRIES, 0);
#[map]
static INTERP_CODES_0: HashMap<InterpCodeKey, InterpCode> =
    HashMap::with_max_entries(CODES_ENTRIES, 0);
#[map]
static INTERP_CODES_1: HashMap<InterpCodeKey, InterpCode> =
    HashMap::with_max_entries(CODES_ENTRIES, 0);
/// What each process added to this interval's `INTERP_STACKS` and `INTERP_CODES`, by
/// `tgid << 32 | epoch`: an interval's entries of old epochs age out of the LRU by themselves.
#[map]
static INTERP_SPENT: LruHashMap<u64, Spent> = LruHashMap::with_max_entries(PROCS_ENTRIES, 0);

/// Entries one process may add to an interval's stack and code maps: half of each, so that
/// a process filling them (distinct forged code pointers, endless distinct stacks) spends its own
/// share and leaves the rest to the others.
const STACKS_PER_PROCESS: u32 = STACKS_ENTRIES / 2;
const CODES_PER_PROCESS: u32 = CODES_ENTRIES / 2;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Spent {
    stacks: u32,
    codes: u32,
}

/// Takes one entry of `tgid`'s share for this interval (`codes`: of the code map, else of the
/// stack map); `false` when its share is used up. Counts may race across CPUs by a few entries.
#[inline(always)]
fn spend(tgid: u32, epoch: u32, codes: bool) -> bool {
    let key = u64::from(tgid) << 32 | u64::from(epoch);
    if INTERP_SPENT.get_ptr_mut(&key).is_none() {
        let _ = INTERP_SPENT.insert(
            &key,
            &Spent {
                stacks: 0,
                codes: 0,
            },
            BPF_NOEXIST as u64,
        );
    }
    let Some(spent) = INTERP_SPENT.get_ptr_mut(&key) else {
        return false;
    };
    // SAFETY: a live value of the map for this program run; a racing CPU can only make the
    // count off by its own increment.
    let spent = unsafe { &mut *spent };
    let (count, cap) = if codes {
        (&mut spent.codes, CODES_PER_PROCESS)
    } else {
        (&mut spent.stacks, STACKS_PER_PROCESS)
    };
    if *count >= cap {
        return false;
    }
    *count += 1;
    true
}

/// Per-CPU room to build one stack and one code copy (too large for the 512-byte BPF stack).
#[map]
static INTERP_STACK_SCRATCH: PerCpuArray<InterpStack> = PerCpuArray::with_max_entries(1, 0);
#[map]
static INTERP_CODE_SCRATCH: PerCpuArray<InterpCode> = PerCpuArray::with_max_entries(1, 0);
#[map]
static FRAME_WINDOW: PerCpuArray<Window> = PerCpuArray::with_max_entries(1, 0);
/// Per CPU, the code objects this CPU recently found already copied: a hit skips the lookup in
/// `INTERP_CODES` (half a frame's cost). Direct-mapped by address; a slot is valid for one
/// process and one value of `CONTROL[0]` (each flip starts writing to an emptied map).
#[map]
static SEEN_CODES: PerCpuArray<SeenCodes> = PerCpuArray::with_max_entries(1, 0);

/// Slots of [`SEEN_CODES`] (a power of two).
const SEEN_SLOTS: usize = 256;

#[repr(C)]
pub struct SeenCodes {
    /// (code address, `tgid << 32 | epoch`) per slot.
    slots: [[u64; 2]; SEEN_SLOTS],
}

/// Bytes of a frame read at once: every field the walk needs lies in this window in every
/// CPython from 3.6 (to 3.10 the fields span 88 bytes, from 3.11 under 80).
const WINDOW: usize = 128;

/// One frame's bytes, from its lowest field the walk reads; 8 bytes of slack so that a field
/// at any offset up to [`WINDOW`] is inside the value.
#[repr(C)]
pub struct Window {
    bytes: [u8; WINDOW + 8],
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user copies from user memory with fault handling; any address
    // is safe to pass.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

#[inline(always)]
fn read_u32(addr: u64) -> Option<u32> {
    // SAFETY: as in `read_u64`.
    unsafe { bpf_probe_read_user(addr as *const u32) }.ok()
}

/// A field of the process's interpreter layout.
#[inline(always)]
fn offset(proc: &InterpProc, index: usize) -> u16 {
    proc.layout.get(index).copied().unwrap_or(INTERP_ABSENT)
}

/// What the thread search carries from one thread to the next.
#[repr(C)]
struct ThreadSearch {
    /// The thread state to look at next (0: none left).
    thread: u64,
    /// The thread state found (0: none yet).
    found: u64,
    tid: u32,
    /// 1 when a read failed.
    failed: u32,
    next: u16,
    native_id: u16,
    pthread: u16,
    pthread_tid: u16,
}

/// Whether thread state `thread` is the one of `tid`: its native id, or (to 3.10) the kernel
/// tid inside glibc's `struct pthread` that its `thread_id` points at. `None`: a read failed.
#[inline(always)]
fn is_thread(search: &ThreadSearch, thread: u64) -> Option<bool> {
    if search.native_id != INTERP_ABSENT {
        return Some(read_u32(thread + u64::from(search.native_id))? == search.tid);
    }
    let pthread = read_u64(thread + u64::from(search.pthread))?;
    Some(read_u32(pthread.wrapping_add(u64::from(search.pthread_tid)))? == search.tid)
}

/// One thread of the interpreter's list, run by `bpf_loop`; returns 1 to stop.
#[inline(never)]
extern "C" fn thread_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `ThreadSearch` that `thread_state` passed to bpf_loop, alive for it.
    let search = unsafe { &mut *ctx.cast::<ThreadSearch>() };
    let thread = search.thread;
    if thread == 0 {
        return 1;
    }
    match is_thread(search, thread) {
        Some(true) => {
            search.found = thread;
            return 1;
        }
        Some(false) => {}
        None => {
            search.failed = 1;
            return 1;
        }
    }
    match read_u64(thread + u64::from(search.next)) {
        Some(next) => search.thread = next,
        None => {
            search.failed = 1;
            return 1;
        }
    }
    if search.thread == 0 {
        1
    } else {
        0
    }
}

/// Why no thread state was found.
enum NoThread {
    /// The interpreter does not list the thread (or lists it past the cap).
    Unknown,
    /// A read of the process's memory failed.
    ReadFailed,
}

/// The address of `tid`'s thread state: the cached one if it still is `tid`'s, else the one
/// found in the first interpreter's thread list.
#[inline(always)]
fn thread_state(proc: &InterpProc, tid: u32) -> Result<u64, NoThread> {
    let mut search = ThreadSearch {
        thread: 0,
        found: 0,
        tid,
        failed: 0,
        next: offset(proc, field::THREAD_NEXT),
        native_id: offset(proc, field::THREAD_NATIVE_ID),
        pthread: offset(proc, field::THREAD_PTHREAD),
        pthread_tid: offset(proc, field::PTHREAD_TID),
    };
    // SAFETY: a lookup in a map only this program writes; the value is copied at once.
    if let Some(&cached) = unsafe { INTERP_THREADS.get(&tid) } {
        if is_thread(&search, cached) == Some(true) {
            return Ok(cached);
        }
    }
    let interp = read_u64(proc.root).ok_or(NoThread::ReadFailed)?;
    if interp == 0 {
        return Err(NoThread::Unknown);
    }
    let head = offset(proc, field::INTERP_THREADS_HEAD);
    search.thread = read_u64(interp + u64::from(head)).ok_or(NoThread::ReadFailed)?;
    // SAFETY: `thread_step` only reads and writes `search` through the pointer, during the call.
    unsafe {
        bpf_loop(
            MAX_INTERP_THREADS,
            thread_step as *mut c_void,
            (&mut search as *mut ThreadSearch).cast(),
            0,
        )
    };
    if search.found != 0 {
        // A full LRU evicts an old entry; a failed insert only costs a search next time.
        let _ = INTERP_THREADS.insert(&tid, &search.found, 0);
        return Ok(search.found);
    }
    if search.failed != 0 {
        return Err(NoThread::ReadFailed);
    }
    Err(NoThread::Unknown)
}

/// What the frame walk carries from one frame to the next (on the program's stack: small).
#[repr(C)]
struct FrameWalk {
    /// The frame to read next (0: the walk ended there).
    frame: u64,
    /// Hash of the frames so far.
    hash: u64,
    code_type: u64,
    /// The sample key's tgid (reuse bit included): the code objects' key.
    tgid: u32,
    generation: u32,
    /// `CONTROL[0]` of this sample (its generation in the low bit).
    epoch: u32,
    _pad: u32,
    /// 0 while walking, else an `interp_end` value + 1.
    ended: u32,
    /// Lowest frame field read and the window's length (0: fields too far apart, read each).
    lo: u16,
    len: u16,
    previous: u16,
    code: u16,
    instruction: u16,
    marker: u16,
    tag_mask: u16,
    object_type: u16,
    name: u16,
    filename: u16,
    firstlineno: u16,
    linetable: u16,
}

/// The 8 bytes at `at` (relative to the window's start) of the frame just read.
#[inline(always)]
fn window_u64(window: &Window, at: u16) -> u64 {
    let at = usize::from(at);
    if at > WINDOW {
        return 0;
    }
    // SAFETY: `at + 8 <= WINDOW + 8`, the array's length; an unaligned read of plain bytes.
    unsafe { window.bytes.as_ptr().add(at).cast::<u64>().read_unaligned() }
}

/// A frame's code, instruction, marker and previous frame, with one read when the fields are
/// close together (always, for CPython), else one read each. `None`: a read failed.
#[inline(always)]
fn read_frame(walk: &FrameWalk, window: &mut Window) -> Option<(u64, u64, u8, u64)> {
    let frame = walk.frame;
    if walk.len != 0 {
        let len = u32::from(walk.len);
        if len > WINDOW as u32 {
            return None;
        }
        // SAFETY: copies at most WINDOW bytes (checked just above) into the window, which holds
        // WINDOW + 8; the source is user memory, read with fault handling.
        let ret = unsafe {
            gen::bpf_probe_read_user(
                window.bytes.as_mut_ptr().cast(),
                len,
                (frame + u64::from(walk.lo)) as *const c_void,
            )
        };
        if ret != 0 {
            return None;
        }
        let at = |offset: u16| offset.wrapping_sub(walk.lo);
        let marker = if walk.marker == INTERP_ABSENT {
            0
        } else {
            window_u64(window, at(walk.marker)) as u8
        };
        return Some((
            window_u64(window, at(walk.code)),
            window_u64(window, at(walk.instruction)),
            marker,
            window_u64(window, at(walk.previous)),
        ));
    }
    let code = read_u64(frame + u64::from(walk.code))?;
    let instruction = read_u64(frame + u64::from(walk.instruction))?;
    let marker = if walk.marker == INTERP_ABSENT {
        0
    } else {
        // SAFETY: as in `read_u64`.
        unsafe { bpf_probe_read_user((frame + u64::from(walk.marker)) as *const u8) }.ok()?
    };
    let previous = read_u64(frame + u64::from(walk.previous))?;
    Some((code, instruction, marker, previous))
}

/// One frame of the walk, run by `bpf_loop`: records it, copies its code object if this
/// generation has not yet, moves to the previous frame; returns 1 to stop.
#[inline(never)]
extern "C" fn frame_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `FrameWalk` that `walk` passed to bpf_loop, alive for the loop.
    let walk = unsafe { &mut *ctx.cast::<FrameWalk>() };
    let i = index as usize;
    if i >= MAX_INTERP_FRAMES {
        return 1;
    }
    if walk.frame == 0 {
        walk.ended = interp_end::WHOLE + 1;
        return 1;
    }
    let (Some(stack), Some(window)) = (
        INTERP_STACK_SCRATCH.get_ptr_mut(0),
        FRAME_WINDOW.get_ptr_mut(0),
    ) else {
        walk.ended = interp_end::READ_FAILED + 1;
        return 1;
    };
    // SAFETY: this CPU's scratch slots; perf_event programs do not nest on one CPU.
    let (stack, window) = unsafe { (&mut *stack, &mut *window) };
    let Some((code, instruction, marker, previous)) = read_frame(walk, window) else {
        walk.ended = interp_end::READ_FAILED + 1;
        return 1;
    };
    let code = code & !u64::from(walk.tag_mask);
    if let Some(slot) = stack.frames.get_mut(i) {
        *slot = InterpFrame {
            code,
            instruction,
            marker,
            _pad: [0; 7],
        };
    }
    stack.len = i as u32 + 1;
    let mut hash = walk.hash;
    for word in [code, instruction, u64::from(marker)] {
        hash = (hash ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        hash ^= hash >> 29;
    }
    walk.hash = hash;
    copy_code(walk, code);
    walk.frame = previous;
    if previous == 0 {
        walk.ended = interp_end::WHOLE + 1;
        return 1;
    }
    0
}

/// Copies `N` bytes from `src` into `dst`, or when that fails (the object ends near the end of
/// its page) the bytes up to the page's end, zeroing the rest. Returns whether it read any.
#[inline(always)]
fn copy_object<const N: usize>(dst: &mut [u8; N], src: u64) -> bool {
    // SAFETY: reads user memory with fault handling into a buffer of exactly its length.
    if unsafe { bpf_probe_read_user_buf(src as *const u8, dst) }.is_ok() {
        return true;
    }
    *dst = [0; N];
    let room = 4096 - (src & 4095) as u32;
    if room as usize >= N {
        return false;
    }
    // SAFETY: copies `room < N` bytes into the N-byte buffer, with fault handling.
    let ret =
        unsafe { gen::bpf_probe_read_user(dst.as_mut_ptr().cast(), room, src as *const c_void) };
    ret == 0
}

/// Copies code object `code` into this generation's map unless it is there: its type checked
/// first (a pointer that is not a code object is counted and left unnamed), then its first line
/// and the raw bytes of its name, file name and line table objects.
#[inline(always)]
fn copy_code(walk: &FrameWalk, code: u64) {
    if code == 0 {
        return;
    }
    let tag = u64::from(walk.tgid) << 32 | u64::from(walk.epoch);
    let seen = SEEN_CODES
        .get_ptr_mut(0)
        // SAFETY: this CPU's slot; perf_event programs do not nest on one CPU.
        .and_then(|s| unsafe { (*s).slots.get_mut((code >> 4) as usize & (SEEN_SLOTS - 1)) });
    if let Some(slot) = &seen {
        if slot[0] == code && slot[1] == tag {
            return;
        }
    }
    let mark_seen = |seen: Option<&mut [u64; 2]>| {
        if let Some(slot) = seen {
            *slot = [code, tag];
        }
    };
    let codes = if walk.generation == 0 {
        &INTERP_CODES_0
    } else {
        &INTERP_CODES_1
    };
    let key = InterpCodeKey {
        tgid: walk.tgid,
        _pad: 0,
        code,
    };
    if codes.get_ptr(&key).is_some() {
        mark_seen(seen);
        return;
    }
    if read_u64(code + u64::from(walk.object_type)) != Some(walk.code_type) {
        // Not retried on this CPU for the rest of the interval: 3.13 and 3.14 put `None` in the
        // code slot of every entry (shim) frame, which the relay drops anyway.
        bump(counter::INTERP_BAD_CODE);
        mark_seen(seen);
        return;
    }
    if !spend(walk.tgid, walk.epoch, true) {
        bump(counter::INTERP_CODES_FULL);
        return;
    }
    let Some(copy) = INTERP_CODE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch slot; perf_event programs do not nest on one CPU.
    let copy = unsafe { &mut *copy };
    // SAFETY: as in `read_u64`.
    copy.first_line =
        unsafe { bpf_probe_read_user((code + u64::from(walk.firstlineno)) as *const i32) }
            .unwrap_or(0);
    copy.copied = 0;
    let object = |at: u16| read_u64(code + u64::from(at));
    match object(walk.name) {
        Some(name) if copy_object(&mut copy.name, name) => copy.copied |= 1,
        _ => copy.name = [0; ember_sampler_ebpf::INTERP_NAME_BYTES],
    }
    match object(walk.filename) {
        Some(file) if copy_object(&mut copy.filename, file) => copy.copied |= 2,
        _ => copy.filename = [0; ember_sampler_ebpf::INTERP_FILE_BYTES],
    }
    match object(walk.linetable) {
        Some(lines) if copy_object(&mut copy.linetable, lines) => copy.copied |= 4,
        _ => copy.linetable = [0; ember_sampler_ebpf::INTERP_LINES_BYTES],
    }
    match codes.insert(&key, copy, BPF_NOEXIST as u64) {
        Ok(()) => mark_seen(seen),
        // Another CPU copied it meanwhile: fine.
        Err(err) if err == -ERRNO_EEXIST => mark_seen(seen),
        // The map is full: tried again at the code's next frame.
        Err(_) => bump(counter::INTERP_CODES_FULL),
    }
}

/// Walks the interpreter frames of thread `tid` of process `tgid` if the sampler gave its
/// layout, stores them in generation `generation` and returns their hash (never 0), or 0 when
/// the process has no interpreter to walk, the thread was not found or the map was full.
/// `key_tgid` is the sample key's tgid (with the reuse bit); `epoch` the sampler's flips.
#[inline(always)]
pub fn walk(tgid: u32, tid: u32, key_tgid: u32, generation: u32, epoch: u32) -> u64 {
    // SAFETY: a lookup in a map only the sampler writes; the value stays valid for this run.
    let Some(proc) = (unsafe { INTERP_PROCS.get(&tgid) }) else {
        return 0;
    };
    let thread = match thread_state(proc, tid) {
        Ok(thread) => thread,
        Err(NoThread::Unknown) => {
            bump(counter::INTERP_NO_THREAD);
            return 0;
        }
        Err(NoThread::ReadFailed) => {
            bump(counter::INTERP_READ_FAILED);
            return 0;
        }
    };
    let Some(stack) = INTERP_STACK_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch slot; perf_event programs do not nest on one CPU.
    let stack = unsafe { &mut *stack };
    stack.len = 0;
    stack.end = interp_end::WHOLE;

    let previous = offset(proc, field::FRAME_PREVIOUS);
    let code = offset(proc, field::FRAME_CODE);
    let instruction = offset(proc, field::FRAME_INSTRUCTION);
    let marker = offset(proc, field::FRAME_MARKER);
    // The window: from the lowest field to the end of the highest.
    let mut lo = previous.min(code).min(instruction);
    let mut hi = previous.max(code).max(instruction) + 8;
    if marker != INTERP_ABSENT {
        lo = lo.min(marker);
        hi = hi.max(marker + 1);
    }
    let len = hi - lo;
    let mut walk = FrameWalk {
        frame: 0,
        hash: 0xcbf2_9ce4_8422_2325,
        code_type: proc.code_type,
        tgid: key_tgid,
        generation,
        epoch,
        _pad: 0,
        ended: 0,
        lo,
        len: if usize::from(len) <= WINDOW { len } else { 0 },
        previous,
        code,
        instruction,
        marker,
        tag_mask: offset(proc, field::CODE_TAG_MASK),
        object_type: offset(proc, field::OBJECT_TYPE),
        name: offset(proc, field::CODE_NAME),
        filename: offset(proc, field::CODE_FILENAME),
        firstlineno: offset(proc, field::CODE_FIRSTLINENO),
        linetable: offset(proc, field::CODE_LINETABLE),
    };
    // The current frame: one hop, or two through 3.11's and 3.12's `_PyCFrame`.
    let mut frame = read_u64(thread + u64::from(offset(proc, field::THREAD_FRAME)));
    let hop = offset(proc, field::CFRAME_CURRENT_FRAME);
    if hop != INTERP_ABSENT {
        frame = match frame {
            Some(0) => Some(0),
            Some(cframe) => read_u64(cframe + u64::from(hop)),
            None => None,
        };
    }
    match frame {
        Some(frame) => {
            walk.frame = frame;
            if frame != 0 {
                // SAFETY: `frame_step` only reads and writes `walk` through the pointer, during
                // the call.
                unsafe {
                    bpf_loop(
                        MAX_INTERP_FRAMES as u32,
                        frame_step as *mut c_void,
                        (&mut walk as *mut FrameWalk).cast(),
                        0,
                    )
                };
            } else {
                walk.ended = interp_end::WHOLE + 1;
            }
        }
        None => walk.ended = interp_end::READ_FAILED + 1,
    }
    let end = match walk.ended {
        0 => interp_end::CUT,
        ended => ended - 1,
    };
    bump(match end {
        interp_end::WHOLE => counter::INTERP_WALKED,
        interp_end::CUT => counter::INTERP_CUT,
        _ => counter::INTERP_READ_FAILED,
    });
    stack.end = end;
    let hash = (walk.hash ^ u64::from(end)).max(1);
    let stacks = if generation == 0 {
        &INTERP_STACKS_0
    } else {
        &INTERP_STACKS_1
    };
    if stacks.get_ptr(&hash).is_some() {
        return hash;
    }
    if !spend(key_tgid, epoch, false) {
        bump(counter::INTERP_STACKS_FULL);
        return 0;
    }
    match stacks.insert(&hash, stack, BPF_NOEXIST as u64) {
        Ok(()) => hash,
        Err(err) if err == -ERRNO_EEXIST => hash,
        Err(_) => {
            bump(counter::INTERP_STACKS_FULL);
            0
        }
    }
}
