//! The relay's CPython decoding against real interpreters: each CPython found on the test
//! machine (`tests::find_all`) runs a known chain of functions with non-ASCII names (kinds 1, 2
//! and 4) in a file with a non-ASCII name, and blocks; the test reads that process's memory
//! through `/proc/PID/mem` with the relay's [`Layout`] exactly as the kernel walk does
//! (root -> interpreter -> thread -> frames; per code object raw copies of 192, 320 and 256
//! bytes from each object's start) and checks what the relay makes of those bytes against what
//! the interpreter itself reports (`sys._current_frames()`): every name, qualified name, file
//! name, first line, instruction offset (`f_lasti`), and that the frames group into eval calls
//! with the shims dropped.
//!
//! Needs to read another process's memory: root (or the same user and ptrace scope 0) and the
//! Debian roots under chroot (root only). A missing interpreter fails under `CI` /
//! `EMBER_REQUIRE_ALL`, else is a printed skip.

use std::{
    fs::{self, File},
    io::{BufRead as _, BufReader},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use super::{
    instruction,
    naming::{Naming, Runtime},
    splice::{self, Boundary},
    tests::{find_all, missing, recognized},
    Interpreter, Layout,
};
use crate::interp::raw::{RawCode, RawInterpFrame};

/// The workload: a chain of calls blocked in `time.sleep`, and a thread that prints the main
/// thread's frames as Python sees them.
const SCRIPT: &str = r#"import sys, threading, time
def 𠀀():
    time.sleep(1000)
def 日本():
    𠀀()
def café():
    return sorted([0], key=lambda _: 日本())
class Worker:
    def run(self):
        café()
def report():
    time.sleep(0.3)
    f = sys._current_frames()[main]
    print("ident %d" % main)
    while f is not None:
        c = f.f_code
        q = getattr(c, "co_qualname", c.co_name)
        print("frame\t%d\t%d\t%s\t%s\t%d\t%d" % (id(c), f.f_lasti, q, c.co_filename, c.co_firstlineno, f.f_lineno))
        f = f.f_back
    print("end")
    sys.stdout.flush()
main = threading.get_ident()
threading.Thread(target=report, daemon=True).start()
Worker().run()
"#;

/// What the interpreter printed of one frame.
#[derive(Debug)]
struct Reported {
    code: u64,
    lasti: i64,
    name: String,
    filename: String,
    first_line: i32,
    line: i32,
}

struct Running {
    child: Child,
    ident: u64,
    frames: Vec<Reported>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the workload under `run` (script at `inside`, as the interpreter sees it) and reads
/// its report.
fn start(run: &[String], inside: &str) -> Running {
    let child = Command::new(&run[0])
        .args(&run[1..])
        .arg(inside)
        .env("PYTHONIOENCODING", "utf-8")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {run:?}: {e}"));
    let mut running = Running {
        child,
        ident: 0,
        frames: Vec::new(),
    };
    let stdout = running.child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line of the report");
        let fields: Vec<&str> = line.split('\t').collect();
        match fields.as_slice() {
            [single] if single.starts_with("ident ") => {
                running.ident = single[6..].parse().expect("ident");
            }
            ["frame", code, lasti, name, filename, first, line] => running.frames.push(Reported {
                code: code.parse().expect("code id"),
                lasti: lasti.parse().expect("f_lasti"),
                name: (*name).to_owned(),
                filename: (*filename).to_owned(),
                first_line: first.parse().expect("first line"),
                line: line.parse().expect("line"),
            }),
            ["end"] => break,
            _ => panic!("unexpected report line {line:?}"),
        }
    }
    running
}

/// `/proc/PID/mem`, read as the kernel's `bpf_probe_read_user` would.
struct Memory(File);

impl Memory {
    fn bytes(&self, at: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.0
            .read_exact_at(&mut buf, at)
            .unwrap_or_else(|e| panic!("read {len} bytes at {at:#x}: {e}"));
        buf
    }

    fn u64(&self, at: u64) -> u64 {
        u64::from_le_bytes(self.bytes(at, 8).try_into().expect("8 bytes"))
    }
}

/// Where `binary` is loaded in `pid`: the start of its mappings minus their file offset.
fn load_base(pid: u32, binary: &Path) -> u64 {
    let want = fs::canonicalize(binary).expect("canonical binary path");
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    maps.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = PathBuf::from(fields.get(5)?);
            (fs::canonicalize(&path).ok()? == want).then_some(())?;
            let start = u64::from_str_radix(fields[0].split('-').next()?, 16).ok()?;
            let offset = u64::from_str_radix(fields[2], 16).ok()?;
            Some(start - offset)
        })
        .min()
        .unwrap_or_else(|| panic!("{} not mapped in {pid}", binary.display()))
}

