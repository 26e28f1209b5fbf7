//! Incremental reader of jitdump files (`jit-<pid>.dump`), the format `perf inject --jit` reads:
//! CPython 3.13+ writes one with `-X perf_jit`, Node with `--perf-prof`, and both map it
//! executable so profilers find it among the process's mappings.
//!
//! The file is a header (magic `JiTD` in the writer's byte order, version, header size, ...)
//! followed by records, each with a common header (id, total size, timestamp). A `CODE_LOAD`
//! record names a piece of code and carries its bytes; a `CODE_MOVE` moves one; a `DEBUG_INFO`
//! record gives the source lines of the next `CODE_LOAD` at its address; `UNWINDING_INFO`,
//! `CLOSE` and unknown records are skipped (as perf does).
//!
//! Invariants, since the file is written by the process it describes and may be hostile:
//! - Only positional reads (`pread`) through the shared descriptor, from the offset reached so
//!   far; at most `max_bytes` read per call, into one reused buffer of at most [`WINDOW`] bytes
//!   (and one of about 1 KiB for moves). Code bytes are skipped by offset, never read unless
//!   they happen to lie in the window beside the records around them.
//! - Every size the file claims is checked against [`Limits`] and the file's length before it is
//!   used; nothing is allocated by a claimed size. A record whose size cannot be (shorter than its
//!   own fields, longer than [`Limits::max_record`], code longer than the record) stops the
//!   reader for good ([`JitReadError::Malformed`], also on every later call): its framing can no
//!   longer be trusted, and what was read before it stays valid.
//! - A record not yet wholly in the file (its size reaches past the end) is left for the next
//!   call; so is one whose fields did not fit in this call's budget.
//! - Names are cut at [`Limits::max_name`] bytes and decoded lossily; what the header claims
//!   (pid, machine, timestamps) is not used: the process's identity is what the kernel says.
//! - `CODE_MOVE` needs the moved code's name: the reader remembers where the last
//!   [`MAX_TRACKED`] loads are in the file (not their names) and reads the name again from
//!   there, exactly the bytes it parses, for at most [`MAX_MOVES_PER_CALL`] moves a call.

use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    os::unix::fs::FileExt as _,
};

use super::{JitEntry, JitReadError, JitSource};

/// The magic number, `JiTD` as a u32 in the writer's byte order.
pub const MAGIC: u32 = 0x4A69_5444;
/// The one format version perf reads (and every runtime writes).
const VERSION: u32 = 1;
/// The file header's fields: magic, version, total size, ELF machine, pad, pid, timestamp, flags.
const FILE_HEADER: u32 = 40;
/// Largest file header accepted (the header's own size field; the rest of it is skipped).
const MAX_FILE_HEADER: u32 = 4096;

/// Record ids.
const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const DEBUG_INFO: u32 = 2;
const CLOSE: u32 = 3;

/// The common record header: id, total size, timestamp.
const RECORD_HEADER: u32 = 16;
/// A `CODE_LOAD` up to its name: header, pid, tid, vma, code address, code size, code index.
const LOAD_FIELDS: u32 = RECORD_HEADER + 8 + 4 * 8;
/// A `CODE_MOVE`: header, pid, tid, vma, old and new code address, code size, code index.
const MOVE_FIELDS: u32 = RECORD_HEADER + 8 + 5 * 8;
/// A `DEBUG_INFO` up to its entries: header, code address, number of entries.
const DEBUG_FIELDS: u32 = RECORD_HEADER + 2 * 8;
/// A debug entry up to its file name: address, line, discriminator.
const DEBUG_ENTRY_FIELDS: u32 = 8 + 4 + 4;
/// The smallest debug entry: its fields and an empty file name's NUL.
const DEBUG_ENTRY_MIN: u64 = DEBUG_ENTRY_FIELDS as u64 + 1;
/// A debug entry's file name of this one byte means "the previous entry's file" (perf's rule).
const SAME_FILE: u8 = 0xff;

/// Bytes read per `pread`: the window records are parsed from.
pub const WINDOW: usize = 64 * 1024;
/// Moves handled per call: each reads its code's load (and debug) record again.
pub const MAX_MOVES_PER_CALL: usize = 256;
/// Code loads whose place in the file is remembered for a later `CODE_MOVE` (the oldest are
/// forgotten first): their offsets, not their names; about 1.5 MiB at most, for a file that
/// loaded that much code.
pub const MAX_TRACKED: usize = 16 * 1024;

