//! The address arithmetic and the layout of `interpreterProcess` on real interpreters: each one
//! is run, its executable mappings are given as the sampler gives them, and the message's root,
//! code type and offsets are followed in the running process's memory (/proc/PID/mem) to its
//! own thread state, current frame and code object.

use std::{
    fs::{self, File},
    io::{BufRead as _, BufReader},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use ember_protocol::{Mapping, ProcessInfo, INTERP_LAYOUT_ABSENT};
use std::os::fd::OwnedFd;

use super::*;
use crate::interp::{recognize, Limits};

/// The file id the test gives the interpreter file.
const FILE: u64 = 7;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `python` sleeping in a Python frame, once it is ready.
fn start(python: &Path) -> Running {
    let mut child = Command::new(python)
        .args([
            "-c",
            "import time\nprint('ready', flush=True)\ntime.sleep(60)\n",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("reading the interpreter's first line");
    assert_eq!(line.trim(), "ready");
    Running(child)
}

/// `/proc/PID/maps` lines of `path`: (start, end, executable, file offset).
fn maps_of(pid: u32, path: &Path) -> Vec<(u64, u64, bool, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).expect("reading maps");
    let real = fs::canonicalize(path).expect("canonical path");
    text.lines()
        .filter(|l| l.ends_with(real.to_str().expect("utf-8 path")))
        .map(|l| {
            let mut parts = l.split_whitespace();
            let range = parts.next().expect("range");
            let perms = parts.next().expect("perms");
            let offset = u64::from_str_radix(parts.next().expect("offset"), 16).expect("hex");
            let (s, e) = range.split_once('-').expect("start-end");
            let hex = |v: &str| u64::from_str_radix(v, 16).expect("hex");
            (hex(s), hex(e), perms.contains('x'), offset)
        })
        .collect()
}

/// The process as the sampler describes it: executable mappings only.
fn facts(pid: u32, path: &Path) -> ProcessInfo {
    let mappings = maps_of(pid, path)
        .into_iter()
        .filter(|&(_, _, exec, _)| exec)
        .map(|(start, end, _, file_offset)| Mapping {
            start,
            end,
            file_offset,
            file_id: FILE,
            ..Mapping::default()
        })
        .collect();
    ProcessInfo {
        pid,
        start_time_unix_ns: 1,
        mappings,
        ..ProcessInfo::default()
    }
}

fn interpreter(path: &Path) -> Interpreter {
    let file = File::open(path).expect("open");
    match recognize(&file, "python", &Limits::default()) {
        Ok(Some(Recognized::CPython(i))) => i,
        other => panic!("{} not recognized: {other:?}", path.display()),
    }
}

struct Memory(File);

impl Memory {
    fn u64(&self, addr: u64) -> u64 {
        let mut b = [0u8; 8];
        self.0
            .read_exact_at(&mut b, addr)
            .unwrap_or_else(|e| panic!("reading {addr:#x}: {e}"));
        u64::from_le_bytes(b)
    }
}

/// Follows `message` in process `pid`'s memory as the kernel walk does: the interpreter, its
/// thread list to the main thread (native id or pthread tid), the current frame, its code
/// object, whose type must be `code_type`.
fn walk_like_the_kernel(pid: u32, message: &InterpreterProcess) {
    let mem = Memory(File::open(format!("/proc/{pid}/mem")).expect("open mem"));
    let l = |i: usize| u64::from(message.layout[i]);
    let interp = mem.u64(message.root);
    assert_ne!(interp, 0, "root does not point at an interpreter");
    let mut thread = mem.u64(interp + l(0));
    let mut found = None;
    for _ in 0..64 {
        if thread == 0 {
            break;
        }
        let tid = if message.layout[2] != INTERP_LAYOUT_ABSENT {
            mem.u64(thread + l(2)) as u32
        } else {
            (mem.u64(mem.u64(thread + l(3)) + l(4)) & 0xffff_ffff) as u32
        };
        if tid == pid {
            found = Some(thread);
            break;
        }
        thread = mem.u64(thread + l(1));
    }
    let thread = found.expect("the main thread's state is in the interpreter's list");
    let mut frame = mem.u64(thread + l(5));
    if message.layout[6] != INTERP_LAYOUT_ABSENT {
        frame = mem.u64(frame + l(6));
    }
    assert_ne!(frame, 0, "no current frame");
    let code = mem.u64(frame + l(8)) & !l(11);
    assert_eq!(
        mem.u64(code + l(16)),
        message.code_type,
        "the current frame's code object is not of type code_type"
    );
}

fn pyenv_312() -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"),
        PathBuf::from,
    );
    let mut dirs: Vec<PathBuf> = fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("3.12."))
        })
        .collect();
    dirs.sort();
    dirs.pop()
}

