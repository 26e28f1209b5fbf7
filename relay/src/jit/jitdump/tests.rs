//! The jitdump reader on files real runtimes wrote (CPython 3.13 and 3.14 with `-X perf_jit`,
//! Node with `--perf-prof`, run while the test reads their file and their mappings) and on
//! crafted files for what runtimes do not write: the other byte order, moves, bad sizes, names
//! without NUL, records cut by the end of the file.

use std::{
    env,
    fs::{self, File, OpenOptions},
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use super::*;

// ---------------------------------------------------------------------------------------------
// Crafted files

/// Builds a jitdump file in either byte order.
struct Writer {
    big_endian: bool,
    bytes: Vec<u8>,
}

impl Writer {
    /// A file with its header.
    fn new(big_endian: bool) -> Self {
        let mut w = Self {
            big_endian,
            bytes: Vec::new(),
        };
        w.u32(MAGIC);
        w.u32(1); // version
        w.u32(40); // header size
        w.u32(62); // EM_X86_64
        w.u32(0); // pad
        w.u32(4242); // pid (claimed; unused)
        w.u64(1); // timestamp
        w.u64(0); // flags
        w
    }

    fn u32(&mut self, v: u32) {
        let b = if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.bytes.extend_from_slice(&b);
    }

    fn u64(&mut self, v: u64) {
        let b = if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.bytes.extend_from_slice(&b);
    }

    fn record_header(&mut self, id: u32, size: u32) {
        self.u32(id);
        self.u32(size);
        self.u64(7); // timestamp
    }

    /// A CODE_LOAD: `name` written as given (a NUL is added unless `nul` is false).
    fn load_raw(&mut self, addr: u64, code: &[u8], name: &[u8], nul: bool) -> &mut Self {
        let size = 56 + name.len() + usize::from(nul) + code.len();
        self.record_header(CODE_LOAD, u32::try_from(size).unwrap());
        self.u32(4242);
        self.u32(4243);
        self.u64(addr); // vma
        self.u64(addr); // code address
        self.u64(code.len() as u64);
        self.u64(1); // code index
        self.bytes.extend_from_slice(name);
        if nul {
            self.bytes.push(0);
        }
        self.bytes.extend_from_slice(code);
        self
    }

    fn load(&mut self, addr: u64, code_size: usize, name: &str) -> &mut Self {
        self.load_raw(addr, &vec![0xcc; code_size], name.as_bytes(), true)
    }

    /// A DEBUG_INFO for `addr` with entries (address, line, file).
    fn debug(&mut self, addr: u64, entries: &[(u64, u32, &str)]) -> &mut Self {
        let size: usize = 32 + entries.iter().map(|e| 16 + e.2.len() + 1).sum::<usize>();
        self.record_header(DEBUG_INFO, u32::try_from(size).unwrap());
        self.u64(addr);
        self.u64(entries.len() as u64);
        for &(at, line, file) in entries {
            self.u64(at);
            self.u32(line);
            self.u32(0);
            self.bytes.extend_from_slice(file.as_bytes());
            self.bytes.push(0);
        }
        self
    }

    fn moved(&mut self, old: u64, new: u64, size: u64) -> &mut Self {
        self.record_header(CODE_MOVE, 64);
        self.u32(4242);
        self.u32(4243);
        self.u64(new);
        self.u64(old);
        self.u64(new);
        self.u64(size);
        self.u64(2);
        self
    }

    fn unwinding(&mut self, data: usize) -> &mut Self {
        self.record_header(4, u32::try_from(16 + 24 + data).unwrap());
        self.u64(data as u64);
        self.u64(0);
        self.u64(data as u64);
        self.bytes.extend(std::iter::repeat_n(0x5a, data));
        self
    }

    fn close(&mut self) -> &mut Self {
        self.record_header(CLOSE, 16);
        self
    }
}

/// A temporary file holding `bytes`, opened for reading (and appending through its path).
fn file_with(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    tmp.write_all(bytes).unwrap();
    tmp.flush().unwrap();
    let file = File::open(tmp.path()).unwrap();
    (tmp, file)
}

fn append(tmp: &tempfile::NamedTempFile, bytes: &[u8]) {
    let mut f = OpenOptions::new().append(true).open(tmp.path()).unwrap();
    f.write_all(bytes).unwrap();
}

/// Every entry of one call, with the bytes it consumed.
fn read(reader: &mut JitDump, file: &File, max: u64) -> (Result<u64, JitReadError>, Vec<JitEntry>) {
    let mut entries = Vec::new();
    let result = reader.read_new(file, max, &mut |e| entries.push(e));
    (result, entries)
}

fn entry(start: u64, size: u64, name: &str) -> JitEntry {
    JitEntry {
        start,
        size,
        name: name.to_owned(),
        source: None,
    }
}

fn malformed(result: Result<u64, JitReadError>) -> &'static str {
    match result {
        Err(JitReadError::Malformed(reason)) => reason,
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[test]
fn both_byte_orders_give_the_same_entries_and_skip_unwinding_info() {
    for big_endian in [false, true] {
        // Given a file of two code loads, each after unwinding info, in one byte order
        let mut w = Writer::new(big_endian);
        w.unwinding(100)
            .load(0x7f00_0000_1000, 15, "py::alpha:/tmp/truth.py")
            .unwinding(3)
            .load(0x7f00_0000_2000, 300, "JS:*beta /tmp/x.js:3:1");
        let (_tmp, file) = file_with(&w.bytes);
        // When it is read
        let mut reader = JitDump::default();
        let (result, entries) = read(&mut reader, &file, u64::MAX);
        // Then both loads come out, and the whole file is consumed
        assert_eq!(
            result.unwrap(),
            w.bytes.len() as u64,
            "big endian: {big_endian}"
        );
        assert_eq!(
            entries,
            [
                entry(0x7f00_0000_1000, 15, "py::alpha:/tmp/truth.py"),
                entry(0x7f00_0000_2000, 300, "JS:*beta /tmp/x.js:3:1"),
            ]
        );
        assert_eq!(reader.stats().records, 4);
    }
}

#[test]
fn a_truncated_header_is_waited_for_and_read_once_complete() {
    // Given a file cut in its header
    let mut w = Writer::new(false);
    w.load(0x1000, 4, "f");
    let (tmp, file) = file_with(&w.bytes[..20]);
    let mut reader = JitDump::default();
    // When it is read, nothing comes out and nothing is consumed
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    assert_eq!((result.unwrap(), entries.len()), (0, 0));
    // Then once the rest is written, the entry comes out
    append(&tmp, &w.bytes[20..]);
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    assert_eq!(result.unwrap(), w.bytes.len() as u64);
    assert_eq!(entries, [entry(0x1000, 4, "f")]);
}

#[test]
fn a_wrong_magic_or_version_or_header_size_stops_the_reader_for_good() {
    let mut w = Writer::new(false);
    w.load(0x1000, 4, "f");
    let cases: [(usize, &[u8], &str); 3] = [
        (0, b"ELF\x7f", "magic"),
        (4, &2u32.to_le_bytes(), "version"),
        (8, &12u32.to_le_bytes(), "header size"),
    ];
    for (at, patch, what) in cases {
        let mut bytes = w.bytes.clone();
        bytes[at..at + patch.len()].copy_from_slice(patch);
        let (_tmp, file) = file_with(&bytes);
        let mut reader = JitDump::default();
        let (first, entries) = read(&mut reader, &file, u64::MAX);
        assert!(entries.is_empty(), "{what}");
        malformed(first);
        // Sticky: a later call reads nothing and says the same.
        let before = reader.stats().bytes_read;
        malformed(read(&mut reader, &file, u64::MAX).0);
        assert_eq!(reader.stats().bytes_read, before, "{what}");
    }
    // A wrong magic is refused as soon as its 4 bytes are there.
    let (_tmp, file) = file_with(b"ELF\x7f\x02");
    malformed(read(&mut JitDump::default(), &file, u64::MAX).0);
}

#[test]
fn a_record_claiming_4_gib_stops_the_reader_without_reading_further() {
    // Given a load, then a record whose size says 4 GiB, then a load
    let mut w = Writer::new(false);
    w.load(0x1000, 4, "before");
    let good = w.bytes.len() as u64;
    w.record_header(CODE_LOAD, u32::MAX);
    w.u64(0);
    w.load(0x2000, 4, "after");
    let (_tmp, file) = file_with(&w.bytes);
    let mut reader = JitDump::default();
    // When it is read
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    // Then the load before it comes out, the reader stops there and stays stopped
    assert_eq!(entries, [entry(0x1000, 4, "before")]);
    assert_eq!(malformed(result), "record larger than the bound");
    assert_eq!(reader.offset(), good);
    malformed(read(&mut reader, &file, u64::MAX).0);
    // Nothing was allocated or read by the claimed size.
    assert!(reader.stats().bytes_read <= w.bytes.len() as u64);
    assert!(reader.buf.capacity() <= WINDOW);
}

#[test]
fn impossible_sizes_stop_the_reader() {
    type Write = Box<dyn Fn(&mut Writer)>;
    let cases: [(&str, Write); 5] = [
        (
            "record shorter than its header",
            Box::new(|w| w.record_header(4, 8)),
        ),
        (
            "record shorter than its fields",
            Box::new(|w| {
                w.record_header(CODE_LOAD, 40);
                w.bytes.extend([0; 24]);
            }),
        ),
        (
            "code load's code beyond its record",
            Box::new(|w| {
                w.load(0x1000, 4, "f");
                let at = w.bytes.len() - 4 - 2 - 16;
                w.bytes[at..at + 8].copy_from_slice(&1000u64.to_le_bytes());
            }),
        ),
        (
            "code load's code wraps around",
            Box::new(|w| {
                w.load(u64::MAX - 1, 4, "f");
            }),
        ),
        (
            "debug entries beyond their record",
            Box::new(|w| {
                w.debug(0x1000, &[(0x1000, 3, "a.js")]);
                let at = w.bytes.len() - 16 - 5 - 8;
                w.bytes[at..at + 8].copy_from_slice(&1_000_000u64.to_le_bytes());
            }),
        ),
    ];
    for (reason, write) in cases {
        let mut w = Writer::new(false);
        write(&mut w);
        let (_tmp, file) = file_with(&w.bytes);
        let (result, entries) = read(&mut JitDump::default(), &file, u64::MAX);
        assert!(entries.is_empty(), "{reason}");
        assert_eq!(malformed(result), reason);
    }
}

#[test]
fn a_name_without_nul_stops_the_reader() {
    let mut w = Writer::new(false);
    w.load(0x1000, 4, "ok")
        .load_raw(0x2000, &[0xcc; 4], b"no-terminator", false);
    let (_tmp, file) = file_with(&w.bytes);
    let (result, entries) = read(&mut JitDump::default(), &file, u64::MAX);
    assert_eq!(entries, [entry(0x1000, 4, "ok")]);
    assert_eq!(malformed(result), "code load name without NUL");
}

#[test]
fn a_long_name_is_cut_at_the_bound() {
    let long = "x".repeat(5000);
    let mut w = Writer::new(false);
    w.load(0x1000, 8, &long).load(0x2000, 8, "next");
    let (_tmp, file) = file_with(&w.bytes);
    let mut reader = JitDump::default();
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    assert_eq!(result.unwrap(), w.bytes.len() as u64);
    assert_eq!(entries[0].name, "x".repeat(1024));
    assert_eq!(entries[1], entry(0x2000, 8, "next"));
    assert_eq!(reader.stats().names_cut, 1);
}

#[test]
fn a_partial_trailing_record_is_returned_once_a_later_append_completes_it() {
    // Given two loads, the second cut in its code bytes (its fields and name are there), and a
    // third cut in its name
    let mut w = Writer::new(false);
    w.load(0x1000, 16, "first");
    let cut = w.bytes.len() + 2000;
    w.load(0x2000, 4096, "second");
    let (tmp, file) = file_with(&w.bytes[..cut]);
    let mut reader = JitDump::default();
    // When it is read, only the first comes out
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    let first = result.unwrap();
    assert_eq!(entries, [entry(0x1000, 16, "first")]);
    assert!(first < cut as u64);
    // Then after the rest is appended, the second comes out on the next call, once
    append(&tmp, &w.bytes[cut..]);
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    assert_eq!(first + result.unwrap(), w.bytes.len() as u64);
    assert_eq!(entries, [entry(0x2000, 4096, "second")]);
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    assert_eq!((result.unwrap(), entries.len()), (0, 0));
    // And a record cut in its name waits the same way
    let before = w.bytes.len();
    w.load(0x3000, 8, "third-with-a-longer-name");
    append(&tmp, &w.bytes[before..before + 60]);
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    assert_eq!((result.unwrap(), entries.len()), (0, 0));
    append(&tmp, &w.bytes[before + 60..]);
    let (_, entries) = read(&mut reader, &file, u64::MAX);
    assert_eq!(entries, [entry(0x3000, 8, "third-with-a-longer-name")]);
}

#[test]
fn code_bytes_are_skipped_unread_and_each_call_reads_at_most_its_budget() {
    // Given loads of 1 MiB of code each
    let mut w = Writer::new(false);
    for i in 0..8u64 {
        w.load(0x10_0000 * (i + 1), 1 << 20, &format!("big{i}"));
    }
    let (_tmp, file) = file_with(&w.bytes);
    let mut reader = JitDump::default();
    // When they are read with a budget of 4 KiB a call
    let mut names = Vec::new();
    let mut consumed = 0;
    for _ in 0..100 {
        let before = reader.stats().bytes_read;
        let (result, entries) = read(&mut reader, &file, 4096);
        consumed += result.unwrap();
        assert!(reader.stats().bytes_read - before <= 4096);
        names.extend(entries.into_iter().map(|e| e.name));
    }
    // Then every load comes out, having read a tiny part of the file
    assert_eq!(names, (0..8).map(|i| format!("big{i}")).collect::<Vec<_>>());
    assert_eq!(consumed, w.bytes.len() as u64);
    assert!(
        reader.stats().bytes_read < 64 * 1024,
        "{} bytes read of {}",
        reader.stats().bytes_read,
        w.bytes.len()
    );
}

#[test]
fn debug_info_gives_the_source_of_the_next_load_at_its_address_only() {
    let mut w = Writer::new(false);
    w.debug(0x1000, &[(0x1040, 12, "app.js"), (0x1048, 13, "app.js")])
        .unwinding(8)
        .load(0x1000, 32, "JS:*hot app.js:12:3")
        .debug(0x5000, &[(0x5040, 99, "other.js")])
        .load(0x2000, 32, "JS:*cold app.js:20:1")
        .load(0x5000, 32, "JS:*late app.js:99:1");
    let (_tmp, file) = file_with(&w.bytes);
    let (result, entries) = read(&mut JitDump::default(), &file, u64::MAX);
    result.unwrap();
    assert_eq!(entries[0].source, Some(("app.js".to_owned(), 12)));
    // The debug info for 0x5000 was followed by a load elsewhere: it is dropped.
    assert_eq!(entries[1].source, None);
    assert_eq!(entries[2].source, None);
}

#[test]
fn a_move_gives_the_code_its_new_address_with_its_name_and_source() {
    let mut w = Writer::new(true);
    w.debug(0x1000, &[(0x1000, 7, "mod.py")])
        .load(0x1000, 32, "hot")
        .load(0x2000, 32, "cold")
        .moved(0x1000, 0x9000, 32)
        .moved(0x4444, 0x8000, 8)
        .moved(0x9000, 0xa000, 32);
    let (_tmp, file) = file_with(&w.bytes);
    let mut reader = JitDump::default();
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    result.unwrap();
    let moved = JitEntry {
        source: Some(("mod.py".to_owned(), 7)),
        ..entry(0x9000, 32, "hot")
    };
    assert_eq!(entries[2], moved);
    assert_eq!(
        entries[3],
        JitEntry {
            start: 0xa000,
            ..moved.clone()
        }
    );
    assert_eq!(entries.len(), 4);
    assert_eq!(reader.stats().moves_unknown, 1);
}

#[test]
fn moves_are_handled_a_bounded_number_per_call() {
    // Given one load moved back and forth many times
    let mut w = Writer::new(false);
    w.load(0x1000, 4000, "hot");
    let n = MAX_MOVES_PER_CALL * 3 + 7;
    for i in 0..n as u64 {
        let (from, to) = if i % 2 == 0 {
            (0x1000, 0x9000)
        } else {
            (0x9000, 0x1000)
        };
        w.moved(from, to, 4000);
    }
    let (_tmp, file) = file_with(&w.bytes);
    let mut reader = JitDump::default();
    // When it is read, each call handles at most MAX_MOVES_PER_CALL of them
    let mut calls = Vec::new();
    loop {
        let before = reader.stats().bytes_read;
        let (result, entries) = read(&mut reader, &file, u64::MAX);
        if result.unwrap() == 0 {
            break;
        }
        calls.push((entries.len(), reader.stats().bytes_read - before));
        assert!(entries.iter().all(|e| e.name == "hot" && e.size == 4000));
    }
    // Then all come out over several calls, each reading little per move
    assert_eq!(calls.iter().map(|c| c.0).sum::<usize>(), n + 1);
    assert!(
        calls.iter().all(|c| c.0 <= MAX_MOVES_PER_CALL + 1),
        "{calls:?}"
    );
    // The window, and a load record's fields and name bound per move.
    for (entries, read) in calls {
        assert!(
            read <= 64 * 1024 + entries as u64 * 1100,
            "{read} bytes for {entries}"
        );
    }
}

#[test]
fn a_close_record_ends_the_file() {
    let mut w = Writer::new(false);
    w.load(0x1000, 4, "f")
        .close()
        .load(0x2000, 4, "after close");
    let (_tmp, file) = file_with(&w.bytes);
    let mut reader = JitDump::default();
    let (result, entries) = read(&mut reader, &file, u64::MAX);
    assert_eq!(entries, [entry(0x1000, 4, "f")]);
    assert_eq!(result.unwrap(), w.bytes.len() as u64 - 72);
    assert_eq!(read(&mut reader, &file, u64::MAX).0.unwrap(), 0);
}

#[test]
fn moves_remember_a_bounded_number_of_loads() {
    let mut moves = Moves::default();
    for i in 0..(3 * MAX_TRACKED as u64) {
        moves.insert(i, i, None);
    }
    assert_eq!(moves.by_addr.len(), MAX_TRACKED);
    assert!(moves.take(0).is_none());
    assert!(moves.take(3 * MAX_TRACKED as u64 - 1).is_some());
    // Back-and-forth moves leave no unbounded queue behind.
    for _ in 0..(5 * MAX_TRACKED) {
        let t = moves.take(1 << 40).unwrap_or(Tracked {
            load: 0,
            debug: None,
            seq: 0,
        });
        moves.insert(1 << 40, t.load, None);
    }
    assert!(moves.order.len() <= 2 * MAX_TRACKED + 1);
}

// ---------------------------------------------------------------------------------------------
// Files real runtimes wrote

/// The Debian roots of `scripts/runtime-roots.sh`: `EMBER_ROOTS`, else `EMBER_PYTHON_ROOTS`
/// (its former name), else /var/cache/ember/roots.
fn roots_dir() -> PathBuf {
    env::var_os("EMBER_ROOTS")
        .or_else(|| env::var_os("EMBER_PYTHON_ROOTS"))
        .map_or_else(|| PathBuf::from("/var/cache/ember/roots"), PathBuf::from)
}

/// A runtime this machine lacks: a failure where nothing may be skipped (`CI` or
/// `EMBER_REQUIRE_ALL`), else a printed skip.
fn missing(what: &str) {
    let required = ["CI", "EMBER_REQUIRE_ALL"]
        .iter()
        .any(|v| env::var(v).is_ok_and(|x| !x.is_empty() && x != "0" && x != "false"));
    let message = format!(
        "{what}: run `sudo scripts/runtime-roots.sh` (Debian trixie and sid roots with python3 \
         and nodejs) and `apt-get install nodejs`, or set EMBER_ROOTS"
    );
    assert!(!required, "{message}");
    eprintln!("SKIPPED: {message}");
}

/// A runtime process started for the test: it does its work, prints `ready`, then does more
/// work each time a line comes on its stdin (printing `ready` again), and exits at EOF.
struct Runtime {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// Where its jitdump file is, as the host sees it.
    dump: PathBuf,
}

impl Runtime {
    /// Starts `command` and waits for its first `ready`; its dump is `dir/jit-PID.dump`.
    fn start(mut command: Command, dir: &Path) -> Self {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let dump = dir.join(format!("jit-{}.dump", child.id()));
        let mut runtime = Self {
            child,
            stdin,
            stdout,
            dump,
        };
        runtime.wait_ready();
        runtime
    }

    fn wait_ready(&mut self) {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the runtime exited before saying ready");
            if line.trim() == "ready" {
                return;
            }
        }
    }

    /// Asks for the second round of work and waits for it.
    fn more(&mut self) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(b"more\n").unwrap();
        stdin.flush().unwrap();
        self.wait_ready();
    }

    /// Its executable mappings: (start, end, path).
    fn executable_mappings(&self) -> Vec<(u64, u64, String)> {
        let maps = fs::read_to_string(format!("/proc/{}/maps", self.child.id())).unwrap();
        maps.lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let (range, perms) = (parts.next()?, parts.next()?);
                if !perms.contains('x') {
                    return None;
                }
                let (start, end) = range.split_once('-')?;
                let path = parts.nth(3).unwrap_or("").to_owned();
                Some((
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(end, 16).ok()?,
                    path,
                ))
            })
            .collect()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.dump);
        // V8's --perf-prof also writes an isolate-ADDRESS-PID-v8.log beside the dump.
        let log_suffix = format!("-{}-v8.log", self.child.id());
        if let Some(dir) = self.dump.parent() {
            for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("isolate-") && name.ends_with(&log_suffix) {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// Reads what was appended to `runtime`'s dump, asserting each entry lies in one of its
/// executable mappings (read at the same time, while it runs).
fn read_live(runtime: &Runtime, reader: &mut JitDump) -> Vec<JitEntry> {
    let file = File::open(&runtime.dump)
        .unwrap_or_else(|e| panic!("open {}: {e}", runtime.dump.display()));
    let maps = runtime.executable_mappings();
    let name = runtime.dump.file_name().unwrap().to_str().unwrap();
    assert!(
        maps.iter()
            .any(|(_, _, path)| path.ends_with(&format!("/{name}"))),
        "the runtime does not map its {name} executable: {maps:?}"
    );
    let len = file.metadata().unwrap().len();
    let mut entries = Vec::new();
    let started = std::time::Instant::now();
    reader
        .read_new(&file, u64::MAX, &mut |e| entries.push(e))
        .unwrap();
    // A figure for the log, not asserted.
    eprintln!(
        "read {} entries of {name} ({len} bytes) in {:?}",
        entries.len(),
        started.elapsed()
    );
    // Everything written when the call began is consumed but a record the runtime's stdio
    // buffer cut (it writes the file in 4 KiB blocks). The runtime keeps writing while we
    // read, so the reader may end past `len`.
    let left = len.saturating_sub(reader.offset());
    assert!(left < 64 * 1024, "{left} bytes of {len} left unread");
    let outside: Vec<&JitEntry> = entries
        .iter()
        .filter(|e| {
            !maps
                .iter()
                .any(|(start, end, _)| *start <= e.start && e.start + e.size <= *end)
        })
        .collect();
    // V8 frees code it no longer needs: a few entries of a long run may be gone already.
    assert!(
        outside.len() * 100 <= entries.len(),
        "{} of {} entries outside the process's executable mappings, e.g. {:?}",
        outside.len(),
        entries.len(),
        outside.first()
    );
    entries
}

/// A workload for CPython: two hot functions under a caller, then `gamma` on request.
const PYTHON_WORKLOAD: &str = r#"
import sys

def alpha(n):
    s = 0
    for i in range(n):
        s += i
    return s

def beta(n):
    return alpha(n) + 1

def outer():
    for _ in range(20):
        beta(1000)

def gamma():
    return sum(range(10))

def push_out(round):
    """CPython writes its jitdump through a 4 KiB stdio buffer: the records of the code that
    ran last stay in it until more follow. 64 new functions (a trampoline each: about 230
    bytes of records) push them into the file."""
    for i in range(64):
        name = f"filler_{round}_{i}"
        space = {}
        exec(f"def {name}():\n    return {i}\n", space)
        space[name]()

outer()
push_out(0)
print("ready", flush=True)
for round, line in enumerate(sys.stdin, 1):
    gamma()
    push_out(round)
    print("ready", flush=True)
"#;

/// Runs Debian `suite`'s python3 with `-X perf_jit` on the workload and checks its dump.
fn python_dump(suite: &str, version: &str) {
    let root = roots_dir().join(suite);
    let exe = format!("/usr/bin/python{version}");
    if !root.join(&exe[1..]).exists() {
        missing(&format!("no python{version} in {}", root.display()));
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        missing("entering a Debian root takes chroot, as root");
        return;
    }
    let dir_inside = "/tmp/ember-jitdump-test";
    let dir = root.join(&dir_inside[1..]);
    fs::create_dir_all(&dir).unwrap();
    let script_inside = format!("{dir_inside}/workload-{}.py", std::process::id());
    fs::write(root.join(&script_inside[1..]), PYTHON_WORKLOAD).unwrap();
    let mut command = Command::new("chroot");
    command
        .arg(&root)
        .args([&exe, "-X", "perf_jit", &script_inside]);
    // CPython writes /tmp/jit-PID.dump, inside the root.
    let mut runtime = Runtime::start(command, &root.join("tmp"));
    let mut reader = JitDump::default();
    // First round: alpha, beta, outer (and the start-up code).
    let first = read_live(&runtime, &mut reader);
    let name = |f: &str| format!("py::{f}:{script_inside}");
    for f in ["alpha", "beta", "outer", "<module>"] {
        let hits: Vec<&JitEntry> = first.iter().filter(|e| e.name == name(f)).collect();
        assert_eq!(hits.len(), 1, "{} in {:?}", name(f), names(&first));
        assert!(hits[0].size > 0 && hits[0].source.is_none());
    }
    assert!(first.iter().all(|e| e.name.starts_with("py::")));
    assert!(!first.iter().any(|e| e.name == name("gamma")));
    // Second round: only what ran since, gamma among it.
    runtime.more();
    let second = read_live(&runtime, &mut reader);
    assert!(
        second.iter().any(|e| e.name == name("gamma")),
        "{:?}",
        names(&second)
    );
    assert!(!second.iter().any(|e| e.name == name("alpha")));
    let stats = reader.stats();
    eprintln!(
        "python{version} ({suite}): {} entries, {} records, {} bytes read of {}",
        stats.entries,
        stats.records,
        stats.bytes_read,
        reader.offset()
    );
    let _ = fs::remove_file(root.join(&script_inside[1..]));
}

fn names(entries: &[JitEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.name.as_str()).collect()
}

#[test]
fn python_3_13_perf_jit_dump_names_the_functions_that_ran() {
    python_dump("trixie", "3.13");
}

#[test]
fn python_3_14_perf_jit_dump_names_the_functions_that_ran() {
    python_dump("sid", "3.14");
}

/// A workload for Node: a hot function compiled by the optimizing tiers, then `gammaLate`.
/// V8 writes its jitdump through a stdio buffer too: each round ends by compiling 64 new
/// functions (`--always-sparkplug` compiles each at its first call) to push its records out.
const NODE_WORKLOAD: &str = r#"
function hotLoop(n) { let s = 0; for (let i = 0; i < n; i++) s += i % 7; return s; }
function outerCaller() { let t = 0; for (let i = 0; i < 3000; i++) t += hotLoop(2000); return t; }
function gammaLate(x) { let s = 0; for (let i = 0; i < 1000; i++) s += (x + i) % 3; return s; }
function pushOut(round) {
  for (let i = 0; i < 64; i++) new Function("x", `return x + ${round * 1000 + i};`)(i);
}
outerCaller();
pushOut(0);
console.log("ready");
let round = 0;
process.stdin.on("data", () => { gammaLate(round); pushOut(++round); console.log("ready"); });
"#;

const NODE_FLAGS: &str = "--perf-prof --always-sparkplug";

/// Runs `node --perf-prof` (the host's, or a root's through chroot) and checks its dump.
fn node_dump(suite: Option<&str>) {
    let (root, host_dir, inside_dir) = match suite {
        Some(suite) => {
            let root = roots_dir().join(suite);
            if !root.join("usr/bin/node").exists() {
                missing(&format!("no node in {}", root.display()));
                return;
            }
            if !nix::unistd::geteuid().is_root() {
                missing("entering a Debian root takes chroot, as root");
                return;
            }
            let inside = "/tmp/ember-jitdump-test-node".to_owned();
            (Some(root.clone()), root.join(&inside[1..]), inside)
        }
        None => {
            if Command::new("node").arg("--version").output().is_err() {
                missing("no node on the host (apt-get install nodejs)");
                return;
            }
            let dir = env::temp_dir().join("ember-jitdump-test-node");
            (None, dir.clone(), dir.display().to_string())
        }
    };
    fs::create_dir_all(&host_dir).unwrap();
    let script = format!("workload-{}.js", std::process::id());
    fs::write(host_dir.join(&script), NODE_WORKLOAD).unwrap();
    // V8 writes jit-PID.dump into its working directory.
    let command = match &root {
        Some(root) => {
            let mut c = Command::new("chroot");
            c.arg(root).args([
                "/bin/sh",
                "-c",
                &format!("cd {inside_dir} && exec /usr/bin/node {NODE_FLAGS} {script}"),
            ]);
            c
        }
        None => {
            let mut c = Command::new("node");
            c.current_dir(&host_dir)
                .args(NODE_FLAGS.split(' '))
                .arg(&script);
            c
        }
    };
    let mut runtime = Runtime::start(command, &host_dir);
    let mut reader = JitDump::default();
    let first = read_live(&runtime, &mut reader);
    let hot: Vec<&JitEntry> = first
        .iter()
        .filter(|e| e.name.starts_with("JS:") && e.name.contains("hotLoop"))
        .collect();
    assert!(!hot.is_empty(), "no hotLoop in {:?}", names(&first));
    assert!(hot.iter().all(|e| e.name.contains(&script)));
    assert!(first.iter().any(|e| e.name.starts_with("Builtin:")));
    assert!(!first.iter().any(|e| e.name.contains("gammaLate")));
    runtime.more();
    let second = read_live(&runtime, &mut reader);
    assert!(
        second.iter().any(|e| e.name.contains("gammaLate")),
        "{:?}",
        names(&second)
    );
    // V8 writes debug info for its optimized code: the sources name the script or Node's own.
    let sources: Vec<&(String, u32)> = first
        .iter()
        .chain(&second)
        .filter_map(|e| e.source.as_ref())
        .collect();
    assert!(!sources.is_empty(), "no debug info read");
    assert!(sources
        .iter()
        .all(|(file, line)| !file.is_empty() && *line > 0));
    let stats = reader.stats();
    eprintln!(
        "node {suite:?}: {} entries ({} with a source), {} records, {} bytes read of {}",
        stats.entries,
        sources.len(),
        stats.records,
        stats.bytes_read,
        reader.offset()
    );
    let _ = fs::remove_file(host_dir.join(&script));
}

#[test]
fn host_node_perf_prof_dump_names_the_functions_that_ran() {
    node_dump(None);
}

#[test]
fn trixie_node_perf_prof_dump_names_the_functions_that_ran() {
    node_dump(Some("trixie"));
}

#[test]
fn sid_node_perf_prof_dump_names_the_functions_that_ran() {
    node_dump(Some("sid"));
}