/// The reader's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest name or file name kept, in bytes (longer ones are cut).
    pub max_name: u32,
    /// Largest record accepted, code bytes included (they are skipped unread).
    pub max_record: u32,
    /// Most entries a `DEBUG_INFO` record may claim; one claiming more gives no source.
    pub max_debug_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // Python names are `py::qualname:path`; a path may be long, a name past 1 KiB is
            // noise in a flame graph.
            max_name: 1024,
            // V8's largest code objects are a few hundred KiB; CPython's trampolines 15 bytes.
            max_record: 16 * 1024 * 1024,
            // V8 writes one entry per source position: thousands for a large function.
            max_debug_entries: 1 << 20,
        }
    }
}

/// What one reader has done, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes read from the file (code bytes skipped are not read).
    pub bytes_read: u64,
    /// Records consumed, of every kind.
    pub records: u64,
    /// Entries handed out (loads and moves).
    pub entries: u64,
    /// Names cut at [`Limits::max_name`].
    pub names_cut: u64,
    /// Moves of code the reader did not know (never loaded, or forgotten).
    pub moves_unknown: u64,
    /// Debug records ignored (too many entries, no usable first entry).
    pub debug_ignored: u64,
}

/// Source file and line, as [`JitEntry::source`] holds them.
type Source = (String, u32);

/// A `DEBUG_INFO` record waiting for its `CODE_LOAD`.
#[derive(Clone, Debug)]
struct PendingDebug {
    code_addr: u64,
    /// Where the record is in the file.
    offset: u64,
    source: Source,
}

/// Where a loaded piece of code's records are in the file, for a later move.
#[derive(Clone, Copy, Debug)]
struct Tracked {
    load: u64,
    debug: Option<u64>,
    /// Insertion number, matched against [`Moves::order`] entries.
    seq: u64,
}

/// Code loads by address, the oldest forgotten past [`MAX_TRACKED`].
#[derive(Default)]
struct Moves {
    by_addr: HashMap<u64, Tracked>,
    /// (address, seq) in insertion order; entries whose seq no longer matches are stale.
    order: VecDeque<(u64, u64)>,
    next_seq: u64,
}

impl Moves {
    fn insert(&mut self, addr: u64, load: u64, debug: Option<u64>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_addr.insert(addr, Tracked { load, debug, seq });
        self.order.push_back((addr, seq));
        while self.by_addr.len() > MAX_TRACKED {
            let Some((old, old_seq)) = self.order.pop_front() else {
                break;
            };
            if self.by_addr.get(&old).is_some_and(|t| t.seq == old_seq) {
                self.by_addr.remove(&old);
            }
        }
        // Moves leave stale queue entries behind: drop them before they outnumber the live ones.
        if self.order.len() > 2 * MAX_TRACKED {
            let by_addr = &self.by_addr;
            self.order
                .retain(|(a, s)| by_addr.get(a).is_some_and(|t| t.seq == *s));
        }
    }

    fn take(&mut self, addr: u64) -> Option<Tracked> {
        self.by_addr.remove(&addr)
    }
}

/// A jitdump file read incrementally: one per file (per process), kept between calls.
pub struct JitDump {
    limits: Limits,
    /// The next byte to read: 0 until the header is read, then the next record's start.
    offset: u64,
    /// The header was read: the file's byte order.
    big_endian: Option<bool>,
    /// A `CLOSE` record was read: nothing more is read.
    closed: bool,
    /// The reader stopped for good, and why.
    failed: Option<&'static str>,
    pending: Option<PendingDebug>,
    moves: Moves,
    /// The window's buffer, reused across calls.
    buf: Vec<u8>,
    /// The buffer of the records a move reads again.
    scratch: Vec<u8>,
    stats: Stats,
}

