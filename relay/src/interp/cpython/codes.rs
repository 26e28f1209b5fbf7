//! Named code objects, and the per-connection cache of them: (pid, start time, code address) ->
//! the code's qualified name, file name, first line and line table, fed each interval by the
//! kernel's raw copies ([`NamedCode::decode`]) and read when the interval's stacks are named.
//!
//! The kernel copies a code object once per interval it is seen in, so a stack may name a code
//! copied in an earlier interval: the cache keeps it. A newer copy of the same address replaces
//! the older (the address may have been freed and reused by another code object). Bounded in
//! entries and bytes ([`Limits`]): beyond either, the least recently used entries go, down to
//! nine tenths of the bound, so eviction is amortized over many inserts. A process's entries go
//! when the session forgets it (exit, pid reuse, exec) ([`CodeCache::forget`]).
//!
//! Invariants: the copies are hostile. A part that does not decode is left out of the name
//! (`[unknown] python` for a name, no file for a file name) and counted; nothing panics.

use std::{collections::HashMap, sync::Arc};

use super::{lines, strings, Layout, Version};
use crate::interp::raw::RawCode;

/// The name of a Python frame whose code is unknown (never copied, or its name unreadable).
pub const UNKNOWN_PYTHON: &str = "[unknown] python";

/// A code object, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedCode {
    /// `co_qualname` (3.11 on) or `co_name`; [`UNKNOWN_PYTHON`] when unreadable.
    pub name: Arc<str>,
    /// `co_filename`, when readable.
    pub filename: Option<Arc<str>>,
    /// `co_firstlineno`, when positive.
    pub first_line: Option<u32>,
    /// The line table's payload (as much as the copy held).
    pub linetable: Arc<[u8]>,
    /// The copy held the whole line table (else `linetable` is a prefix of it).
    pub linetable_complete: bool,
}

/// What decoding one copy could not read, for the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unread {
    pub name: bool,
    pub filename: bool,
}

impl NamedCode {
    /// Names the code object `raw` is a copy of, with the layout of its interpreter.
    pub fn decode(raw: &RawCode, version: Version, layout: &Layout) -> (Self, Unread) {
        let text = |bit: u32, bytes: &[u8], what: &str| -> Option<String> {
            if !raw.has(bit) {
                return None;
            }
            match strings::decode(bytes, &layout.unicode, version) {
                Ok(decoded) if !decoded.text.is_empty() => Some(decoded.shown()),
                Ok(_) => None,
                Err(reason) => {
                    tracing::debug!(%reason, what, "a Python code object's string refused");
                    None
                }
            }
        };
        let name = text(RawCode::NAME, &raw.name, "name");
        let filename = text(RawCode::FILENAME, &raw.filename, "file name");
        let unread = Unread {
            name: name.is_none(),
            filename: filename.is_none(),
        };
        let linetable = raw
            .has(RawCode::LINETABLE)
            .then(|| lines::payload(&raw.linetable))
            .flatten();
        let code = Self {
            name: name.map_or_else(|| Arc::from(UNKNOWN_PYTHON), Arc::from),
            filename: filename.map(Arc::from),
            first_line: u32::try_from(raw.first_line).ok().filter(|&l| l > 0),
            linetable: Arc::from(linetable.map_or(&[][..], |t| t.bytes())),
            linetable_complete: linetable.is_some_and(|t| t.is_complete()),
        };
        (code, unread)
    }

    /// Heap bytes the entry holds (for the cache's bound).
    fn bytes(&self) -> usize {
        self.name.len()
            + self.filename.as_ref().map_or(0, |f| f.len())
            + self.linetable.len()
            + std::mem::size_of::<Self>()
            + 64
    }
}

/// The cache's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most code objects kept, over every process.
    pub max_entries: usize,
    /// Most heap bytes they hold together.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_entries: 200_000,
            max_bytes: 64 << 20,
        }
    }
}

/// Counters of the cache, for the logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Copies taken in.
    pub inserted: u64,
    /// Copies whose name (or file name) could not be read.
    pub names_unread: u64,
    pub filenames_unread: u64,
    /// Entries dropped for the bounds.
    pub evicted: u64,
}

struct Entry {
    code: Arc<NamedCode>,
    bytes: usize,
    last_used: u64,
}

struct ProcessCodes {
    start_time_unix_ns: u64,
    codes: HashMap<u64, Entry>,
}

