//! The compiled table of one binary: rows sorted by address, covering every address of the
//! binary's executable range exactly once, and its byte encoding.
//!
//! Invariants (checked by [`UnwindTable::new`] and by [`UnwindTable::decode`], so a table from
//! the cache or the wire is held to the same rules as a freshly compiled one):
//! - the first row starts at the base (offset 0); row offsets strictly increase and stay below
//!   `len`, so the rows partition `[base, base + len)` and a binary search finds exactly one row;
//! - no two adjacent rows have the same rule (identical neighbours are merged);
//! - `len` fits in u32 (row offsets are u32).
//!
//! Encoding: a 16-byte header (`base` u64, `len` u32, row count u32, little-endian) followed by
//! the rows of [`super::row`], 12 bytes each: [`ember_protocol::unwind_table`], whose `check`
//! the sampler holds every table to, and [`UnwindTable::decode`] too.

use std::ops::Range;

pub use ember_protocol::unwind_table::HEADER_BYTES;
use ember_protocol::unwind_table::{check, encode_header};

use super::{
    cfi::Span,
    row::{Row, Rule, ROW_BYTES},
};

/// A table that breaks one of the module's invariants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad unwind table: {0}")]
pub struct BadTable(pub &'static str);

/// A compiled unwind table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwindTable {
    base: u64,
    len: u32,
    rows: Vec<Row>,
}

impl UnwindTable {
    /// A table from parts, if they keep the invariants.
    pub fn new(base: u64, len: u32, rows: Vec<Row>) -> Result<Self, BadTable> {
        let first = rows.first().ok_or(BadTable("no rows"))?;
        if first.pc != 0 {
            return Err(BadTable("first row does not start at the base"));
        }
        if base.checked_add(u64::from(len)).is_none() {
            return Err(BadTable("range overflows"));
        }
        for pair in rows.windows(2) {
            if pair[0].pc >= pair[1].pc {
                return Err(BadTable("rows not strictly sorted"));
            }
            if pair[0].rule == pair[1].rule {
                return Err(BadTable("adjacent rows not merged"));
            }
        }
        if rows.last().is_some_and(|r| r.pc >= len) {
            return Err(BadTable("row beyond the end"));
        }
        Ok(Self { base, len, rows })
    }

    /// Sorts `spans` (stable: at equal starts the earlier FDE wins) and sweeps them into rows
    /// over `exec`: an address no span covers becomes a gap, a span overlapping an earlier one
    /// loses the overlapped part (counted in `overlapping`), identical neighbours merge.
    pub fn from_spans(mut spans: Vec<Span>, exec: Range<u64>, overlapping: &mut u64) -> Self {
        spans.sort_by_key(|s| s.start);
        let base = exec.start;
        let mut rows: Vec<Row> = Vec::new();
        let mut push = |at: u64, rule: Rule| {
            // Spans are inside `exec` (checked by cfi) and exec is at most u32::MAX long.
            let pc = u32::try_from(at - base).unwrap_or(u32::MAX);
            match rows.last_mut() {
                Some(last) if last.rule == rule => {}
                Some(last) if last.pc == pc => last.rule = rule,
                _ => rows.push(Row { pc, rule }),
            }
        };
        let mut covered = base;
        for span in spans {
            if span.start < covered {
                *overlapping += 1;
            }
            let start = span.start.max(covered);
            if start >= span.end {
                continue;
            }
            if start > covered {
                push(covered, Rule::Gap);
            }
            push(start, span.rule);
            covered = span.end;
        }
        if covered < exec.end {
            push(covered, Rule::Gap);
        }
        if rows.is_empty() {
            rows.push(Row {
                pc: 0,
                rule: Rule::Gap,
            });
        }
        // A replaced row (`last.pc == pc`) may now equal its predecessor: merge once more.
        rows.dedup_by(|next, prev| next.rule == prev.rule);
        // Kept for minutes (the worker's memory of recent tables, `recent.rs`): without the
        // spare capacity pushing left, up to half of it.
        rows.shrink_to_fit();
        let len = u32::try_from(exec.end - base).unwrap_or(u32::MAX);
        Self { base, len, rows }
    }

    /// The lowest address covered (an ELF virtual address).
    #[cfg(test)]
    pub fn base(&self) -> u64 {
        self.base
    }