impl Default for JitDump {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl JitDump {
    /// A reader with these bounds (a name bound past half the window is lowered to it, so the
    /// fields read of any record fit in the window).
    pub fn new(limits: Limits) -> Self {
        let limits = Limits {
            max_name: limits.max_name.min(WINDOW as u32 / 2),
            ..limits
        };
        Self {
            limits,
            offset: 0,
            big_endian: None,
            closed: false,
            failed: None,
            pending: None,
            moves: Moves::default(),
            buf: Vec::new(),
            scratch: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// What this reader has done so far.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "the tests' figures; the store counts what it consumes"
        )
    )]
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The file offset read up to (the header and every whole record before it).
    #[cfg_attr(
        not(any(test, feature = "fuzzing")),
        expect(dead_code, reason = "the tests' and the fuzz target's check")
    )]
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn fail(&mut self, reason: &'static str) -> JitReadError {
        self.failed = Some(reason);
        JitReadError::Malformed(reason)
    }

    /// Reads and checks the file header; Ok(false) while it is not wholly written.
    fn read_header(&mut self, win: &mut Window<'_>) -> Result<bool, JitReadError> {
        let Some(head) = win.get(0, 4)? else {
            return Ok(false);
        };
        let magic = [head[0], head[1], head[2], head[3]];
        let big_endian = if u32::from_le_bytes(magic) == MAGIC {
            false
        } else if u32::from_be_bytes(magic) == MAGIC {
            true
        } else {
            return Err(self.fail("not a jitdump file (no JiTD magic)"));
        };
        let Some(head) = win.get(0, FILE_HEADER)? else {
            return Ok(false);
        };
        let fields = Fields { big_endian };
        if fields.u32(head, 4) != VERSION {
            return Err(self.fail("unsupported jitdump version"));
        }
        let size = fields.u32(head, 8);
        if !(FILE_HEADER..=MAX_FILE_HEADER).contains(&size) {
            return Err(self.fail("impossible file header size"));
        }
        if u64::from(size) > win.len {
            return Ok(false);
        }
        self.big_endian = Some(big_endian);
        self.offset = u64::from(size);
        Ok(true)
    }

    /// The name of a `CODE_LOAD` record of `size` bytes whose bytes from the start are `record`
    /// (at least its fields, at most its fields and a name of the bound): the code is the
    /// record's last `code_size` bytes and the name the NUL-terminated bytes before it.
    fn load_name(
        &mut self,
        record: &[u8],
        size: u32,
        code_size: u64,
    ) -> Result<String, JitReadError> {
        let Some(region) = size
            .checked_sub(LOAD_FIELDS)
            .and_then(|room| u64::from(room).checked_sub(code_size))
        else {
            return Err(self.fail("code load's code beyond its record"));
        };
        let read = record.get(LOAD_FIELDS as usize..).unwrap_or_default();
        let read = &read[..read
            .len()
            .min(usize::try_from(region).unwrap_or(usize::MAX))];
        match cut_name(read, region, self.limits.max_name) {
            Name::Whole(name) => Ok(name),
            Name::Cut(name) => {
                self.stats.names_cut += 1;
                Ok(name)
            }
            Name::Unterminated => Err(self.fail("code load name without NUL")),
        }
    }

    /// Parses a `DEBUG_INFO` record's fields and first entry: (code address, source). The
    /// record's bytes from the start are `record` (at least its fields).
    fn debug_source(
        &mut self,
        fields: Fields,
        record: &[u8],
        size: u32,
    ) -> Result<(u64, Option<Source>), JitReadError> {
        let code_addr = fields.u64(record, 16);
        let entries = fields.u64(record, 24);
        let Some(room) = size.checked_sub(DEBUG_FIELDS).map(u64::from) else {
            return Err(self.fail("record shorter than its fields"));
        };
        if entries > room / DEBUG_ENTRY_MIN {
            return Err(self.fail("debug entries beyond their record"));
        }
        if entries == 0 || entries > self.limits.max_debug_entries {
            self.stats.debug_ignored += 1;
            return Ok((code_addr, None));
        }
        // The first entry is the code's start (entries are in address order).
        let entry = record.get(DEBUG_FIELDS as usize..).unwrap_or_default();
        let line = fields.u32(entry, 8);
        let name_room = room.saturating_sub(u64::from(DEBUG_ENTRY_FIELDS));
        let read = entry.get(DEBUG_ENTRY_FIELDS as usize..).unwrap_or_default();
        let read = &read[..read
            .len()
            .min(usize::try_from(name_room).unwrap_or(usize::MAX))];
        let file = match cut_name(read, name_room, self.limits.max_name) {
            Name::Whole(file) => file,
            Name::Cut(file) => {
                self.stats.names_cut += 1;
                file
            }
            Name::Unterminated => return Err(self.fail("debug file name without NUL")),
        };
        // A negative line (the field is a C int) or "same file as before" on the first entry.
        if i32::try_from(line).is_err() || read.first() == Some(&SAME_FILE) || file.is_empty() {
            self.stats.debug_ignored += 1;
            return Ok((code_addr, None));
        }
        Ok((code_addr, Some((file, line))))
    }

    /// The bytes of the record of `size` bytes at `at` that the reader parses: its fields and at
    /// most a name of the bound (or the whole record when shorter).
    fn wanted(&self, id: u32, size: u32) -> u32 {
        let name = self.limits.max_name.saturating_add(1);
        let want = match id {
            CODE_LOAD => LOAD_FIELDS.saturating_add(name),
            CODE_MOVE => MOVE_FIELDS,
            DEBUG_INFO => DEBUG_FIELDS
                .saturating_add(DEBUG_ENTRY_FIELDS)
                .saturating_add(name),
            _ => RECORD_HEADER,
        };
        want.min(size)
    }

    /// The entry of the `CODE_LOAD` record at `load` (and the `DEBUG_INFO` at `debug`), read
    /// again from the file for a move (checked again: the process may have rewritten it). None
    /// when this call's budget does not reach it.
    fn reread(
        &mut self,
        win: &mut Window<'_>,
        fields: Fields,
        load: u64,
        debug: Option<u64>,
    ) -> Result<Option<(String, Option<Source>)>, JitReadError> {
        // Read through a window of its own, exactly the bytes parsed, so that a move costs
        // about 2 KiB of reads and leaves the main window where the records are.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let mut small = Window {
            file: win.file,
            buf: &mut scratch,
            at: 0,
            len: win.len,
            budget: win.budget,
            read: 0,
            // A record's header and parsed part in one read.
            chunk: u64::from(self.wanted(CODE_LOAD, u32::MAX)),
        };
        let result = self.reread_through(&mut small, fields, load, debug);
        win.budget -= small.read;
        win.read += small.read;
        self.scratch = scratch;
        result
    }

    fn reread_through(
        &mut self,
        win: &mut Window<'_>,
        fields: Fields,
        load: u64,
        debug: Option<u64>,
    ) -> Result<Option<(String, Option<Source>)>, JitReadError> {
        let Some(record) = self.record_at(win, fields, load, CODE_LOAD)? else {
            return Ok(None);
        };
        let size = fields.u32(record, 4);
        let code_size = fields.u64(record, 40);
        let name = self.load_name(record, size, code_size)?;
        let source = match debug {
            Some(at) => {
                let Some(record) = self.record_at(win, fields, at, DEBUG_INFO)? else {
                    return Ok(None);
                };
                let size = fields.u32(record, 4);
                self.debug_source(fields, record, size)?.1
            }
            None => None,
        };
        Ok(Some((name, source)))
    }

    /// The parsed part ([`JitDump::wanted`]) of the record at `at`, read before, which must be
    /// of kind `id`.
    fn record_at<'w>(
        &mut self,
        win: &'w mut Window<'_>,
        fields: Fields,
        at: u64,
        id: u32,
    ) -> Result<Option<&'w [u8]>, JitReadError> {
        let Some(head) = win.get(at, RECORD_HEADER)? else {
            return Ok(None);
        };
        let size = fields.u32(head, 4);
        if fields.u32(head, 0) != id || size < minimum(id) || size > self.limits.max_record {
            return Err(self.fail("a record read before was rewritten"));
        }
        win.get(at, self.wanted(id, size))
    }

    fn read_records(
        &mut self,
        win: &mut Window<'_>,
        out: &mut dyn FnMut(JitEntry),
    ) -> Result<(), JitReadError> {
        let Some(big_endian) = self.big_endian else {
            return Ok(());
        };
        let fields = Fields { big_endian };
        let mut moves = 0;
        while !self.closed {
            let at = self.offset;
            let Some(head) = win.get(at, RECORD_HEADER)? else {
                return Ok(());
            };
            let id = fields.u32(head, 0);
            let size = fields.u32(head, 4);
            if size < RECORD_HEADER {
                return Err(self.fail("record shorter than its header"));
            }
            if size > self.limits.max_record {
                return Err(self.fail("record larger than the bound"));
            }
            if size < minimum(id) {
                return Err(self.fail("record shorter than its fields"));
            }
            let end = at + u64::from(size);
            if end > win.len {
                // Not wholly written yet.
                return Ok(());
            }
            let want = self.wanted(id, size);
            let Some(record) = win.get(at, want)? else {
                return Ok(());
            };
            match id {
                CODE_LOAD => {
                    let code_addr = fields.u64(record, 32);
                    let code_size = fields.u64(record, 40);
                    if code_addr.checked_add(code_size).is_none() {
                        return Err(self.fail("code load's code wraps around"));
                    }
                    let name = self.load_name(record, size, code_size)?;
                    let (source, debug) = match self.pending.take() {
                        Some(p) if p.code_addr == code_addr => (Some(p.source), Some(p.offset)),
                        _ => (None, None),
                    };
                    self.moves.insert(code_addr, at, debug);
                    self.stats.entries += 1;
                    out(JitEntry {
                        start: code_addr,
                        size: code_size,
                        name,
                        source,
                    });
                }
                CODE_MOVE => {
                    let old = fields.u64(record, 32);
                    let new = fields.u64(record, 40);
                    let code_size = fields.u64(record, 48);
                    if new.checked_add(code_size).is_none() {
                        return Err(self.fail("code move's code wraps around"));
                    }
                    if moves == MAX_MOVES_PER_CALL {
                        // Each costs re-reads: the rest wait for the next call.
                        return Ok(());
                    }
                    match self.moves.take(old) {
                        Some(tracked) => {
                            moves += 1;
                            match self.reread(win, fields, tracked.load, tracked.debug)? {
                                Some((name, source)) => {
                                    self.moves.insert(new, tracked.load, tracked.debug);
                                    self.stats.entries += 1;
                                    out(JitEntry {
                                        start: new,
                                        size: code_size,
                                        name,
                                        source,
                                    });
                                }
                                None => {
                                    // Out of budget: the move is read again next call.
                                    self.moves.insert(old, tracked.load, tracked.debug);
                                    return Ok(());
                                }
                            }
                        }
                        None => self.stats.moves_unknown += 1,
                    }
                }
                DEBUG_INFO => {
                    let (code_addr, source) = self.debug_source(fields, record, size)?;
                    // Only the last one waits: runtimes write it just before its code load.
                    self.pending = source.map(|source| PendingDebug {
                        code_addr,
                        offset: at,
                        source,
                    });
                }
                CLOSE => self.closed = true,
                // UNWINDING_INFO and ids this reader does not know: skipped, as perf does.
                _ => {}
            }
            self.offset = end;
            self.stats.records += 1;
        }
        Ok(())
    }
}

