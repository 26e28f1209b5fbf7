//! Unwind tables sent by the relay (issue 10): chunks are assembled per file, each table is
//! checked whole, and only a table that passes every check is kept; a bad one is refused and
//! counted, never partly used. No ELF or DWARF is parsed here: the relay compiled the table, the
//! sampler checks only its framing and row encoding.
//!
//! The checks are the decoding rules of the relay's `unwind/table.rs` and `unwind/row.rs`
//! (16-byte header `base u64, len u32, rows u32`, then 12-byte rows `pc u32, a i32, b i16,
//! kind u8, flags u8`): first row at 0, row offsets strictly increasing and below `len`, no two
//! adjacent rows alike, every field a row's kind does not use zero, stop codes 1..=8.
//!
//! Bounds: one table assembles at a time (the relay sends them one after another), at most
//! [`MAX_TABLE_BYTES`]; accepted tables together at most the `--unwind-memory` budget. A hostile
//! relay can therefore make the sampler hold at most budget + one table, and wrong tables can only
//! give wrong stacks.

use std::collections::HashMap;

use ember_protocol::UnwindTableChunk;

/// Largest encoded table accepted (about 2.8 million rows).
pub const MAX_TABLE_BYTES: usize = 32 << 20;
const HEADER_BYTES: usize = 16;
const ROW_BYTES: usize = 12;

/// One checked table.
#[derive(Debug, PartialEq, Eq)]
pub struct Table {
    pub base: u64,
    pub len: u32,
    /// Rows as received (12 bytes each), checked.
    pub rows: Vec<u8>,
}

/// A table being assembled.
struct Pending {
    file_id: u64,
    chunks: u32,
    next: u32,
    data: Vec<u8>,
}

/// The tables the sampler holds, and what it refused.
pub struct Tables {
    pending: Option<Pending>,
    loaded: HashMap<u64, Table>,
    loaded_bytes: usize,
    budget_bytes: usize,
    /// Tables checked and kept, since start.
    pub accepted: u64,
    /// Tables (or stray chunks) refused, since start.
    pub refused: u64,
}

impl Tables {
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            pending: None,
            loaded: HashMap::new(),
            loaded_bytes: 0,
            budget_bytes,
            accepted: 0,
            refused: 0,
        }
    }

    /// Bytes of rows held.
    pub fn loaded_bytes(&self) -> usize {
        self.loaded_bytes
    }

    /// Takes one chunk; `known` says whether the sampler holds the file the table is for.
    /// Returns the file id when this chunk completed a table that was accepted.
    pub fn chunk(&mut self, chunk: UnwindTableChunk, known: impl Fn(u64) -> bool) -> Option<u64> {
        let started = chunk.chunk == 0;
        if started && self.pending.take().is_some() {
            // The relay abandoned a table half-sent: that one is refused.
            self.refuse("a new table began before the last one ended");
        }
        let expected = self
            .pending
            .as_ref()
            .is_some_and(|p| p.file_id == chunk.file_id && p.next == chunk.chunk);
        if !(started || expected) {
            self.pending = None;
            self.refuse("chunk out of order");
            return None;
        }
        let max_chunks = MAX_TABLE_BYTES.div_ceil(ember_protocol::MAX_UNWIND_CHUNK_BYTES);
        if started && (chunk.chunks == 0 || chunk.chunks as usize > max_chunks) {
            self.refuse("chunk count out of range");
            return None;
        }
        let pending = self.pending.get_or_insert_with(|| Pending {
            file_id: chunk.file_id,
            chunks: chunk.chunks,
            next: 0,
            data: Vec::new(),
        });
        if chunk.chunks != pending.chunks || pending.data.len() + chunk.data.len() > MAX_TABLE_BYTES
        {
            self.pending = None;
            self.refuse("chunk count changed or table over the size bound");
            return None;
        }
        pending.data.extend_from_slice(&chunk.data);
        pending.next += 1;
        if pending.next < pending.chunks {
            return None;
        }
        let done = self.pending.take()?;
        self.finish(done, known)
    }

    /// Checks a complete table and keeps it within the budget.
    fn finish(&mut self, done: Pending, known: impl Fn(u64) -> bool) -> Option<u64> {
        if !known(done.file_id) {
            self.refuse("table for a file the sampler does not hold");
            return None;
        }
        let table = match check(&done.data) {
            Ok(table) => table,
            Err(reason) => {
                self.refuse(reason);
                return None;
            }
        };
        self.drop_table(done.file_id);
        if self.loaded_bytes + table.rows.len() > self.budget_bytes {
            self.refuse("over the --unwind-memory budget");
            return None;
        }
        self.loaded_bytes += table.rows.len();
        self.loaded.insert(done.file_id, table);
        self.accepted += 1;
        Some(done.file_id)
    }

    /// Forgets the table of `file_id` (the relay asked, or the file was closed).
    pub fn drop_table(&mut self, file_id: u64) {
        if let Some(old) = self.loaded.remove(&file_id) {
            self.loaded_bytes -= old.rows.len();
        }
    }

    /// Forgets the tables of files the sampler no longer holds.
    pub fn retain_known(&mut self, known: impl Fn(u64) -> bool) {
        let gone: Vec<u64> = self
            .loaded
            .keys()
            .copied()
            .filter(|id| !known(*id))
            .collect();
        for id in gone {
            self.drop_table(id);
        }
    }

    fn refuse(&mut self, reason: &'static str) {
        self.refused += 1;
        tracing::warn!(
            reason,
            refused = self.refused,
            "refused an unwind table from the relay"
        );
    }
}

