//! The relay -> sampler control channel of issue 10 under a hostile relay: a test relay (this
//! process, root) sends the real sampler (`--unwind dwarf`) garbage, an oversized datagram, a
//! corrupt unwind table, a table for a file the sampler does not hold and one good table. The
//! sampler must refuse exactly the four bad ones (counted in `Losses.unwindTablesRefused`), load
//! the good one (`unwindTablesLoaded`) and keep sampling.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::PermissionsExt as _,
    },
    time::{Duration, Instant},
};

use ember_protocol::{
    decode_sampler_message, encode_relay_message,
    transport::{self, Received},
    Limits, RelayMessage, SamplerMessage, UnwindTableChunk,
};
use ember_tests::*;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Waits for the next datagram on `sock` until `deadline`; `None` on timeout or end.
fn next(sock: &OwnedFd, deadline: Instant) -> Option<SamplerMessage> {
    let mut buf = vec![0u8; 4 << 20];
    let left = deadline.saturating_duration_since(Instant::now());
    let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    if poll(&mut fds, PollTimeout::from(millis)).ok()? == 0 {
        return None;
    }
    match transport::recv(sock.as_fd(), &mut buf).ok()? {
        Received::Message { len, .. } => {
            Some(decode_sampler_message(&buf[..len], &Limits::default()).expect("decodes"))
        }
        other => panic!("unexpected datagram from the sampler: {other:?}"),
    }
}

/// An encoded table (relay/src/unwind/table.rs layout) over [0x1000, 0x1040) whose one row has
/// `kind` (1 = CFA at rsp + 8, a frame; 9 = no such kind).
fn table(kind: u8) -> Vec<u8> {
    let mut out = 0x1000u64.to_le_bytes().to_vec();
    out.extend_from_slice(&0x40u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // pc
    out.extend_from_slice(&8i32.to_le_bytes()); // a
    out.extend_from_slice(&0i16.to_le_bytes()); // b
    out.extend([kind, 0]);
    out
}

fn send_table(sock: &OwnedFd, file_id: u64, data: Vec<u8>) {
    let message = RelayMessage::UnwindTableChunk(UnwindTableChunk {
        file_id,
        chunk: 0,
        chunks: 1,
        data,
        vaddr_minus_offset: 0,
    });
    transport::send(sock.as_fd(), &encode_relay_message(&message), &[], false)
        .expect("sending a table");
}

#[test]
fn sampler_refuses_bad_tables_loads_a_good_one_and_keeps_sampling() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let workload = spawn_workload(&workloads().spinner, 120);
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let socket = dir.path().join("relay.sock");
    let listener = transport::listen(&socket).expect("listen");
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666)).expect("chmod socket");
    let pid = workload.pid().to_string();
    let (mut sampler, log) = spawn_sampler(
        "sampler --unwind dwarf",
        &socket,
        &["--unwind", "dwarf", "--pid", &pid, "--log-format", "json"],
    );
    let mut ready = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let polled = poll(&mut ready, PollTimeout::from(60_000u16)).expect("poll");
    assert_eq!(polled, 1, "the sampler never connected:\n{}", log.text());
    let conn = transport::accept(listener.as_fd()).expect("accept");

    // Given the id of a file the sampler passed (one it holds open).
    let deadline = Instant::now() + TIMEOUT;
    let file_id = loop {
        match next(&conn, deadline) {
            Some(SamplerMessage::Files(files)) => {
                if let Some(file) = files.iter().find(|f| f.fd >= 0) {
                    break file.file_id;
                }
            }
            Some(_) => {}
            None => panic!("no file from the sampler:\n{}", log.text()),
        }
    };
    // When the relay sends four bad messages and one good table.
    transport::send(conn.as_fd(), &[1, 2, 3, 4, 5, 6, 7, 8], &[], false).expect("garbage");
    transport::send(conn.as_fd(), &vec![0u8; 60 << 10], &[], false).expect("oversized");
    send_table(&conn, file_id, table(9));
    send_table(&conn, u64::MAX, table(1));
    send_table(&conn, file_id, table(1));

    // Then the sampler counts 4 refused and 1 loaded, and its batches keep carrying samples.
    let mut counted_at = None;
    let mut later_batches = 0;
    let mut last = (0, 0);
    while later_batches < 2 {
        let Some(message) = next(&conn, deadline) else {
            panic!(
                "the sampler stopped sending (refused/loaded last seen {last:?}):\n{}",
                log.text()
            );
        };
        let SamplerMessage::Batch(batch) = message else {
            continue;
        };
        last = (
            batch.losses.unwind_tables_refused,
            batch.losses.unwind_tables_loaded,
        );
        if counted_at.is_some() {
            assert!(
                batch.sample_count() > 0,
                "a batch without samples after the refusals"
            );
            later_batches += 1;
        } else if last == (4, 1) {
            counted_at = Some(batch.sequence);
        } else {
            assert!(last.0 <= 4 && last.1 <= 1, "over-counted: {last:?}");
        }
    }
    assert!(
        sampler.try_wait().is_none(),
        "the sampler exited:\n{}",
        log.text()
    );
    assert!(
        log.text()
            .contains("refused an unwind table from the relay"),
        "no refusal logged:\n{}",
        log.text()
    );
}

