//! Names JIT code from what runtimes write about it: a per-process store of code ranges
//! ([`JitMap`]), fed incrementally by the readers of the files a process appends to (its perf
//! map, [`perfmap`]; its jitdump, through the same [`JitSource`] interface), and read only when
//! frames of that process fall in JIT code nothing names yet ([`JitStores::catch_up`]).
//!
//! Everything here comes from the process itself, so it names only that process's own JIT
//! frames, and only those in memory the kernel says is anonymous executable memory (or in no
//! mapped file): a name in a perf map never overrides a mapped file's symbols. Its cost is
//! bounded whatever the file holds ([the budget](#budget)).
//!
//! # Budget
//! - Per process at most [`PROCESS_ENTRIES`] ranges and [`PROCESS_BYTES`] bytes (names plus
//!   [`ENTRY_OVERHEAD`] per range); beyond, its oldest ranges are forgotten (counted): runtimes
//!   append, so the newest code is what runs.
//! - All processes of a connection together at most [`TOTAL_BYTES`] (+ one process's
//!   [`PROCESS_BYTES`] between two checks): beyond, the processes holding the most give back
//!   their oldest ranges down to a fair share.
//! - Per process at most [`READ_PER_CALL`] bytes read at once and [`READ_PER_PROCESS`] in all
//!   (counted when reached): a map that grows toward gigabytes costs that much, once.
//! - A file is read only when a frame of its process falls in JIT code no range names and the
//!   file grew since the last read: one `fstat` per such process and batch otherwise.

pub mod jitdump;
pub mod perfmap;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs::File,
    os::fd::OwnedFd,
    sync::Arc,
};

use self::perfmap::PerfMapReader;

/// One piece of JIT code a runtime reported about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitEntry {
    pub start: u64,
    pub size: u64,
    /// The name as the runtime wrote it (bounded by the reader).
    pub name: String,
    /// Source file and line of the code's start, when the runtime said (jitdump debug info).
    pub source: Option<(String, u32)>,
}

/// Why a JIT source could not be read further.
#[derive(Debug)]
pub enum JitReadError {
    Io(std::io::Error),
    /// The bytes are not what the format says; the reason.
    Malformed(&'static str),
}

impl std::fmt::Display for JitReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(err) => write!(f, "reading failed: {err}"),
            Self::Malformed(reason) => write!(f, "malformed: {reason}"),
        }
    }
}

/// An append-only file a process writes about its JIT code, read incrementally.
pub trait JitSource {
    /// Reads what was appended since the last call from `file` (positional reads only: the
    /// descriptor is shared), at most `max_bytes`, handing each complete entry to `out`;
    /// returns the bytes consumed. A partial entry at the end is left for the next call.
    fn read_new(
        &mut self,
        file: &std::fs::File,
        max_bytes: u64,
        out: &mut dyn FnMut(JitEntry),
    ) -> Result<u64, JitReadError>;
}

/// Most ranges kept per process.
pub const PROCESS_ENTRIES: usize = 100_000;
/// Most bytes kept per process (see [`ENTRY_OVERHEAD`]).
pub const PROCESS_BYTES: usize = 16 << 20;
/// Most bytes kept by all processes of a connection together.
pub const TOTAL_BYTES: usize = 128 << 20;
/// Bytes counted per range besides its name: the tree nodes, the age index, the name's header.
pub const ENTRY_OVERHEAD: usize = 128;
/// Most bytes of a process's files read at once.
pub const READ_PER_CALL: u64 = 32 << 20;
/// Most bytes of a process's files read in all.
pub const READ_PER_PROCESS: u64 = 256 << 20;

/// One named range of JIT code.
#[derive(Clone, Debug)]
pub struct Code {
    end: u64,
    pub name: Arc<str>,
    pub source: Option<(Arc<str>, u32)>,
    /// Insertion order: the oldest goes first.
    seq: u64,
}

/// A process's JIT code ranges: non-overlapping, the newest entry wins (a range it overlaps
/// is forgotten whole: code the runtime freed and reused).
#[derive(Debug, Default)]
pub struct JitMap {
    by_start: BTreeMap<u64, Code>,
    /// (seq, start) of every range, oldest first.
    by_age: BTreeSet<(u64, u64)>,
    bytes: usize,
    next_seq: u64,
}

