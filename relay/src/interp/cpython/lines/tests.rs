//! The line decoder against hand-built tables of each format, hostile bytes, and every CPython
//! on the test machine: for every code unit of every code object `lines.py` compiles, the
//! decoder must give the line the interpreter itself gives, from the whole table, and the same
//! or nothing from the kernel's 256-byte copy and from any shorter prefix.

use std::{
    env, fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::{line_of, payload, Table};
use crate::interp::cpython::Version;

/// What the eBPF walker copies of a line table's bytes object (`INTERP_LINES_BYTES`).
const KERNEL_COPY: usize = 256;

fn v(minor: u8) -> Version {
    Version::new(3, minor, 0)
}

/// The lines of code units `0..units` (offsets `0, 2, ...`).
fn lines(version: Version, table: Table<'_>, first: u32, units: u32) -> Vec<Option<u32>> {
    (0..units)
        .map(|u| line_of(version, table, first, u * 2))
        .collect()
}

#[test]
fn lnotab_sums_pairs_up_to_the_offset_and_signs_line_increments() {
    // Given the rows 0:first, 6:+1, 50:+5, 350:+200 (a byte step over 255 and a line step over
    // 127, each split over pairs), 361:+1, 370:-3 (a signed increment, 3.6 on).
    let table = [0, 0, 6, 1, 44, 5, 255, 0, 45, 127, 0, 73, 11, 1, 9, 0xfd];
    let at = |offset| line_of(v(8), Table::whole(&table), 10, offset);
    // Then each row's line holds from its offset to the next row's.
    assert_eq!(at(0), Some(10));
    assert_eq!(at(5), Some(10));
    assert_eq!(at(6), Some(11));
    assert_eq!(at(49), Some(11));
    assert_eq!(at(50), Some(16));
    assert_eq!(at(349), Some(16));
    assert_eq!(at(350), Some(216));
    assert_eq!(at(361), Some(217));
    assert_eq!(at(369), Some(217));
    assert_eq!(at(370), Some(214));
    // Past the last pair of a whole table: the last line.
    assert_eq!(at(9999), Some(214));
    // The same bytes as a prefix: past its last pair nothing is known.
    let prefix = |offset| line_of(v(8), Table::prefix(&table), 10, offset);
    assert_eq!(prefix(369), Some(217));
    assert_eq!(prefix(370), None);
    // A prefix cut inside the pairs that split a step: the step's first pair does not answer.
    let cut = Table::prefix(&table[..10]);
    assert_eq!(line_of(v(8), cut, 10, 349), Some(16));
    assert_eq!(line_of(v(8), cut, 10, 350), None);
    // Cut in the middle of a pair: the half pair is ignored, and the row before it is not
    // known to end anywhere.
    assert_eq!(line_of(v(8), Table::prefix(&table[..5]), 10, 5), Some(10));
    assert_eq!(line_of(v(8), Table::prefix(&table[..5]), 10, 6), None);
    // A line below zero is no line.
    assert_eq!(line_of(v(6), Table::whole(&[2, 0xfb]), 3, 2), None);
}

#[test]
fn pep626_ranges_carry_their_line_and_no_line_keeps_the_running_line() {
    // Ranges: [0,4) first+1, [4,4) empty +2, [4,10) no line, [10,12) +0, [12,266) -1,
    // [266,266) empty +0, [266,268) +127.
    let table = [4, 1, 0, 2, 6, 0x80, 2, 0, 254, 0xff, 0, 0, 2, 127];
    let at = |offset| line_of(v(10), Table::whole(&table), 20, offset);
    assert_eq!(at(0), Some(21));
    assert_eq!(at(2), Some(21));
    assert_eq!(at(4), None);
    assert_eq!(at(8), None);
    // The no-line range did not move the running line: 21 + 2 + 0.
    assert_eq!(at(10), Some(23));
    assert_eq!(at(12), Some(22));
    assert_eq!(at(264), Some(22));
    assert_eq!(at(266), Some(149));
    // Past the last range: no line, whole table or not.
    assert_eq!(at(268), None);
    assert_eq!(line_of(v(10), Table::prefix(&table[..8]), 20, 12), None);
}

#[test]
fn location_entries_of_every_kind_give_their_lines() {
    let entry = |kind: u8, units: u8| 0x80 | (kind << 3) | (units - 1);
    let table = [
        // Short form (kind 3), 2 units: the first line, one byte of columns.
        entry(3, 2),
        0x12,
        // One-line form +2, 1 unit, two column bytes.
        entry(12, 1),
        4,
        9,
        // No columns, -5 as a svarint (5 << 1 | 1 = 11), 3 units.
        entry(13, 3),
        11,
        // No location, 1 unit: no line, the running line unchanged.
        entry(15, 1),
        // Long form: +100 (200 = 0x48 0x03 in 6-bit chunks), end line +1, columns 1 and 70
        // (70 = 0x46 0x01), 8 units.
        entry(14, 8),
        0x48,
        0x03,
        2,
        1,
        0x46,
        0x01,
        // One-line form +0, 1 unit.
        entry(10, 1),
        0,
        1,
    ];
    let got = lines(v(12), Table::whole(&table), 7, 17);
    let mut want = vec![Some(7), Some(7), Some(9), Some(4), Some(4), Some(4), None];
    want.extend([Some(104); 8]);
    want.extend([Some(104), None]);
    assert_eq!(got, want);
    // Cut inside the long form's line delta: its units are unknown, the earlier ones are not.
    let cut = Table::prefix(&table[..10]);
    assert_eq!(line_of(v(13), cut, 7, 14), None);
    assert_eq!(line_of(v(13), cut, 7, 6), Some(4));
    // Cut inside a short form's column byte: its length is in its first byte, so it answers.
    assert_eq!(line_of(v(11), Table::prefix(&table[..1]), 7, 2), Some(7));
    assert_eq!(line_of(v(11), Table::prefix(&table[..1]), 7, 4), None);
    // A table that does not start with an entry is not one.
    assert_eq!(
        line_of(v(14), Table::whole(&[0x12, entry(3, 2)]), 7, 0),
        None
    );
}

#[test]
fn versions_outside_3_6_to_3_14_have_no_lines() {
    let table = Table::whole(&[8, 1]);
    for version in [Version::new(2, 7, 18), v(5), v(15), Version::new(4, 0, 0)] {
        assert_eq!(line_of(version, table, 1, 0), None, "{version}");
    }
    assert_eq!(line_of(v(6), table, 1, 0), Some(1));
}

/// A `PyBytesObject` image: header with `ob_size`, then `data`.
fn bytes_object(size: i64, data: &[u8]) -> Vec<u8> {
    let mut raw = vec![0u8; 32];
    raw[..8].copy_from_slice(&1u64.to_le_bytes());
    raw[16..24].copy_from_slice(&size.to_le_bytes());
    raw[24..32].copy_from_slice(&(-1i64).to_le_bytes());
    raw.extend_from_slice(data);
    raw
}

#[test]
fn payload_is_bounded_by_ob_size_and_by_the_copy() {
    let data: Vec<u8> = (0..=255).collect();
    // Whole, with garbage after the data (the kernel copies a fixed size).
    let raw = bytes_object(5, &data);
    assert_eq!(payload(&raw), Some(Table::whole(&data[..5])));
    // Empty.
    assert_eq!(payload(&bytes_object(0, &[])), Some(Table::whole(&[])));
    // Longer than the copy: a prefix of what the copy holds.
    let raw = bytes_object(1000, &data[..224]);
    let table = payload(&raw).expect("a prefix");
    assert_eq!(table.bytes(), &data[..224]);
    assert!(!table.is_complete());
    let huge = bytes_object(i64::MAX, &data[..3]);
    assert_eq!(payload(&huge), Some(Table::prefix(&data[..3])));
    // No data to hold, or no bytes object.
    assert_eq!(payload(&raw[..31]), None);
    assert_eq!(payload(&raw[..32]), Some(Table::prefix(&[])));
    assert_eq!(payload(&bytes_object(-1, &data)), None);
    assert_eq!(payload(&[]), None);
}

/// xorshift64*: deterministic bytes for the hostile-input test, no dependency.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random bytes as tables and raw copies, random versions, first lines and offsets: no panic,
/// and no prefix ever answers other than the whole table does.
#[test]
fn random_bytes_never_panic_and_prefixes_never_contradict() {
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let mut answered = 0;
    for round in 0..20_000 {
        let len = noise.below(300) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| noise.next() as u8).collect();
        if round % 3 == 0 {
            // Mostly entry starts, so the 3.11+ decoder gets far.
            for b in bytes.iter_mut().step_by(2) {
                *b |= 0x80;
            }
        }
        let version = Version::new(3, noise.below(17) as u8, 0);
        let first = match noise.below(4) {
            0 => u32::MAX - noise.below(300) as u32,
            1 => noise.below(5) as u32,
            _ => noise.next() as u32,
        };
        let offset = match noise.below(4) {
            0 => u32::MAX - noise.below(3) as u32,
            _ => noise.below(2 * len as u64 + 2) as u32,
        };
        let whole = line_of(version, Table::whole(&bytes), first, offset);
        answered += usize::from(whole.is_some());
        let cut = noise.below(len as u64 + 1) as usize;
        let part = line_of(version, Table::prefix(&bytes[..cut]), first, offset);
        assert!(
            part.is_none() || part == whole,
            "{version} first {first} offset {offset} cut {cut} of {bytes:02x?}: prefix says \
             {part:?}, whole {whole:?}"
        );
        // As a raw copy with a random ob_size.
        let mut raw: Vec<u8> = (0..noise.below(300)).map(|_| noise.next() as u8).collect();
        if raw.len() >= 24 && round % 2 == 0 {
            let size = noise.below(400);
            raw[16..24].copy_from_slice(&size.to_le_bytes());
        }
        if let Some(table) = payload(&raw) {
            assert!(table.bytes().len() <= raw.len().saturating_sub(32));
            let _ = line_of(version, table, first, offset);
        }
    }
    // A test of nothing would pass too: make sure the decoders ran past their first bytes.
    assert!(answered > 2_000, "only {answered} random lookups answered");
}

