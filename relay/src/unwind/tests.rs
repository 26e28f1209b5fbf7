//! Tests of the whole compiler on real binaries (a C workload built here, this machine's libc,
//! this test binary), checked against an independent oracle (`readelf --debug-dump=frames-interp`),
//! and on crafted hostile inputs. Runnable as a normal user; needs `cc`, `objcopy` and `readelf`
//! (binutils), which the project's setup installs.

use std::{
    collections::HashMap,
    fs::{self, File},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use super::{
    cache::{Cache, Outcome},
    compile, Cfa, CfiSection, Compiled, Compression, Error, Limits, Rbp, Rule, StopReason,
    Truncation, UnwindTable,
};

const WORKLOAD: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) long leaf(long x) {
    volatile long acc = x;
    for (int i = 0; i < 100; i++) acc = acc * 31 + i;
    return acc;
}

/* A variable-length array makes GCC keep a frame pointer here: CFA = rbp + 16. */
__attribute__((noinline)) long with_vla(int n) {
    char buf[n];
    memset(buf, n, (size_t)n);
    return leaf(buf[n / 2]) + buf[0];
}

/* A big frame: CFA = rsp + a large offset. */
__attribute__((noinline)) long big_frame(int n) {
    volatile char page[70000];
    page[n] = (char)n;
    return with_vla(n + 8) + page[n];
}

__attribute__((noinline)) long recurse(int depth) {
    if (depth == 0) return big_frame(depth + 1);
    return recurse(depth - 1) + depth;
}

int main(int argc, char **argv) {
    long total = 0;
    for (int i = 0; i < (argc > 1 ? atoi(argv[1]) : 1); i++) total += recurse(5);
    printf("%ld\n", total);
    return 0;
}
"#;

/// A scratch directory removed at the end of the test.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("cannot make a temporary directory: {e}"))
}

fn run(cmd: &mut Command) -> String {
    run_checked(cmd, true)
}

/// Runs `cmd`; with `strict`, a failure status fails the test. readelf exits 1 on libc after
/// printing the whole dump (no message), so the oracle only requires output.
fn run_checked(cmd: &mut Command, strict: bool) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (binutils and cc are needed): {e}"));
    assert!(
        out.status.success() || (!strict && !out.stdout.is_empty()),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the C workload in `dir` with `flags`.
fn build_workload(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join("workload.c");
    fs::write(&src, WORKLOAD).unwrap_or_else(|e| panic!("cannot write {src:?}: {e}"));
    let out = dir.join(name);
    run(Command::new("cc").args(flags).arg("-o").arg(&out).arg(&src));
    out
}

fn compile_path(path: &Path, limits: &Limits) -> Result<Compiled, Error> {
    let file = File::open(path).unwrap_or_else(|e| panic!("cannot open {path:?}: {e}"));
    compile(&file, limits)
}

fn libc_path() -> PathBuf {
    let candidates = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
        "/usr/lib64/libc.so.6",
    ];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no libc.so.6 in {candidates:?}"))
}