/// The truth workload's call chain, root first.
const CHAIN: [&str; 4] = ["main", "outer_work", "middle_work", "inner_work"];
const FUNCS: [&str; 3] = ["outer_work", "middle_work", "inner_work"];

/// Ground truth without frame pointers: the groundtruth workload built `-O2
/// -fomit-frame-pointer`, profiled by `run --unwind dwarf` + `ember-sampler --unwind dwarf`.
/// The relay's second window (4-8 s: the first holds the interval before the process's mappings
/// and tables reached the kernel) must have >= 95% of the workload's samples carry the whole
/// chain `_start` ... `main` -> ... -> leaf, and the self-time split within 3 points of what the
/// workload measured itself.
#[test]
fn dwarf_unwinding_gives_whole_stacks_without_frame_pointers() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let binary = compile_workload(
        dir.path(),
        "groundtruth",
        "gt-nofp",
        &["-O2", "-fomit-frame-pointer"],
    );
    let workload = spawn_workload(&binary, 120);
    let pid = workload.pid().to_string();
    let out_dir = dir.path().join("out");
    let socket = dir.path().join("relay.sock");
    let out_arg = out_dir.to_str().expect("utf-8 path");
    let relay = spawn_relay_run(
        "relay --unwind dwarf",
        &socket,
        &[
            "--unwind",
            "dwarf",
            "--output-dir",
            out_arg,
            "--window",
            "4s",
        ],
    );
    let (_sampler, sampler_log) = spawn_sampler(
        "sampler --unwind dwarf",
        &socket,
        &["--unwind", "dwarf", "--pid", &pid, "--frequency", "499"],
    );
    std::thread::sleep(Duration::from_millis(9_000));
    let folded = fs::read_to_string(out_dir.join("stacks.folded")).unwrap_or_else(|err| {
        panic!(
            "no stacks.folded ({err}):\n{}\n{}",
            relay.log.text(),
            sampler_log.text()
        )
    });
    let (status, out) = workload.terminate_and_read_stdout(Duration::from_secs(10));
    assert!(status.success(), "groundtruth exited with {status}");
    let truth: serde_json::Value = out
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("the workload's JSON summary");

    let mut self_counts = [0u64; 3];
    let (mut total, mut whole) = (0u64, 0u64);
    let mut other: Vec<(String, u64)> = Vec::new();
    for stack in parse_folded(&folded) {
        if !stack.process.starts_with("gt-nofp") {
            continue;
        }
        total += stack.count;
        let Some(leaf) = FUNCS.iter().position(|f| stack.leaf() == Some(f)) else {
            other.push((stack.frames.join(";"), stack.count));
            continue;
        };
        self_counts[leaf] += stack.count;
        let main = stack.frames.iter().position(|f| f == "main");
        let chain_ok = main.is_some_and(|m| stack.frames[m..] == CHAIN[..leaf + 2]);
        if chain_ok && stack.frames.first().map(String::as_str) == Some("_start") {
            whole += stack.count;
        } else {
            other.push((stack.frames.join(";"), stack.count));
        }
    }
    other.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let covered: u64 = self_counts.iter().sum();
    let share = whole as f64 / total.max(1) as f64;
    eprintln!(
        "whole stacks _start..main..leaf: {whole} of {total} ({:.1}%); other: {:?}",
        share * 100.0,
        &other[..other.len().min(5)]
    );
    assert!(
        total >= 500,
        "only {total} samples of the workload:\n{folded}"
    );
    assert!(
        share >= 0.95,
        "only {:.1}% whole stacks; most common others: {:?}",
        share * 100.0,
        &other[..other.len().min(5)]
    );
    for (i, func) in FUNCS.iter().enumerate() {
        let measured = self_counts[i] as f64 / covered.max(1) as f64;
        let expected = truth[func].as_f64().expect("truth share");
        eprintln!(
            "{func}: measured {:.2}%, truth {:.2}%",
            measured * 100.0,
            expected * 100.0
        );
        assert!(
            (measured - expected).abs() <= 0.03,
            "{func}: measured {:.2}%, truth {:.2}%",
            measured * 100.0,
            expected * 100.0
        );
    }
}