/// Checks an encoded table (see the module header); the reason when it is refused.
pub fn check(bytes: &[u8]) -> Result<Table, &'static str> {
    let (header, body) = bytes
        .split_first_chunk::<HEADER_BYTES>()
        .ok_or("short header")?;
    let base = u64::from_le_bytes(header[0..8].try_into().map_err(|_| "header")?);
    let len = u32::from_le_bytes(header[8..12].try_into().map_err(|_| "header")?);
    let count = u32::from_le_bytes(header[12..16].try_into().map_err(|_| "header")?) as usize;
    if count == 0 || body.len() != count.saturating_mul(ROW_BYTES) {
        return Err("row count does not match the length");
    }
    if base.checked_add(u64::from(len)).is_none() {
        return Err("range overflows");
    }
    let mut previous: Option<&[u8]> = None;
    for row in body.chunks_exact(ROW_BYTES) {
        let pc = u32::from_le_bytes([row[0], row[1], row[2], row[3]]);
        if !row_ok(row) {
            return Err("row not canonical");
        }
        match previous {
            None if pc != 0 => return Err("first row does not start at 0"),
            Some(prev) if pc <= u32::from_le_bytes([prev[0], prev[1], prev[2], prev[3]]) => {
                return Err("rows not strictly sorted")
            }
            Some(prev) if prev[4..] == row[4..] => return Err("adjacent rows not merged"),
            _ => {}
        }
        if pc >= len {
            return Err("row beyond the end");
        }
        previous = Some(row);
    }
    Ok(Table {
        base,
        len,
        rows: body.to_vec(),
    })
}