impl JitSource for JitDump {
    fn read_new(
        &mut self,
        file: &File,
        max_bytes: u64,
        out: &mut dyn FnMut(JitEntry),
    ) -> Result<u64, JitReadError> {
        if let Some(reason) = self.failed {
            return Err(JitReadError::Malformed(reason));
        }
        if self.closed {
            return Ok(0);
        }
        let len = file.metadata().map_err(JitReadError::Io)?.len();
        let start = self.offset;
        let mut buf = std::mem::take(&mut self.buf);
        // What it held was read by an earlier call, at another offset: read again.
        buf.clear();
        let mut win = Window {
            file,
            buf: &mut buf,
            at: 0,
            len,
            budget: max_bytes,
            read: 0,
            chunk: WINDOW as u64,
        };
        let result = match self.big_endian {
            Some(_) => self.read_records(&mut win, out),
            None => match self.read_header(&mut win) {
                Ok(true) => self.read_records(&mut win, out),
                Ok(false) => Ok(()),
                Err(err) => Err(err),
            },
        };
        self.stats.bytes_read += win.read;
        self.buf = buf;
        result.map(|()| self.offset - start)
    }
}

/// The size of a record of kind `id` up to its variable part.
fn minimum(id: u32) -> u32 {
    match id {
        CODE_LOAD => LOAD_FIELDS,
        CODE_MOVE => MOVE_FIELDS,
        DEBUG_INFO => DEBUG_FIELDS,
        _ => RECORD_HEADER,
    }
}

