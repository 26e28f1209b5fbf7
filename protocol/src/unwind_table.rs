//! The bytes of an unwind table on the control channel (`unwindTableChunk.data`, joined), in one
//! copy for both sides: the relay encodes its compiled tables with it (and decodes its cache
//! with it), and the sampler holds every table the relay sends to [`check`] before any row
//! reaches the kernel's maps.
//!
//! Layout, little-endian: a 16-byte header (`base` u64, `len` u32, row count u32), then 12-byte
//! rows (`pc` u32, `a` i32, `b` i16, `kind` u8, `flags` u8); what each kind means is the relay's
//! `unwind/row.rs`. A table passes [`check`] when its first row is at offset 0, row offsets
//! strictly increase and stay below `len`, no two adjacent rows are alike, and every row is its
//! kind's one canonical encoding (a field the kind does not use is zero; a stop code is 1..=8),
//! so a table has exactly one encoding.
//!
//! Privilege assumptions: [`check`] runs in the privileged sampler on bytes from the relay, which
//! it does not trust: it reads only within the slice, allocates nothing and never panics.

/// Size of the encoded header.
pub const HEADER_BYTES: usize = 16;
/// Size of one encoded row.
pub const ROW_BYTES: usize = 12;
/// Largest encoded table the sampler accepts (about 2.8 million rows).
pub const MAX_TABLE_BYTES: usize = 32 << 20;

/// Row kinds: no CFI (frame pointers), CFA = rsp + a, CFA = rbp + a, PLT stub, signal
/// frame, stop.
pub const KIND_GAP: u8 = 0;
pub const KIND_CFA_RSP: u8 = 1;
pub const KIND_CFA_RBP: u8 = 2;
pub const KIND_PLT: u8 = 3;
pub const KIND_SIGNAL: u8 = 4;
pub const KIND_STOP: u8 = 5;
/// Flag of a frame row (kinds 1 and 2): the caller's rbp was saved at CFA + b.
pub const FLAG_RBP_AT_CFA: u8 = 1;
/// The stop codes a stop row may carry in `a`.
pub const STOP_CODES: std::ops::RangeInclusive<i32> = 1..=8;

/// The fields of one encoded row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRow {
    /// Offset of the row's first address from the table's base.
    pub pc: u32,
    pub a: i32,
    pub b: i16,
    pub kind: u8,
    pub flags: u8,
}

impl RawRow {
    pub fn from_bytes(row: &[u8; ROW_BYTES]) -> Self {
        let [p0, p1, p2, p3, a0, a1, a2, a3, b0, b1, kind, flags] = *row;
        Self {
            pc: u32::from_le_bytes([p0, p1, p2, p3]),
            a: i32::from_le_bytes([a0, a1, a2, a3]),
            b: i16::from_le_bytes([b0, b1]),
            kind,
            flags,
        }
    }

    pub fn to_bytes(&self) -> [u8; ROW_BYTES] {
        let mut out = [0u8; ROW_BYTES];
        out[0..4].copy_from_slice(&self.pc.to_le_bytes());
        out[4..8].copy_from_slice(&self.a.to_le_bytes());
        out[8..10].copy_from_slice(&self.b.to_le_bytes());
        out[10] = self.kind;
        out[11] = self.flags;
        out
    }

    /// Whether the fields are the one canonical encoding of the row's kind.
    pub fn is_canonical(&self) -> bool {
        let (a, b, flags) = (self.a, self.b, self.flags);
        match self.kind {
            KIND_GAP => a == 0 && b == 0 && flags == 0,
            KIND_CFA_RSP | KIND_CFA_RBP => flags & !FLAG_RBP_AT_CFA == 0 && (flags != 0 || b == 0),
            KIND_PLT | KIND_SIGNAL => flags == 0,
            KIND_STOP => b == 0 && flags == 0 && STOP_CODES.contains(&a),
            _ => false,
        }
    }
}

/// The header of a table of `rows` rows covering `[base, base + len)`.
pub fn encode_header(base: u64, len: u32, rows: u32) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[0..8].copy_from_slice(&base.to_le_bytes());
    out[8..12].copy_from_slice(&len.to_le_bytes());
    out[12..16].copy_from_slice(&rows.to_le_bytes());
    out
}

/// A table that passed [`check`]: its header and its encoded rows.
#[derive(Debug, PartialEq, Eq)]
pub struct CheckedTable<'a> {
    pub base: u64,
    pub len: u32,
    body: &'a [u8],
}

impl CheckedTable<'_> {
    pub fn row_count(&self) -> usize {
        self.body.len() / ROW_BYTES
    }

    /// The rows, decoded one at a time.
    pub fn rows(&self) -> impl Iterator<Item = RawRow> + '_ {
        self.body
            .chunks_exact(ROW_BYTES)
            .filter_map(|row| row.try_into().ok().map(RawRow::from_bytes))
    }
}

/// Checks an encoded table (see the module header); the reason when it is refused.
pub fn check(bytes: &[u8]) -> Result<CheckedTable<'_>, &'static str> {
    let (header, body) = bytes
        .split_first_chunk::<HEADER_BYTES>()
        .ok_or("short header")?;
    let [b0, b1, b2, b3, b4, b5, b6, b7, l0, l1, l2, l3, n0, n1, n2, n3] = *header;
    let base = u64::from_le_bytes([b0, b1, b2, b3, b4, b5, b6, b7]);
    let len = u32::from_le_bytes([l0, l1, l2, l3]);
    let count = u32::from_le_bytes([n0, n1, n2, n3]) as usize;
    if count == 0 || body.len() != count.saturating_mul(ROW_BYTES) {
        return Err("row count does not match the length");
    }
    if base.checked_add(u64::from(len)).is_none() {
        return Err("range overflows");
    }
    let table = CheckedTable { base, len, body };
    let mut previous: Option<RawRow> = None;
    for row in table.rows() {
        if !row.is_canonical() {
            return Err("row not canonical");
        }
        match previous {
            None if row.pc != 0 => return Err("first row does not start at 0"),
            Some(prev) if row.pc <= prev.pc => return Err("rows not strictly sorted"),
            Some(prev)
                if (prev.a, prev.b, prev.kind, prev.flags)
                    == (row.a, row.b, row.kind, row.flags) =>
            {
                return Err("adjacent rows not merged")
            }
            _ => {}
        }
        if row.pc >= len {
            return Err("row beyond the end");
        }
        previous = Some(row);
    }
    Ok(table)
}