// ---- Against real interpreters ----

/// The release lines every test machine must hold an interpreter of.
const LINES: std::ops::RangeInclusive<u8> = 6..=14;

fn roots_dir() -> PathBuf {
    env::var_os("EMBER_ROOTS")
        .or_else(|| env::var_os("EMBER_PYTHON_ROOTS"))
        .map_or_else(|| PathBuf::from("/var/cache/ember/roots"), PathBuf::from)
}

fn pyenv_root() -> PathBuf {
    env::var_os("PYENV_ROOT").map_or_else(
        || PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"),
        PathBuf::from,
    )
}

/// How to run one interpreter: a command and its leading arguments, and where it came from.
struct Interpreter {
    run: Vec<String>,
    origin: String,
}

/// Every CPython 3 interpreter in the places cpython/tests.rs looks: pyenv's versions, the
/// host's `/usr/bin/python3.N`, and the Debian roots (run under chroot).
fn interpreters() -> Vec<Interpreter> {
    let mut found = Vec::new();
    let sorted = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let versions = pyenv_root().join("versions");
    for name in sorted(&versions) {
        let exe = versions.join(&name).join("bin/python3");
        if name.starts_with("3.") && exe.exists() {
            found.push(Interpreter {
                run: vec![exe.display().to_string()],
                origin: format!("pyenv {name}"),
            });
        }
    }
    let mut host = |root: &Path, chroot: bool, origin: &str| {
        for name in sorted(&root.join("usr/bin")) {
            let is_line = name
                .strip_prefix("python3.")
                .is_some_and(|minor| minor.parse::<u8>().is_ok());
            if !is_line {
                continue;
            }
            let inside = format!("/usr/bin/{name}");
            let run = if chroot {
                vec!["chroot".into(), root.display().to_string(), inside]
            } else {
                vec![inside]
            };
            found.push(Interpreter {
                run,
                origin: origin.to_owned(),
            });
        }
    };
    host(Path::new("/"), false, "host");
    for suite in ["trixie", "sid"] {
        host(
            &roots_dir().join(suite),
            true,
            &format!("Debian {suite} root"),
        );
    }
    found
}