#[test]
fn debian_static_python_3_11_root_is_its_link_address_and_leads_to_its_frames() {
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        panic!("no /usr/bin/python3.11 (Debian's python3.11 package)");
    }
    let interpreter = interpreter(python);
    assert_eq!(interpreter.first_vaddr, 0x40_0000, "a non-PIE executable");
    let running = start(python);
    let pid = running.0.id();
    // Given the process's executable mappings of python3.11
    let info = facts(pid, python);
    // When described
    let message = interpreter_process(&info, FILE, &interpreter).expect("a message");
    // Then, non-PIE, every address is the link address: root is _PyRuntime's interpreters list
    let layout = interpreter.layout.as_ref().expect("layout");
    let runtime = layout.anchors.runtime.expect("_PyRuntime");
    assert_eq!(
        message.root,
        runtime + layout.runtime.interpreters_head.expect("head")
    );
    assert_eq!(message.code_type, layout.anchors.code_type.expect("type"));
    // 3.11: native thread id, a cframe hop, `is_entry` as the marker
    assert_eq!(message.layout[2], 160);
    assert_eq!(message.layout[4], INTERP_LAYOUT_ABSENT);
    assert_eq!((message.layout[6], message.layout[10]), (8, 68));
    // And following it in the running process reaches its current frame's code object
    walk_like_the_kernel(pid, &message);
}

#[test]
fn pyenv_shared_libpython_3_12_addresses_follow_its_load_base() {
    let Some(dir) = pyenv_312() else {
        panic!("no pyenv CPython 3.12: run `pyenv install 3.12` (a shared build)");
    };
    let lib = dir.join("lib/libpython3.12.so.1.0");
    let interpreter = interpreter(&lib);
    assert!(interpreter.shared_library);
    let running = start(&dir.join("bin/python3.12"));
    let pid = running.0.id();
    // Given libpython's executable mappings (not its offset-0 read-only one)
    let info = facts(pid, &lib);
    assert!(info.mappings.iter().all(|m| m.file_offset != 0));
    // When described
    let message = interpreter_process(&info, FILE, &interpreter).expect("a message");
    // Then root is the load base (the start of the mapping of file offset 0) plus the anchor
    let load_base = maps_of(pid, &lib)
        .into_iter()
        .find(|&(_, _, _, offset)| offset == 0)
        .map(|(start, ..)| start)
        .expect("libpython's first mapping");
    let layout = interpreter.layout.as_ref().expect("layout");
    let runtime = layout.anchors.runtime.expect("_PyRuntime");
    assert_eq!(
        message.root,
        load_base + runtime + layout.runtime.interpreters_head.expect("head")
    );
    assert_eq!(
        message.code_type,
        load_base + layout.anchors.code_type.expect("type")
    );
    // 3.12: `owner` is the marker, no pthread tid needed
    assert_eq!((message.layout[6], message.layout[10]), (0, 70));
    walk_like_the_kernel(pid, &message);
}

#[test]
fn pyenv_3_9_without_native_ids_is_matched_through_the_pthread_tid() {
    let Some(dir) = pyenv_312().and_then(|d| {
        let versions = d.parent()?.to_path_buf();
        let mut dirs: Vec<PathBuf> = fs::read_dir(versions)
            .ok()?
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.to_str().is_some_and(|s| s.contains("/3.9.")))
            .collect();
        dirs.sort();
        dirs.pop()
    }) else {
        panic!("no pyenv CPython 3.9: run `pyenv install 3.9` (a shared build)");
    };
    let lib = dir.join("lib/libpython3.9.so.1.0");
    let interpreter = interpreter(&lib);
    let running = start(&dir.join("bin/python3.9"));
    let pid = running.0.id();
    let message = interpreter_process(&facts(pid, &lib), FILE, &interpreter).expect("a message");
    assert_eq!(message.layout[2], INTERP_LAYOUT_ABSENT);
    assert_eq!(message.layout[4], GLIBC_PTHREAD_TID_X86_64);
    assert_eq!(message.layout[10], INTERP_LAYOUT_ABSENT);
    walk_like_the_kernel(pid, &message);
}

#[test]
fn a_process_not_mapping_the_file_or_without_a_layout_gets_no_message() {
    let python = Path::new("/usr/bin/python3.11");
    let mut interpreter = interpreter(python);
    let info = ProcessInfo {
        pid: 1,
        mappings: vec![Mapping {
            start: 0x41_f000,
            end: 0x6d_2000,
            file_offset: 0x1_f000,
            file_id: FILE + 1,
            ..Mapping::default()
        }],
        ..ProcessInfo::default()
    };
    assert!(interpreter_process(&info, FILE, &interpreter).is_err());
    assert!(interpreter_process(&info, FILE + 1, &interpreter).is_ok());
    interpreter.layout = Err("no layout".into());
    assert_eq!(
        interpreter_process(&info, FILE + 1, &interpreter),
        Err("no layout".to_owned())
    );
}