/// Reads of the file through one reused buffer, bounded by the file's length and the call's
/// budget.
struct Window<'a> {
    file: &'a File,
    buf: &'a mut Vec<u8>,
    /// The file offset of `buf[0]`.
    at: u64,
    /// The file's length at the call's start: nothing past it is read.
    len: u64,
    /// Bytes this call may still read.
    budget: u64,
    /// Bytes this call read.
    read: u64,
    /// Bytes read at once when what is asked is not held (at least what is asked).
    chunk: u64,
}

impl Window<'_> {
    /// The `n` bytes at file offset `at` (`n` at most [`WINDOW`]), reading them when the window
    /// does not hold them; None when the file ends or the budget runs out before them.
    fn get(&mut self, at: u64, n: u32) -> Result<Option<&[u8]>, JitReadError> {
        let n = n as usize;
        if n > WINDOW {
            return Ok(None);
        }
        let Some(end) = at.checked_add(n as u64) else {
            return Ok(None);
        };
        if end > self.len {
            return Ok(None);
        }
        let held = at >= self.at && end <= self.at + self.buf.len() as u64;
        if !held {
            // Read as much as the chunk, the file and the budget allow, at least `n`.
            let want = self.chunk.max(n as u64).min(self.len - at).min(self.budget);
            if want < n as u64 {
                return Ok(None);
            }
            // `want` is at most WINDOW (callers ask at most that much), so the buffer never
            // grows past it.
            let want = want as usize;
            self.buf.clear();
            self.buf.resize(want, 0);
            let mut filled = 0;
            while filled < want {
                match self
                    .file
                    .read_at(&mut self.buf[filled..], at + filled as u64)
                {
                    Ok(0) => break,
                    Ok(k) => filled += k,
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(err) => {
                        self.buf.clear();
                        return Err(JitReadError::Io(err));
                    }
                }
            }
            self.buf.truncate(filled);
            self.at = at;
            self.budget -= filled as u64;
            self.read += filled as u64;
            if filled < n {
                // The file shrank since its length was read.
                return Ok(None);
            }
        }
        let from = (at - self.at) as usize;
        Ok(self.buf.get(from..from + n))
    }
}