/// Walks the main thread's frames as the kernel does and copies their code objects.
fn walk(
    memory: &Memory,
    interpreter: &Interpreter,
    layout: &Layout,
    base: u64,
    ident: u64,
) -> (Vec<RawInterpFrame>, Vec<(u64, RawCode)>) {
    let a = &layout.anchors;
    let root = match (a.runtime, layout.runtime.interpreters_head, a.interp_head) {
        (Some(runtime), Some(head), _) => runtime + head,
        (_, _, Some(head)) => head,
        _ => panic!("no root anchor for {}", interpreter.version),
    } - interpreter.first_vaddr
        + base;
    let interp = memory.u64(root);
    let mut tstate = memory.u64(interp + layout.interpreter.threads_head);
    for _ in 0..64 {
        if tstate == 0 || memory.u64(tstate + layout.thread.thread_id) == ident {
            break;
        }
        tstate = memory.u64(tstate + layout.thread.next);
    }
    assert_ne!(tstate, 0, "the main thread's state");
    let mut frame = memory.u64(tstate + layout.thread.frame);
    if let Some(hop) = layout.thread.cframe_current_frame {
        frame = memory.u64(frame + hop);
    }
    let marker = splice::marker_offset(interpreter.version, layout);
    let mut frames = Vec::new();
    let mut codes: Vec<(u64, RawCode)> = Vec::new();
    while frame != 0 && frames.len() < 64 {
        let code = memory.u64(frame + layout.frame.code) & !layout.frame.code_tag_mask;
        let raw = RawInterpFrame {
            code,
            instruction: memory.u64(frame + layout.frame.instruction),
            marker: marker.map_or(0, |m| memory.bytes(frame + m, 1)[0]),
        };
        frames.push(raw);
        // The shims' code is no code object (None, or garbage): the kernel's type check leaves
        // it uncopied.
        let shim =
            Boundary::of(interpreter.version) == Boundary::Shim && raw.marker >= splice::SHIM_OWNER;
        if !shim && code != 0 && !codes.iter().any(|(c, _)| *c == code) {
            let c = &layout.code;
            let name_at = memory.u64(code + c.qualname.unwrap_or(c.name));
            let file_at = memory.u64(code + c.filename);
            let lines_at = memory.u64(code + c.linetable);
            let first = memory.bytes(code + c.firstlineno, 4);
            codes.push((
                code,
                RawCode {
                    first_line: i32::from_le_bytes(first.try_into().expect("4 bytes")),
                    copied: RawCode::NAME | RawCode::FILENAME | RawCode::LINETABLE,
                    name: memory.bytes(name_at, 192),
                    filename: memory.bytes(file_at, 320),
                    linetable: memory.bytes(lines_at, 256),
                },
            ));
        }
        frame = memory.u64(frame + layout.frame.previous);
    }
    (frames, codes)
}

#[test]
fn real_interpreters_frames_and_code_objects_decode_as_the_interpreter_reports_them() {
    let root = nix::unistd::geteuid().is_root();
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for found in find_all() {
        if found.run[0] == "chroot" && !root {
            missing(&format!("{} needs root to run under chroot", found.origin));
            continue;
        }
        let Some(interpreter) = recognized(&found.binary) else {
            continue;
        };
        let Ok(layout) = interpreter.layout.clone() else {
            continue;
        };
        // The script goes where the interpreter sees it: inside the chroot when there is one.
        let dir = tempfile::Builder::new()
            .prefix("ember-live-")
            .tempdir_in(match found.run.as_slice() {
                [chroot, root, ..] if chroot == "chroot" => Path::new(root).join("tmp"),
                _ => std::env::temp_dir(),
            })
            .expect("temp dir");
        let script = dir.path().join("wörkload_日本.py");
        fs::write(&script, SCRIPT).expect("write the workload");
        let inside = match found.run.as_slice() {
            [chroot, root, ..] if chroot == "chroot" => Path::new("/")
                .join(script.strip_prefix(root).expect("inside the root"))
                .display()
                .to_string(),
            _ => script.display().to_string(),
        };
        let running = start(&found.run, &inside);
        let pid = running.child.id();
        let memory = Memory(
            File::open(format!("/proc/{pid}/mem"))
                .unwrap_or_else(|e| panic!("open /proc/{pid}/mem (root needed?): {e}")),
        );
        let base = load_base(pid, &found.binary);
        let (frames, codes) = walk(&memory, &interpreter, &layout, base, running.ident);
        let what = format!("{} {}", found.origin, interpreter.version);
        if let Err(failure) = check(&interpreter, &layout, &running, &frames, &codes) {
            failures.push(format!("{what}: {failure}"));
        } else {
            checked.push(what);
        }
    }
    println!("checked: {checked:#?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    if checked.is_empty() {
        missing("no CPython with a layout to check against");
    }
}

