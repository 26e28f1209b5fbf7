//! Compiled tables kept in the worker's memory a while, by the relay's own identity of the file
//! (`FileKey`: device, inode, size, modification and change times from `fstat` of the passed
//! descriptor), so that a binary passed again under a new file id is not compiled again.
//!
//! The sampler closes a file when the last process mapping it is gone and passes it again, with
//! a new id, when the next one starts: on a host running a build, every compiler process maps
//! the same `librustc_driver` (6 MB of `.eh_frame`), and its table was compiled again for each
//! one, holding the worker while hot processes waited. The key is what the kernel says of the
//! descriptor, never what the file claims; a file rewritten in place changes its size or its
//! times (the change time cannot be set back by its owner), so it is never served another
//! content's table. Bounded in bytes ([`Recent::new`]), the least recently used dropped first.
//! A table is kept as the bytes sent to the sampler (12 a row), not as rows (16 a row in
//! memory): that is all a re-send needs, and the rows are freed once encoded.

use std::{collections::HashMap, sync::Arc};

use super::UnwindTable;
use crate::symbolize::FileKey;

/// A table as sent: its encoding ([`UnwindTable::encode`]), rows and `vaddr_minus_offset`.
#[derive(Clone, Debug)]
pub(crate) struct Kept {
    pub encoded: Arc<Vec<u8>>,
    pub rows: u64,
    pub vaddr_minus_offset: i64,
}

impl Kept {
    /// The encoding of `table` (which the caller then drops).
    pub(crate) fn of(table: &UnwindTable, vaddr_minus_offset: i64) -> Self {
        Self {
            encoded: Arc::new(table.encode()),
            rows: table.rows().len() as u64,
            vaddr_minus_offset,
        }
    }
}

/// Bytes a kept table is charged: its encoding (allocated to its exact size) and its entry.
fn charge(kept: &Kept) -> u64 {
    (kept.encoded.capacity() as u64).saturating_add(64)
}

/// Tables by file identity, at most `max_bytes` of them.
pub(crate) struct Recent {
    tables: HashMap<FileKey, (Kept, u64)>,
    bytes: u64,
    max_bytes: u64,
    clock: u64,
}

impl Recent {
    pub(crate) fn new(max_bytes: u64) -> Self {
        Self {
            tables: HashMap::new(),
            bytes: 0,
            max_bytes,
            clock: 0,
        }
    }

    /// The table kept for `key`, marked as used now.
    pub(crate) fn get(&mut self, key: &FileKey) -> Option<Kept> {
        self.clock += 1;
        let clock = self.clock;
        let (kept, used) = self.tables.get_mut(key)?;
        *used = clock;
        Some(kept.clone())
    }

    /// Keeps `kept` under `key`, dropping the least recently used tables beyond the bound; a
    /// table over the whole bound is not kept.
    pub(crate) fn put(&mut self, key: FileKey, kept: Kept) {
        let size = charge(&kept);
        if size > self.max_bytes {
            return;
        }
        self.clock += 1;
        if let Some((old, _)) = self.tables.insert(key, (kept, self.clock)) {
            self.bytes -= charge(&old);
        }
        self.bytes += size;
        while self.bytes > self.max_bytes {
            let Some(oldest) = self
                .tables
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some((table, _)) = self.tables.remove(&oldest) {
                self.bytes -= charge(&table);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::{compile, Limits};

    fn key(ino: u64) -> FileKey {
        FileKey {
            dev: 1,
            ino,
            size: 10,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    #[test]
    fn a_kept_table_is_served_by_identity_and_the_least_recently_used_goes_first() {
        // Given this test binary's table, and room for two copies of it.
        let exe = std::fs::File::open("/proc/self/exe").expect("own exe");
        let table = compile(&exe, &Limits::default()).expect("compiles").table;
        let kept = |v| Kept::of(&table, v);
        let mut recent = Recent::new(charge(&kept(0)) * 2);
        recent.put(key(1), kept(5));
        recent.put(key(2), kept(6));
        // When 1 is used, then a third comes.
        assert_eq!(recent.get(&key(1)).map(|k| k.vaddr_minus_offset), Some(5));
        recent.put(key(3), kept(7));
        // Then 2 (least recently used) is gone; another identity (a rewritten file) is a miss.
        assert!(recent.get(&key(2)).is_none());
        assert_eq!(recent.get(&key(3)).map(|k| k.vaddr_minus_offset), Some(7));
        assert_eq!(recent.get(&key(1)).map(|k| k.vaddr_minus_offset), Some(5));
        let rewritten = FileKey {
            ctime_ns: 1,
            ..key(1)
        };
        assert!(recent.get(&rewritten).is_none());
        // And a table over the whole bound is not kept.
        let mut tiny = Recent::new(10);
        tiny.put(key(1), kept(0));
        assert!(tiny.get(&key(1)).is_none());
    }

    #[test]
    fn a_kept_table_holds_its_encoding_not_its_rows() {
        // Given this test binary's table, compiled and kept the way the worker keeps it
        let exe = std::fs::File::open("/proc/self/exe").expect("own exe");
        let ((kept, rows), held) = crate::symbolize::alloc::measure(|| {
            let table = compile(&exe, &Limits::default()).expect("compiles").table;
            let rows = table.rows().len();
            (Kept::of(&table, 0), rows)
        });
        // Then what stays allocated is the 12-byte rows sent to the sampler (and the header),
        // not the 16-byte rows compiled (nor both)
        assert!(rows > 10_000, "{rows} rows: too few to tell");
        assert_eq!(kept.rows, rows as u64);
        let held = u64::try_from(held).expect("allocated");
        assert!(
            held <= rows as u64 * 12 + 4096,
            "{held} bytes held for {rows} rows"
        );
        assert_eq!(charge(&kept), kept.encoded.len() as u64 + 64);
    }
}