/// Integer fields in the file's byte order.
#[derive(Clone, Copy)]
struct Fields {
    big_endian: bool,
}

impl Fields {
    /// The `N` bytes at `at` of `bytes` (zeros past the end: callers read only checked offsets).
    fn raw<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
        bytes
            .get(at..at.saturating_add(N))
            .and_then(|b| <[u8; N]>::try_from(b).ok())
            .unwrap_or([0; N])
    }

    /// The u32 at `at` of `bytes` (0 past the end).
    fn u32(self, bytes: &[u8], at: usize) -> u32 {
        let raw = Self::raw(bytes, at);
        if self.big_endian {
            u32::from_be_bytes(raw)
        } else {
            u32::from_le_bytes(raw)
        }
    }

    /// The u64 at `at` of `bytes` (0 past the end).
    fn u64(self, bytes: &[u8], at: usize) -> u64 {
        let raw = Self::raw(bytes, at);
        if self.big_endian {
            u64::from_be_bytes(raw)
        } else {
            u64::from_le_bytes(raw)
        }
    }
}

/// A NUL-terminated name as read.
enum Name {
    Whole(String),
    /// Longer than the bound: its first bytes.
    Cut(String),
    /// No NUL in the room the record gives it.
    Unterminated,
}

/// The name at the start of `read`, the first bytes of a room of `room` bytes, at most `max`
/// bytes kept.
fn cut_name(read: &[u8], room: u64, max: u32) -> Name {
    let max = max as usize;
    match read.iter().position(|&b| b == 0) {
        Some(end) if end <= max => Name::Whole(String::from_utf8_lossy(&read[..end]).into_owned()),
        Some(_) => Name::Cut(String::from_utf8_lossy(&read[..max]).into_owned()),
        // The whole room was read and holds no NUL.
        None if read.len() as u64 >= room => Name::Unterminated,
        None => Name::Cut(String::from_utf8_lossy(&read[..max.min(read.len())]).into_owned()),
    }
}

#[cfg(test)]
mod tests;
