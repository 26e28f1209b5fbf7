//! Unwind tables sent by the relay: chunks are assembled per file, each table is
//! checked whole, and only a table that passes every check is written into the BPF maps
//! (`UNWIND_ROWS`, then its `UNWIND_TABLES` entry, so the program never sees half a table); a
//! bad one is refused and counted, never partly used. No ELF or DWARF is parsed here: the relay compiled the table, the
//! sampler checks only its framing and row encoding.
//!
//! The checks are [`ember_protocol::unwind_table::check`], the table encoding the relay writes
//! with: first row at 0, row offsets strictly increasing and below `len`, no two adjacent rows
//! alike, every field a row's kind does not use zero, stop codes 1..=8.
//!
//! Bounds: one table assembles at a time (the relay sends them one after another), at most
//! [`MAX_TABLE_BYTES`] in the sampler's memory; accepted tables live only in the row array and
//! the table map, sized at load from `--unwind-memory-bytes`. When a new table finds no free
//! range (or the table map is full), the least recently sampled tables are evicted until it
//! fits (counted): the program stamps a tick on each table it uses
//! (`UnwindTableInfo::last_sampled`). An evicted table's entry is deleted before its rows are
//! reused, so its file's frames fall back to frame pointers, never to another table's rows.
//! A table larger than the whole row array is refused. The hello tells the relay the sizes of
//! both maps: an honest relay sends no more than they hold, within a fair share per file owner,
//! and drops tables itself (`dropUnwindTable`) to make room, so eviction here happens only when
//! free rows are fragmented. Tables are all dropped when a new relay connects: it starts its
//! account from nothing. A hostile relay can therefore make the
//! sampler hold at most one table in memory and fill the fixed-size maps; wrong tables can only
//! give wrong stacks.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use ember_protocol::{
    unwind_table::{check, CheckedTable, RawRow, MAX_TABLE_BYTES, ROW_BYTES},
    UnwindTableChunk,
};
use ember_sampler_ebpf::{UnwindRow, UnwindTableInfo};

/// Where checked tables go: the BPF maps (`load::UnwindMaps`), or a fake in tests.
pub trait TableMaps {
    /// Writes `rows` at indices `first..` of the row array.
    fn write_rows(&mut self, first: u32, rows: &[UnwindRow]) -> Result<(), String>;
    /// Makes the table of `file_id` visible to the program.
    fn set_info(&mut self, file_id: u64, info: UnwindTableInfo) -> Result<(), String>;
    /// Hides the table of `file_id` (before its rows are reused).
    fn remove_info(&mut self, file_id: u64);
    /// Moves the `count` rows of `file_id`'s table from `from` down to `to` (`to < from`),
    /// hidden while they move, and shows it again there. On error the table stays hidden.
    fn move_table(&mut self, file_id: u64, from: u32, to: u32, count: u32) -> Result<(), String>;
    /// The tick the program last used the table of `file_id` at (`None`: not in the map).
    fn last_sampled(&self, file_id: u64) -> Option<u32>;
    /// The current tick (`ember_sampler_ebpf::tick` of CLOCK_MONOTONIC).
    fn now_tick(&self) -> u32;
}

/// Refusals logged one by one before the rest are summarized.
const WARN_FIRST: u64 = 5;
/// At most one summary line of further refusals per this period.
const WARN_PERIOD: Duration = Duration::from_secs(10);

/// Rate limit of the refusal warnings (a hostile or broken relay can cause thousands a
/// second): the first [`WARN_FIRST`] are logged one by one, then at most one summary line per
/// [`WARN_PERIOD`] with how many were refused since the last line. Every refusal is counted in
/// `Losses.unwindTablesRefused` either way.
#[derive(Debug)]
pub struct RefusalLog {
    each: u64,
    unlogged: u64,
    last_reason: &'static str,
    last_summary: Instant,
}

/// What to log for one refusal.
#[derive(Debug, PartialEq, Eq)]
pub enum RefusalLine {
    /// This refusal, on its own line.
    Each,
    /// Nothing now: counted for the next summary.
    Later,
}

impl RefusalLog {
    pub fn new(now: Instant) -> Self {
        Self {
            each: 0,
            unlogged: 0,
            last_reason: "",
            last_summary: now,
        }
    }