/// (pid, start time, code address) -> named code, bounded (see the module's doc).
#[derive(Default)]
pub struct CodeCache {
    processes: HashMap<u32, ProcessCodes>,
    limits: Limits,
    entries: usize,
    bytes: usize,
    /// The clock of `Entry::last_used`: one tick per interval.
    tick: u64,
    pub stats: CacheStats,
}

impl CodeCache {
    pub fn with_limits(limits: Limits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// Starts an interval (entries used from now on are newer than all before).
    pub fn next_interval(&mut self) {
        self.tick += 1;
    }

    /// Takes in a copy of the code at `code` in process `pid` (started at `start`), replacing
    /// any earlier one of that address; a process known under another start time (pid reused)
    /// loses its entries first.
    pub fn insert(&mut self, pid: u32, start: u64, code: u64, named: NamedCode, unread: Unread) {
        self.stats.inserted += 1;
        self.stats.names_unread += u64::from(unread.name);
        self.stats.filenames_unread += u64::from(unread.filename);
        if self
            .processes
            .get(&pid)
            .is_some_and(|p| p.start_time_unix_ns != start)
        {
            self.forget(pid);
        }
        let bytes = named.bytes();
        let process = self.processes.entry(pid).or_insert_with(|| ProcessCodes {
            start_time_unix_ns: start,
            codes: HashMap::new(),
        });
        let entry = Entry {
            code: Arc::new(named),
            bytes,
            last_used: self.tick,
        };
        match process.codes.insert(code, entry) {
            Some(old) => self.bytes = self.bytes - old.bytes + bytes,
            None => {
                self.entries += 1;
                self.bytes += bytes;
            }
        }
        if self.entries > self.limits.max_entries || self.bytes > self.limits.max_bytes {
            self.evict();
        }
    }

    /// The named code at `code` in process `pid` started at `start`, if a copy was taken in.
    pub fn get(&mut self, pid: u32, start: u64, code: u64) -> Option<Arc<NamedCode>> {
        let process = self.processes.get_mut(&pid)?;
        if process.start_time_unix_ns != start {
            return None;
        }
        let entry = process.codes.get_mut(&code)?;
        entry.last_used = self.tick;
        Some(Arc::clone(&entry.code))
    }

    /// Drops everything of `pid` (it exited, exec'd, or the pid was reused).
    pub fn forget(&mut self, pid: u32) {
        if let Some(process) = self.processes.remove(&pid) {
            self.entries -= process.codes.len();
            self.bytes -= process.codes.values().map(|e| e.bytes).sum::<usize>();
        }
    }

    /// How many code objects are held, and their bytes.
    pub fn size(&self) -> (usize, usize) {
        (self.entries, self.bytes)
    }

    /// Drops the least recently used entries down to nine tenths of both bounds.
    fn evict(&mut self) {
        let entries_goal = self.limits.max_entries / 10 * 9;
        let bytes_goal = self.limits.max_bytes / 10 * 9;
        let mut all: Vec<(u64, u32, u64)> = self
            .processes
            .iter()
            .flat_map(|(&pid, p)| p.codes.iter().map(move |(&c, e)| (e.last_used, pid, c)))
            .collect();
        all.sort_unstable();
        for (_, pid, code) in all {
            if self.entries <= entries_goal && self.bytes <= bytes_goal {
                break;
            }
            let Some(process) = self.processes.get_mut(&pid) else {
                continue;
            };
            if let Some(entry) = process.codes.remove(&code) {
                self.entries -= 1;
                self.bytes -= entry.bytes;
                self.stats.evicted += 1;
            }
            if process.codes.is_empty() {
                self.processes.remove(&pid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{super::table, *};

    const V: Version = Version::new(3, 12, 1);

    fn layout() -> Layout {
        table::layout(V).expect("3.12 layout")
    }

    /// A compact ASCII `str` image of 3.12 (header 40 bytes).
    fn str_image(text: &str) -> Vec<u8> {
        let mut raw = vec![0u8; 40];
        raw[16..24].copy_from_slice(&(text.len() as i64).to_le_bytes());
        raw[32..36].copy_from_slice(&((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes());
        raw.extend_from_slice(text.as_bytes());
        raw
    }

    fn bytes_image(payload: &[u8]) -> Vec<u8> {
        let mut raw = vec![0u8; 32];
        raw[16..24].copy_from_slice(&(payload.len() as i64).to_le_bytes());
        raw.extend_from_slice(payload);
        raw
    }

    fn raw(name: &str) -> RawCode {
        RawCode {
            first_line: 12,
            copied: RawCode::NAME | RawCode::FILENAME | RawCode::LINETABLE,
            name: str_image(name),
            filename: str_image("/srv/app/workload.py"),
            linetable: bytes_image(&[1, 2, 3]),
        }
    }

    fn named(name: &str) -> (NamedCode, Unread) {
        NamedCode::decode(&raw(name), V, &layout())
    }

    #[test]
    fn a_copy_is_named_with_its_file_first_line_and_line_table() {
        let (code, unread) = named("Worker.hot");
        assert_eq!(&*code.name, "Worker.hot");
        assert_eq!(code.filename.as_deref(), Some("/srv/app/workload.py"));
        assert_eq!(code.first_line, Some(12));
        assert_eq!(&*code.linetable, &[1, 2, 3]);
        assert_eq!(unread, Unread::default());
    }

    #[test]
    fn parts_not_copied_or_refused_are_left_out_and_reported() {
        // Given a copy whose name was not read and whose file name is garbage
        let mut copy = raw("f");
        copy.copied = RawCode::FILENAME | RawCode::LINETABLE;
        copy.filename[16..24].copy_from_slice(&(-5i64).to_le_bytes());
        copy.linetable[16..24].copy_from_slice(&(1i64 << 40).to_le_bytes());
        copy.first_line = -3;
        let (code, unread) = NamedCode::decode(&copy, V, &layout());
        // Then it is an unknown Python function, without a file or a first line, its line
        // table as far as the copy goes
        assert_eq!(&*code.name, UNKNOWN_PYTHON);
        assert_eq!(code.filename, None);
        assert_eq!(code.first_line, None);
        assert_eq!(&*code.linetable, &[1, 2, 3]);
        assert_eq!(
            unread,
            Unread {
                name: true,
                filename: true
            }
        );
    }

    #[test]
    fn the_latest_copy_wins_and_another_start_time_sees_nothing() {
        let mut cache = CodeCache::default();
        let (a, u) = named("a");
        cache.insert(7, 100, 0x1000, a, u);
        let (b, u) = named("b");
        cache.insert(7, 100, 0x1000, b, u);
        assert_eq!(&*cache.get(7, 100, 0x1000).expect("cached").name, "b");
        assert_eq!(cache.size().0, 1);
        // A reader of the pid's new process (another start time) gets nothing
        assert!(cache.get(7, 200, 0x1000).is_none());
        // And a copy from the new process drops the old process's entries
        let (c, u) = named("c");
        cache.insert(7, 200, 0x2000, c, u);
        assert!(cache.get(7, 200, 0x1000).is_none());
        assert_eq!(cache.size().0, 1);
    }

    #[test]
    fn forgetting_a_process_drops_its_entries_and_bytes() {
        let mut cache = CodeCache::default();
        for (pid, code) in [(7, 1), (7, 2), (8, 1)] {
            let (n, u) = named("f");
            cache.insert(pid, 1, code, n, u);
        }
        let one = cache.size().1 / 3;
        cache.forget(7);
        assert_eq!(cache.size(), (1, one));
        assert!(cache.get(7, 1, 1).is_none());
        assert!(cache.get(8, 1, 1).is_some());
        cache.forget(8);
        assert_eq!(cache.size(), (0, 0));
    }

    #[test]
    fn beyond_its_bounds_the_least_recently_used_codes_go() {
        // Given a cache of at most 10 entries, with 10 codes of which the first was used in a
        // later interval
        let mut cache = CodeCache::with_limits(Limits {
            max_entries: 10,
            max_bytes: usize::MAX,
        });
        for code in 0..10 {
            let (n, u) = named("f");
            cache.insert(1, 1, code, n, u);
        }
        cache.next_interval();
        assert!(cache.get(1, 1, 0).is_some());
        // When an eleventh comes
        let (n, u) = named("g");
        cache.insert(1, 1, 10, n, u);
        // Then the oldest unused ones went, down to 9, and the used one and the new one stay
        assert_eq!(cache.size().0, 9);
        assert_eq!(cache.stats.evicted, 2);
        assert!(cache.get(1, 1, 0).is_some());
        assert!(cache.get(1, 1, 10).is_some());
        assert!(cache.get(1, 1, 1).is_none());
        // And a byte bound holds too
        let mut small = CodeCache::with_limits(Limits {
            max_entries: usize::MAX,
            max_bytes: 2000,
        });
        for code in 0..100 {
            let (n, u) = named("f");
            small.insert(1, 1, code, n, u);
        }
        assert!(small.size().1 <= 2000, "{:?}", small.size());
    }
}