/// Debian's own python3 (no frame pointers) running a pure-Python loop: in the relay's second
/// window, >= 90% of its samples reach `_start` (native frames only; no Python symbols needed).
#[test]
fn dwarf_unwinding_reaches_start_in_debians_python3() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().expect("temp dir");
    let loop_src = "import time\nt = time.time()\nx = 0\nwhile time.time() - t < 60:\n    \
                    for i in range(10000):\n        x += i * i\n";
    let mut command = std::process::Command::new("python3");
    command.args(["-c", loop_src]);
    let python = ChildGuard::spawn("python3 loop", &mut command);
    let pid = python.pid().to_string();
    let out_dir = dir.path().join("out");
    let socket = dir.path().join("relay.sock");
    let out_arg = out_dir.to_str().expect("utf-8 path");
    let relay = spawn_relay_run(
        "relay --unwind dwarf",
        &socket,
        &[
            "--unwind",
            "dwarf",
            "--output-dir",
            out_arg,
            "--window",
            "4s",
        ],
    );
    let (_sampler, sampler_log) = spawn_sampler(
        "sampler --unwind dwarf",
        &socket,
        &["--unwind", "dwarf", "--pid", &pid, "--frequency", "499"],
    );
    std::thread::sleep(Duration::from_millis(9_000));
    let folded = fs::read_to_string(out_dir.join("stacks.folded")).unwrap_or_else(|err| {
        panic!(
            "no stacks.folded ({err}):\n{}\n{}",
            relay.log.text(),
            sampler_log.text()
        )
    });
    drop(python);
    let (mut total, mut rooted) = (0u64, 0u64);
    let mut other: Vec<(String, u64)> = Vec::new();
    for stack in parse_folded(&folded) {
        total += stack.count;
        if stack.frames.first().map(String::as_str) == Some("_start") {
            rooted += stack.count;
        } else {
            other.push((stack.frames.join(";"), stack.count));
        }
    }
    other.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let share = rooted as f64 / total.max(1) as f64;
    eprintln!(
        "python3 stacks from _start: {rooted} of {total} ({:.1}%); other: {:?}",
        share * 100.0,
        &other[..other.len().min(5)]
    );
    assert!(total >= 500, "only {total} samples of python3:\n{folded}");
    assert!(
        share >= 0.90,
        "only {:.1}% of python3's samples reach _start; most common others: {:?}",
        share * 100.0,
        &other[..other.len().min(5)]
    );
}