    /// Notes one refusal.
    pub fn note(&mut self, reason: &'static str) -> RefusalLine {
        if self.each < WARN_FIRST {
            self.each += 1;
            return RefusalLine::Each;
        }
        self.unlogged += 1;
        self.last_reason = reason;
        RefusalLine::Later
    }

    /// The refusals not logged yet and the last one's reason, once per [`WARN_PERIOD`] when
    /// there are any.
    pub fn summary(&mut self, now: Instant) -> Option<(u64, &'static str)> {
        if self.unlogged == 0 || now.duration_since(self.last_summary) < WARN_PERIOD {
            return None;
        }
        self.last_summary = now;
        Some((std::mem::take(&mut self.unlogged), self.last_reason))
    }
}

/// Rows decoded and written at a time: the decoded copy of a table held at once (768 KiB),
/// beside its encoded bytes. The table map entry is set only after all are written.
pub const ROWS_PER_WRITE: usize = 1 << 16;

/// Writes the rows of a checked table at indices `first..` of the row array, decoded
/// [`ROWS_PER_WRITE`] at a time.
fn write_rows(
    table: &CheckedTable<'_>,
    first: u32,
    maps: &mut dyn TableMaps,
) -> Result<(), String> {
    let mut decoded = Vec::with_capacity(table.row_count().min(ROWS_PER_WRITE));
    let mut rows = table.rows().map(|r: RawRow| UnwindRow {
        pc: r.pc,
        a: r.a,
        b: r.b,
        kind: r.kind,
        flags: r.flags,
    });
    let mut index = first;
    loop {
        decoded.clear();
        decoded.extend(rows.by_ref().take(ROWS_PER_WRITE));
        if decoded.is_empty() {
            return Ok(());
        }
        maps.write_rows(index, &decoded)?;
        // At most MAX_TABLE_BYTES / 12 rows: no wrap.
        index = index.saturating_add(ROWS_PER_WRITE as u32);
    }
}

/// A table being assembled.
struct Pending {
    file_id: u64,
    vaddr_minus_offset: i64,
    chunks: u32,
    next: u32,
    data: Vec<u8>,
}

/// The tables loaded into the maps, and what was refused.
pub struct Tables {
    pending: Option<Pending>,
    /// File id -> (first row, rows) in the row array.
    loaded: HashMap<u64, (u32, u32)>,
    /// Free ranges (first row, rows) of the row array, sorted, never adjacent.
    free: Vec<(u32, u32)>,
    loaded_rows: u64,
    capacity_rows: u32,
    /// Most tables the table map holds.
    capacity_tables: usize,
    /// Tables checked and kept, since start.
    pub accepted: u64,
    /// Tables evicted to make room for newer ones, since start.
    pub evicted: u64,
    /// Times the loaded tables were moved together to join the free rows, since start.
    pub compactions: u64,
    /// Tables (or stray chunks) refused, since start.
    pub refused: u64,
    warnings: RefusalLog,
}

impl Tables {
    /// Tables over a row array of `capacity_rows` rows and a table map of `capacity_tables`.
    pub fn new(capacity_rows: u32, capacity_tables: u32) -> Self {
        Self {
            pending: None,
            loaded: HashMap::new(),
            free: vec![(0, capacity_rows)],
            loaded_rows: 0,
            capacity_rows,
            capacity_tables: capacity_tables as usize,
            accepted: 0,
            evicted: 0,
            compactions: 0,
            refused: 0,
            warnings: RefusalLog::new(Instant::now()),
        }
    }

    /// Bytes of rows loaded.
    pub fn loaded_bytes(&self) -> u64 {
        self.loaded_rows * ROW_BYTES as u64
    }