/// A test machine without an interpreter the tests expect: a failure where nothing may be
/// skipped (`CI` or `EMBER_REQUIRE_ALL`), else a printed skip.
fn missing(what: &str) {
    let required = ["CI", "EMBER_REQUIRE_ALL"]
        .iter()
        .any(|v| env::var(v).is_ok_and(|x| !x.is_empty() && x != "0" && x != "false"));
    let message = format!(
        "{what}: run `pyenv install 3.6 3.7 3.8 3.9 3.10 3.11 3.12 3.13` and `sudo \
         scripts/runtime-roots.sh` (Debian's 3.13 and 3.14), or set PYENV_ROOT / \
         EMBER_ROOTS"
    );
    assert!(!required, "{message}");
    eprintln!("SKIPPED: {message}");
}

/// One code object as lines.py prints it.
struct Code {
    name: String,
    first_line: u32,
    /// The whole line table.
    table: Vec<u8>,
    /// The bytes object's memory from its start, at most 256 bytes.
    raw: Vec<u8>,
    /// The line of each code unit by `dis.findlinestarts` / `co_lines()`.
    by_table: Vec<Option<u32>>,
    /// The same by `PyCode_Addr2Line`.
    by_addr2line: Vec<Option<u32>>,
    /// The same by `co_positions()` (3.11 on; empty before).
    by_positions: Vec<Option<u32>>,
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

fn line_list(text: &str) -> Vec<Option<u32>> {
    if text.is_empty() {
        return Vec::new();
    }
    text.split(',')
        .map(|x| (x != "-").then(|| x.parse().expect("a line number")))
        .collect()
}

/// Runs lines.py in `interpreter`: its version and its code objects.
fn run_lines_py(interpreter: &Interpreter) -> (Version, Vec<Code>) {
    let mut child = Command::new(&interpreter.run[0])
        .args(&interpreter.run[1..])
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {:?}: {e}", interpreter.run));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(include_bytes!("../lines.py"))
        .expect("writing lines.py");
    let output = child.wait_with_output().expect("lines.py output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "lines.py in {:?} failed: {}",
        interpreter.run,
        String::from_utf8_lossy(&output.stderr)
    );
    let mut version = None;
    let mut codes = Vec::new();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields.as_slice() {
            ["version", text] => {
                let parts: Vec<u8> = text.split('.').map(|p| p.parse().expect("M.N.P")).collect();
                version = Some(Version::new(parts[0], parts[1], parts[2]));
            }
            ["code", name, first, table, raw, by_table, by_addr2line, by_positions] => {
                codes.push(Code {
                    name: (*name).to_owned(),
                    first_line: first.parse().expect("co_firstlineno"),
                    table: hex(table),
                    raw: hex(raw),
                    by_table: line_list(by_table),
                    by_addr2line: line_list(by_addr2line),
                    by_positions: line_list(by_positions),
                })
            }
            _ => panic!("lines.py printed {line:?}"),
        }
    }
    (version.expect("lines.py printed its version"), codes)
}

