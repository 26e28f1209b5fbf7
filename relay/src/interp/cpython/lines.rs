//! The source line of a Python instruction, from the kernel's truncated copy of its code
//! object's line table (CPython 3.6 to 3.14).
//!
//! The eBPF walker copies, for each code object it meets, `co_firstlineno` and the first bytes
//! (`INTERP_LINES_BYTES`) of the line table's bytes object from the object's start: `co_lnotab`
//! up to 3.9, `co_linetable` from 3.10. [`payload`] takes the table out of that copy; when the
//! table is longer than the copy, what remains is a prefix. [`line_of`] decodes the table in
//! the release line's own format:
//!
//! - 3.6 to 3.9, `co_lnotab`: pairs of (byte offset increment: unsigned, line increment:
//!   signed from 3.6); the line at an offset is the sum of the line increments of the pairs
//!   whose offset does not pass it.
//! - 3.10, `co_linetable` (PEP 626): pairs of (range length in bytes: unsigned, line delta:
//!   signed), one address range each; a delta of -128 marks a range without a line and leaves
//!   the running line as it was.
//! - 3.11 to 3.14, the location table (PEP 657): entries starting with a byte whose top bit is
//!   set, holding the entry's kind and its length in code units, followed by the kind's data
//!   (the line delta, as a signed 6-bit-chunk varint for the long and the no-column forms;
//!   implied by the kind for the others); the "no location" kind has no line.
//!
//! Invariants: the input is untrusted (the copy comes from another process's memory and may be
//! torn or forged): decoding never panics, every loop is bounded by the bytes it reads, and no
//! sum can overflow (running offsets and lines grow by at most a byte's worth per byte read,
//! in 64 bits; a varint's delta is bounded and added checked). A prefix never yields a line the whole table would not: an offset the
//! copy does not reach has no answer (`None`), and so does an instruction the interpreter itself
//! knows no line for. Callers show the code object's first line then.

use super::Version;

/// Where `ob_size` (the data length, a signed word) is in a `PyBytesObject`: after `ob_refcnt`
/// and `ob_type`. The same in every release 3.6 to 3.14 on 64-bit targets (default builds; the
/// free-threaded build's object header is larger and has no layout in the relay).
const SIZE_AT: usize = 16;
/// Where the data (`ob_sval`) starts: after `ob_size` and `ob_shash` (deprecated in 3.11 but
/// still there in 3.14).
const DATA_AT: usize = 32;

/// A line table as far as the copy holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table<'a> {
    bytes: &'a [u8],
    complete: bool,
}

impl<'a> Table<'a> {
    /// All of a table.
    pub fn whole(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            complete: true,
        }
    }

    /// The first bytes of a longer table.
    pub fn prefix(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            complete: false,
        }
    }

    /// The bytes held.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Whether the bytes held are the whole table. It matters up to 3.9, where an offset past
    /// the last pair belongs to the last line; later formats give every instruction an entry.
    pub fn is_complete(&self) -> bool {
        self.complete
    }
}

/// The line table inside `raw`, a copy of a `PyBytesObject` from its start: `ob_size` bytes of
/// data from offset 32, or as many of them as the copy holds (a prefix). `None` when the copy
/// does not reach the data or `ob_size` is negative (no bytes object).
pub fn payload(raw: &[u8]) -> Option<Table<'_>> {
    let size: [u8; 8] = raw.get(SIZE_AT..SIZE_AT + 8)?.try_into().ok()?;
    let size = u64::try_from(i64::from_le_bytes(size)).ok()?;
    let data = raw.get(DATA_AT..)?;
    match usize::try_from(size) {
        Ok(size) if size <= data.len() => Some(Table::whole(&data[..size])),
        _ => Some(Table::prefix(data)),
    }
}

/// The source line of the instruction at `offset` in a code object whose line table is
/// `table` and whose `co_firstlineno` is `first_line`, decoded as CPython `version` does.
///
/// `offset` is the instruction's offset in bytes from the start of the code object's
/// bytecode, the offsets `dis` shows and `co_lines()` / `co_positions()` count:
/// - 3.6 to 3.9: into `co_code`; a frame's `f_lasti` is this offset;
/// - 3.10: into `co_code`; a frame's `f_lasti` counts code units, so this is `2 * f_lasti`;
/// - 3.11 on: into the adaptive code (`_co_code_adaptive`, inline caches included, the same
///   offsets as `co_code`): the frame's `prev_instr` (3.11, 3.12) or `instr_ptr` (3.13 on)
///   minus the adaptive code's address, the offset `_PyInterpreterFrame_LASTI` counts in code
///   units and the interpreter's own line lookup doubles.
///
/// `None` when the table does not say: the offset lies beyond what a truncated copy covers,
/// the instruction has no line in the interpreter's own view, the table is malformed there, or
/// `version` is not a release line from 3.6 to 3.14.
pub fn line_of(version: Version, table: Table<'_>, first_line: u32, offset: u32) -> Option<u32> {
    if version.major != 3 {
        return None;
    }
    let first = i64::from(first_line);
    let offset = u64::from(offset);
    match version.minor {
        6..=9 => lnotab(table, first, offset),
        10 => pep626(table.bytes, first, offset),
        11..=14 => locations(table.bytes, first, offset),
        _ => None,
    }
}