impl JitMap {
    /// Adds `entry`, forgetting the ranges it overlaps. An empty or wrapping range is ignored.
    pub fn insert(&mut self, entry: JitEntry) {
        let Some(end) = entry
            .start
            .checked_add(entry.size)
            .filter(|_| entry.size > 0)
        else {
            return;
        };
        let mut overlapped = Vec::new();
        if let Some((&start, code)) = self.by_start.range(..entry.start).next_back() {
            if code.end > entry.start {
                overlapped.push(start);
            }
        }
        overlapped.extend(self.by_start.range(entry.start..end).map(|(&s, _)| s));
        for start in overlapped {
            self.remove(start);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let source = entry
            .source
            .map(|(file, line)| (Arc::<str>::from(file.as_str()), line));
        self.bytes += entry_bytes(&entry.name, source.as_ref());
        self.by_age.insert((seq, entry.start));
        self.by_start.insert(
            entry.start,
            Code {
                end,
                name: Arc::from(entry.name.as_str()),
                source,
                seq,
            },
        );
    }

    fn remove(&mut self, start: u64) {
        if let Some(code) = self.by_start.remove(&start) {
            self.by_age.remove(&(code.seq, start));
            self.bytes = self
                .bytes
                .saturating_sub(entry_bytes(&code.name, code.source.as_ref()));
        }
    }

    /// Forgets the oldest range; `false` when there is none.
    pub fn evict_oldest(&mut self) -> bool {
        match self.by_age.first().copied() {
            Some((_, start)) => {
                self.remove(start);
                true
            }
            None => false,
        }
    }

    /// The range holding `address`, if any.
    pub fn lookup(&self, address: u64) -> Option<&Code> {
        let (_, code) = self.by_start.range(..=address).next_back()?;
        (address < code.end).then_some(code)
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// The bytes counted against the budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

fn entry_bytes(name: &str, source: Option<&(Arc<str>, u32)>) -> usize {
    ENTRY_OVERHEAD + name.len() + source.map_or(0, |(file, _)| file.len())
}

/// What the JIT stores did and skipped, since the connection started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JitStats {
    /// Perf maps passed by the sampler and taken (one per process and file).
    pub maps: u64,
    /// Perf maps the sampler found but did not pass (another owner, a symlink, not a regular
    /// file, too large), once per process and reason.
    pub maps_refused: u64,
    /// Entries read from perf maps and jitdumps.
    pub entries: u64,
    /// Lines of perf maps that are not entries, and lines over the length bound.
    pub garbage_lines: u64,
    pub long_lines: u64,
    /// Ranges forgotten to keep within the budget.
    pub evicted: u64,
    /// Reads that failed (I/O or a malformed jitdump); the file is not read again.
    pub read_errors: u64,
    /// Processes whose files reached [`READ_PER_PROCESS`].
    pub read_capped: u64,
    /// Bytes read from these files.
    pub bytes_read: u64,
}

impl JitStats {
    /// Adds what one connection's stores counted between `before` and `after`.
    pub fn add_since(&mut self, before: &JitStats, after: &JitStats) {
        let since = |f: fn(&JitStats) -> u64| f(after).saturating_sub(f(before));
        self.maps += since(|s| s.maps);
        self.maps_refused += since(|s| s.maps_refused);
        self.entries += since(|s| s.entries);
        self.garbage_lines += since(|s| s.garbage_lines);
        self.long_lines += since(|s| s.long_lines);
        self.evicted += since(|s| s.evicted);
        self.read_errors += since(|s| s.read_errors);
        self.read_capped += since(|s| s.read_capped);
        self.bytes_read += since(|s| s.bytes_read);
    }
}

/// A jitdump of a process, read through the descriptor of its mapped file.
struct DumpFeed {
    file_id: u64,
    reader: Box<dyn JitSource>,
    consumed: u64,
    /// The file's length when a read last found no whole record: the record the runtime has
    /// not finished writing is read again only once the file grows past it.
    seen: u64,
    failed: bool,
}

/// What is known of one process's JIT code.
struct ProcessJit {
    start_time_unix_ns: u64,
    /// Its perf map, the file's identity and its reader.
    perf_map: Option<(File, (u64, u64), PerfMapReader)>,
    perf_map_failed: bool,
    /// The perf map's length when a read last found no whole line (see [`DumpFeed::seen`]).
    perf_map_seen: u64,
    dumps: Vec<DumpFeed>,
    map: JitMap,
    read_total: u64,
    /// The last refusal counted for it.
    refused: Option<String>,
}

impl ProcessJit {
    fn new(start_time_unix_ns: u64) -> Self {
        Self {
            start_time_unix_ns,
            perf_map: None,
            perf_map_failed: false,
            perf_map_seen: 0,
            dumps: Vec::new(),
            map: JitMap::default(),
            read_total: 0,
            refused: None,
        }
    }

    fn has_sources(&self) -> bool {
        self.perf_map.is_some() || !self.dumps.is_empty()
    }
}

/// Makes a reader of `jit-<pid>.dump` files, when ember has one.
type DumpReaderFactory = fn() -> Box<dyn JitSource>;

/// The JIT stores of one connection's processes.
#[derive(Default)]
pub struct JitStores {
    processes: HashMap<u32, ProcessJit>,
    pub stats: JitStats,
    /// The jitdump reader ([`JitStores::with_jitdump`]); `None`: jitdumps are not read.
    jitdump: Option<DumpReaderFactory>,
}

impl JitStores {
    /// Reads the jitdump files processes map with readers `make` makes.
    pub fn with_jitdump(mut self, make: DumpReaderFactory) -> Self {
        self.jitdump = Some(make);
        self
    }

    /// Takes in what the sampler said of a process's perf map with its facts: `perf_map`, the
    /// descriptor it passed (checked here again: a regular file only), or `refused`, why it did
    /// not; `dumps`, the ids of its mapped `jit-<digits>.dump` files. Newer facts of another
    /// process under the pid (another start time) start afresh.
    pub fn process(
        &mut self,
        pid: u32,
        start_time_unix_ns: u64,
        perf_map: Option<OwnedFd>,
        refused: &str,
        dumps: &[u64],
    ) {
        if self
            .processes
            .get(&pid)
            .is_some_and(|p| p.start_time_unix_ns != start_time_unix_ns)
        {
            self.processes.remove(&pid);
        }
        if !refused.is_empty() {
            let jit = self
                .processes
                .entry(pid)
                .or_insert_with(|| ProcessJit::new(start_time_unix_ns));
            if jit.refused.as_deref() != Some(refused) {
                self.stats.maps_refused += 1;
                tracing::info!(
                    pid,
                    reason = refused,
                    "the sampler did not pass this process's perf map: its JIT frames stay unnamed"
                );
                jit.refused = Some(refused.to_owned());
            }
        }
        if let Some(fd) = perf_map {
            let file = File::from(fd);
            match file.metadata() {
                Ok(meta) if meta.is_file() => {
                    use std::os::unix::fs::MetadataExt as _;
                    let key = (meta.dev(), meta.ino());
                    let jit = self
                        .processes
                        .entry(pid)
                        .or_insert_with(|| ProcessJit::new(start_time_unix_ns));
                    if jit.perf_map.as_ref().is_none_or(|(_, k, _)| *k != key) {
                        self.stats.maps += 1;
                        jit.perf_map = Some((file, key, PerfMapReader::default()));
                        jit.perf_map_failed = false;
                        jit.perf_map_seen = 0;
                    }
                }
                _ => {
                    self.stats.maps_refused += 1;
                    tracing::debug!(pid, "a passed perf map is not a regular file: not read");
                }
            }
        }
        if let Some(jit) = self.processes.get_mut(&pid) {
            jit.dumps.retain(|d| dumps.contains(&d.file_id));
        }
        if let Some(make) = self.jitdump {
            if !dumps.is_empty() {
                let jit = self
                    .processes
                    .entry(pid)
                    .or_insert_with(|| ProcessJit::new(start_time_unix_ns));
                for &file_id in dumps {
                    if !jit.dumps.iter().any(|d| d.file_id == file_id) {
                        jit.dumps.push(DumpFeed {
                            file_id,
                            reader: make(),
                            consumed: 0,
                            seen: 0,
                            failed: false,
                        });
                    }
                }
            }
        }
    }

    /// Forgets an exited process.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    /// Whether `pid` has a file to name its JIT code from.
    pub fn has_sources(&self, pid: u32) -> bool {
        self.processes
            .get(&pid)
            .is_some_and(ProcessJit::has_sources)
    }

    /// The range of `pid`'s JIT code holding `address`.
    pub fn lookup(&self, pid: u32, address: u64) -> Option<&Code> {
        self.processes.get(&pid)?.map.lookup(address)
    }

    /// Ranges and bytes held, all processes together.
    pub fn size(&self) -> (usize, usize) {
        self.processes
            .values()
            .fold((0, 0), |(n, b), p| (n + p.map.len(), b + p.map.bytes()))
    }

    /// Reads what `pid`'s files gained since the last read (a frame of it fell in JIT code
    /// nothing names), within the budget. `dump_file` gives the descriptor of a mapped file by
    /// id (a jitdump), while the sampler holds it.
    pub fn catch_up(&mut self, pid: u32, dump_file: &dyn Fn(u64) -> Option<File>) {
        let Some(jit) = self.processes.get_mut(&pid) else {
            return;
        };
        let stats = &mut self.stats;
        let before = jit.read_total;
        let map = &mut jit.map;
        let mut add = |entry: JitEntry| {
            stats.entries += 1;
            map.insert(entry);
            while map.len() > PROCESS_ENTRIES || map.bytes() > PROCESS_BYTES {
                if !map.evict_oldest() {
                    break;
                }
                stats.evicted += 1;
            }
        };
        if let Some((file, _, reader)) = jit.perf_map.as_mut().filter(|_| !jit.perf_map_failed) {
            let len = file.metadata().map_or(0, |m| m.len());
            let grew = len > reader.offset() && len > jit.perf_map_seen;
            let room = READ_PER_PROCESS.saturating_sub(jit.read_total);
            if grew && room > 0 {
                let garbage = reader.stats;
                let limit = room.min(READ_PER_CALL);
                match reader.read_new(file, limit, &mut add) {
                    Ok(n) => {
                        jit.read_total += n;
                        if n == 0 {
                            jit.perf_map_seen = len;
                        }
                    }
                    Err(err) => {
                        jit.perf_map_failed = true;
                        stats.read_errors += 1;
                        tracing::debug!(pid, %err, "reading a perf map failed: not read again");
                    }
                }
                stats.garbage_lines += reader.stats.garbage_lines - garbage.garbage_lines;
                stats.long_lines += reader.stats.long_lines - garbage.long_lines;
            }
        }
        for dump in jit.dumps.iter_mut().filter(|d| !d.failed) {
            let room = READ_PER_PROCESS.saturating_sub(jit.read_total);
            let Some(file) = dump_file(dump.file_id) else {
                continue;
            };
            let len = file.metadata().map_or(0, |m| m.len());
            let grew = len > dump.consumed && len > dump.seen;
            if !grew || room == 0 {
                continue;
            }
            let limit = room.min(READ_PER_CALL);
            match dump.reader.read_new(&file, limit, &mut add) {
                Ok(n) => {
                    dump.consumed += n;
                    jit.read_total += n;
                    if n == 0 {
                        dump.seen = len;
                    }
                }
                Err(err) => {
                    dump.failed = true;
                    stats.read_errors += 1;
                    tracing::debug!(pid, %err, "reading a jitdump failed: not read again");
                }
            }
        }
        stats.bytes_read += jit.read_total - before;
        if before < READ_PER_PROCESS && jit.read_total >= READ_PER_PROCESS {
            stats.read_capped += 1;
            tracing::info!(
                pid,
                read = jit.read_total,
                "a process's perf map or jitdump reached the bytes the relay reads of it: its \
                 newer JIT code stays unnamed"
            );
        }
        if jit.read_total > before {
            self.keep_within_total();
        }
    }

    /// Takes the oldest ranges of the processes holding the most back to a fair share while
    /// all together hold more than [`TOTAL_BYTES`].
    fn keep_within_total(&mut self) {
        let mut total: usize = self.processes.values().map(|p| p.map.bytes()).sum();
        if total <= TOTAL_BYTES {
            return;
        }
        let holders = self
            .processes
            .values()
            .filter(|p| !p.map.is_empty())
            .count();
        let share = TOTAL_BYTES / holders.max(1);
        for jit in self.processes.values_mut() {
            while jit.map.bytes() > share && total > TOTAL_BYTES {
                let before = jit.map.bytes();
                if !jit.map.evict_oldest() {
                    break;
                }
                total -= before - jit.map.bytes();
                self.stats.evicted += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, size: u64, name: &str) -> JitEntry {
        JitEntry {
            start,
            size,
            name: name.into(),
            source: None,
        }
    }

    fn name_at(map: &JitMap, address: u64) -> Option<&str> {
        map.lookup(address).map(|c| &*c.name)
    }

    #[test]
    fn the_newest_entry_wins_for_an_address_range() {
        // Given code at [0x1000, 0x1100) and [0x1200, 0x1300)
        let mut map = JitMap::default();
        map.insert(entry(0x1000, 0x100, "old_a"));
        map.insert(entry(0x1200, 0x100, "old_b"));
        assert_eq!(name_at(&map, 0x10ff), Some("old_a"));
        assert_eq!(name_at(&map, 0x1100), None);
        // When the runtime reuses [0x1080, 0x1280) for new code
        map.insert(entry(0x1080, 0x200, "new"));
        // Then the new code names that range and both old ranges are gone
        assert_eq!(name_at(&map, 0x1080), Some("new"));
        assert_eq!(name_at(&map, 0x1000), None);
        assert_eq!(name_at(&map, 0x12ff), None);
        assert_eq!(map.len(), 1);
        // And empty or wrapping entries are ignored
        map.insert(entry(0x5000, 0, "empty"));
        map.insert(entry(u64::MAX, 2, "wraps"));
        assert_eq!(map.len(), 1);
        // And the bytes follow what is held
        assert_eq!(map.bytes(), ENTRY_OVERHEAD + 3);
    }

    #[test]
    fn a_process_holds_at_most_its_budget_keeping_its_newest_code() {
        // Given a perf map with more entries than a process may hold
        let path = std::env::temp_dir().join(format!("ember-jit-budget-{}", std::process::id()));
        let mut text = String::new();
        let n = PROCESS_ENTRIES as u64 + 5_000;
        for i in 0..n {
            text.push_str(&format!("{:x} 10 f{i}\n", 0x10_0000 + i * 0x10));
        }
        std::fs::write(&path, &text).expect("write");
        let fd = OwnedFd::from(File::open(&path).expect("open"));
        let mut stores = JitStores::default();
        stores.process(7, 1, Some(fd), "", &[]);
        // When its frames ask for names
        stores.catch_up(7, &|_| None);
        // Then it holds at most the budget, the oldest went (counted), the newest stay
        let (entries, bytes) = stores.size();
        assert!(entries <= PROCESS_ENTRIES && bytes <= PROCESS_BYTES);
        assert_eq!(stores.stats.evicted, n - entries as u64);
        assert!(stores.lookup(7, 0x10_0000).is_none());
        let last = 0x10_0000 + (n - 1) * 0x10;
        assert_eq!(
            stores.lookup(7, last).map(|c| c.name.to_string()),
            Some(format!("f{}", n - 1))
        );
        // And with nothing appended, nothing is read again
        let read = stores.stats.bytes_read;
        stores.catch_up(7, &|_| None);
        assert_eq!(stores.stats.bytes_read, read);
        // And another process under the pid starts afresh
        stores.process(7, 2, None, "", &[]);
        assert!(stores.lookup(7, last).is_none());
        let _ = std::fs::remove_file(path);
    }

    /// A jitdump stand-in: each 16-byte record is `start size` (two little-endian u32s, then 8
    /// bytes of name), read positionally as the real reader must.
    #[derive(Default)]
    struct Records;

    impl JitSource for Records {
        fn read_new(
            &mut self,
            file: &File,
            max_bytes: u64,
            out: &mut dyn FnMut(JitEntry),
        ) -> Result<u64, JitReadError> {
            use std::os::unix::fs::FileExt as _;
            let mut buf = vec![0u8; usize::try_from(max_bytes).unwrap_or(0).min(1 << 16)];
            let n = file.read_at(&mut buf, 0).map_err(JitReadError::Io)?;
            let mut consumed = 0;
            for record in buf[..n].chunks_exact(16) {
                let word =
                    |i: usize| u64::from(u32::from_le_bytes(record[i..i + 4].try_into().unwrap()));
                out(JitEntry {
                    start: word(0),
                    size: word(4),
                    name: String::from_utf8_lossy(&record[8..]).into_owned(),
                    source: Some(("x.js".into(), 3)),
                });
                consumed += 16;
            }
            Ok(consumed)
        }
    }

    #[test]
    fn a_mapped_jitdump_feeds_the_same_store() {
        // Given a process mapping a jitdump (file id 5) that names [0x1000, 0x1010)
        let path = std::env::temp_dir().join(format!("ember-jit-dump-{}", std::process::id()));
        let mut record = Vec::new();
        record.extend(0x1000u32.to_le_bytes());
        record.extend(0x10u32.to_le_bytes());
        record.extend(b"jsfunc!!");
        std::fs::write(&path, &record).expect("write");
        let mut stores = JitStores::default().with_jitdump(|| Box::new(Records));
        stores.process(3, 1, None, "", &[5]);
        assert!(stores.has_sources(3));
        // When a frame asks, the file is read through the descriptor the sampler passed
        let opened = |id: u64| (id == 5).then(|| File::open(&path).expect("open"));
        stores.catch_up(3, &opened);
        // Then its code is named, with its source line
        let code = stores.lookup(3, 0x1008).expect("named from the jitdump");
        assert_eq!(&*code.name, "jsfunc!!");
        assert_eq!(code.source, Some((Arc::from("x.js"), 3)));
        // And facts that no longer map it stop reading it
        stores.process(3, 1, None, "", &[]);
        assert!(!stores.has_sources(3));
        let _ = std::fs::remove_file(path);
    }

    /// Calls of [`Unfinished`]'s reader (only the test below makes one).
    static UNFINISHED_READS: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// A source whose file ends in a record the runtime has not finished: it consumes nothing
    /// and counts the calls.
    struct Unfinished;

    impl JitSource for Unfinished {
        fn read_new(
            &mut self,
            _file: &File,
            _max_bytes: u64,
            _out: &mut dyn FnMut(JitEntry),
        ) -> Result<u64, JitReadError> {
            UNFINISHED_READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(0)
        }
    }

    #[test]
    fn an_unfinished_record_is_read_again_only_once_the_file_grows() {
        // Given a jitdump that ends in half a record
        let path = std::env::temp_dir().join(format!("ember-jit-half-{}", std::process::id()));
        std::fs::write(&path, [0u8; 10]).expect("write");
        let mut stores = JitStores::default().with_jitdump(|| Box::new(Unfinished));
        stores.process(4, 1, None, "", &[6]);
        let opened = |id: u64| (id == 6).then(|| File::open(&path).expect("open"));
        let read = || UNFINISHED_READS.load(std::sync::atomic::Ordering::Relaxed);
        // When frames ask three times while the file stays as it is
        for _ in 0..3 {
            stores.catch_up(4, &opened);
        }
        // Then the tail was read once
        assert_eq!(read(), 1);
        // And once more when the runtime writes on
        std::fs::write(&path, [0u8; 20]).expect("write");
        stores.catch_up(4, &opened);
        stores.catch_up(4, &opened);
        assert_eq!(read(), 2);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn refusals_are_counted_once_per_process_and_reason() {
        let mut stores = JitStores::default();
        for _ in 0..3 {
            stores.process(9, 1, None, "it is a symlink", &[]);
        }
        stores.process(
            9,
            1,
            None,
            "it is owned by another user than the process's",
            &[],
        );
        assert_eq!(stores.stats.maps_refused, 2);
        assert!(!stores.has_sources(9));
    }
}