    /// Takes one chunk; `known` says whether the sampler holds the file the table is for.
    /// Returns the file id when this chunk completed a table that was accepted.
    pub fn chunk(
        &mut self,
        chunk: UnwindTableChunk,
        known: impl Fn(u64) -> bool,
        maps: &mut dyn TableMaps,
    ) -> Option<u64> {
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
            vaddr_minus_offset: chunk.vaddr_minus_offset,
            chunks: chunk.chunks,
            next: 0,
            data: Vec::new(),
        });
        if chunk.chunks != pending.chunks
            || chunk.vaddr_minus_offset != pending.vaddr_minus_offset
            || pending.data.len() + chunk.data.len() > MAX_TABLE_BYTES
        {
            self.pending = None;
            self.refuse("chunk count or offset changed, or table over the size bound");
            return None;
        }
        pending.data.extend_from_slice(&chunk.data);
        pending.next += 1;
        if pending.next < pending.chunks {
            return None;
        }
        let done = self.pending.take()?;
        self.finish(done, known, maps)
    }

    /// Checks a complete table and writes it into a free range of the maps.
    fn finish(
        &mut self,
        done: Pending,
        known: impl Fn(u64) -> bool,
        maps: &mut dyn TableMaps,
    ) -> Option<u64> {
        if !known(done.file_id) {
            // Most often compiled for a file closed meanwhile (its processes exited): a race the
            // relay cannot avoid, so counted but logged only at debug, not warned about.
            self.refused += 1;
            tracing::debug!(
                file_id = done.file_id,
                refused = self.refused,
                "dropped an unwind table for a file the sampler no longer holds"
            );
            return None;
        }
        let table = match check(&done.data) {
            Ok(table) => table,
            Err(reason) => {
                self.refuse(reason);
                return None;
            }
        };
        self.drop_table(done.file_id, maps);
        // At most MAX_TABLE_BYTES / 12 rows: fits u32.
        let count = u32::try_from(table.row_count()).unwrap_or(u32::MAX);
        let Some(first) = self.make_room(count, maps) else {
            self.refuse("table larger than the whole row array (--unwind-memory-bytes)");
            return None;
        };
        let info = UnwindTableInfo {
            base: table.base,
            vaddr_minus_offset: done.vaddr_minus_offset,
            len: table.len,
            first_row: first,
            rows: count,
            // New: as recent as any table sampled now, so it is not the next one evicted.
            last_sampled: maps.now_tick(),
        };
        let written =
            write_rows(&table, first, maps).and_then(|()| maps.set_info(done.file_id, info));
        if let Err(err) = written {
            maps.remove_info(done.file_id);
            self.release(first, count);
            tracing::warn!(%err, "writing an unwind table into the BPF maps failed");
            self.refuse("BPF map update failed");
            return None;
        }
        self.loaded.insert(done.file_id, (first, count));
        self.loaded_rows += u64::from(count);
        self.accepted += 1;
        Some(done.file_id)
    }

    /// The relay connection ended: a table it left half-sent is refused (counted), so that chunks
    /// on the next connection can never complete it.
    pub fn abandon(&mut self) {
        if self.pending.take().is_some() {
            self.refuse("the relay disconnected in the middle of a table");
        }
    }

    /// Forgets the table of `file_id` (the relay asked, or the file was closed): hidden from
    /// the program first, then its rows are free.
    pub fn drop_table(&mut self, file_id: u64, maps: &mut dyn TableMaps) {
        if let Some((first, count)) = self.loaded.remove(&file_id) {
            maps.remove_info(file_id);
            self.release(first, count);
            self.loaded_rows -= u64::from(count);
        }
    }

    /// Forgets every table (a new relay connection: that relay decides afresh what is loaded).
    pub fn drop_all(&mut self, maps: &mut dyn TableMaps) {
        self.retain_known(|_| false, maps);
    }

    /// Forgets the tables of files the sampler no longer holds.
    pub fn retain_known(&mut self, known: impl Fn(u64) -> bool, maps: &mut dyn TableMaps) {
        let gone: Vec<u64> = self
            .loaded
            .keys()
            .copied()
            .filter(|id| !known(*id))
            .collect();
        for id in gone {
            self.drop_table(id, maps);
        }
    }

    /// A free range of `count` rows (and a free table entry), evicting the least recently
    /// sampled tables until there is one; `None` when `count` is over the whole array.
    fn make_room(&mut self, count: u32, maps: &mut dyn TableMaps) -> Option<u32> {
        if count > self.capacity_rows || self.capacity_tables == 0 {
            return None;
        }
        loop {
            if self.loaded.len() < self.capacity_tables {
                if let Some(first) = self.allocate(count) {
                    return Some(first);
                }
                // Enough rows are free, in pieces: the tables move together, nobody is evicted.
                if u64::from(self.capacity_rows) - self.loaded_rows >= u64::from(count) {
                    self.compact(maps);
                    if let Some(first) = self.allocate(count) {
                        return Some(first);
                    }
                }
            }
            // Ties (same tick) go to the lower file id: any order is correct.
            let oldest = self
                .loaded
                .keys()
                .map(|&id| (maps.last_sampled(id).unwrap_or(0), id))
                .min()?;
            self.drop_table(oldest.1, maps);
            self.evicted += 1;
            tracing::debug!(
                file_id = oldest.1,
                last_sampled_tick = oldest.0,
                evicted = self.evicted,
                "unwind table evicted (least recently sampled)"
            );
        }
    }

    /// Moves every table down to the start of the row array, in order, so that the free rows
    /// are one range at the end. A table that fails to move is dropped (counted as evicted).
    fn compact(&mut self, maps: &mut dyn TableMaps) {
        let mut tables: Vec<(u32, u32, u64)> = self
            .loaded
            .iter()
            .map(|(&id, &(first, count))| (first, count, id))
            .collect();
        tables.sort_unstable();
        let mut cursor = 0u32;
        for (first, count, id) in tables {
            if first != cursor {
                if let Err(err) = maps.move_table(id, first, cursor, count) {
                    tracing::warn!(file_id = id, %err, "moving an unwind table failed: dropped");
                    maps.remove_info(id);
                    self.loaded.remove(&id);
                    self.loaded_rows -= u64::from(count);
                    self.evicted += 1;
                    continue;
                }
                self.loaded.insert(id, (cursor, count));
            }
            cursor += count;
        }
        self.free = if cursor < self.capacity_rows {
            vec![(cursor, self.capacity_rows - cursor)]
        } else {
            Vec::new()
        };
        self.compactions += 1;
        tracing::debug!(
            compactions = self.compactions,
            tables = self.loaded.len(),
            "unwind tables compacted to join the free rows"
        );
    }

    /// First fit: the first free range that holds `count` rows.
    fn allocate(&mut self, count: u32) -> Option<u32> {
        let slot = self.free.iter().position(|&(_, len)| len >= count)?;
        let (first, len) = self.free[slot];
        if len == count {
            self.free.remove(slot);
        } else {
            self.free[slot] = (first + count, len - count);
        }
        Some(first)
    }

    /// Returns a range to the free list, merged with its neighbours.
    fn release(&mut self, first: u32, count: u32) {
        let at = self.free.partition_point(|&(start, _)| start < first);
        self.free.insert(at, (first, count));
        if at + 1 < self.free.len() && first + count == self.free[at + 1].0 {
            self.free[at].1 += self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].0 + self.free[at - 1].1 == first {
            self.free[at - 1].1 += self.free[at].1;
            self.free.remove(at);
        }
    }

    /// Counts one refusal; logs it while few, else leaves it to [`Self::log_refusals`].
    pub fn refuse(&mut self, reason: &'static str) {
        self.refused += 1;
        if self.warnings.note(reason) == RefusalLine::Each {
            tracing::warn!(
                reason,
                refused = self.refused,
                "refused an unwind table from the relay"
            );
            if self.refused == WARN_FIRST {
                tracing::warn!(
                    "further refusals are logged as one summary line per 10 s (all are counted \
                     in unwind_tables_refused)"
                );
            }
        }
        self.log_refusals();
    }

    /// Logs the summary of refusals not logged yet, at most once per 10 s (call it often).
    pub fn log_refusals(&mut self) {
        if let Some((count, last_reason)) = self.warnings.summary(Instant::now()) {
            tracing::warn!(
                count,
                last_reason,
                refused = self.refused,
                "refused unwind tables from the relay since the last summary"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use ember_protocol::unwind_table::HEADER_BYTES;

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

    /// The maps, in memory; `fail` makes the next row write fail.
    #[derive(Default)]
    struct FakeMaps {
        rows: HashMap<u32, UnwindRow>,
        infos: HashMap<u64, UnwindTableInfo>,
        fail: bool,
        tick: u32,
        /// Most rows one `write_rows` was given.
        largest_write: usize,
    }

    impl TableMaps for FakeMaps {
        fn write_rows(&mut self, first: u32, rows: &[UnwindRow]) -> Result<(), String> {
            if std::mem::take(&mut self.fail) {
                return Err("injected".into());
            }
            self.largest_write = self.largest_write.max(rows.len());
            for (i, row) in (first..).zip(rows) {
                self.rows.insert(i, *row);
            }
            Ok(())
        }
        fn set_info(&mut self, file_id: u64, info: UnwindTableInfo) -> Result<(), String> {
            self.infos.insert(file_id, info);
            Ok(())
        }
        fn remove_info(&mut self, file_id: u64) {
            self.infos.remove(&file_id);
        }
        fn move_table(
            &mut self,
            file_id: u64,
            from: u32,
            to: u32,
            count: u32,
        ) -> Result<(), String> {
            let mut info = self.infos.remove(&file_id).ok_or("no entry")?;
            for i in 0..count {
                let row = self.rows.remove(&(from + i)).ok_or("no row")?;
                self.rows.insert(to + i, row);
            }
            info.first_row = to;
            self.infos.insert(file_id, info);
            Ok(())
        }
        fn last_sampled(&self, file_id: u64) -> Option<u32> {
            self.infos.get(&file_id).map(|i| i.last_sampled)
        }
        fn now_tick(&self) -> u32 {
            self.tick
        }
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
                vaddr_minus_offset: -0x1000,
            })
            .collect()
    }

    #[test]
    fn a_good_table_passes_and_each_corruption_is_refused() {
        let good = table(0x1000, 64, &good_rows());
        assert_eq!(check(&good).expect("good").row_count(), 6);
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
    fn a_large_table_is_written_whole_a_bounded_part_at_a_time() {
        // Given a loaded 6-row table, and a checked table of 150,000 rows (over two parts of
        // decoded rows) in protocol-sized chunks.
        let mut maps = FakeMaps::default();
        let mut tables = Tables::new(1_000_000, 100);
        for c in chunks(7, &table(0x1000, 64, &good_rows()), 30) {
            tables.chunk(c, |_| true, &mut maps);
        }
        let count = 150_000u32;
        // Adjacent rows differ (rsp+8, rsp+16, ...), as a merged table's must.
        let rows: Vec<Vec<u8>> = (0..count)
            .map(|i| row(i * 4, 8 + 8 * (i % 2) as i32, 0, 1, 0))
            .collect();
        let big = table(0x40_0000, count * 4, &rows);
        let mut done = None;
        for c in chunks(8, &big, ember_protocol::MAX_UNWIND_CHUNK_BYTES) {
            done = tables.chunk(c, |_| true, &mut maps);
        }
        // Then every row is in the maps after the first table's, and no write held more than
        // one part.
        assert_eq!(done, Some(8));
        let info = maps.infos[&8];
        assert_eq!((info.first_row, info.rows), (6, count));
        for i in 0..count {
            let want = UnwindRow {
                pc: i * 4,
                a: 8 + 8 * (i % 2) as i32,
                b: 0,
                kind: 1,
                flags: 0,
            };
            assert_eq!(maps.rows.get(&(6 + i)), Some(&want), "row {i}");
        }
        assert_eq!(maps.rows.len(), 6 + count as usize);
        assert!(
            maps.largest_write <= ROWS_PER_WRITE,
            "{} rows decoded at once",
            maps.largest_write
        );
    }

    #[test]
    fn a_table_half_sent_before_a_disconnect_is_refused_and_never_continued() {
        // Given the first two of three chunks of a good table, When the relay disconnects and
        // the next one sends the last chunk, Then the half table is refused (counted once) and
        // the stray chunk too; nothing is loaded.
        let good = table(0x1000, 64, &good_rows());
        let parts = chunks(7, &good, 30);
        assert_eq!(parts.len(), 3);
        let mut maps = FakeMaps::default();
        let mut tables = Tables::new(1000, 100);
        let mut parts = parts.into_iter();
        for c in parts.by_ref().take(2) {
            assert_eq!(tables.chunk(c, |_| true, &mut maps), None);
        }
        tables.abandon();
        assert_eq!((tables.accepted, tables.refused), (0, 1));
        tables.abandon();
        assert_eq!(tables.refused, 1, "nothing pending: nothing more refused");
        let last = parts.next().expect("third chunk");
        assert_eq!(tables.chunk(last, |_| true, &mut maps), None);
        assert_eq!((tables.accepted, tables.refused), (0, 2));
        assert!(maps.infos.is_empty());
    }

    #[test]
    fn chunks_assemble_and_bad_tables_are_refused_whole() {
        // Given a good table in 3 chunks and a known file, When all arrive, Then its rows and
        // its info are in the maps.
        let good = table(0x1000, 64, &good_rows());
        let mut maps = FakeMaps::default();
        let mut tables = Tables::new(1000, 100);
        let known = |id: u64| id == 7 || id == 8;
        let mut done = None;
        for c in chunks(7, &good, 30) {
            done = tables.chunk(c, known, &mut maps);
        }
        assert_eq!(done, Some(7));
        assert_eq!((tables.accepted, tables.refused), (1, 0));
        assert_eq!(tables.loaded_bytes(), 6 * ROW_BYTES as u64);
        let info = maps.infos[&7];
        assert_eq!(
            (info.base, info.len, info.first_row, info.rows),
            (0x1000, 64, 0, 6)
        );
        assert_eq!(info.vaddr_minus_offset, -0x1000);
        assert_eq!(
            maps.rows[&1],
            UnwindRow {
                pc: 4,
                a: 16,
                b: -16,
                kind: 2,
                flags: 1
            }
        );
        // Given a corrupt table for file 8, Then it is refused and file 7's stays.
        let mut corrupt = good.clone();
        corrupt[HEADER_BYTES + 10] = 9;
        for c in chunks(8, &corrupt, 30) {
            assert_eq!(tables.chunk(c, known, &mut maps), None);
        }
        assert_eq!((tables.accepted, tables.refused), (1, 1));
        assert!(!maps.infos.contains_key(&8) && maps.infos.contains_key(&7));
        // An unknown file, a chunk out of order, a half-sent table: each refused.
        for c in chunks(9, &good, 30) {
            tables.chunk(c, known, &mut maps);
        }
        let mut parts = chunks(8, &good, 30);
        tables.chunk(parts.remove(1), known, &mut maps);
        tables.chunk(parts.remove(0), known, &mut maps);
        for c in chunks(8, &good, 30) {
            tables.chunk(c, known, &mut maps);
        }
        assert_eq!((tables.accepted, tables.refused), (2, 4));
        assert_eq!(maps.infos[&8].first_row, 6);
        // A closed file's table is hidden and its rows reused by the next table.
        tables.retain_known(|id| id == 8, &mut maps);
        assert!(!maps.infos.contains_key(&7));
        assert_eq!(tables.loaded_bytes(), 6 * ROW_BYTES as u64);
        for c in chunks(7, &good, 1000) {
            tables.chunk(c, known, &mut maps);
        }
        assert_eq!(maps.infos[&7].first_row, 0);
    }

    #[test]
    fn a_full_row_array_or_a_failed_write_refuses_the_table_and_leaks_nothing() {
        let good = table(0x1000, 64, &good_rows());
        let known = |_| true;
        // Given room for 5 rows, When a 6-row table arrives, Then it is refused.
        let mut maps = FakeMaps::default();
        let mut small = Tables::new(5, 100);
        for c in chunks(7, &good, 1000) {
            assert_eq!(small.chunk(c, known, &mut maps), None);
        }
        assert_eq!(small.refused, 1);
        assert!(maps.infos.is_empty());
        // Given a map write that fails, Then the table is refused, invisible, its rows free.
        let mut tables = Tables::new(6, 100);
        maps.fail = true;
        for c in chunks(7, &good, 1000) {
            assert_eq!(tables.chunk(c, known, &mut maps), None);
        }
        assert_eq!((tables.accepted, tables.refused), (0, 1));
        assert!(maps.infos.is_empty());
        assert_eq!(tables.free, vec![(0, 6)]);
        for c in chunks(7, &good, 1000) {
            assert_eq!(tables.chunk(c, known, &mut maps), Some(7));
        }
    }

    #[test]
    fn a_full_row_array_evicts_the_least_recently_sampled_table_first() {
        // Given room for 12 rows and two 6-row tables, 7 loaded at tick 1 and 8 at tick 2.
        let good = table(0x1000, 64, &good_rows());
        let known = |_| true;
        let mut maps = FakeMaps::default();
        let mut tables = Tables::new(12, 100);
        for (id, tick) in [(7, 1), (8, 2)] {
            maps.tick = tick;
            for c in chunks(id, &good, 1000) {
                tables.chunk(c, known, &mut maps);
            }
        }
        // When the program samples 7 again (tick 3) and a third table arrives at tick 4.
        maps.infos.get_mut(&7).expect("7 loaded").last_sampled = 3;
        maps.tick = 4;
        for c in chunks(9, &good, 1000) {
            assert_eq!(tables.chunk(c, known, &mut maps), Some(9));
        }
        // Then 8 (sampled least recently) is evicted, hidden before its rows went to 9.
        assert_eq!((tables.accepted, tables.evicted, tables.refused), (3, 1, 0));
        assert!(!maps.infos.contains_key(&8));
        assert_eq!(maps.infos[&9].first_row, 6);
        assert_eq!(maps.infos[&9].last_sampled, 4);
        assert_eq!(maps.infos[&7].first_row, 0);
        // A full table map evicts too: room for 2 entries, a third table evicts 7 (tick 3).
        let mut two = Tables::new(1000, 2);
        let mut maps = FakeMaps::default();
        for (id, tick) in [(7, 3), (9, 4), (10, 5)] {
            maps.tick = tick;
            for c in chunks(id, &good, 1000) {
                two.chunk(c, known, &mut maps);
            }
        }
        assert_eq!(two.evicted, 1);
        assert!(!maps.infos.contains_key(&7) && maps.infos.contains_key(&10));
    }

    #[test]
    fn free_rows_in_pieces_are_joined_by_moving_tables_not_by_evicting_them() {
        // Given room for 18 rows, three 6-row tables, the first and last then dropped: 12 rows
        // free, in two pieces around table 8.
        let good = table(0x1000, 64, &good_rows());
        let known = |_| true;
        let mut maps = FakeMaps::default();
        let mut tables = Tables::new(18, 100);
        for id in [7, 8, 9] {
            for c in chunks(id, &good, 1000) {
                tables.chunk(c, known, &mut maps);
            }
        }
        tables.retain_known(|id| id == 8, &mut maps);
        assert_eq!(tables.free, vec![(0, 6), (12, 6)]);
        // When a 12-row table arrives.
        let rows: Vec<Vec<u8>> = (0..12u32)
            .map(|i| row(i * 4, 8 + 8 * (i % 2) as i32, 0, 1, 0))
            .collect();
        let mut done = None;
        for c in chunks(10, &table(0x2000, 48, &rows), 1000) {
            done = tables.chunk(c, known, &mut maps);
        }
        assert_eq!(done, Some(10));
        // Then table 8 moved to the start, whole, and the new one follows; nothing evicted.
        assert_eq!((tables.evicted, tables.compactions), (0, 1));
        assert_eq!(maps.infos[&8].first_row, 0);
        assert_eq!(maps.infos[&10].first_row, 6);
        assert_eq!(maps.rows[&1].b, -16, "table 8's second row moved with it");
        assert!(tables.free.is_empty());
    }

    #[test]
    fn refusal_warnings_are_five_then_one_summary_per_ten_seconds() {
        // Given a burst of 100 refusals within a second.
        let start = Instant::now();
        let mut log = RefusalLog::new(start);
        let lines: Vec<RefusalLine> = (0..100).map(|_| log.note("rows not sorted")).collect();
        // Then the first 5 are logged each, the other 95 wait for a summary.
        assert!(lines[..5].iter().all(|l| *l == RefusalLine::Each));
        assert!(lines[5..].iter().all(|l| *l == RefusalLine::Later));
        assert_eq!(log.summary(start + Duration::from_secs(1)), None);
        // When 10 s passed, Then one summary with the 95, and none again for 10 s.
        let later = start + Duration::from_secs(10);
        assert_eq!(log.summary(later), Some((95, "rows not sorted")));
        log.note("unknown kind");
        assert_eq!(log.summary(later + Duration::from_secs(9)), None);
        assert_eq!(
            log.summary(later + Duration::from_secs(10)),
            Some((1, "unknown kind"))
        );
        assert_eq!(log.summary(later + Duration::from_secs(30)), None);
    }

    #[test]
    fn freed_ranges_merge_with_their_neighbours() {
        let mut tables = Tables::new(30, 100);
        let (a, b, c) = (
            tables.allocate(10),
            tables.allocate(10),
            tables.allocate(10),
        );
        assert_eq!((a, b, c), (Some(0), Some(10), Some(20)));
        assert_eq!(tables.allocate(1), None);
        tables.release(0, 10);
        tables.release(20, 10);
        tables.release(10, 10);
        assert_eq!(tables.free, vec![(0, 30)]);
    }
}