/// 3.6 to 3.9: the line of the last pair whose running offset does not pass `offset`.
fn lnotab(table: Table<'_>, first: i64, offset: u64) -> Option<u32> {
    let mut addr = 0u64;
    let mut line = first;
    for pair in table.bytes.chunks_exact(2) {
        addr += u64::from(pair[0]);
        if addr > offset {
            return to_line(line);
        }
        line += i64::from(pair[1] as i8);
    }
    // Past the last pair: the last line, if this was the last pair.
    if table.complete {
        to_line(line)
    } else {
        None
    }
}

/// 3.10: the line of the address range holding `offset`.
fn pep626(table: &[u8], first: i64, offset: u64) -> Option<u32> {
    /// The line delta of a range without a line.
    const NO_LINE: i8 = -128;
    let mut end = 0u64;
    let mut line = first;
    for pair in table.chunks_exact(2) {
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        if delta != NO_LINE {
            line += i64::from(delta);
        }
        // The ranges before ended at or before `offset`: this one holds it.
        if end > offset {
            return if delta == NO_LINE {
                None
            } else {
                to_line(line)
            };
        }
    }
    None
}

/// The kinds of 3.11+ location entries that carry their line delta as a signed varint (the
/// long form and the form without columns).
const KIND_LONG: u8 = 14;
const KIND_NO_COLUMNS: u8 = 13;
/// The one-line forms: the kind minus this is the line delta (0 to 2).
const KIND_ONE_LINE_0: u8 = 10;
const KIND_ONE_LINE_2: u8 = 12;
/// No location: no line, and the running line is left as it was.
const KIND_NONE: u8 = 15;

/// 3.11 to 3.14: the line of the location entry covering `offset`.
fn locations(table: &[u8], first: i64, offset: u64) -> Option<u32> {
    let mut end = 0u64;
    let mut line = first;
    let mut at = 0;
    while let Some(&head) = table.get(at) {
        // Every entry starts with its top bit set; anything else means the table is not one.
        if head & 0x80 == 0 {
            return None;
        }
        let kind = (head >> 3) & 0x0f;
        let units = u64::from(head & 0x07) + 1;
        // The entry's data: the bytes up to the next entry's start (or the end of the copy).
        let data_end = table[at + 1..]
            .iter()
            .position(|b| b & 0x80 != 0)
            .map_or(table.len(), |n| at + 1 + n);
        let data = &table[at + 1..data_end];
        let delta = match kind {
            KIND_LONG | KIND_NO_COLUMNS => svarint(data)?,
            KIND_ONE_LINE_0..=KIND_ONE_LINE_2 => i64::from(kind - KIND_ONE_LINE_0),
            _ => 0,
        };
        line = line.checked_add(delta)?;
        end += units * 2;
        if end > offset {
            return if kind == KIND_NONE {
                None
            } else {
                to_line(line)
            };
        }
        at = data_end;
    }
    None
}

/// A signed varint at the start of `data` (locations.md): unsigned 6-bit chunks, least
/// significant first, bit 6 set on every chunk but the last; the lowest bit of the value is the
/// sign. `None` when cut short by the copy's end or longer than CPython's `int` could hold.
fn svarint(data: &[u8]) -> Option<i64> {
    /// Six chunks hold 36 bits: more than the 32 CPython decodes into.
    const MAX_CHUNKS: usize = 6;
    let mut value = 0u64;
    for (i, &byte) in data.iter().take(MAX_CHUNKS).enumerate() {
        value |= u64::from(byte & 0x3f) << (6 * i);
        if byte & 0x40 == 0 {
            let magnitude = i64::try_from(value >> 1).ok()?;
            return Some(if value & 1 == 1 {
                -magnitude
            } else {
                magnitude
            });
        }
    }
    None
}

/// A line as CPython reports it: negative is none.
fn to_line(line: i64) -> Option<u32> {
    u32::try_from(line).ok()
}

#[cfg(test)]
mod tests;