    /// One past the highest address covered.
    #[cfg(test)]
    pub fn end(&self) -> u64 {
        self.base + u64::from(self.len)
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The rule for `address`, `None` outside the table's range.
    #[cfg(test)]
    pub fn lookup(&self, address: u64) -> Option<Rule> {
        let offset = u32::try_from(address.checked_sub(self.base)?).ok()?;
        if offset >= self.len {
            return None;
        }
        let after = self.rows.partition_point(|r| r.pc <= offset);
        // The first row is at offset 0, so `after` >= 1.
        self.rows.get(after.checked_sub(1)?).map(|r| r.rule)
    }

    /// How many stop rows there are per reason (reasons with none left out).
    #[cfg(test)]
    pub fn stop_counts(&self) -> Vec<(super::row::StopReason, u64)> {
        super::row::StopReason::ALL
            .into_iter()
            .map(|reason| {
                let n = self.rows.iter().filter(|r| r.rule == Rule::Stop(reason));
                (reason, n.count() as u64)
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Size of [`Self::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES + self.rows.len() * ROW_BYTES
    }

    /// The header and rows, as documented at the top of this module.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        // At most max_rows (far below u32::MAX) rows exist.
        let rows = u32::try_from(self.rows.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&encode_header(self.base, self.len, rows));
        for row in &self.rows {
            out.extend_from_slice(&row.encode());
        }
        out
    }

    /// Decodes and checks an encoded table (as the sampler checks it); `bytes` must hold
    /// exactly one table.
    pub fn decode(bytes: &[u8]) -> Result<Self, BadTable> {
        let checked = check(bytes).map_err(BadTable)?;
        let rows = checked
            .rows()
            .map(|raw| Row::from_raw(raw).map_err(|_| BadTable("bad row")))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(checked.base, checked.len, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::row::{Cfa, Rbp, StopReason};

    const RSP8: Rule = Rule::Frame {
        cfa: Cfa::Rsp(8),
        rbp: Rbp::Unchanged,
    };
    const RSP16: Rule = Rule::Frame {
        cfa: Cfa::Rsp(16),
        rbp: Rbp::Unchanged,
    };

    fn span(start: u64, end: u64, rule: Rule) -> Span {
        Span { start, end, rule }
    }

    #[test]
    fn spans_become_a_partition_with_gaps_and_merged_neighbours() {
        // Given: two adjacent FDE rows with the same rule, a hole, and an FDE given out of order.
        let spans = vec![
            span(0x1030, 0x1040, RSP16),
            span(0x1000, 0x1010, RSP8),
            span(0x1010, 0x1020, RSP8),
        ];
        // When
        let mut overlapping = 0;
        let table = UnwindTable::from_spans(spans, 0x1000..0x1050, &mut overlapping);
        // Then: rows at 0 (rsp+8, merged), 0x20 (gap), 0x30 (rsp+16), 0x40 (gap to the end).
        let rows: Vec<(u32, Rule)> = table.rows().iter().map(|r| (r.pc, r.rule)).collect();
        assert_eq!(
            rows,
            vec![
                (0, RSP8),
                (0x20, Rule::Gap),
                (0x30, RSP16),
                (0x40, Rule::Gap)
            ]
        );
        assert_eq!(overlapping, 0);
        assert_eq!(table.lookup(0x0fff), None);
        assert_eq!(table.lookup(0x1000), Some(RSP8));
        assert_eq!(table.lookup(0x101f), Some(RSP8));
        assert_eq!(table.lookup(0x1020), Some(Rule::Gap));
        assert_eq!(table.lookup(0x103f), Some(RSP16));
        assert_eq!(table.lookup(0x104f), Some(Rule::Gap));
        assert_eq!(table.lookup(0x1050), None);
        assert_eq!(UnwindTable::decode(&table.encode()), Ok(table));
    }

    #[test]
    fn an_overlapping_fde_loses_the_overlap_and_is_counted() {
        let spans = vec![
            span(0x1000, 0x1020, RSP8),
            span(0x1010, 0x1030, RSP16),
            span(0x1000, 0x1008, Rule::Stop(StopReason::Malformed)),
        ];
        let mut overlapping = 0;
        let table = UnwindTable::from_spans(spans, 0x1000..0x1030, &mut overlapping);
        assert_eq!(overlapping, 2);
        assert_eq!(table.lookup(0x1004), Some(RSP8));
        assert_eq!(table.lookup(0x1018), Some(RSP8));
        assert_eq!(table.lookup(0x1020), Some(RSP16));
        assert!(UnwindTable::new(table.base, table.len, table.rows.clone()).is_ok());
    }

    #[test]
    fn decode_refuses_tables_that_break_an_invariant() {
        let good = UnwindTable::from_spans(vec![span(0, 8, RSP8)], 0..16, &mut 0);
        let bytes = good.encode();
        assert!(UnwindTable::decode(&bytes).is_ok());
        assert!(UnwindTable::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(UnwindTable::decode(&bytes[..8]).is_err());
        // Row count says more than there is.
        let mut count = bytes.clone();
        count[12] = 3;
        assert!(UnwindTable::decode(&count).is_err());
        // Second row moved to the same pc as the first: not strictly sorted.
        let mut unsorted = bytes.clone();
        unsorted[HEADER_BYTES + ROW_BYTES..HEADER_BYTES + ROW_BYTES + 4].fill(0);
        assert!(UnwindTable::decode(&unsorted).is_err());
        // A row at or past the end.
        let mut short = bytes.clone();
        short[8..12].copy_from_slice(&8u32.to_le_bytes());
        assert!(UnwindTable::decode(&short).is_err());
        // Two identical neighbours.
        let same = vec![Row { pc: 0, rule: RSP8 }, Row { pc: 4, rule: RSP8 }];
        assert!(UnwindTable::new(0, 16, same).is_err());
        assert!(UnwindTable::new(u64::MAX, 16, vec![Row { pc: 0, rule: RSP8 }]).is_err());
    }
}