/// Whether the fields of one row are its kind's canonical encoding.
fn row_ok(row: &[u8]) -> bool {
    let a = i32::from_le_bytes([row[4], row[5], row[6], row[7]]);
    let b = i16::from_le_bytes([row[8], row[9]]);
    let (kind, flags) = (row[10], row[11]);
    match kind {
        // gap
        0 => a == 0 && b == 0 && flags == 0,
        // CFA = rsp + a / rbp + a; flag bit 0: rbp saved at CFA + b
        1 | 2 => flags & !1 == 0 && (flags != 0 || b == 0),
        // PLT, signal frame
        3 | 4 => flags == 0,
        // stop, with a known reason code
        5 => b == 0 && flags == 0 && (1..=8).contains(&a),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u32, a: i32, b: i16, kind: u8, flags: u8) -> Vec<u8> {
        let mut out = pc.to_le_bytes().to_vec();
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
        out.extend([kind, flags]);
        out
    }

    fn table(base: u64, len: u32, rows: &[Vec<u8>]) -> Vec<u8> {
        let mut out = base.to_le_bytes().to_vec();
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
        for r in rows {
            out.extend_from_slice(r);
        }
        out
    }

    /// Every kind once: rsp+8, rbp+16 with rbp at CFA-16, PLT, signal, stop(outermost), gap.
    fn good_rows() -> Vec<Vec<u8>> {
        vec![
            row(0, 8, 0, 1, 0),
            row(4, 16, -16, 2, 1),
            row(16, 8, 11, 3, 0),
            row(32, 160, 120, 4, 0),
            row(40, 1, 0, 5, 0),
            row(48, 0, 0, 0, 0),
        ]
    }

    fn chunks(file_id: u64, bytes: &[u8], size: usize) -> Vec<UnwindTableChunk> {
        let parts: Vec<&[u8]> = bytes.chunks(size).collect();
        parts
            .iter()
            .enumerate()
            .map(|(i, data)| UnwindTableChunk {
                file_id,
                chunk: i as u32,
                chunks: parts.len() as u32,
                data: data.to_vec(),
            })
            .collect()
    }

    #[test]
    fn a_good_table_passes_and_each_corruption_is_refused() {
        let good = table(0x1000, 64, &good_rows());
        assert_eq!(check(&good).expect("good").rows.len(), 6 * ROW_BYTES);
        let mut bad: Vec<(&str, Vec<u8>)> = vec![
            ("short", good[..10].to_vec()),
            (
                "count",
                table(0, 64, &good_rows())[..good.len() - 1].to_vec(),
            ),
            ("empty", table(0, 64, &[])),
            ("not at 0", table(0, 64, &[row(4, 8, 0, 1, 0)])),
            (
                "unsorted",
                table(0, 64, &[row(0, 8, 0, 1, 0), row(0, 16, 0, 1, 0)]),
            ),
            (
                "unmerged",
                table(0, 64, &[row(0, 8, 0, 1, 0), row(4, 8, 0, 1, 0)]),
            ),
            (
                "beyond end",
                table(0, 4, &[row(0, 8, 0, 1, 0), row(4, 16, 0, 1, 0)]),
            ),
            ("overflow", table(u64::MAX, 4, &[row(0, 8, 0, 1, 0)])),
        ];
        for (what, r) in [
            ("unknown kind", row(0, 0, 0, 6, 0)),
            ("gap with a", row(0, 1, 0, 0, 0)),
            ("b without flag", row(0, 8, 4, 1, 0)),
            ("unknown flag", row(0, 8, 0, 1, 2)),
            ("plt flag", row(0, 8, 11, 3, 1)),
            ("stop code 0", row(0, 0, 0, 5, 0)),
            ("stop code 9", row(0, 9, 0, 5, 0)),
            ("stop with b", row(0, 1, 1, 5, 0)),
        ] {
            bad.push((what, table(0, 64, &[r])));
        }
        for (what, bytes) in bad {
            assert!(check(&bytes).is_err(), "{what} must be refused");
        }
    }

    #[test]
    fn chunks_assemble_and_bad_tables_are_refused_whole() {
        // Given a good table in 3 chunks and a known file, When all arrive, Then it is kept.
        let good = table(0x1000, 64, &good_rows());
        let mut tables = Tables::new(1 << 20);
        let known = |id: u64| id == 7 || id == 8;
        let mut done = None;
        for c in chunks(7, &good, 30) {
            done = tables.chunk(c, known);
        }
        assert_eq!(done, Some(7));
        assert_eq!((tables.accepted, tables.refused), (1, 0));
        assert_eq!(tables.loaded_bytes(), 6 * ROW_BYTES);
        // Given a corrupt table for file 8, Then it is refused and file 7's stays.
        let mut corrupt = good.clone();
        corrupt[HEADER_BYTES + 10] = 9;
        for c in chunks(8, &corrupt, 30) {
            assert_eq!(tables.chunk(c, known), None);
        }
        assert_eq!((tables.accepted, tables.refused), (1, 1));
        assert!(!tables.loaded.contains_key(&8) && tables.loaded.contains_key(&7));
        // An unknown file, a chunk out of order, a half-sent table: each refused.
        for c in chunks(9, &good, 30) {
            tables.chunk(c, known);
        }
        let mut parts = chunks(8, &good, 30);
        tables.chunk(parts.remove(1), known);
        tables.chunk(parts.remove(0), known);
        for c in chunks(8, &good, 30) {
            tables.chunk(c, known);
        }
        assert_eq!((tables.accepted, tables.refused), (2, 4));
        // Over the budget: refused; a closed file's table is forgotten.
        let mut small = Tables::new(ROW_BYTES);
        for c in chunks(7, &good, 1000) {
            assert_eq!(small.chunk(c, known), None);
        }
        assert_eq!(small.refused, 1);
        tables.retain_known(|id| id == 8);
        assert!(!tables.loaded.contains_key(&7));
        assert_eq!(tables.loaded_bytes(), 6 * ROW_BYTES);
    }
}
