//! CPython recognition against real binaries: every release line 3.6 to 3.14 must be found on
//! the test machine (pyenv's builds, the host's `/usr/bin/python3.N`, the Debian roots of
//! `scripts/runtime-roots.sh`), recognized with the version the interpreter itself reports, and
//! its layout checked field by field against that interpreter running (`check.py`). Plus hostile
//! inputs: truncated binaries, forged debug offsets.

use std::{
    env,
    fs::{self, File},
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use super::{debug_offsets, Interpreter, Layout, Source, Version};
use crate::interp::{recognize, Limits, Recognized};

/// The release lines every test machine must hold a binary of.
const LINES: std::ops::RangeInclusive<u8> = 6..=14;

/// Where the Debian roots are (scripts/runtime-roots.sh).
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

/// One CPython binary found on this machine.
#[derive(Debug)]
pub(super) struct Found {
    /// The file the relay reads: libpython when the build has one, else the executable.
    pub(super) binary: PathBuf,
    /// How to run its interpreter: a command and its leading arguments.
    pub(super) run: Vec<String>,
    pub(super) origin: String,
}

/// Every CPython 3 binary in the well-known places.
pub(super) fn find_all() -> Vec<Found> {
    let mut found = Vec::new();
    let versions = pyenv_root().join("versions");
    let mut dirs: Vec<PathBuf> = fs::read_dir(&versions)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    dirs.sort();
    for dir in dirs {
        let Some(v) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        let mut parts = v.split('.');
        let (Some("3"), Some(minor)) = (parts.next(), parts.next()) else {
            continue;
        };
        let major = "3";
        let line = format!("{major}.{minor}");
        let exe = dir.join("bin").join(format!("python{line}"));
        if !exe.exists() {
            continue;
        }
        let lib = ["", "m"]
            .iter()
            .map(|abi| dir.join("lib").join(format!("libpython{line}{abi}.so.1.0")))
            .find(|p| p.exists());
        let binary = lib.unwrap_or_else(|| exe.clone());
        found.push(Found {
            binary,
            run: vec![exe.display().to_string()],
            origin: format!("pyenv {v}"),
        });
    }
    let host = |dir: &Path, chroot: Option<&Path>, origin: &str, found: &mut Vec<Found>| {
        let bin = dir.join("usr/bin");
        let mut names: Vec<String> = fs::read_dir(&bin)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        for name in names {
            let Some(minor) = name.strip_prefix("python3.") else {
                continue;
            };
            if minor.parse::<u8>().is_err() {
                continue;
            }
            let inside = format!("/usr/bin/{name}");
            let run = match chroot {
                Some(root) => vec!["chroot".into(), root.display().to_string(), inside],
                None => vec![inside],
            };
            found.push(Found {
                binary: bin.join(&name),
                run,
                origin: origin.to_owned(),
            });
        }
    };
    host(Path::new("/"), None, "host", &mut found);
    for suite in ["trixie", "sid"] {
        let root = roots_dir().join(suite);
        host(
            &root,
            Some(&root),
            &format!("Debian {suite} root"),
            &mut found,
        );
    }
    found
}

/// A test machine without a binary the tests expect: a failure where nothing may be skipped
/// (`CI` or `EMBER_REQUIRE_ALL`, as scripts/test.sh sets), else a printed skip.
pub(crate) fn missing(what: &str) {
    let required = ["CI", "EMBER_REQUIRE_ALL"]
        .iter()
        .any(|v| env::var(v).is_ok_and(|x| !x.is_empty() && x != "0" && x != "false"));
    let message = format!(
        "{what}: run `pyenv install 3.6 3.7 3.8 3.9 3.10 3.11 3.12 3.13` (shared builds: \
         PYTHON_CONFIGURE_OPTS=--enable-shared) and `sudo scripts/runtime-roots.sh` (Debian's \
         3.13 and 3.14), or set PYENV_ROOT / EMBER_ROOTS"
    );
    assert!(!required, "{message}");
    eprintln!("SKIPPED: {message}");
}

/// `sys.version_info[:3]` as the interpreter itself prints it.
fn reported_version(found: &Found) -> Option<Version> {
    let output = Command::new(&found.run[0])
        .args(&found.run[1..])
        .args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let mut parts = text.trim().split('.').map(|p| p.parse::<u8>().ok());
    Some(Version::new(parts.next()??, parts.next()??, parts.next()??))
}

/// The `key=value` arguments of check.py for `layout`.
fn check_args(interpreter: &Interpreter, layout: &Layout) -> Vec<String> {
    let mut args = vec![format!("first_vaddr={}", interpreter.first_vaddr)];
    let mut put = |key: &str, value: Option<u64>| {
        if let Some(value) = value {
            args.push(format!("{key}={value}"));
        }
    };
    let a = &layout.anchors;
    put("anchors.runtime", a.runtime);
    put("anchors.thread_state_current", a.thread_state_current);
    put("anchors.auto_tls_key", a.auto_tls_key);
    put("anchors.interp_head", a.interp_head);
    put("anchors.code_type", a.code_type);
    put(
        "runtime.interpreters_head",
        layout.runtime.interpreters_head,
    );
    put("runtime.tss_key", layout.runtime.tss_key);
    put("runtime.tstate_current", layout.runtime.tstate_current);
    put(
        "interpreter.threads_head",
        Some(layout.interpreter.threads_head),
    );
    let t = &layout.thread;
    put("thread.next", Some(t.next));
    put("thread.interp", Some(t.interp));
    put("thread.frame", Some(t.frame));
    put("thread.cframe_current_frame", t.cframe_current_frame);
    put("thread.thread_id", Some(t.thread_id));
    put("thread.native_thread_id", t.native_thread_id);
    let f = &layout.frame;
    put("frame.previous", Some(f.previous));
    put("frame.code", Some(f.code));
    put("frame.code_tag_mask", Some(f.code_tag_mask));
    put("frame.instruction", Some(f.instruction));
    put("frame.owner", f.owner);
    put("frame.is_entry", f.is_entry);
    let c = &layout.code;
    put("code.filename", Some(c.filename));
    put("code.name", Some(c.name));
    put("code.qualname", c.qualname);
    put("code.firstlineno", Some(c.firstlineno));
    put("code.linetable", Some(c.linetable));
    put("code.code_adaptive", c.code_adaptive);
    let u = &layout.unicode;
    put("unicode.length", Some(u.length));
    put("unicode.state", Some(u.state));
    put("unicode.ascii_size", Some(u.ascii_size));
    args.push(format!(
        "frame.kind={}",
        match f.kind {
            super::FrameKind::Object => "object",
            super::FrameKind::Interpreter => "interpreter",
        }
    ));
    args
}

/// Runs check.py in `found`'s interpreter: (fields checked, mismatch lines).
fn live_check(found: &Found, interpreter: &Interpreter, layout: &Layout) -> (usize, Vec<String>) {
    let output = Command::new(&found.run[0])
        .args(&found.run[1..])
        .args(["-c", include_str!("check.py")])
        .args(check_args(interpreter, layout))
        .output()
        .unwrap_or_else(|e| panic!("running {:?}: {e}", found.run));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "check.py in {:?} failed: {}{}",
        found.run,
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    let ok = stdout.lines().filter(|l| l.starts_with("ok ")).count();
    let bad = stdout
        .lines()
        .filter(|l| !l.starts_with("ok "))
        .map(str::to_owned)
        .collect();
    (ok, bad)
}

pub(super) fn recognized(path: &Path) -> Option<Interpreter> {
    let file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match recognize(&file, name, &Limits::default()) {
        Ok(Some(Recognized::CPython(i))) => Some(i),
        Ok(None) => None,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

#[test]
fn every_cpython_line_is_recognized_and_its_layout_matches_the_running_interpreter() {
    let all = find_all();
    let root = nix::unistd::geteuid().is_root();
    let mut rows = vec![format!(
        "{:<8} {:<62} {:<7} {:<10} {:<17} spot check",
        "python", "binary", "kind", "recognized", "offsets from"
    )];
    let mut lines_seen = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for found in &all {
        if found.run[0] == "chroot" && !root {
            missing(&format!("{} needs root to run under chroot", found.origin));
            continue;
        }
        let Some(reported) = reported_version(found) else {
            failures.push(format!("{:?} did not report its version", found.run));
            continue;
        };
        let Some(interpreter) = recognized(&found.binary) else {
            failures.push(format!(
                "{} (CPython {reported}) was not recognized",
                found.binary.display()
            ));
            continue;
        };
        let kind = if interpreter.shared_library {
            "shared"
        } else {
            "static"
        };
        if interpreter.version != reported {
            failures.push(format!(
                "{}: recognized {} but the interpreter says {reported}",
                found.binary.display(),
                interpreter.version
            ));
        }
        let (source, spot) = match &interpreter.layout {
            Ok(layout) => {
                let (ok, bad) = live_check(found, &interpreter, layout);
                if !bad.is_empty() || ok < 15 {
                    failures.push(format!(
                        "{} ({reported}): {ok} fields agree, these do not:\n  {}",
                        found.binary.display(),
                        bad.join("\n  ")
                    ));
                }
                lines_seen.insert(reported.minor);
                let verdict = if bad.is_empty() { "agree" } else { "DISAGREE" };
                (layout.source.to_string(), format!("{ok} fields {verdict}"))
            }
            Err(reason) => {
                failures.push(format!("{}: no layout: {reason}", found.binary.display()));
                ("-".to_owned(), "-".to_owned())
            }
        };
        rows.push(format!(
            "{:<8} {:<62} {:<7} {:<10} {:<17} {spot}",
            reported.to_string(),
            found.binary.display().to_string(),
            kind,
            interpreter.version.to_string(),
            source,
        ));
    }
    println!("{}", rows.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let absent: Vec<String> = LINES
        .filter(|m| !lines_seen.contains(m))
        .map(|m| format!("3.{m}"))
        .collect();
    if !absent.is_empty() {
        missing(&format!(
            "no CPython {} found to test against",
            absent.join(", ")
        ));
    }
}

#[test]
fn python_2_is_recognized_but_has_no_layout() {
    let lib = pyenv_root().join("versions/2.7.18/lib/libpython2.7.so.1.0");
    if !lib.exists() {
        missing("no pyenv CPython 2.7.18");
        return;
    }
    let interpreter = recognized(&lib).expect("CPython 2.7 recognized");
    assert_eq!(interpreter.version, Version::new(2, 7, 18));
    let reason = interpreter.layout.expect_err("no layout for 2.7");
    assert!(reason.contains("not supported"), "{reason}");
}

#[test]
fn files_that_are_no_cpython_are_not_claimed() {
    // The test binary itself, and a file that is no ELF at all.
    let me = env::current_exe().expect("current exe");
    assert!(recognized(&me).is_none());
    let mut text = tempfile::NamedTempFile::new().expect("tempfile");
    text.write_all(b"#!/bin/sh\necho python3.11\n")
        .expect("write");
    let file = File::open(text.path()).expect("open");
    assert!(recognize(&file, "python3.11", &Limits::default()).is_err());
}

/// Every prefix length that cuts a real CPython binary somewhere interesting: the result is a
/// refusal or "not mine", never a panic and never a different version.
#[test]
fn truncated_cpython_binaries_are_refused_without_panic() {
    let Some(found) = find_all().into_iter().find(|f| {
        f.binary
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("3.12"))
    }) else {
        missing("no CPython 3.12 binary to truncate");
        return;
    };
    let bytes = fs::read(&found.binary).expect("read");
    let whole = recognized(&found.binary).expect("recognized whole");
    let mut cuts: Vec<usize> = (0..12).map(|i| 1usize << (i + 6)).collect();
    cuts.extend((1..40).map(|i| bytes.len() * i / 40));
    let mut claimed = 0;
    for cut in cuts {
        let mut part = tempfile::NamedTempFile::new().expect("tempfile");
        part.write_all(&bytes[..cut.min(bytes.len())])
            .expect("write");
        let file = File::open(part.path()).expect("open");
        if let Ok(Some(Recognized::CPython(i))) =
            recognize(&file, "libpython3.12.so.1.0", &Limits::default())
        {
            assert_eq!(i.version, whole.version, "cut at {cut}");
            claimed += 1;
        }
    }
    println!("{claimed} of the cuts still recognized (the rest refused)");
}

/// A valid 3.13 `_Py_DebugOffsets` image for the forgery tests: every size 64, every offset 8.
fn debug_offsets_image(version: Version) -> Vec<u8> {
    let shape = debug_offsets::shape(version).expect("shape");
    let mut bytes = debug_offsets::COOKIE.to_vec();
    for (section, members) in shape {
        for member in *members {
            let word: u64 = match (*section, *member) {
                ("header", "version") => {
                    (u64::from(version.major) << 24)
                        | (u64::from(version.minor) << 16)
                        | (u64::from(version.micro) << 8)
                        | 0xf0
                }
                ("header", "free_threaded") => 0,
                (_, "size") => 64,
                _ => 8,
            };
            bytes.extend_from_slice(&word.to_le_bytes());
        }
    }
    bytes
}

#[test]
fn forged_debug_offsets_are_refused_with_a_reason() {
    let v = Version::new(3, 13, 5);
    let good = debug_offsets_image(v);
    let layout = debug_offsets::parse(&good, v).expect("a well-formed image parses");
    assert_eq!(layout.source, Source::DebugOffsets);
    assert_eq!(layout.thread.frame, 8);

    // Each forgery, and the refusal it must get.
    let word_at = |section: &str, member: &str| {
        let mut index = 0;
        for (s, members) in debug_offsets::shape(v).expect("shape") {
            if *s == section {
                return 8 + 8
                    * (index + members.iter().position(|m| *m == member).expect("member"));
            }
            index += members.len();
        }
        panic!("no {section}");
    };
    let forge = |section: &str, member: &str, value: u64| {
        let mut bytes = good.clone();
        let at = word_at(section, member);
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        debug_offsets::parse(&bytes, v).expect_err("forgery refused")
    };
    let mut cookie = good.clone();
    cookie[0] = b'X';
    assert_eq!(
        debug_offsets::parse(&cookie, v),
        Err(debug_offsets::Refused::Cookie)
    );
    assert!(matches!(
        debug_offsets::parse(&good[..100], v),
        Err(debug_offsets::Refused::Short(100, _))
    ));
    assert!(matches!(
        forge("header", "version", 0x030c_01f0),
        debug_offsets::Refused::Version { .. }
    ));
    assert!(matches!(
        forge("header", "version", 0x030d_04f0),
        debug_offsets::Refused::Version { .. }
    ));
    assert_eq!(
        forge("header", "free_threaded", 1),
        debug_offsets::Refused::FreeThreaded
    );
    assert!(matches!(
        forge("thread_state", "current_frame", 60),
        debug_offsets::Refused::Offset { .. }
    ));
    assert!(matches!(
        forge("thread_state", "current_frame", u64::MAX - 3),
        debug_offsets::Refused::Offset { .. }
    ));
    assert!(matches!(
        forge("code_object", "size", 1 << 40),
        debug_offsets::Refused::Size { .. }
    ));
    assert!(matches!(
        forge("unicode_object", "asciiobject_size", 0),
        debug_offsets::Refused::Size { .. }
    ));
    assert!(matches!(
        debug_offsets::parse(&good, Version::new(3, 15, 0)),
        Err(debug_offsets::Refused::UnknownShape(3, 15))
    ));
}