/// Address of `symbol` in the file's symbol table, from `nm`.
fn symbol(path: &Path, name: &str) -> u64 {
    let out = run(Command::new("nm").arg(path));
    out.lines()
        .find_map(|l| {
            let mut parts = l.split_whitespace();
            let (addr, _, sym) = (parts.next()?, parts.next()?, parts.next()?);
            (sym == name).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .unwrap_or_else(|| panic!("no symbol {name} in {path:?}"))
}

// ---- the readelf oracle ----

/// One row of `readelf --debug-dump=frames-interp`: `[start, end)` and its column values.
#[derive(Debug)]
struct OracleRow {
    start: u64,
    end: u64,
    cfa: String,
    rbp: Option<String>,
    ra: Option<String>,
}

/// What the compiler must say for an oracle row.
#[derive(Debug, PartialEq)]
enum Expect {
    Exact(Rule),
    /// A CFA expression: PLT, signal frame, or a stop.
    Expression,
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s, 16).unwrap_or_else(|e| panic!("bad hex {s:?}: {e}"))
}

/// readelf's columns of one table line: (column name, value).
type Columns = Vec<(String, String)>;

/// The entry being read: a CIE, or an FDE with its range and CIE offset.
struct Entry {
    offset: String,
    fde: Option<(u64, u64, String)>,
    lines: Vec<(u64, Columns)>,
}

/// Collects oracle rows from readelf's interpreted dump, entry by entry.
#[derive(Default)]
struct OracleParser {
    rows: Vec<OracleRow>,
    /// Per CIE offset, its last line (an FDE without instructions prints no lines).
    cies: HashMap<String, Columns>,
    entry: Option<Entry>,
    columns: Vec<String>,
}

impl OracleParser {
    fn flush(&mut self) {
        let Some(mut entry) = self.entry.take() else {
            return;
        };
        let Some((start, end, cie)) = entry.fde else {
            if let Some((_, cols)) = entry.lines.pop() {
                self.cies.insert(entry.offset, cols);
            }
            return;
        };
        if entry.lines.is_empty() {
            if let Some(cols) = self.cies.get(&cie) {
                entry.lines.push((start, cols.clone()));
            }
        }
        for (i, (loc, cols)) in entry.lines.iter().enumerate() {
            let next = entry.lines.get(i + 1).map_or(end, |r| r.0).min(end);
            if *loc >= next {
                continue;
            }
            let get = |name: &str| cols.iter().find(|(c, _)| c == name).map(|(_, v)| v.clone());
            self.rows.push(OracleRow {
                start: *loc,
                end: next,
                cfa: get("CFA").unwrap_or_default(),
                rbp: get("rbp"),
                ra: get("ra"),
            });
        }
    }

    fn line(&mut self, line: &str) {
        // A register column reads `r9 (r9)`: keep the value, drop the parenthesised name.
        let mut words: Vec<&str> = Vec::new();
        for word in line.split_whitespace() {
            if !word.starts_with('(') || words.is_empty() {
                words.push(word);
            }
        }
        if words.len() >= 4 && (words[3] == "CIE" || words[3] == "FDE") && !line.starts_with(' ') {
            self.flush();
            let fde = (words[3] == "FDE").then(|| {
                let cie = words[4].trim_start_matches("cie=").to_owned();
                let pc = words[5].trim_start_matches("pc=");
                let (s, e) = pc.split_once("..").unwrap_or_else(|| panic!("bad pc {pc}"));
                (hex(s), hex(e), cie)
            });
            self.entry = Some(Entry {
                offset: words[0].to_owned(),
                fde,
                lines: Vec::new(),
            });
        } else if words.first() == Some(&"LOC") {
            self.columns = words.iter().map(|w| (*w).to_owned()).collect();
        } else if let Some(entry) = self.entry.as_mut() {
            if words.len() != self.columns.len() || words.is_empty() {
                return;
            }
            let Ok(loc) = u64::from_str_radix(words[0], 16) else {
                return;
            };
            let cols = self.columns[1..]
                .iter()
                .cloned()
                .zip(words[1..].iter().map(|w| (*w).to_owned()))
                .collect();
            entry.lines.push((loc, cols));
        }
    }
}

/// Parses the rows of `section` (".eh_frame" or ".debug_frame") from readelf's interpreted dump.
fn oracle(path: &Path, section: &str) -> Vec<OracleRow> {
    let text = run_checked(
        Command::new("readelf")
            .arg("-W")
            .arg("--debug-dump=frames-interp")
            .arg(path),
        false,
    );
    let mut parser = OracleParser::default();
    let mut in_section = false;
    for line in text.lines() {
        if line.starts_with("Contents of the ") {
            parser.flush();
            parser.cies.clear();
            // The GNU form of .debug_frame is named .zdebug_frame.
            in_section = line.contains(&format!("{section} section"))
                || (section == ".debug_frame" && line.contains(".zdebug_frame section"));
        } else if in_section {
            parser.line(line);
        }
    }
    parser.flush();
    parser.rows
}

/// Parses readelf's `reg+N` / `reg-N`.
fn reg_offset(s: &str) -> Option<(&str, i64)> {
    let at = s.find(['+', '-'])?;
    Some((&s[..at], s[at..].trim_start_matches('+').parse().ok()?))
}

/// The rule the compiler must give for a row, by the same precedence (CFA, return address, rbp).
fn expect(row: &OracleRow) -> Expect {
    if row.cfa == "exp" {
        return Expect::Expression;
    }
    let stop = |r| Expect::Exact(Rule::Stop(r));
    let cfa = match reg_offset(&row.cfa) {
        Some((reg, off)) => match (reg, i32::try_from(off)) {
            (_, Err(_)) => return stop(StopReason::OffsetRange),
            ("rsp", Ok(off)) => Cfa::Rsp(off),
            ("rbp", Ok(off)) => Cfa::Rbp(off),
            _ => return stop(StopReason::CfaRegister),
        },
        None => return stop(StopReason::CfaRegister),
    };
    match row.ra.as_deref() {
        Some("c-8") => {}
        Some("u") => return stop(StopReason::Outermost),
        _ => return stop(StopReason::ReturnAddressRule),
    }
    let rbp = match row.rbp.as_deref() {
        None | Some("u" | "s") => Rbp::Unchanged,
        Some(v) => match v.strip_prefix('c').and_then(|n| n.parse::<i64>().ok()) {
            Some(off) => match i16::try_from(off) {
                Ok(off) => Rbp::AtCfa(off),
                Err(_) => return stop(StopReason::OffsetRange),
            },
            None => return stop(StopReason::RbpRule),
        },
    };
    Expect::Exact(Rule::Frame { cfa, rbp })
}

/// Checks every `every`-th oracle row (first and last address) against the table; returns the
/// number of addresses checked. Panics listing the first mismatches.
fn check_against_readelf(path: &Path, compiled: &Compiled, every: usize) -> usize {
    let sections: &[&str] = match compiled.stats.section {
        CfiSection::Both => &[".eh_frame", ".debug_frame"],
        one => &[one.name()],
    };
    let rows: Vec<OracleRow> = sections.iter().flat_map(|s| oracle(path, s)).collect();
    assert!(!rows.is_empty(), "readelf shows no rows for {path:?}");
    let table = &compiled.table;
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for row in rows.iter().step_by(every.max(1)) {
        if row.start < table.base() || row.end > table.end() {
            continue; // an FDE outside the executable range: skipped by design
        }
        for address in [row.start, row.end - 1] {
            checked += 1;
            let got = table.lookup(address);
            let ok = match (expect(row), got) {
                (Expect::Exact(want), Some(got)) => want == got,
                (Expect::Expression, Some(got)) => matches!(
                    got,
                    Rule::Plt { .. }
                        | Rule::Signal { .. }
                        | Rule::Stop(StopReason::CfaExpression | StopReason::ReturnAddressRule)
                ),
                (_, None) => false,
            };
            if !ok {
                mismatches.push(format!("{address:#x}: readelf {row:?}, table {got:?}"));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {checked} addresses of {path:?} disagree with readelf, e.g. {:#?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    checked
}

/// `.text`'s address range, from readelf's section headers.
fn text_range(path: &Path) -> (u64, u64) {
    let out = run(Command::new("readelf").args(["-S", "-W"]).arg(path));
    out.lines()
        .find_map(|l| {
            let w: Vec<&str> = l
                .trim_start_matches(|c: char| {
                    c == ' ' || c == '[' || c.is_ascii_digit() || c == ']'
                })
                .split_whitespace()
                .collect();
            (w.first() == Some(&".text")).then(|| {
                let addr = hex(w[2]);
                (addr, addr + hex(w[4]))
            })
        })
        .unwrap_or_else(|| panic!("no .text in {path:?}"))
}

/// Every `.text` address resolves to exactly one row (a rule or an explicit gap); returns the
/// fraction of `.text` bytes that are gaps.
fn check_text_coverage(path: &Path, table: &UnwindTable) -> f64 {
    let (start, end) = text_range(path);
    assert!(
        table.base() <= start && end <= table.end(),
        "{path:?}: .text {start:#x}..{end:#x} outside the table {:#x}..{:#x}",
        table.base(),
        table.end()
    );
    // Walk the rows rather than every byte: rows partition the range, so summing their
    // intersections with .text must give exactly .text's size.
    let rows = table.rows();
    let (mut covered, mut gaps) = (0u64, 0u64);
    for (i, row) in rows.iter().enumerate() {
        let lo = table.base() + u64::from(row.pc);
        let hi = rows
            .get(i + 1)
            .map_or(table.end(), |n| table.base() + u64::from(n.pc));
        let (lo, hi) = (lo.max(start), hi.min(end));
        if lo < hi {
            covered += hi - lo;
            if row.rule == Rule::Gap {
                gaps += hi - lo;
            }
            assert_eq!(table.lookup(lo), Some(row.rule));
            assert_eq!(table.lookup(hi - 1), Some(row.rule));
        }
    }
    assert_eq!(
        covered,
        end - start,
        "{path:?}: rows do not partition .text"
    );
    gaps as f64 / (end - start) as f64
}

// ---- real binaries ----

#[test]
fn a_no_frame_pointer_c_workload_matches_readelf_everywhere() {
    // Given: the workload built with the compiler's own CFI and no frame pointers.
    let dir = scratch();
    let exe = build_workload(dir.path(), "nofp", &["-O2", "-fomit-frame-pointer"]);
    // When
    let compiled = compile_path(&exe, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    // Then: every row agrees with readelf, .text is covered, nothing was cut or malformed.
    assert_eq!(compiled.stats.section, CfiSection::EhFrame);
    assert_eq!(compiled.stats.truncated, None);
    assert_eq!(compiled.stats.fdes_malformed, 0);
    let checked = check_against_readelf(&exe, &compiled, 1);
    assert!(checked > 20, "only {checked} addresses checked");
    check_text_coverage(&exe, &compiled.table);
    let table = &compiled.table;
    // The big frame's body: CFA = rsp + a large offset (70000 bytes of locals).
    let big = symbol(&exe, "big_frame");
    let deep = (big..big + 64)
        .filter_map(|a| table.lookup(a))
        .any(|r| matches!(r, Rule::Frame { cfa: Cfa::Rsp(off), .. } if off > 70_000));
    assert!(deep, "no rsp+70000 row in big_frame");
    // The VLA function keeps a frame pointer: CFA = rbp + 16, rbp saved at CFA - 16.
    let vla = symbol(&exe, "with_vla");
    let rbp_based = Rule::Frame {
        cfa: Cfa::Rbp(16),
        rbp: Rbp::AtCfa(-16),
    };
    assert!(
        (vla..vla + 64).any(|a| table.lookup(a) == Some(rbp_based)),
        "no rbp+16 row in with_vla"
    );
    // Entry of a leaf function: CFA = rsp + 8, return address on top of the stack.
    assert_eq!(
        table.lookup(symbol(&exe, "leaf")),
        Some(Rule::Frame {
            cfa: Cfa::Rsp(8),
            rbp: Rbp::Unchanged
        })
    );
    // The PLT stub the linker describes with its expression (printf is called through it).
    assert!(
        table.rows().iter().any(|r| r.rule
            == Rule::Plt {
                rsp_offset: 8,
                threshold: 11
            }),
        "no PLT row"
    );
    // _start marks the return address undefined: the outermost frame.
    assert_eq!(
        table.lookup(symbol(&exe, "_start")),
        Some(Rule::Stop(StopReason::Outermost))
    );
}

#[test]
fn debug_frame_is_used_when_there_is_no_eh_frame() {
    // Given: CFI only in .debug_frame (-fno-asynchronous-unwind-tables -g), .eh_frame removed.
    let dir = scratch();
    let exe = build_workload(
        dir.path(),
        "dbg",
        &[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
        ],
    );
    let stripped = dir.path().join("dbg-no-eh");
    run(Command::new("objcopy")
        .args([
            "--remove-section=.eh_frame",
            "--remove-section=.eh_frame_hdr",
        ])
        .arg(&exe)
        .arg(&stripped));
    // When
    let compiled = compile_path(&stripped, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    // Then
    assert_eq!(compiled.stats.section, CfiSection::DebugFrame);
    assert!(compiled.stats.fdes >= 5, "{:?}", compiled.stats);
    check_against_readelf(&stripped, &compiled, 1);
    assert_eq!(
        compiled.table.lookup(symbol(&stripped, "leaf")),
        Some(Rule::Frame {
            cfa: Cfa::Rsp(8),
            rbp: Rbp::Unchanged
        })
    );
}

#[test]
fn libc_matches_readelf_and_unwinds_its_signal_trampoline() {
    let libc = libc_path();
    let compiled = compile_path(&libc, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.stats.truncated, None);
    check_against_readelf(&libc, &compiled, 3);
    let gaps = check_text_coverage(&libc, &compiled.table);
    assert!(
        gaps < 0.05,
        "{:.1}% of libc's .text has no CFI",
        gaps * 100.0
    );
    // __restore_rt: the kernel's ucontext at rsp, rsp saved at +160, rip at +168, rbp at +120.
    let signal = Rule::Signal {
        rsp_at: 160,
        rbp_at: 120,
    };
    assert!(
        compiled.table.rows().iter().any(|r| r.rule == signal),
        "no signal-frame row in libc"
    );
}

#[test]
fn this_test_binary_matches_readelf_on_a_sample() {
    let exe = fs::read_link("/proc/self/exe").unwrap_or_else(|e| panic!("no /proc/self/exe: {e}"));
    let compiled = compile_path(&exe, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.stats.truncated, None);
    assert_eq!(compiled.stats.fdes_malformed, 0);
    check_against_readelf(&exe, &compiled, 97);
    check_text_coverage(&exe, &compiled.table);
    assert_eq!(
        UnwindTable::decode(&compiled.table.encode()).as_ref(),
        Ok(&compiled.table)
    );
}

#[test]
fn python3_matches_readelf_on_a_sample() {
    let Ok(python) = fs::canonicalize("/usr/bin/python3") else {
        eprintln!("skipped: no /usr/bin/python3 on this machine");
        return;
    };
    let compiled = compile_path(&python, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.stats.truncated, None);
    check_against_readelf(&python, &compiled, 29);
    let gaps = check_text_coverage(&python, &compiled.table);
    assert!(
        gaps < 0.05,
        "{:.1}% of python3's .text has no CFI",
        gaps * 100.0
    );
}

// ---- hostile input ----

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap_or_else(|e| panic!("cannot write {path:?}: {e}"));
    path
}

/// (section header index, file offset, size) of `name`, from readelf.
fn section_header(path: &Path, name: &str) -> (usize, u64, u64) {
    let out = run(Command::new("readelf").args(["-S", "-W"]).arg(path));
    out.lines()
        .find_map(|l| {
            let (idx, rest) = l.trim_start().strip_prefix('[')?.split_once(']')?;
            let w: Vec<&str> = rest.split_whitespace().collect();
            (w.first() == Some(&name)).then(|| (idx.trim().parse().ok(), hex(w[3]), hex(w[4])))
        })
        .and_then(|(i, off, size)| Some((i?, off, size)))
        .unwrap_or_else(|| panic!("no {name} in {path:?}"))
}

/// The byte offset of section header `index`'s field at `field` (ELF64 little-endian).
fn shdr_field(bytes: &[u8], index: usize, field: usize) -> usize {
    let u = |at: usize, n: usize| {
        bytes[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
    };
    let shoff = u(0x28, 8) as usize;
    let shentsize = u(0x3a, 2) as usize;
    shoff + index * shentsize + field
}

#[test]
fn garbage_truncated_and_foreign_files_are_errors() {
    let dir = scratch();
    let exe = build_workload(dir.path(), "w", &["-O2"]);
    let real = fs::read(&exe).unwrap_or_else(|e| panic!("{e}"));
    let limits = Limits::default();
    let empty = write_file(dir.path(), "empty", &[]);
    assert!(matches!(compile_path(&empty, &limits), Err(Error::Elf(_))));
    let mut rng = fastrand::Rng::with_seed(7);
    let noise: Vec<u8> = (0..4096).map(|_| rng.u8(..)).collect();
    let noise = write_file(dir.path(), "noise", &noise);
    assert!(matches!(compile_path(&noise, &limits), Err(Error::Elf(_))));
    // Only the ELF header: the section headers it points at are past the end of the file.
    let head = write_file(dir.path(), "head", &real[..64]);
    assert!(matches!(compile_path(&head, &limits), Err(Error::Elf(_))));
    // Another machine (aarch64 = 183).
    let mut arm = real.clone();
    arm[0x12..0x14].copy_from_slice(&183u16.to_le_bytes());
    let arm = write_file(dir.path(), "arm", &arm);
    assert!(matches!(
        compile_path(&arm, &limits),
        Err(Error::Machine(183))
    ));
    // Section headers claimed far beyond the file.
    let mut far = real.clone();
    far[0x28..0x30].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let far = write_file(dir.path(), "far", &far);
    assert!(matches!(compile_path(&far, &limits), Err(Error::Elf(_))));
}

#[test]
fn a_claimed_huge_section_is_refused_before_anything_is_read() {
    // Given: .eh_frame's header claims 1 TiB.
    let dir = scratch();
    let exe = build_workload(dir.path(), "w", &["-O2"]);
    let (index, _, _) = section_header(&exe, ".eh_frame");
    let mut bytes = fs::read(&exe).unwrap_or_else(|e| panic!("{e}"));
    let at = shdr_field(&bytes, index, 0x20); // sh_size
    bytes[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let huge = write_file(dir.path(), "huge", &bytes);
    // When/Then: refused by size, fast.
    let started = Instant::now();
    let err = compile_path(&huge, &Limits::default()).err();
    assert!(
        matches!(err, Some(Error::SectionTooLarge { size, .. }) if size == 1 << 40),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    // And a real section over a small limit is refused the same way.
    let small = Limits {
        max_section_bytes: 64,
        ..Limits::default()
    };
    assert!(matches!(
        compile_path(&exe, &small),
        Err(Error::SectionTooLarge { .. })
    ));
}

fn assert_valid(table: &UnwindTable) {
    assert_eq!(
        UnwindTable::decode(&table.encode()).as_ref(),
        Ok(table),
        "a compiled table breaks its own invariants"
    );
}

#[test]
fn budgets_truncate_the_table_and_say_why() {
    let libc = libc_path();
    // Work budget: a few FDEs' worth.
    let work = Limits {
        max_work_bytes: 4096,
        ..Limits::default()
    };
    assert_eq!(work.work_budget(1 << 20), 4096);
    let c = compile_path(&libc, &work).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.stats.truncated, Some(Truncation::WorkBudget));
    assert!(c.stats.work_bytes <= 4096);
    assert_valid(&c.table);
    // Row budget.
    let rows = Limits {
        max_rows: 100,
        ..Limits::default()
    };
    let c = compile_path(&libc, &rows).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.stats.truncated, Some(Truncation::RowBudget));
    assert!(c.stats.cfi_rows <= 100);
    assert!(
        c.table.rows().len() <= 2 * 100 + 1,
        "{}",
        c.table.rows().len()
    );
    assert_valid(&c.table);
    // Per-FDE budget: big FDEs become stop rows, counted, the rest is compiled.
    let fde = Limits {
        max_fde_bytes: 48,
        ..Limits::default()
    };
    let c = compile_path(&libc, &fde).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.stats.truncated, None);
    assert!(c.stats.fdes_over_budget > 0);
    let budget_rows = c
        .table
        .stop_counts()
        .into_iter()
        .find(|(r, _)| *r == StopReason::Budget);
    assert!(budget_rows.is_some_and(|(_, n)| n > 0));
    assert_valid(&c.table);
}

#[test]
fn corrupted_cfi_never_panics_and_always_gives_a_valid_table_or_an_error() {
    // Given: the workload with random bytes of its .eh_frame (and sometimes anywhere) flipped.
    let dir = scratch();
    let exe = build_workload(dir.path(), "w", &["-O2", "-fomit-frame-pointer"]);
    let real = fs::read(&exe).unwrap_or_else(|e| panic!("{e}"));
    let (_, eh_off, eh_size) = section_header(&exe, ".eh_frame");
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let (mut ok, mut errors, mut noticed) = (0, 0, 0);
    for i in 0..300 {
        let mut bytes = real.clone();
        for _ in 0..rng.usize(1..=8) {
            let at = if i % 5 == 0 {
                rng.usize(..bytes.len())
            } else {
                (eh_off + rng.u64(..eh_size)) as usize
            };
            bytes[at] = rng.u8(..);
        }
        let path = write_file(dir.path(), "fuzzed", &bytes);
        // When
        let started = Instant::now();
        let result = compile_path(&path, &Limits::default());
        // Then: bounded time, and either an error or a table that keeps every invariant.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "case {i} too slow"
        );
        match result {
            Ok(c) => {
                ok += 1;
                assert_valid(&c.table);
                let s = &c.stats;
                if s.fdes_malformed + s.fdes_out_of_range + s.fdes_empty > 0
                    || s.truncated.is_some()
                {
                    noticed += 1;
                }
            }
            Err(_) => errors += 1,
        }
    }
    eprintln!("fuzzed 300: {ok} tables ({noticed} with counted damage), {errors} errors");
    assert!(ok > 100 && noticed > 20, "{ok} tables, {noticed} noticed");
}

/// An `.eh_frame` that amplifies work: one CIE of `cie_len` bytes whose initial instructions
/// are `remember_state; restore_state` pairs (run again for every FDE), then as many 20-byte
/// FDEs as fit, each covering 16 bytes from `code` on. `section_addr` is the section's address.
fn amplifying_eh_frame(size: usize, cie_len: usize, section_addr: u64, code: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    // CIE: length, id 0, version 1, "zR", code align 1, data align -8, RA r16, aug len 1,
    // pointer encoding pcrel|sdata4, def_cfa rsp+8, offset r16 at cfa-8, then the pairs.
    let body = cie_len - 4;
    out.extend_from_slice(&(body as u32).to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b]);
    out.extend_from_slice(&[0x0c, 0x07, 0x08, 0x90, 0x01]);
    while out.len() + 2 <= cie_len {
        out.extend_from_slice(&[0x0a, 0x0b]);
    }
    out.resize(cie_len, 0); // DW_CFA_nop
    let mut i = 0u64;
    while out.len() + 20 + 4 <= size {
        let here = out.len();
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&((here + 4) as u32).to_le_bytes()); // back to the CIE
        let field = section_addr + here as u64 + 8;
        let target = code + 16 * i;
        out.extend_from_slice(&((target.wrapping_sub(field)) as u32).to_le_bytes());
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]); // aug len 0, nops
        i += 1;
    }
    out.resize(size, 0); // a zero length ends .eh_frame
    out
}

#[test]
fn a_work_amplifying_cie_is_bounded_by_the_work_budget() {
    // Given: libc with its .eh_frame replaced by one 3 KiB CIE shared by thousands of FDEs
    // (about 20 MiB of instructions to evaluate from a 150 KiB section).
    let dir = scratch();
    let libc = libc_path();
    let (_, _, eh_size) = section_header(&libc, ".eh_frame");
    let (text, _) = text_range(&libc);
    let path = libc_with_eh_frame(dir.path(), "amplified", |size, addr, text| {
        amplifying_eh_frame(size, 3 << 10, addr, text)
    });
    let limits = Limits::default();
    let budget = limits.work_budget(eh_size);
    // When
    let c = compile_path(&path, &limits).unwrap_or_else(|e| panic!("{e}"));
    // Then: cut at the budget, counted, valid, and the FDEs evaluated got their CFI.
    eprintln!(
        "amplified: {} FDEs, {} KiB of work in {:?}",
        c.stats.fdes,
        c.stats.work_bytes >> 10,
        c.stats.elapsed
    );
    assert_eq!(c.stats.truncated, Some(Truncation::WorkBudget));
    assert!(c.stats.work_bytes <= budget);
    assert!(
        c.stats.elapsed < Duration::from_secs(10),
        "{:?}",
        c.stats.elapsed
    );
    assert_valid(&c.table);
    assert_eq!(
        c.table.lookup(text),
        Some(Rule::Frame {
            cfa: Cfa::Rsp(8),
            rbp: Rbp::Unchanged
        })
    );
    // The FDEs past the budget are stop rows, not gaps.
    let last = text + 16 * (c.stats.fdes - 1);
    assert_eq!(c.table.lookup(last), Some(Rule::Stop(StopReason::Budget)));
    // And a CIE over its budget is not evaluated at all: one stop row per FDE.
    let path = libc_with_eh_frame(dir.path(), "over", |size, addr, text| {
        amplifying_eh_frame(size, 8 << 10, addr, text)
    });
    let c = compile_path(&path, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.stats.work_bytes, 0);
    assert!(c.stats.fdes_over_budget > 1000, "{:?}", c.stats);
    assert_eq!(c.table.lookup(text), Some(Rule::Stop(StopReason::Budget)));
}

/// libc with its `.eh_frame` replaced by `make(section size, section address, .text start)`.
fn libc_with_eh_frame(
    dir: &Path,
    name: &str,
    make: impl Fn(usize, u64, u64) -> Vec<u8>,
) -> PathBuf {
    let libc = libc_path();
    let (index, eh_off, eh_size) = section_header(&libc, ".eh_frame");
    let mut bytes = fs::read(&libc).unwrap_or_else(|e| panic!("{e}"));
    let addr_at = shdr_field(&bytes, index, 0x10); // sh_addr
    let addr = u64::from_le_bytes(bytes[addr_at..addr_at + 8].try_into().unwrap_or([0; 8]));
    let (text, _) = text_range(&libc);
    let crafted = make(eh_size as usize, addr, text);
    bytes[eh_off as usize..(eh_off + eh_size) as usize].copy_from_slice(&crafted);
    write_file(dir, name, &bytes)
}

#[test]
fn fdes_outside_the_executable_range_are_skipped_and_counted() {
    // Given: every FDE claims code far above libc's executable segment.
    let dir = scratch();
    let path = libc_with_eh_frame(dir.path(), "outside", |size, addr, _| {
        amplifying_eh_frame(size, 64, addr, 1 << 40)
    });
    // When
    let c = compile_path(&path, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    // Then: none evaluated, all counted, the table is one gap over the executable range.
    assert!(c.stats.fdes > 1000);
    assert_eq!(c.stats.fdes_out_of_range, c.stats.fdes);
    assert_eq!(c.stats.work_bytes, 0);
    assert_eq!(c.table.rows().len(), 1);
    assert_eq!(c.table.rows()[0].rule, Rule::Gap);
}

#[test]
fn a_broken_entry_length_truncates_the_section_and_keeps_what_came_before() {
    // Given: a valid CIE and FDEs, then one FDE whose length runs past the section.
    let dir = scratch();
    let path = libc_with_eh_frame(dir.path(), "broken", |size, addr, text| {
        let mut frame = amplifying_eh_frame(size, 64, addr, text);
        let tenth_fde = 64 + 10 * 20;
        frame[tenth_fde..tenth_fde + 4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        frame
    });
    // When
    let c = compile_path(&path, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    // Then: the first ten FDEs are in, the rest is cut and the cut is said.
    assert_eq!(c.stats.truncated, Some(Truncation::MalformedSection));
    assert_eq!(c.stats.fdes, 10);
    assert_valid(&c.table);
}

#[test]
fn the_per_read_bound_refuses_headers_larger_than_it() {
    // Given: a bound smaller than libc's section header table.
    let limits = Limits {
        max_read_bytes: 512,
        ..Limits::default()
    };
    // When/Then: an error, not a read of whatever the header claims.
    assert!(matches!(
        compile_path(&libc_path(), &limits),
        Err(Error::Elf(_))
    ));
}

#[test]
fn the_time_net_truncates_and_such_a_table_is_not_cached() {
    let libc = libc_path();
    let limits = Limits {
        max_time: Duration::ZERO,
        ..Limits::default()
    };
    let c = compile_path(&libc, &limits).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.stats.truncated, Some(Truncation::TimeBudget));
    assert_valid(&c.table);
    let dir = scratch();
    let cache = Cache::open(dir.path(), 1 << 20, limits).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        get(&cache, &libc).outcome,
        Outcome::Compiled { stored: Err(_), .. }
    ));
    assert!(entries(dir.path()).is_empty());
}

// ---- the cache ----

fn entries(dir: &Path) -> Vec<(String, u64)> {
    let mut names: Vec<(String, u64)> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(Result::ok)
        .map(|e| {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    names.sort();
    names
}

fn get(cache: &Cache, path: &Path) -> super::cache::Cached {
    let file = File::open(path).unwrap_or_else(|e| panic!("{e}"));
    cache
        .get_or_compile(&file)
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn stored(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Compiled { stored: Ok(()), .. })
}

#[test]
fn a_restarted_cache_serves_the_table_it_stored() {
    let dir = scratch();
    let state = dir.path().join("state/unwind");
    let exe = build_workload(dir.path(), "w", &["-O2", "-fomit-frame-pointer"]);
    // Given: a first compile stores the table.
    let first = get(
        &Cache::open(&state, 1 << 20, Limits::default()).unwrap_or_else(|e| panic!("{e}")),
        &exe,
    );
    assert!(stored(&first.outcome), "{:?}", first.outcome);
    assert!(
        first.key.starts_with("b-"),
        "keyed by build id: {}",
        first.key
    );
    // When: a new cache over the same directory (a restarted relay).
    let cache = Cache::open(&state, 1 << 20, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let second = get(&cache, &exe);
    // Then: a verified hit with the same table, and no temporary files left.
    assert!(
        matches!(second.outcome, Outcome::Hit),
        "{:?}",
        second.outcome
    );
    assert_eq!(second.table, first.table);
    let names = entries(&state);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].0.ends_with(".unw"));
    // Other limits compile to a possibly different table: not served from this entry.
    let other = Limits {
        max_rows: 7,
        ..Limits::default()
    };
    let cache = Cache::open(&state, 1 << 20, other).unwrap_or_else(|e| panic!("{e}"));
    assert!(!matches!(get(&cache, &exe).outcome, Outcome::Hit));
}

#[test]
fn a_corrupt_or_truncated_cache_file_is_ignored_and_rebuilt() {
    let dir = scratch();
    let state = dir.path().join("cache");
    let exe = build_workload(dir.path(), "w", &["-O2"]);
    let cache = Cache::open(&state, 1 << 20, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let good = get(&cache, &exe);
    let entry = state.join(format!("{}.unw", good.key));
    let pristine = fs::read(&entry).unwrap_or_else(|e| panic!("{e}"));
    let damages: Vec<(&str, Vec<u8>)> = vec![
        ("last byte flipped", {
            let mut b = pristine.clone();
            let last = b.len() - 1;
            b[last] ^= 0x40;
            b
        }),
        ("truncated", pristine[..pristine.len() / 2].to_vec()),
        ("magic", {
            let mut b = pristine.clone();
            b[0] = b'X';
            b
        }),
        ("empty", Vec::new()),
        ("grown", {
            let mut b = pristine.clone();
            b.extend_from_slice(&[0; 12]);
            b
        }),
    ];
    for (what, bytes) in damages {
        // Given: a damaged entry.
        fs::write(&entry, &bytes).unwrap_or_else(|e| panic!("{e}"));
        // When
        let again = get(&cache, &exe);
        // Then: rebuilt (and said so), identical table, and the entry is good again.
        match &again.outcome {
            Outcome::Compiled {
                replaced_bad: true,
                stored: Ok(()),
                ..
            } => {}
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(again.table, good.table, "{what}");
        assert_eq!(
            fs::read(&entry).ok().as_deref(),
            Some(&pristine[..]),
            "{what}"
        );
        assert!(matches!(get(&cache, &exe).outcome, Outcome::Hit), "{what}");
    }
}

#[test]
fn a_copied_build_id_never_selects_another_binarys_table() {
    // Given: two different programs that claim the same build id.
    let dir = scratch();
    let id = "-Wl,--build-id=0x00112233445566778899aabbccddeeff00112233";
    let a = build_workload(dir.path(), "a", &["-O2", "-fomit-frame-pointer", id]);
    let b = build_workload(dir.path(), "b", &["-O0", id]);
    let cache = Cache::open(&dir.path().join("c"), 1 << 20, Limits::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let first = get(&cache, &a);
    // When
    let second = get(&cache, &b);
    // Then: same cache name, but b is compiled from its own CFI.
    assert_eq!(first.key, second.key);
    assert!(!matches!(second.outcome, Outcome::Hit));
    assert_ne!(first.table, second.table);
    let own = compile_path(&b, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(second.table, own.table);
}

#[test]
fn the_cache_directory_stays_under_its_size_bound() {
    let dir = scratch();
    let state = dir.path().join("c");
    let a = build_workload(dir.path(), "a", &["-O2"]);
    let b = build_workload(dir.path(), "b", &["-O0"]);
    // Given: a bound that holds the bigger of the two entries but not both.
    let probe = Cache::open(&dir.path().join("probe"), 1 << 20, Limits::default())
        .unwrap_or_else(|e| panic!("{e}"));
    get(&probe, &a);
    get(&probe, &b);
    let sizes: Vec<u64> = entries(&dir.path().join("probe"))
        .iter()
        .map(|e| e.1)
        .collect();
    let bound = sizes.iter().max().copied().unwrap_or(0) + 8;
    assert!(bound < sizes.iter().sum::<u64>());
    let cache = Cache::open(&state, bound, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    // A temporary file left by a writer that died an hour ago.
    let stale = state.join(".tmp-dead-1-0");
    let stale_file = File::create(&stale).unwrap_or_else(|e| panic!("{e}"));
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    stale_file
        .set_modified(hour_ago)
        .unwrap_or_else(|e| panic!("{e}"));
    // When
    assert!(stored(&get(&cache, &a).outcome));
    assert!(stored(&get(&cache, &b).outcome));
    // Then: only the newest entry remains, under the bound, the stale temporary file is gone.
    let left = entries(&state);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left.iter().map(|e| e.1).sum::<u64>() <= bound);
    assert!(matches!(get(&cache, &b).outcome, Outcome::Hit));
    // A table bigger than the whole bound is not stored at all.
    let tiny = Cache::open(&dir.path().join("tiny"), 16, Limits::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        get(&tiny, &a).outcome,
        Outcome::Compiled { stored: Err(_), .. }
    ));
    assert!(entries(&dir.path().join("tiny")).is_empty());
}

// ---- figures ----

/// Prints rows, bytes and compile time per MB of CFI for libc, the relay binary and python3.
/// `cargo test -p ember-relay --lib unwind::tests::figures -- --ignored --nocapture`
/// (a debug build unless run with `--release`: say which when quoting the numbers).
#[test]
#[ignore = "prints figures; run by hand"]
fn figures() {
    let relay = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/ember-relay");
    let mut binaries = vec![libc_path(), relay];
    binaries.extend(
        ["/usr/bin/python3"]
            .iter()
            .filter_map(|p| fs::canonicalize(p).ok()),
    );
    // More binaries by hand, e.g. an unstripped Go tool: EMBER_FIGURES_BINARIES=a:b.
    if let Some(extra) = std::env::var_os("EMBER_FIGURES_BINARIES") {
        binaries.extend(std::env::split_paths(&extra));
    }
    eprintln!(
        "{:<44} {:>8} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9}  stops",
        "binary", "section", "KiB", "work", "FDEs", "cfi rows", "rows", "KiB out", "ms", "ms/MB"
    );
    for path in binaries {
        if !path.exists() {
            eprintln!("{}: missing, skipped", path.display());
            continue;
        }
        // Best of three: the first run also pays for reading the file.
        let mut best: Option<Compiled> = None;
        for _ in 0..3 {
            let c = compile_path(&path, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
            if best
                .as_ref()
                .is_none_or(|b| c.stats.elapsed < b.stats.elapsed)
            {
                best = Some(c);
            }
        }
        let Some(c) = best else { continue };
        let s = &c.stats;
        let ms = s.elapsed.as_secs_f64() * 1e3;
        let mb = s.section_bytes as f64 / (1 << 20) as f64;
        let stops: Vec<String> = c
            .table
            .stop_counts()
            .iter()
            .map(|(r, n)| format!("{r}={n}"))
            .collect();
        eprintln!(
            "{:<44} {:>8} {:>6} {:>5.2}x {:>9} {:>9} {:>9} {:>8} {:>9.1} {:>9.1}  {}",
            path.display(),
            s.section.name(),
            s.section_bytes / 1024,
            s.work_bytes as f64 / s.section_bytes.max(1) as f64,
            s.fdes,
            s.cfi_rows,
            c.table.rows().len(),
            c.table.encoded_len() / 1024,
            ms,
            ms / mb.max(1e-9),
            stops.join(" ")
        );
    }
}

/// `vaddr_minus_offset` against readelf's program headers (the executable `LOAD`), for a PIE
/// and a non-PIE build of the same workload.
#[test]
fn vaddr_minus_offset_matches_the_executable_segment() {
    let dir = scratch();
    for (name, flags) in [
        ("pie", &["-O2", "-pie", "-fPIE"][..]),
        ("nopie", &["-O2", "-no-pie"][..]),
    ] {
        let path = build_workload(dir.path(), name, flags);
        let out = run(Command::new("readelf").args(["-l", "-W"]).arg(&path));
        let load = out
            .lines()
            .map(str::split_whitespace)
            .map(Iterator::collect::<Vec<_>>)
            // `LOAD off vaddr paddr filesz memsz R E align`: the flags are split words.
            .find(|f| f.first() == Some(&"LOAD") && f.iter().rev().nth(1) == Some(&"E"))
            .expect("an executable LOAD");
        let field = |i: usize| hex(load[i].trim_start_matches("0x"));
        let expected = field(2).wrapping_sub(field(1)) as i64;
        let compiled = compile_path(&path, &Limits::default()).expect("compiles");
        assert_eq!(compiled.vaddr_minus_offset, expected, "{name}");
    }
}

// ---- .debug_frame: C built without unwind tables, compressed or not; Go; hostile forms ----

/// C without unwind tables and without frame pointers: the CFI of the program's own code is in
/// `.debug_frame` only; `.eh_frame` holds the C runtime's (`_start`, `_init`) alone.
const NO_UNWIND_TABLES: [&str; 5] = [
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-fno-asynchronous-unwind-tables",
    "-fno-unwind-tables",
];

/// Whether readelf's `.eh_frame` rows of `path` describe `address`.
fn eh_frame_describes(path: &Path, address: u64) -> bool {
    oracle(path, ".eh_frame")
        .iter()
        .any(|r| r.start <= address && address < r.end)
}

/// The section header flags column of `name` (e.g. "C" when compressed), from readelf.
fn section_flags(path: &Path, name: &str) -> String {
    let out = run(Command::new("readelf").args(["-S", "-W"]).arg(path));
    out.lines()
        .find_map(|l| {
            let (_, rest) = l.trim_start().strip_prefix('[')?.split_once(']')?;
            let w: Vec<&str> = rest.split_whitespace().collect();
            // name type addr off size es [flags] lk inf al
            (w.first() == Some(&name)).then(|| {
                if w.len() == 10 {
                    w[6].to_owned()
                } else {
                    String::new()
                }
            })
        })
        .unwrap_or_else(|| panic!("no {name} in {path:?}"))
}

fn objcopy(args: &[&str], from: &Path, to: &Path) {
    run(Command::new("objcopy").args(args).arg(from).arg(to));
}

#[test]
fn c_without_unwind_tables_unwinds_from_its_debug_frame_stored_plain_or_compressed() {
    // Given: the workload built without unwind tables, with .debug_frame plain, compressed by
    // the compiler (-gz=zlib: SHF_COMPRESSED) and rewritten in the GNU .zdebug_frame form.
    let dir = scratch();
    let plain = build_workload(dir.path(), "plain", &NO_UNWIND_TABLES);
    let mut gz_flags = NO_UNWIND_TABLES.to_vec();
    gz_flags.push("-gz=zlib");
    let zlib = build_workload(dir.path(), "zlib", &gz_flags);
    let gnu = dir.path().join("gnu");
    objcopy(&["--compress-debug-sections=zlib-gnu"], &plain, &gnu);
    assert_eq!(section_flags(&plain, ".debug_frame"), "");
    assert_eq!(section_flags(&zlib, ".debug_frame"), "C");
    section_header(&gnu, ".zdebug_frame");
    let mut tables = Vec::new();
    for (exe, compression) in [
        (&plain, None),
        (&zlib, Some(Compression::ElfZlib)),
        (&gnu, Some(Compression::GnuZlib)),
    ] {
        for f in ["main", "leaf", "recurse", "big_frame"] {
            assert!(
                !eh_frame_describes(exe, symbol(exe, f)),
                "{exe:?}: .eh_frame describes {f}: the test needs a binary where it does not"
            );
        }
        // When
        let compiled = compile_path(exe, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
        // Then: both sections read, every row as readelf interprets them (which decompresses
        // on its own), the program's functions described.
        assert_eq!(compiled.stats.section, CfiSection::Both, "{exe:?}");
        assert_eq!(compiled.stats.debug_frame_compression, compression);
        assert_eq!(compiled.stats.truncated, None);
        assert_eq!(compiled.stats.fdes_malformed, 0);
        let checked = check_against_readelf(exe, &compiled, 1);
        assert!(checked > 20, "only {checked} addresses checked");
        let table = &compiled.table;
        assert_eq!(
            table.lookup(symbol(exe, "leaf")),
            Some(Rule::Frame {
                cfa: Cfa::Rsp(8),
                rbp: Rbp::Unchanged
            })
        );
        let big = symbol(exe, "big_frame");
        assert!(
            (big..big + 64)
                .filter_map(|a| table.lookup(a))
                .any(|r| matches!(r, Rule::Frame { cfa: Cfa::Rsp(off), .. } if off > 70_000)),
            "{exe:?}: no rsp+70000 row in big_frame"
        );
        // _start keeps its .eh_frame row: the outermost frame.
        assert_eq!(
            table.lookup(symbol(exe, "_start")),
            Some(Rule::Stop(StopReason::Outermost))
        );
        tables.push(compiled.table);
    }
    // The same code: the same table however .debug_frame was stored.
    assert_eq!(tables[0], tables[1]);
    assert_eq!(tables[0], tables[2]);
}

#[test]
fn sixty_four_bit_dwarf_debug_frame_matches_readelf() {
    // Given: 64-bit DWARF CFI (CIE id all ones over 8 bytes, 8-byte CIE pointers), version 3
    // CIEs as GCC writes them without the assembler's CFI directives.
    let dir = scratch();
    let mut flags = NO_UNWIND_TABLES.to_vec();
    flags.extend(["-gdwarf-5", "-gdwarf64", "-fno-dwarf2-cfi-asm", "-gz=zlib"]);
    let exe = build_workload(dir.path(), "dwarf64", &flags);
    let dump = run(Command::new("readelf").arg("--debug-dump=frames").arg(&exe));
    assert!(
        dump.contains("ffffffffffffffff CIE"),
        "not 64-bit DWARF CFI:\n{dump}"
    );
    // When
    let compiled = compile_path(&exe, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    // Then
    assert_eq!(compiled.stats.fdes_malformed, 0);
    assert!(check_against_readelf(&exe, &compiled, 1) > 20);
    assert_eq!(
        compiled.table.lookup(symbol(&exe, "leaf")),
        Some(Rule::Frame {
            cfa: Cfa::Rsp(8),
            rbp: Rbp::Unchanged
        })
    );
}

/// A DWARF 4 `.debug_frame`: a CIE naming its address size (`address_size`) and a zero
/// segment size, one FDE over `[TEXT.start, TEXT.start + 0x20)` that pushes one word at +4.
fn dwarf4_debug_frame(address_size: u8, segment_size: u8) -> Vec<u8> {
    let mut cie = Vec::new();
    cie.extend_from_slice(&u32::MAX.to_le_bytes()); // CIE id
    cie.push(4); // version
    cie.push(0); // augmentation ""
    cie.push(address_size);
    cie.push(segment_size);
    cie.extend([1, 0x78, 16]); // code align 1, data align -8, return address r16
    cie.extend([0x0c, 7, 8]); // DW_CFA_def_cfa rsp 8
    cie.extend([0x90, 1]); // DW_CFA_offset r16 at cfa-8
    while !(cie.len() + 4).is_multiple_of(8) {
        cie.push(0); // DW_CFA_nop
    }
    let mut out = (cie.len() as u32).to_le_bytes().to_vec();
    out.extend(cie);
    let mut fde = 0u32.to_le_bytes().to_vec(); // CIE pointer: offset 0 in the section
    let (start, len) = (super::synthetic::TEXT.start, 0x20u64);
    match address_size {
        4 => {
            fde.extend_from_slice(&(start as u32).to_le_bytes());
            fde.extend_from_slice(&(len as u32).to_le_bytes());
        }
        _ => {
            fde.extend_from_slice(&start.to_le_bytes());
            fde.extend_from_slice(&len.to_le_bytes());
        }
    }
    fde.extend([0x44, 0x0e, 16]); // advance 4; DW_CFA_def_cfa_offset 16
    while !(fde.len() + 4).is_multiple_of(8) {
        fde.push(0);
    }
    out.extend_from_slice(&(fde.len() as u32).to_le_bytes());
    out.extend(fde);
    out
}

fn compile_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Result<Compiled, Error> {
    compile_path(&write_file(dir, name, bytes), &Limits::default())
}

#[test]
fn dwarf4_cies_name_their_address_size_and_a_segment_size_is_refused() {
    use super::synthetic::{elf_with_debug_frame, Form, TEXT};
    let dir = scratch();
    let pushed = |off| Rule::Frame {
        cfa: Cfa::Rsp(off),
        rbp: Rbp::Unchanged,
    };
    for (address_size, form) in [(8, Form::Plain), (4, Form::ElfZlib), (8, Form::GnuZlib)] {
        // Given: a version 4 CIE with 8- or 4-byte addresses, stored in each form.
        let cfi = dwarf4_debug_frame(address_size, 0);
        let bytes = elf_with_debug_frame(&cfi, form, 0);
        // When
        let compiled = compile_bytes(dir.path(), "v4", &bytes).unwrap_or_else(|e| panic!("{e}"));
        // Then: the FDE's two rows, then a gap to the end of the executable range.
        assert_eq!(compiled.stats.section, CfiSection::DebugFrame);
        assert_eq!((compiled.stats.fdes, compiled.stats.fdes_malformed), (1, 0));
        let table = &compiled.table;
        assert_eq!(table.lookup(TEXT.start), Some(pushed(8)), "{form:?}");
        assert_eq!(table.lookup(TEXT.start + 3), Some(pushed(8)));
        assert_eq!(table.lookup(TEXT.start + 4), Some(pushed(16)));
        assert_eq!(table.lookup(TEXT.start + 0x1f), Some(pushed(16)));
        assert_eq!(table.lookup(TEXT.start + 0x20), Some(Rule::Gap));
    }
    // A segment selector (never on x86-64) or an address size gimli cannot read: the CIE does
    // not parse, so the section's framing is broken from there on; the table is all gap.
    for (address_size, segment_size) in [(8, 1), (3, 0)] {
        let bytes = elf_with_debug_frame(
            &dwarf4_debug_frame(address_size, segment_size),
            Form::Plain,
            0,
        );
        let compiled = compile_bytes(dir.path(), "bad", &bytes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            compiled.stats.truncated,
            Some(Truncation::MalformedSection),
            "{address_size}/{segment_size}: {:?}",
            compiled.stats
        );
        assert_eq!(compiled.table.rows().len(), 1);
        assert_eq!(compiled.table.lookup(TEXT.start), Some(Rule::Gap));
    }
}

#[test]
fn compressed_debug_frame_that_lies_about_its_size_or_is_cut_is_refused() {
    use super::synthetic::{elf_with_debug_frame, Form};
    let dir = scratch();
    let mut gz_flags = NO_UNWIND_TABLES.to_vec();
    gz_flags.push("-gz=zlib");
    let exe = build_workload(dir.path(), "zlib", &gz_flags);
    let real = fs::read(&exe).unwrap_or_else(|e| panic!("{e}"));
    let (index, offset, size) = section_header(&exe, ".debug_frame");
    let ch_size = offset as usize + 8;
    let claimed = u64::from_le_bytes(real[ch_size..ch_size + 8].try_into().unwrap_or([0; 8]));
    let refused = |name: &str, bytes: &[u8], why: &str| {
        let err = compile_bytes(dir.path(), name, bytes).err();
        assert!(
            matches!(&err, Some(Error::BadCompression { reason, .. }) if reason.contains(why)),
            "{name}: {err:?}"
        );
    };
    // A claim of 1 TiB: refused before anything is allocated or inflated.
    let mut huge = real.clone();
    huge[ch_size..ch_size + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    refused("huge", &huge, "over the limit");
    // A claim one byte short (the stream inflates past it) or one byte long.
    for (name, claim, why) in [
        ("short", claimed - 1, "past the"),
        ("long", claimed + 1, "not the"),
    ] {
        let mut bytes = real.clone();
        bytes[ch_size..ch_size + 8].copy_from_slice(&claim.to_le_bytes());
        refused(name, &bytes, why);
    }
    // The compressed section cut short (its header's size shrunk): the stream ends early.
    let mut cut = real.clone();
    let at = shdr_field(&cut, index, 0x20);
    cut[at..at + 8].copy_from_slice(&(size - 8).to_le_bytes());
    refused("cut", &cut, "");
    // A zip bomb: 64 MiB of zeros (64 KiB compressed) claiming 4 KiB costs 4 KiB; claiming its
    // real size, it is over the limit and not inflated at all.
    let zeros = vec![0u8; 64 << 20];
    for form in [Form::ElfZlib, Form::GnuZlib] {
        let small = elf_with_debug_frame(&zeros, form, 4096 - (64 << 20));
        refused("bomb", &small, "stopped after 4097");
        let big = elf_with_debug_frame(&zeros, form, 0);
        refused("bomb-whole", &big, "over the limit");
    }
}

#[test]
fn zstd_debug_frame_is_refused_as_unsupported_and_eh_frame_alone_is_kept() {
    // Given: the plain build with .debug_frame recompressed with zstd, with and without the C
    // runtime's .eh_frame.
    let dir = scratch();
    let plain = build_workload(dir.path(), "plain", &NO_UNWIND_TABLES);
    let zstd = dir.path().join("zstd");
    objcopy(&["--compress-debug-sections=zstd"], &plain, &zstd);
    let bare = dir.path().join("zstd-bare");
    objcopy(&["--remove-section=.eh_frame"], &zstd, &bare);
    // When / Then: .eh_frame alone, as before; without it, an error (not a bad file).
    let compiled = compile_path(&zstd, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.stats.section, CfiSection::EhFrame);
    assert!(matches!(
        compile_path(&bare, &Limits::default()),
        Err(Error::UnsupportedCompression { format: "zstd", .. })
    ));
}

/// A Go program: main.main calls main.caller (a frame) calls main.leaf (frameless), all
/// `//go:noinline`.
const GO_PROGRAM: &str = r#"package main

//go:noinline
func leaf(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		s += i*i ^ (s >> 3)
	}
	return s
}

//go:noinline
func caller(n int) int {
	return leaf(n) + 1
}

func main() {
	t := 0
	for i := 0; i < 3; i++ {
		t += caller(1000)
	}
	println(t)
}
"#;

/// Builds [`GO_PROGRAM`] with the host's `go` (Debian's golang-go) into `dir`.
pub(super) fn build_go(dir: &Path) -> PathBuf {
    let src = dir.join("gosrc");
    fs::create_dir_all(&src).unwrap_or_else(|e| panic!("{e}"));
    fs::write(src.join("main.go"), GO_PROGRAM).unwrap_or_else(|e| panic!("{e}"));
    fs::write(src.join("go.mod"), "module leaf\n\ngo 1.19\n").unwrap_or_else(|e| panic!("{e}"));
    let out = dir.join("goleaf");
    run(Command::new("go")
        .current_dir(&src)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOFLAGS", "-mod=mod")
        .args(["build", "-o"])
        .arg(&out)
        .arg("."));
    out
}

#[test]
fn a_go_binary_unwinds_from_its_go_table_rather_than_its_compressed_debug_frame() {
    // Given: a Go binary as `go build` makes it: no .eh_frame, zlib-compressed .debug_frame.
    let dir = scratch();
    let exe = build_go(dir.path());
    assert_eq!(section_flags(&exe, ".debug_frame"), "C");
    let headers = run(Command::new("readelf").args(["-S", "-W"]).arg(&exe));
    assert!(!headers.contains(".eh_frame"), "{headers}");
    // When
    let compiled = compile_path(&exe, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    // Then: the rows come from the Go table, which stripping keeps (and which says where rbp
    // was saved, which Go's .debug_frame does not): Go's text covered, the frameless leaf and
    // its framed caller as the compiler laid them out.
    assert_eq!(compiled.stats.section, CfiSection::GoPclntab);
    assert!(compiled.stats.go_funcs > 1000, "{:?}", compiled.stats);
    assert_eq!(compiled.stats.truncated, None);
    let gaps = check_text_coverage(&exe, &compiled.table);
    assert!(gaps < 0.05, "{:.1}% of .text has no rows", gaps * 100.0);
    let leaf = symbol(&exe, "main.leaf");
    let frameless = Rule::Frame {
        cfa: Cfa::Rsp(8),
        rbp: Rbp::Unchanged,
    };
    assert!(
        (leaf..leaf + 16).all(|a| compiled.table.lookup(a) == Some(frameless)),
        "main.leaf is not frameless"
    );
    let caller = symbol(&exe, "main.caller");
    assert!(
        (caller..caller + 32).any(|a| matches!(
            compiled.table.lookup(a),
            Some(Rule::Frame { cfa: Cfa::Rsp(off), .. }) if off > 8
        )),
        "main.caller has no frame"
    );
}

#[test]
fn a_table_cached_from_eh_frame_alone_is_not_served_once_debug_frame_is_read() {
    // Given: the cache entry a relay from before .debug_frame was read beside .eh_frame would
    // have stored for this binary: compiler version 1, its digest over .eh_frame alone, and the
    // table of the C runtime's .eh_frame alone (what the old code compiled).
    let dir = scratch();
    let state = dir.path().join("cache");
    let mut gz_flags = NO_UNWIND_TABLES.to_vec();
    gz_flags.push("-gz=zlib");
    let exe = build_workload(dir.path(), "zlib", &gz_flags);
    let eh_only = dir.path().join("eh-only");
    objcopy(&["--remove-section=.debug_frame"], &exe, &eh_only);
    let old_table = compile_path(&eh_only, &Limits::default())
        .unwrap_or_else(|e| panic!("{e}"))
        .table;
    let cache = Cache::open(&state, 1 << 20, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let key = get(&cache, &exe).key;
    fs::write(
        state.join(format!("{key}.unw")),
        version1_entry(&exe, &old_table),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // When
    let got = get(&cache, &exe);
    // Then: compiled again (the old entry found unusable), with the program's functions.
    assert!(
        matches!(
            got.outcome,
            Outcome::Compiled {
                replaced_bad: true,
                ..
            }
        ),
        "{:?}",
        got.outcome
    );
    assert_ne!(got.table, old_table);
    assert_eq!(
        got.table.lookup(symbol(&exe, "leaf")),
        Some(Rule::Frame {
            cfa: Cfa::Rsp(8),
            rbp: Rbp::Unchanged,
        })
    );
    // And the rewritten entry is served from then on.
    assert!(matches!(get(&cache, &exe).outcome, Outcome::Hit));
}

/// A cache file as compiler version 1 wrote it for `exe` (`.eh_frame` alone, default limits).
fn version1_entry(exe: &Path, table: &UnwindTable) -> Vec<u8> {
    use ring::digest::{digest, SHA256};
    let (_, eh_offset, eh_size) = section_header(exe, ".eh_frame");
    let bytes = fs::read(exe).unwrap_or_else(|e| panic!("{e}"));
    let eh = &bytes[eh_offset as usize..(eh_offset + eh_size) as usize];
    let eh_addr = section_addr(exe, ".eh_frame");
    let file = File::open(exe).unwrap_or_else(|e| panic!("{e}"));
    let input = super::elf::read(&file, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let l = Limits::default();
    let words = [
        1,
        l.max_read_bytes,
        l.max_section_bytes,
        l.max_cie_bytes,
        l.max_fde_bytes,
        l.max_work_bytes,
        l.max_work_factor,
        l.max_rows as u64,
        1, // .eh_frame
        eh_addr,
        input.text_addr,
        input.got_addr,
        input.exec.start,
        input.exec.end,
        eh.len() as u64,
    ];
    let mut hashed: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    hashed.extend_from_slice(eh);
    let body = table.encode();
    let mut out = b"EMBRUNW1".to_vec();
    out.extend_from_slice(digest(&SHA256, &hashed).as_ref());
    out.extend_from_slice(digest(&SHA256, &body).as_ref());
    out.extend_from_slice(&body);
    out
}

/// A section's address (`sh_addr`), from readelf.
fn section_addr(path: &Path, name: &str) -> u64 {
    let out = run(Command::new("readelf").args(["-S", "-W"]).arg(path));
    out.lines()
        .find_map(|l| {
            let (_, rest) = l.trim_start().strip_prefix('[')?.split_once(']')?;
            let w: Vec<&str> = rest.split_whitespace().collect();
            (w.first() == Some(&name)).then(|| hex(w[2]))
        })
        .unwrap_or_else(|| panic!("no {name} in {path:?}"))
}

#[test]
fn debug_frame_fdes_over_code_eh_frame_describes_are_skipped() {
    // Given: GCC without the assembler's CFI directives writes both sections in full.
    let dir = scratch();
    let both = build_workload(
        dir.path(),
        "both",
        &["-O2", "-g", "-fomit-frame-pointer", "-fno-dwarf2-cfi-asm"],
    );
    let eh_only = dir.path().join("eh-only");
    objcopy(&["--remove-section=.debug_frame"], &both, &eh_only);
    // When
    let compiled = compile_path(&both, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let alone = compile_path(&eh_only, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    // Then: every .debug_frame FDE skipped unevaluated, the table the one of .eh_frame alone.
    assert_eq!(compiled.stats.section, CfiSection::Both);
    let debug_fdes = oracle(&both, ".debug_frame").len();
    assert!(debug_fdes > 0);
    assert!(
        compiled.stats.fdes_described_twice >= 5,
        "{:?}",
        compiled.stats
    );
    assert_eq!(compiled.stats.fdes_overlapping, 0);
    assert_eq!(compiled.stats.work_bytes, alone.stats.work_bytes);
    assert_eq!(compiled.table, alone.table);
}