/// Compares the relay's reading of the walked bytes with the interpreter's report.
fn check(
    interpreter: &Interpreter,
    layout: &Layout,
    running: &Running,
    frames: &[RawInterpFrame],
    codes: &[(u64, RawCode)],
) -> Result<(), String> {
    let runtime = Runtime {
        version: interpreter.version,
        layout,
        module: None,
    };
    let mut naming = Naming::default();
    naming.take_codes((1, 1), runtime, codes.iter().map(|(c, raw)| (*c, raw)));
    let unread = naming.cache.stats;
    if unread.names_unread + unread.filenames_unread > 0 {
        return Err(format!("strings refused: {unread:?}"));
    }
    // The walk's frames, shims left out, are the interpreter's own frames in order.
    let boundary = Boundary::of(interpreter.version);
    let groups = splice::groups(frames, boundary);
    let python: Vec<&RawInterpFrame> = groups
        .iter()
        .flat_map(|g| frames[g.clone()].iter())
        .collect();
    if python.len() != running.frames.len() {
        return Err(format!(
            "{} frames walked ({} in {} groups), the interpreter reports {}: {frames:x?}",
            frames.len(),
            python.len(),
            groups.len(),
            running.frames.len()
        ));
    }
    for (raw, want) in python.iter().zip(&running.frames) {
        if raw.code != want.code {
            return Err(format!(
                "code {:#x}, the interpreter's {:#x}",
                raw.code, want.code
            ));
        }
        let named = naming.frame((1, 1), runtime, raw);
        if *named.function != *want.name || named.file.as_deref() != Some(want.filename.as_str()) {
            return Err(format!("named {named:?}, the interpreter says {want:?}"));
        }
        let offset = instruction::offset(interpreter.version, layout, raw.code, raw.instruction);
        if offset.map(i64::from) != Some(want.lasti) {
            return Err(format!(
                "{}: instruction offset {offset:?}, f_lasti {}",
                want.name, want.lasti
            ));
        }
        // The line: the interpreter's own, decoded from the copied line table.
        let line = u32::try_from(want.line).ok();
        if named.line != line {
            return Err(format!(
                "{}: line {:?}, the interpreter's {line:?} (first {})",
                want.name, named.line, want.first_line
            ));
        }
    }
    // The chain the script set up, leaf first
    let names: Vec<&str> = running.frames.iter().map(|f| f.name.as_str()).collect();
    let want = [
        "𠀀",
        "日本",
        "café.<locals>.<lambda>",
        "café",
        "Worker.run",
        "<module>",
    ];
    let want_old = ["𠀀", "日本", "<lambda>", "café", "run", "<module>"];
    if names != want && names != want_old {
        return Err(format!("the chain is {names:?}"));
    }
    // Two eval calls from C (the module's, and the lambda's from `sorted`), to 3.10 one per
    // frame: the markers (3.11's `is_entry`, the shims' owner) must cut exactly there.
    let expected_groups = if boundary == Boundary::EachFrame {
        6
    } else {
        2
    };
    if boundary != Boundary::EachFrame && groups.first().map(ExactSizeIterator::len) != Some(3) {
        return Err(format!(
            "the first group is {groups:?}, not the 3 frames up to the lambda"
        ));
    }
    if groups.len() != expected_groups {
        return Err(format!(
            "{} groups, expected {expected_groups}: {frames:x?}",
            groups.len()
        ));
    }
    Ok(())
}