/// What one interpreter's code objects showed.
#[derive(Default)]
struct Tally {
    codes: usize,
    /// Code units checked against the whole table.
    offsets: usize,
    /// Of those, where the decoder and the interpreter disagree.
    mismatches: usize,
    /// Tables longer than the kernel's copy.
    truncated: usize,
    /// Code units the kernel's copy answers (the rest: `None`).
    answered_from_copy: usize,
    /// Lookups in prefixes of the table (the copy's and shorter).
    prefix_lookups: usize,
    failures: Vec<String>,
}

impl Tally {
    fn fail(&mut self, message: String) {
        if self.failures.len() < 12 {
            self.failures.push(message);
        }
    }
}

/// Prefix lengths to cut a table at: every one over the first entries (a cut at every place
/// inside an entry of each kind), then a sample as far as the table goes. The kernel's own
/// 224-byte cut is checked apart.
fn cuts(len: usize) -> impl Iterator<Item = usize> {
    let dense = len.min(96);
    (0..=dense).chain((dense + 1..=len).step_by(61))
}

fn check_code(version: Version, code: &Code, tally: &mut Tally) {
    tally.codes += 1;
    let units = u32::try_from(code.by_table.len()).expect("code units");
    // The interpreter's answers must agree, or there is no truth to hold the decoder to.
    if code.by_table != code.by_addr2line {
        tally.fail(format!(
            "{}: co_lines/findlinestarts and PyCode_Addr2Line disagree",
            code.name
        ));
    }
    if version.minor >= 11 && code.by_table != code.by_positions {
        tally.fail(format!("{}: co_lines and co_positions disagree", code.name));
    }
    let truth = &code.by_table;
    let whole = lines(version, Table::whole(&code.table), code.first_line, units);
    for (unit, (got, want)) in whole.iter().zip(truth).enumerate() {
        tally.offsets += 1;
        if got != want {
            tally.mismatches += 1;
            tally.fail(format!(
                "{} offset {}: decoded {got:?}, the interpreter says {want:?}",
                code.name,
                unit * 2
            ));
        }
    }
    // The kernel's copy: the object as it is in memory, then whatever follows it up to 256.
    let mut raw = code.raw.clone();
    raw.resize(KERNEL_COPY, 0xa5);
    let Some(copy) = payload(&raw) else {
        tally.fail(format!("{}: no payload in the raw copy", code.name));
        return;
    };
    let held = code.table.len().min(KERNEL_COPY - 32);
    if copy.bytes() != &code.table[..held] || copy.is_complete() != (held == code.table.len()) {
        tally.fail(format!(
            "{}: the copy's payload is not the table's first {held} bytes ({} of {}, complete: {})",
            code.name,
            copy.bytes().len(),
            code.table.len(),
            copy.is_complete()
        ));
    }
    tally.truncated += usize::from(!copy.is_complete());
    let from_copy = lines(version, copy, code.first_line, units);
    tally.answered_from_copy += from_copy.iter().filter(|l| l.is_some()).count();
    let mut prefixes = vec![(copy, from_copy)];
    for cut in cuts(code.table.len()) {
        let part = Table::prefix(&code.table[..cut]);
        prefixes.push((part, lines(version, part, code.first_line, units)));
    }
    for (part, got) in prefixes {
        for (unit, (got, want)) in got.iter().zip(truth).enumerate() {
            tally.prefix_lookups += 1;
            if got.is_some() && got != want {
                tally.fail(format!(
                    "{} offset {} from the table's first {} bytes: decoded {got:?}, the \
                     interpreter says {want:?}",
                    code.name,
                    unit * 2,
                    part.bytes().len()
                ));
            }
        }
    }
}

