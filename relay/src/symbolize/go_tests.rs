//! Tests of the Go table reader ([`super::gopclntab`], [`super::gofile`]) and of the unwind rows
//! made from it, on real Go binaries built here by every Go toolchain the machine has: the
//! host's `go` (Debian 12: Go 1.19, table magic `0xfffffff0`) and Debian trixie's (Go 1.24,
//! `0xfffffff1`) in the root of `scripts/runtime-roots.sh`, run under `chroot` in a private mount
//! namespace with its own /proc. Each program is built unstripped and with `-ldflags='-s -w'`;
//! names and lines are checked against the toolchain's own `go tool addr2line`, frame sizes
//! against its `go tool objdump`. Builds are cached under `target/go-fixtures`.
//!
//! A missing toolchain fails the test under `CI` or `EMBER_REQUIRE_ALL`, else it is a printed
//! skip. Building in the root needs root (a mount namespace).

use std::{
    collections::hash_map::DefaultHasher,
    env, fs,
    hash::{Hash, Hasher},
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::{
    elf::{ElfCache, FileKey},
    gofile::{self, FoundBy},
    gopclntab::Version,
};
use crate::unwind::{self, row::Cfa, row::Rbp, row::Rule};

/// The fixture: `callerWork` calls the frameless leaf `leafWork` (no locals, no calls: the
/// compiler gives it no frame), whose loop calls `inlinedStep`, inlined.
pub(crate) const FIXTURE: &str = r#"package main

import "os"

var sink uint64

func inlinedStep(x uint64) uint64 {
	return x*6364136223846793005 + 1442695040888963407 // inlined body
}

//go:noinline
func leafWork(n uint64) uint64 {
	x := n
	for i := 0; i < 1000; i++ {
		x = inlinedStep(x) // call site
	}
	return x
}

//go:noinline
func callerWork(n uint64) uint64 {
	return leafWork(n) ^ leafWork(n+1)
}

func main() {
	for i := 0; i < len(os.Args); i++ {
		sink += callerWork(uint64(i))
	}
	os.Exit(int(sink & 1))
}
"#;

/// One Go toolchain of the machine.
#[derive(Clone, Debug)]
pub(crate) struct Toolchain {
    pub label: &'static str,
    /// The root it runs in (under chroot), `None` for the host's.
    pub root: Option<PathBuf>,
    pub version: Version,
}

fn roots_dir() -> PathBuf {
    env::var_os("EMBER_ROOTS")
        .or_else(|| env::var_os("EMBER_PYTHON_ROOTS"))
        .map_or_else(|| PathBuf::from("/var/cache/ember/roots"), PathBuf::from)
}

fn required() -> bool {
    ["CI", "EMBER_REQUIRE_ALL"]
        .iter()
        .any(|v| env::var(v).is_ok_and(|x| !x.is_empty() && x != "0" && x != "false"))
}

/// The toolchains the tests run: the host's Go 1.19 and trixie's Go 1.24. A missing one fails
/// under CI, else it is skipped with a message.
pub(crate) fn toolchains() -> Vec<Toolchain> {
    let mut found = Vec::new();
    let host = Toolchain {
        label: "host go 1.19",
        root: None,
        version: Version::Go118,
    };
    if run_go(&host, &["version"], None).is_some_and(|v| v.contains("go1.19")) {
        found.push(host);
    } else {
        missing("the host's Go 1.19 (Debian 12 package golang-go)");
    }
    let trixie = roots_dir().join("trixie");
    let root = Toolchain {
        label: "trixie go 1.24",
        root: Some(trixie.clone()),
        version: Version::Go120,
    };
    if trixie.join("usr/bin/go").exists()
        && run_go(&root, &["version"], None).is_some_and(|v| v.contains("go1.24"))
    {
        found.push(root);
    } else {
        missing(
            "Debian trixie's Go 1.24 (golang-go in the trixie root of scripts/runtime-roots.sh)",
        );
    }
    found
}

fn missing(what: &str) {
    let message = format!("{what} is not installed");
    assert!(!required(), "{message}");
    eprintln!("SKIPPED: {message}");
}

/// `target/` (this test binary is target/debug/deps/NAME).
fn target_dir() -> PathBuf {
    let exe = env::current_exe().expect("own exe");
    exe.ancestors()
        .nth(3)
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
}

/// Where the toolchain's work happens, as the host sees it and as the toolchain does.
fn work_dirs(tc: &Toolchain) -> (PathBuf, PathBuf) {
    match &tc.root {
        Some(root) => (
            root.join("tmp/ember-go-fixtures"),
            PathBuf::from("/tmp/ember-go-fixtures"),
        ),
        None => {
            let dir = target_dir().join("go-fixtures/host-work");
            (dir.clone(), dir)
        }
    }
}

/// Runs `go ARGS` of `tc` (in `dir` as it sees it, when given); its stdout, `None` when it
/// could not run or failed.
pub(crate) fn run_go(tc: &Toolchain, args: &[&str], stdin: Option<&str>) -> Option<String> {
    let (host_work, work) = work_dirs(tc);
    fs::create_dir_all(&host_work).ok()?;
    let envs = [
        ("GOCACHE", work.join("gocache")),
        ("GOPATH", work.join("gopath")),
        ("HOME", work.clone()),
        ("GOTOOLCHAIN", "local".into()),
        ("GOPROXY", "off".into()),
        ("GOFLAGS", "".into()),
        ("GOTELEMETRY", "off".into()),
        ("CGO_ENABLED", "0".into()),
    ];
    let mut command = match &tc.root {
        None => {
            let mut c = Command::new("go");
            c.args(args).envs(envs);
            c
        }
        Some(root) => {
            // Go needs /proc (os.Executable): a private mount namespace gets its own.
            let mut c = Command::new("unshare");
            c.args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg("mount -t proc proc \"$0/proc\" && exec chroot \"$0\" /usr/bin/env \"$@\"")
                .arg(root);
            for (k, v) in &envs {
                c.arg(format!("{k}={}", v.display()));
            }
            c.arg("/usr/bin/go").args(args);
            c
        }
    };
    command.current_dir(&host_work).stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().ok()?;
    if let Some(input) = stdin {
        use std::io::Write as _;
        child.stdin.take()?.write_all(input.as_bytes()).ok()?;
    }
    let out = child.wait_with_output().ok()?;
    if !out.status.success() {
        eprintln!(
            "go {args:?} ({}) failed: {}",
            tc.label,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    String::from_utf8(out.stdout).ok()
}

/// `source` built by `tc` (stripped with `-s -w` when asked), cached under target/go-fixtures
/// by the source, the toolchain and the flags.
pub(crate) fn build(tc: &Toolchain, source: &str, stripped: bool) -> PathBuf {
    let mut hasher = DefaultHasher::new();
    (source, tc.label, stripped).hash(&mut hasher);
    let name = format!(
        "{}-{:016x}{}",
        tc.label.replace(' ', "-"),
        hasher.finish(),
        if stripped { "-stripped" } else { "" }
    );
    let cached = target_dir().join("go-fixtures").join(&name);
    if cached.exists() {
        return cached;
    }
    let (host_work, work) = work_dirs(tc);
    let src = host_work.join(format!("{name}.go"));
    fs::create_dir_all(&host_work).expect("go work dir");
    fs::write(&src, source).expect("write the Go source");
    let out = work.join(&name);
    let mut args = vec!["build", "-o"];
    let out_text = out.display().to_string();
    let src_text = work.join(format!("{name}.go")).display().to_string();
    args.push(&out_text);
    if stripped {
        args.push("-ldflags=-s -w");
    }
    args.push(&src_text);
    run_go(tc, &args, None).unwrap_or_else(|| panic!("{}: go build failed", tc.label));
    fs::create_dir_all(cached.parent().expect("parent")).expect("fixture dir");
    let tmp = cached.with_extension(format!("tmp{}", std::process::id()));
    fs::copy(host_work.join(&name), &tmp).expect("copy the built binary");
    fs::rename(&tmp, &cached).expect("rename the fixture into place");
    cached
}

/// `path` where `tc` sees it (copied into its root when it runs in one).
fn visible_to(tc: &Toolchain, path: &Path) -> String {
    match &tc.root {
        None => path.display().to_string(),
        Some(_) => {
            let (host_work, work) = work_dirs(tc);
            let name = path.file_name().expect("file name");
            fs::copy(path, host_work.join(name)).expect("copy into the root");
            work.join(name).display().to_string()
        }
    }
}

/// `go tool nm -size -n` of `bin`: (address, size, name) of its text symbols.
fn text_symbols(tc: &Toolchain, bin: &Path) -> Vec<(u64, u64, String)> {
    let path = visible_to(tc, bin);
    let out = run_go(tc, &["tool", "nm", "-size", "-n", &path], None).expect("go tool nm");
    out.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (addr, size, kind) = (f.next()?, f.next()?, f.next()?);
            let name = f.collect::<Vec<_>>().join(" ");
            (kind == "T").then(|| {
                Some((
                    u64::from_str_radix(addr, 16).ok()?,
                    size.parse().ok()?,
                    name,
                ))
            })?
        })
        .collect()
}

/// `go tool addr2line` of `bin` at `addrs`: (function, file, line) each.
fn addr2line(tc: &Toolchain, bin: &Path, addrs: &[u64]) -> Vec<(String, String, u32)> {
    let path = visible_to(tc, bin);
    let input: String = addrs.iter().map(|a| format!("{a:#x}\n")).collect();
    let out = run_go(tc, &["tool", "addr2line", &path], Some(&input)).expect("go tool addr2line");
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .map(|pair| {
            let (file, line) = pair[1].rsplit_once(':').expect("file:line");
            (
                pair[0].to_owned(),
                file.to_owned(),
                line.parse().unwrap_or(0),
            )
        })
        .collect()
}

/// The source line number holding `marker`.
fn line_of(marker: &str) -> u32 {
    let index = FIXTURE
        .lines()
        .position(|l| l.contains(marker))
        .expect("marker in the fixture");
    u32::try_from(index + 1).expect("small")
}

#[test]
fn names_and_lines_match_go_tool_addr2line_for_every_toolchain() {
    for tc in toolchains() {
        let reference = build(&tc, FIXTURE, false);
        let symbols = text_symbols(&tc, &reference);
        assert!(
            symbols.len() > 500,
            "{}: {} symbols",
            tc.label,
            symbols.len()
        );
        // About 400 addresses across the text: entries and points inside functions.
        let step = (symbols.len() / 200).max(1);
        let addrs: Vec<u64> = symbols
            .iter()
            .step_by(step)
            .chain(symbols.iter().filter(|s| s.2.starts_with("main.")))
            .flat_map(|(addr, size, _)| [*addr, addr + size / 2])
            .collect();
        for stripped in [false, true] {
            // Given the binary, stripped or not, and its toolchain's own answers
            let bin = build(&tc, FIXTURE, stripped);
            let expected = addr2line(&tc, &bin, &addrs);
            // When its Go table is found and read
            let file = fs::File::open(&bin).expect("open fixture");
            let go = gofile::locate(&file, true).expect("a Go table");
            assert_eq!(go.found_by, FoundBy::Section, "{}", tc.label);
            assert_eq!(go.table.version, tc.version, "{}", tc.label);
            assert!(go.funcdata.is_some(), "{}: no inline trees", tc.label);
            // Then every address has the toolchain's function, and the innermost frame its
            // file and line
            let mut checked = 0;
            for (addr, (function, path, line)) in addrs.iter().zip(&expected) {
                let func = go.table.find(*addr);
                if function == "?" {
                    assert!(func.is_none(), "{}: {addr:#x} is in no function", tc.label);
                    continue;
                }
                let func = func.unwrap_or_else(|| panic!("{}: no function at {addr:#x}", tc.label));
                let frames = go.table.frames(&func, *addr, go.funcdata.as_ref());
                let outer = frames.last().expect("a frame");
                assert_eq!(&outer.function, function, "{} {addr:#x}", tc.label);
                let inner = &frames[0];
                assert_eq!(
                    inner.file.as_deref(),
                    Some(path.as_str()),
                    "{} {addr:#x}",
                    tc.label
                );
                assert_eq!(inner.line, Some(*line), "{} {addr:#x} {function}", tc.label);
                checked += 1;
            }
            eprintln!(
                "{} stripped={stripped}: {checked} of {} addresses match addr2line",
                tc.label,
                addrs.len()
            );
            assert!(checked >= 300, "{}: only {checked} checked", tc.label);
        }
    }
}

#[test]
fn an_inlined_call_is_a_frame_below_its_caller_at_the_call_site() {
    for tc in toolchains() {
        // Given the stripped fixture, looked up through the symbolizer's cache as a process's
        // file would be
        let reference = build(&tc, FIXTURE, false);
        let leaf = text_symbols(&tc, &reference)
            .into_iter()
            .find(|s| s.2 == "main.leafWork")
            .expect("main.leafWork");
        let bin = build(&tc, FIXTURE, true);
        let fd = OwnedFd::from(fs::File::open(&bin).expect("open fixture"));
        let key = FileKey::of(&fd).expect("fstat");
        let mut cache = ElfCache::default();
        let go = gofile::locate(&fs::File::open(&bin).expect("open"), false).expect("Go table");
        // When every pc of leafWork is named
        let mut inlined = 0;
        for pc in leaf.0..leaf.0 + leaf.1 {
            let offset = go
                .loads
                .iter()
                .find(|(_, va, size)| pc >= *va && pc - va < *size)
                .map(|(off, va, _)| off + (pc - va))
                .expect("pc in a segment");
            let frames = cache.resolve(&key, &fd, "fixture", offset).expect("named");
            let outer = frames.last().expect("a frame");
            assert_eq!(&*outer.function, "main.leafWork", "{}", tc.label);
            assert!(frames.iter().all(|f| f.go), "{}: a Go frame", tc.label);
            if frames.len() == 2 {
                // Then the pcs of the inlined body are inlinedStep at its body's line, inside
                // leafWork at the call's line
                assert_eq!(&*frames[0].function, "main.inlinedStep", "{}", tc.label);
                assert!(frames[0].inlined && !frames[1].inlined);
                assert_eq!(frames[0].line, Some(line_of("// inlined body")));
                assert_eq!(frames[1].line, Some(line_of("// call site")));
                inlined += 1;
            }
        }
        eprintln!("{}: {inlined} pcs of leafWork are in inlinedStep", tc.label);
        assert!(inlined > 0, "{}: no inlined frame in leafWork", tc.label);
    }
}

/// `bin` copied with its section headers gone (`e_shoff`, `e_shnum`, `e_shstrndx` zeroed), or
/// with `.gopclntab`'s name changed (`.gopclntab` -> `.gopclnta_`).
fn damaged(bin: &Path, how: &str) -> tempfile::NamedTempFile {
    let mut bytes = fs::read(bin).expect("read fixture");
    match how {
        "no sections" => {
            bytes[0x28..0x30].fill(0);
            bytes[0x3c..0x40].fill(0);
        }
        _ => {
            let at = bytes
                .windows(11)
                .position(|w| w == b".gopclntab\0")
                .expect("the section name");
            bytes[at + 9] = b'_';
        }
    }
    let out = tempfile::NamedTempFile::new().expect("temp file");
    fs::write(out.path(), &bytes).expect("write copy");
    out
}

#[test]
fn the_table_is_found_by_symbol_and_by_scanning_when_its_section_is_gone() {
    for tc in toolchains() {
        let unstripped = build(&tc, FIXTURE, false);
        let stripped = build(&tc, FIXTURE, true);
        let whole = gofile::locate(&fs::File::open(&stripped).expect("open"), true).expect("table");
        for (bin, how, by) in [
            (&unstripped, "renamed", FoundBy::Symbol),
            (&stripped, "no sections", FoundBy::Scan),
            (&unstripped, "no sections", FoundBy::Scan),
        ] {
            // Given a copy whose section is not named so, or which has no section headers
            let copy = damaged(bin, how);
            // When it is located
            let go = gofile::locate(&fs::File::open(copy.path()).expect("open"), true)
                .unwrap_or_else(|err| panic!("{} {how}: {err}", tc.label));
            // Then it is found the other way, at the same address, and names alike
            assert_eq!(go.found_by, by, "{} {how}", tc.label);
            assert_eq!(go.table.func_count(), whole.table.func_count());
            assert_eq!(
                go.table.text_start, whole.table.text_start,
                "{} {how}",
                tc.label
            );
            assert!(go.funcdata.is_some(), "{} {how}: no inline trees", tc.label);
            for func in whole.table.funcs().step_by(50) {
                let a = whole
                    .table
                    .frames(&func, func.entry, whole.funcdata.as_ref());
                let found = go.table.find(func.entry).expect("function");
                let b = go.table.frames(&found, func.entry, go.funcdata.as_ref());
                assert_eq!(a, b, "{} {how}", tc.label);
            }
        }
    }
}

/// `go tool objdump -s '^main.NAME$'` of `bin`: (address, instruction text) lines.
fn objdump(tc: &Toolchain, bin: &Path, name: &str) -> Vec<(u64, String)> {
    let path = visible_to(tc, bin);
    let pattern = format!("^main.{name}$");
    let out = run_go(tc, &["tool", "objdump", "-s", &pattern, &path], None).expect("objdump");
    out.lines()
        .filter_map(|line| {
            // "  file.go:12\t0x4553e0\t\t493b6610\t\tCMPQ SP, 0x10(R14)"
            let mut fields = line.split('\t').map(str::trim).filter(|f| !f.is_empty());
            let _position = fields.next()?;
            let addr = u64::from_str_radix(fields.next()?.strip_prefix("0x")?, 16).ok()?;
            let _bytes = fields.next()?;
            Some((addr, fields.collect::<Vec<_>>().join(" ")))
        })
        .collect()
}

#[test]
fn unwind_rows_give_the_frame_size_at_each_call_and_a_frameless_leaf_none() {
    for tc in toolchains() {
        for stripped in [false, true] {
            // Given the fixture, and its toolchain's disassembly of callerWork and leafWork
            let reference = build(&tc, FIXTURE, false);
            let bin = build(&tc, FIXTURE, stripped);
            let caller = objdump(&tc, &reference, "callerWork");
            let leaf = objdump(&tc, &reference, "leafWork");
            assert!(!caller.is_empty() && !leaf.is_empty(), "{}", tc.label);
            assert!(
                leaf.iter()
                    .all(|(_, i)| !i.contains("SUBQ $") && !i.contains("PUSHQ BP")),
                "{}: leafWork has a frame: {leaf:?}",
                tc.label
            );
            // callerWork's frame: PUSHQ BP (Go 1.21 on) and SUBQ $N, SP
            let pushed = caller.iter().any(|(_, i)| i == "PUSHQ BP");
            let sub = caller
                .iter()
                .find_map(|(_, i)| {
                    let imm = i.strip_prefix("SUBQ $0x")?.strip_suffix(", SP")?;
                    u64::from_str_radix(imm, 16).ok()
                })
                .unwrap_or_else(|| panic!("{}: no SUBQ in {caller:?}", tc.label));
            let cfa = i32::try_from(sub + 8 + if pushed { 8 } else { 0 }).expect("small");
            // When its unwind table is compiled
            let compiled = unwind::compile(
                &fs::File::open(&bin).expect("open"),
                &unwind::Limits::default(),
            )
            .unwrap_or_else(|err| panic!("{}: {err}", tc.label));
            assert_eq!(compiled.stats.section, unwind::CfiSection::GoPclntab);
            assert!(compiled.stats.go_funcs > 500, "{:?}", compiled.stats);
            // Then at each call in callerWork the CFA is rsp + the frame + 8, with rbp saved
            // below the return address
            let calls: Vec<u64> = caller
                .iter()
                .filter(|(_, i)| i.starts_with("CALL main.leafWork"))
                .map(|(a, _)| *a)
                .collect();
            assert_eq!(calls.len(), 2, "{}: {caller:?}", tc.label);
            for call in calls {
                assert_eq!(
                    compiled.table.lookup(call),
                    Some(Rule::Frame {
                        cfa: Cfa::Rsp(cfa),
                        rbp: Rbp::AtCfa(-16)
                    }),
                    "{} stripped={stripped}: at {call:#x}",
                    tc.label
                );
            }
            // And at every instruction of the frameless leaf, the return address is at rsp
            for (addr, _) in &leaf {
                assert_eq!(
                    compiled.table.lookup(*addr),
                    Some(Rule::Frame {
                        cfa: Cfa::Rsp(8),
                        rbp: Rbp::Unchanged
                    }),
                    "{} stripped={stripped}: at {addr:#x}",
                    tc.label
                );
            }
        }
    }
}