#[test]
fn pyenv_shared_libpython_3_13_is_walked_from_its_debug_offsets() {
    let Some(dir) = pyenv_312().and_then(|d| {
        let mut dirs: Vec<PathBuf> = fs::read_dir(d.parent()?)
            .ok()?
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.to_str().is_some_and(|s| s.contains("/3.13.")))
            .collect();
        dirs.sort();
        dirs.pop()
    }) else {
        panic!("no pyenv CPython 3.13: run `pyenv install 3.13` (a shared build)");
    };
    let lib = dir.join("lib/libpython3.13.so.1.0");
    let interpreter = interpreter(&lib);
    let running = start(&dir.join("bin/python3.13"));
    let pid = running.0.id();
    let message = interpreter_process(&facts(pid, &lib), FILE, &interpreter).expect("a message");
    // 3.13: the current frame directly, `owner` as the marker
    assert_eq!(message.layout[6], INTERP_LAYOUT_ABSENT);
    assert_ne!(message.layout[10], INTERP_LAYOUT_ABSENT);
    walk_like_the_kernel(pid, &message);
}

/// Every `interpreterProcess` waiting on `sock`, decoded.
fn received(sock: &OwnedFd) -> Vec<InterpreterProcess> {
    use ember_protocol::{decode_relay_message, Limits as WireLimits};
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut ready = [nix::poll::PollFd::new(
        sock.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    while nix::poll::poll(&mut ready, nix::poll::PollTimeout::ZERO).is_ok_and(|n| n > 0) {
        let Ok(transport::Received::Message { len, .. }) = transport::recv(sock.as_fd(), &mut buf)
        else {
            break;
        };
        match decode_relay_message(&buf[..len], &WireLimits::default()) {
            Ok(RelayMessage::InterpreterProcess(m)) => out.push(m),
            other => panic!("unexpected: {other:?}"),
        }
    }
    out
}

#[test]
fn each_claim_is_sent_once_and_withdrawn_when_the_process_maps_no_interpreter() {
    let python = Path::new("/usr/bin/python3.11");
    let runtime = Arc::new(Recognized::CPython(interpreter(python)));
    let runtimes = vec![(FILE, Arc::clone(&runtime))];
    let info = |start: u64, text_start: u64| ProcessInfo {
        pid: 42,
        start_time_unix_ns: start,
        mappings: vec![Mapping {
            start: text_start,
            end: text_start + 0x2b_3000,
            file_offset: 0x1_f000,
            file_id: FILE,
            ..Mapping::default()
        }],
        ..ProcessInfo::default()
    };
    let (ours, theirs) = transport::pair().expect("socketpair");
    let mut publisher = InterpPublisher::default();
    publisher.connected(1, Arc::new(ours));
    // Given a process's facts, When they come (and again, unchanged, with more mappings)
    publisher.process(1, &info(5, 0x41_f000), &runtimes);
    publisher.process(1, &info(5, 0x41_f000), &runtimes);
    // Then one message is sent, at the link addresses of the non-PIE executable
    let got = received(&theirs);
    assert_eq!(got.len(), 1);
    let first = got[0];
    assert_eq!((first.pid, first.file_id, first.forget), (42, FILE, false));
    // Given the file mapped elsewhere (another root), Then it is described again
    publisher.process(1, &info(5, 0x1041_f000), &runtimes);
    let got = received(&theirs);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].root, first.root + 0x1000_0000);
    // Given facts of the same process without the interpreter, Then it is withdrawn
    publisher.process(1, &info(5, 0x41_f000), &[]);
    let got = received(&theirs);
    assert_eq!(got.len(), 1);
    assert!(got[0].forget && got[0].start_time_unix_ns == 5);
    // Given a new process under the pid (exited first), Then it is described, nothing withdrawn
    publisher.process(1, &info(5, 0x41_f000), &runtimes);
    publisher.exited(1, 42);
    publisher.process(1, &info(6, 0x41_f000), &runtimes);
    let got = received(&theirs);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|m| !m.forget));
    assert_eq!(got[1].start_time_unix_ns, 6);
    assert_eq!((publisher.sent, publisher.dropped), (5, 0));
    // And a closed connection is sent nothing
    publisher.closed(1);
    publisher.process(1, &info(7, 0x41_f000), &runtimes);
    assert!(received(&theirs).is_empty());
}