#[test]
fn every_cpython_line_table_decodes_as_the_interpreter_says() {
    let root = nix::unistd::geteuid().is_root();
    let mut rows = vec![format!(
        "{:<8} {:<22} {:>5} {:>7} {:>10} {:>9} {:>15} {:>10}",
        "python", "from", "codes", "offsets", "mismatches", "truncated", "copy answers", "prefixes"
    )];
    let mut seen = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for interpreter in interpreters() {
        if interpreter.run[0] == "chroot" && !root {
            missing(&format!(
                "{} needs root to run under chroot",
                interpreter.origin
            ));
            continue;
        }
        let (version, codes) = run_lines_py(&interpreter);
        let mut tally = Tally::default();
        for code in &codes {
            check_code(version, code, &mut tally);
        }
        if tally.codes < 15 {
            tally.fail(format!("only {} code objects", tally.codes));
        }
        if tally.truncated == 0 {
            tally.fail("no table longer than the kernel's copy".to_owned());
        }
        seen.insert(version.minor);
        rows.push(format!(
            "{:<8} {:<22} {:>5} {:>7} {:>10} {:>9} {:>15} {:>10}",
            version.to_string(),
            interpreter.origin,
            tally.codes,
            tally.offsets,
            tally.mismatches,
            tally.truncated,
            format!("{}/{}", tally.answered_from_copy, tally.offsets),
            tally.prefix_lookups,
        ));
        if !tally.failures.is_empty() {
            failures.push(format!(
                "{version} ({}):\n  {}",
                interpreter.origin,
                tally.failures.join("\n  ")
            ));
        }
    }
    println!("{}", rows.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let absent: Vec<String> = LINES
        .filter(|m| !seen.contains(m))
        .map(|m| format!("3.{m}"))
        .collect();
    if !absent.is_empty() {
        missing(&format!(
            "no CPython {} found to test against",
            absent.join(", ")
        ));
    }
}
