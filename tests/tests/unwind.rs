//! The relay -> sampler control channel under a hostile relay: a test relay (this
//! process, root) sends the real sampler (`--unwind dwarf`) garbage, an oversized datagram, a
//! corrupt unwind table, a table for a file the sampler does not hold and one good table. The
//! sampler must refuse exactly the four bad ones (counted in `Losses.unwindTablesRefused`), load
//! the good one (`unwindTablesLoaded`) and keep sampling. Two more: a relay that
//! floods the channel with hundreds of MiB of good and bad chunks, and one that disconnects in
//! the middle of a table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::PermissionsExt as _,
    },
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use ember_protocol::{
    decode_sampler_message, encode_relay_message,
    transport::{self, Received},
    Limits, RelayMessage, SamplerMessage, UnwindTableChunk, MAX_UNWIND_CHUNK_BYTES,
};
use ember_tests::attack::{vm_hwm_kib, Watch};
use ember_tests::{
    scenario::{ebpf_gate, Scenario},
    *,
};
use nix::{
    errno::Errno,
    poll::{poll, PollFd, PollFlags, PollTimeout},
};

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
    let Some(_lock) = ebpf_gate() else { return };
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

/// A valid table of `rows` rows (CFA at rsp + 8 / rsp + 16 alternating, 4 bytes apart), split
/// into chunks of at most [`MAX_UNWIND_CHUNK_BYTES`]; with `corrupt` its last row has kind 9,
/// so the table passes framing and fails the whole-table check.
fn chunked_table(file_id: u64, rows: u32, corrupt: bool) -> Vec<RelayMessage> {
    let mut data = 0x1000u64.to_le_bytes().to_vec();
    data.extend_from_slice(&(rows * 4).to_le_bytes());
    data.extend_from_slice(&rows.to_le_bytes());
    for i in 0..rows {
        data.extend_from_slice(&(i * 4).to_le_bytes());
        data.extend_from_slice(&(8 + 8 * (i as i32 % 2)).to_le_bytes());
        data.extend_from_slice(&0i16.to_le_bytes());
        let kind = if corrupt && i + 1 == rows { 9 } else { 1 };
        data.extend([kind, 0]);
    }
    let parts: Vec<&[u8]> = data.chunks(MAX_UNWIND_CHUNK_BYTES).collect();
    let chunks = u32::try_from(parts.len()).expect("chunk count");
    parts
        .iter()
        .zip(0..)
        .map(|(part, chunk)| {
            RelayMessage::UnwindTableChunk(UnwindTableChunk {
                file_id,
                chunk,
                chunks,
                data: part.to_vec(),
                vaddr_minus_offset: 0,
            })
        })
        .collect()
}

/// Sends one datagram without ever blocking for good: while the socket is full, waits for it
/// to drain (that wait is the sampler's backpressure). Panics when the sampler has not read
/// for 20 s. Returns the time spent waiting.
fn send_waiting(sock: &OwnedFd, bytes: &[u8]) -> Duration {
    let started = Instant::now();
    loop {
        match transport::send(sock.as_fd(), bytes, &[], true) {
            Ok(()) => return started.elapsed(),
            Err(Errno::EAGAIN) => {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the sampler stopped reading its socket for 20 s"
                );
                let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLOUT)];
                let _ = poll(&mut fds, PollTimeout::from(200u16));
            }
            Err(err) => panic!("sending to the sampler failed: {err}"),
        }
    }
}

/// A sampler (`--unwind dwarf`, profiling `pid` only) connected to a listener of this test:
/// the sampler, its log, the listener and the accepted connection.
struct Connected {
    sampler: ChildGuard,
    log: LogReader,
    listener: OwnedFd,
    conn: OwnedFd,
    _dir: tempfile::TempDir,
}

fn connect_sampler(pid: u32, extra: &[&str]) -> Connected {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let socket = dir.path().join("relay.sock");
    let listener = transport::listen(&socket).expect("listen");
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666)).expect("chmod socket");
    let pid = pid.to_string();
    let mut args = vec!["--unwind", "dwarf", "--pid", &pid, "--log-format", "json"];
    args.extend_from_slice(extra);
    let (sampler, log) = spawn_sampler("sampler --unwind dwarf", &socket, &args);
    let conn = accept_within(&listener, &log, 60_000);
    Connected {
        sampler,
        log,
        listener,
        conn,
        _dir: dir,
    }
}

fn accept_within(listener: &OwnedFd, log: &LogReader, millis: u16) -> OwnedFd {
    let mut ready = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let polled = poll(&mut ready, PollTimeout::from(millis)).expect("poll");
    assert_eq!(polled, 1, "the sampler did not connect:\n{}", log.text());
    transport::accept(listener.as_fd()).expect("accept")
}

/// Reads until a `Files` message names a file the sampler holds open; its id.
fn held_file(conn: &OwnedFd, log: &LogReader) -> u64 {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match next(conn, deadline) {
            Some(SamplerMessage::Files(files)) => {
                if let Some(file) = files.iter().find(|f| f.fd >= 0) {
                    return file.file_id;
                }
            }
            Some(_) => {}
            None => panic!("no file from the sampler:\n{}", log.text()),
        }
    }
}

/// Reads until the next batch; panics with the sampler's log when none comes in time.
fn next_batch(conn: &OwnedFd, log: &LogReader, deadline: Instant) -> ember_protocol::Batch {
    loop {
        match next(conn, deadline) {
            Some(SamplerMessage::Batch(batch)) => return batch,
            Some(_) => {}
            None => panic!("no batch from the sampler:\n{}", log.text()),
        }
    }
}

/// Frequency of the flood test's sampler; its batches come every second.
const FLOOD_HZ: u32 = 199;
/// How long the relay floods (whole rounds of 17 datagrams, about 830 KiB, after it).
const FLOOD_TIME: Duration = Duration::from_secs(10);

/// A relay floods the control channel for 10 s with good tables (8 chunks of 48 KiB each), bad
/// tables of the same size (the last row's kind is 9), chunks out of order, undecodable
/// datagrams and datagrams over the 56 KiB the sampler reads. The sampler must keep sampling
/// (a batch with samples at least every 3 s, the sample total within the workload's measured
/// CPU time x frequency), count exactly each bad thing once in `Losses.unwindTablesRefused`
/// (undecodable and bad-table refusals from `Tables`, oversized ones from the link's inbox) and
/// each good table in `unwindTablesLoaded`, and keep its peak resident memory (VmHWM from
/// /proc, polled from outside) under its start + 24 MiB: what it may hold is one table under
/// assembly (here 384 KiB), 16 inbox datagrams of 56 KiB, and the decoded copies of one.
#[test]
fn a_flooding_relay_is_held_back_counted_and_does_not_stop_sampling() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().spinner, 120);
    let hz = FLOOD_HZ.to_string();
    let c = connect_sampler(workload.pid(), &["--frequency", &hz]);
    let connected_at = Instant::now();
    let file_id = held_file(&c.conn, &c.log);
    let deadline = Instant::now() + TIMEOUT;
    // Given a sampler that already sent one batch (its memory is set up).
    let first = next_batch(&c.conn, &c.log, deadline);
    let cpu_start = process_cpu_time(workload.pid());
    let hwm_start = vm_hwm_kib(c.sampler.pid()).expect("sampler VmHWM");
    let watch = Watch::start(c.sampler.pid(), Some(1 << 20));

    let good = chunked_table(file_id, 32_000, false);
    let bad = chunked_table(file_id, 32_000, true);
    assert_eq!((good.len(), bad.len()), (8, 8));
    let good: Vec<Vec<u8>> = good.iter().map(encode_relay_message).collect();
    let bad: Vec<Vec<u8>> = bad.iter().map(encode_relay_message).collect();
    let stray = encode_relay_message(&chunked_table(file_id, 32_000, false)[3]);
    let garbage = vec![0xa5u8; 4096];
    let oversized = vec![0u8; 60 << 10];
    let flooding = AtomicBool::new(true);

    // When the relay sends as fast as the socket takes for 10 s (whole rounds), while this
    // thread reads the sampler's batches.
    let (sent_bytes, good_sent, bad_sent, blocked, batches) = std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            let (mut bytes, mut good_sent, mut bad_sent) = (0u64, 0u64, 0u64);
            let mut blocked = Duration::ZERO;
            let end = Instant::now() + FLOOD_TIME;
            while Instant::now() < end {
                for datagram in good.iter().chain(&bad) {
                    blocked += send_waiting(&c.conn, datagram);
                    bytes += datagram.len() as u64;
                }
                for datagram in [&stray, &garbage, &oversized] {
                    blocked += send_waiting(&c.conn, datagram);
                    bytes += datagram.len() as u64;
                }
                good_sent += 1;
                bad_sent += 4; // the bad table, the stray chunk, the garbage, the oversized
            }
            flooding.store(false, Ordering::SeqCst);
            (bytes, good_sent, bad_sent, blocked)
        });
        let mut batches = Vec::new();
        while flooding.load(Ordering::SeqCst) {
            let wait = Instant::now() + Duration::from_secs(1);
            if let Some(SamplerMessage::Batch(batch)) = next(&c.conn, wait) {
                batches.push((Instant::now(), batch));
            }
            assert!(
                Instant::now() < deadline + TIMEOUT,
                "the flood never ended:\n{}",
                c.log.text()
            );
        }
        let (bytes, good_sent, bad_sent, blocked) = sender.join().expect("sender thread");
        (bytes, good_sent, bad_sent, blocked, batches)
    });

    // Then every good table is counted loaded and every bad thing refused, exactly.
    let expected = (bad_sent, good_sent);
    let settle = Instant::now() + Duration::from_secs(30);
    let mut after = Vec::new();
    let mut last = (0, 0);
    while last != expected {
        let Some(message) = next(&c.conn, settle) else {
            panic!(
                "(refused, loaded) stuck at {last:?}, sent {expected:?}: something was not \
                 counted:\n{}",
                c.log.text()
            );
        };
        let SamplerMessage::Batch(batch) = message else {
            continue;
        };
        last = (
            batch.losses.unwind_tables_refused,
            batch.losses.unwind_tables_loaded,
        );
        assert!(
            last.0 <= expected.0 && last.1 <= expected.1,
            "over-counted: (refused, loaded) {last:?}, sent {expected:?}"
        );
        after.push(batch);
    }
    let cpu_end = process_cpu_time(workload.pid());
    let seen = watch.stop();
    let hwm_end = vm_hwm_kib(c.sampler.pid()).expect("sampler VmHWM");
    let peak_kib = seen.max_hwm_kib.max(hwm_end);

    let samples: u64 = batches
        .iter()
        .map(|(_, b)| b.sample_count())
        .chain(after.iter().map(ember_protocol::Batch::sample_count))
        .sum();
    let cpu = (cpu_end - cpu_start).as_secs_f64();
    let derived = cpu * f64::from(FLOOD_HZ);
    let slack = 2.0 * f64::from(FLOOD_HZ); // batches lag their interval by up to ~2 s
    let mut gaps = Vec::new();
    let mut previous = None;
    for (at, batch) in &batches {
        if batch.sample_count() == 0 {
            continue;
        }
        if let Some(p) = previous {
            gaps.push(at.duration_since(p));
        }
        previous = Some(*at);
    }
    let max_gap = gaps.iter().max().copied().unwrap_or(Duration::MAX);
    eprintln!(
        "flood: {:.0} MiB sent ({good_sent} good tables, {bad_sent} bad messages), relay blocked \
         {blocked:?}; {} batches during the flood, largest gap between batches with samples \
         {max_gap:?}; {samples} samples vs {derived:.0} derived from {cpu:.2} s CPU; sampler \
         VmHWM {hwm_start} KiB before, {peak_kib} KiB peak; first batch seq {}",
        sent_bytes as f64 / f64::from(1 << 20),
        batches.len(),
        first.sequence
    );
    // Thousands of refusals, but the log is not flooded: the first 5 one by one, a notice, then
    // at most one summary per 10 s since the connection.
    let refusal_lines = c
        .log
        .matching(|l| level(l) == "WARN" && message(l).contains("refus"))
        .len() as u64;
    let summaries = connected_at.elapsed().as_secs() / 10 + 1;
    eprintln!("refusal warnings logged: {refusal_lines} (at most 6 + {summaries})");
    assert!(
        refusal_lines <= 6 + summaries,
        "{refusal_lines} refusal warnings logged"
    );
    // The sampler reads at most 16 datagrams per wake-up, so the relay, not the sampler, waits:
    // most of the flood it is blocked on a full socket.
    assert!(
        sent_bytes >= 64 << 20,
        "only {sent_bytes} bytes sent: not a flood"
    );
    assert!(
        blocked >= FLOOD_TIME / 2,
        "the relay waited only {blocked:?} of {FLOOD_TIME:?}: the sampler is not holding it back"
    );
    assert!(
        max_gap <= Duration::from_secs(3) && batches.len() >= 3,
        "sampling stalled during the flood: {} batches, largest gap {max_gap:?}",
        batches.len()
    );
    assert!(
        (samples as f64) >= 0.85 * derived - slack && (samples as f64) <= 1.1 * derived + slack,
        "{samples} samples for {cpu:.2} s of CPU at {FLOOD_HZ} Hz ({derived:.0} derived)"
    );
    assert!(
        peak_kib <= hwm_start + (24 << 10),
        "sampler VmHWM grew from {hwm_start} KiB to {peak_kib} KiB under the flood"
    );
    let mut sampler = c.sampler;
    assert!(
        sampler.try_wait().is_none(),
        "the sampler exited:\n{}",
        c.log.text()
    );
}

/// A relay sends the first two of three chunks of a good table and disconnects; the sampler
/// must reconnect (hello, files, batches with samples), count the half table refused when the
/// new connection begins, refuse the missing third chunk sent on the new connection (it can
/// never complete a table of the old one: still nothing loaded), then load a whole table sent
/// on the new connection.
#[test]
fn a_table_half_sent_before_a_disconnect_is_refused_and_the_next_connection_loads() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().spinner, 120);
    let Connected {
        mut sampler,
        log,
        listener,
        conn,
        _dir,
    } = connect_sampler(workload.pid(), &[]);
    let file_id = held_file(&conn, &log);
    let deadline = Instant::now() + TIMEOUT;
    next_batch(&conn, &log, deadline);

    // Given the first two chunks of a three-chunk table, read by the sampler (two batches
    // later: it reads its socket every 100 ms).
    let table = chunked_table(file_id, 10_000, false);
    assert_eq!(table.len(), 3);
    let encoded: Vec<Vec<u8>> = table.iter().map(encode_relay_message).collect();
    for datagram in &encoded[..2] {
        send_waiting(&conn, datagram);
    }
    for _ in 0..2 {
        let batch = next_batch(&conn, &log, deadline);
        assert_eq!(
            (
                batch.losses.unwind_tables_refused,
                batch.losses.unwind_tables_loaded
            ),
            (0, 0),
            "a half table is neither refused nor loaded while it may still complete"
        );
    }
    // When the relay disconnects and the sampler connects again.
    drop(conn);
    let conn = accept_within(&listener, &log, 30_000);
    let first = next(&conn, deadline);
    assert!(
        matches!(first, Some(SamplerMessage::Hello(_))),
        "the new connection did not begin with a hello: {first:?}"
    );
    let new_id = held_file(&conn, &log);
    assert_eq!(new_id, file_id, "the file kept its id across connections");

    // Then the third chunk alone is refused and nothing is loaded ...
    send_waiting(&conn, &encoded[2]);
    let counters = |batch: &ember_protocol::Batch| {
        (
            batch.losses.unwind_tables_refused,
            batch.losses.unwind_tables_loaded,
        )
    };
    let mut last = (0, 0);
    while last != (2, 0) {
        let batch = next_batch(&conn, &log, deadline);
        last = counters(&batch);
        assert!(
            last.0 <= 2 && last.1 == 0,
            "(refused, loaded) {last:?}: the half table or the stray chunk was used"
        );
    }
    // ... and a whole table sent on the new connection loads, with sampling going on.
    for datagram in &encoded {
        send_waiting(&conn, datagram);
    }
    let mut with_samples = 0;
    while last != (2, 1) || with_samples < 2 {
        let batch = next_batch(&conn, &log, deadline);
        last = counters(&batch);
        assert!(
            last.0 == 2 && last.1 <= 1,
            "(refused, loaded) {last:?} after a whole table"
        );
        if last == (2, 1) && batch.sample_count() > 0 {
            with_samples += 1;
        }
    }
    assert!(
        sampler.try_wait().is_none(),
        "the sampler exited:\n{}",
        log.text()
    );
    assert!(
        log.text()
            .contains("the relay disconnected in the middle of a table"),
        "the abandoned table was not logged:\n{}",
        log.text()
    );
}

/// The groundtruth workload built `-O2 -fomit-frame-pointer` as `name` in a new directory any
/// user may enter (the sampler reads it after dropping to nobody).
fn nofp_groundtruth(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let binary = compile_workload(
        dir.path(),
        "groundtruth",
        name,
        &["-O2", "-fomit-frame-pointer"],
    );
    (dir, binary)
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
    let Some(_lock) = ebpf_gate() else { return };
    let (_dir, binary) = nofp_groundtruth("gt-nofp");
    let workload = spawn_workload(&binary, 120);
    let pid = workload.pid().to_string();
    let scenario = dwarf_scenario("relay --unwind dwarf", &pid).run();
    let out_dir = scenario.out_dir();
    let relay = &scenario.relay;
    let sampler_log = &scenario.sampler.as_ref().expect("a sampler").log;
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

/// The samples of `process` in `folded`, and how many of them carry the truth workload's whole
/// chain `_start` ... `main` -> ... -> leaf; the most common others.
fn truth_whole_stacks(folded: &str, process: &str) -> (u64, u64, Vec<(String, u64)>) {
    let (mut total, mut whole) = (0u64, 0u64);
    let mut other: Vec<(String, u64)> = Vec::new();
    for stack in parse_folded(folded) {
        if !stack.process.starts_with(process) {
            continue;
        }
        total += stack.count;
        let leaf = FUNCS.iter().position(|f| stack.leaf() == Some(f));
        let main = stack.frames.iter().position(|f| f == "main");
        let chain_ok = leaf
            .zip(main)
            .is_some_and(|(leaf, m)| stack.frames[m..] == CHAIN[..leaf + 2]);
        if chain_ok && stack.frames.first().map(String::as_str) == Some("_start") {
            whole += stack.count;
        } else {
            other.push((stack.frames.join(";"), stack.count));
        }
    }
    other.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    other.truncate(5);
    (total, whole, other)
}

/// `record` as a new user runs it, on a binary without frame pointers that was running before
/// the recording began: >= 95% of the workload's samples over the whole 10 s carry the whole
/// chain, the first second included. Until a process's mappings and its files' unwind tables
/// are in the kernel its stacks are walked by frame pointers and stop after the leaf; in steady
/// state the workload loses under 1% (its `clock_gettime` calls into the vDSO), so 95% leaves
/// the first half second to the start-up, where the first reporter interval (1 s) alone is 10%.
#[test]
fn a_recording_has_whole_stacks_from_its_first_second() {
    let Some(_lock) = ebpf_gate() else { return };
    let (_dir, binary) = nofp_groundtruth("gt-first");
    let workload = spawn_workload(&binary, 120);
    let pid = workload.pid().to_string();
    let frequency = 999u64;
    let recorded = record(
        &["--pid", &pid, "--duration", "10s", "--frequency", "999"],
        TIMEOUT,
    );
    drop(workload);
    let (total, whole, other) = truth_whole_stacks(&recorded.folded_text(), "gt-first");
    let share = whole as f64 / total.max(1) as f64;
    eprintln!(
        "whole stacks over the recording: {whole} of {total} ({:.1}%); other: {other:?}",
        share * 100.0
    );
    // At least 2 of the 10 s sampled, however loaded the machine: the share covers a recording.
    assert!(
        total >= 2 * frequency,
        "only {total} samples of the workload:\n{}",
        recorded.stderr
    );
    assert!(
        share >= 0.95,
        "only {:.1}% whole stacks over the recording; most common others: {other:?}\n{}",
        share * 100.0,
        recorded.stdout
    );
}

/// Debian's own python3 (no frame pointers) running a pure-Python loop: in the relay's second
/// window, >= 90% of its samples reach `_start` (native frames only; no Python symbols needed).
#[test]
fn dwarf_unwinding_reaches_start_in_debians_python3() {
    let Some(_lock) = ebpf_gate() else { return };
    let loop_src = "import time\nt = time.time()\nx = 0\nwhile time.time() - t < 60:\n    \
                    for i in range(10000):\n        x += i * i\n";
    let mut command = std::process::Command::new("python3");
    command.args(["-c", loop_src]);
    let python = ChildGuard::spawn("python3 loop", &mut command);
    let pid = python.pid().to_string();
    let scenario = dwarf_scenario("relay --unwind dwarf", &pid).run();
    let out_dir = scenario.out_dir();
    let relay = &scenario.relay;
    let sampler_log = &scenario.sampler.as_ref().expect("a sampler").log;
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

/// Stop reason counted by the stop-row test (6 = `StopReason::RbpRule`).
const STOP_CODE: u32 = 6;

/// A table over every address of a file (base 0, 4 GiB - 1) whose one row is a stop row of
/// `code`: any frame found in that file ends the walk with that reason.
fn stop_table(code: u32) -> Vec<u8> {
    let mut out = 0u64.to_le_bytes().to_vec();
    out.extend_from_slice(&u32::MAX.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // pc
    out.extend_from_slice(&(code as i32).to_le_bytes()); // a: the stop code
    out.extend_from_slice(&0i16.to_le_bytes()); // b
    out.extend([5, 0]); // kind 5: stop
    out
}

/// Stop reasons are counted one by one: a test relay gives the spinner's executable a table
/// whose only row says "stop, reason 6". Every walked stack that reaches a spinner frame ends
/// there, so (1) the sampler's count under reason 6 equals exactly the samples whose user stack's
/// outermost frame is in the spinner's executable mapping, summed over every batch until the
/// spinner exited and the totals settled, (2) no other stop reason is counted, and (3) the old
/// total `unwindStopped` agrees.
#[test]
fn a_stop_row_counts_exactly_its_samples_under_its_reason() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().spinner, 120);
    let spinner_pid = workload.pid();
    let Connected {
        sampler: _sampler,
        log,
        listener: _listener,
        conn,
        _dir,
    } = connect_sampler(spinner_pid, &["--frequency", "499"]);
    let deadline = Instant::now() + TIMEOUT;
    let exe = workloads().spinner.to_string_lossy().into_owned();
    // Given the spinner's executable (its file id, its mappings) ...
    let (mut file_id, mut mappings) = (None, Vec::new());
    let mut batches = Vec::new();
    while file_id.is_none() || mappings.is_empty() {
        match next(&conn, deadline) {
            Some(SamplerMessage::Files(files)) => {
                if let Some(f) = files.iter().find(|f| f.path == exe && f.fd >= 0) {
                    file_id = Some(f.file_id);
                }
            }
            Some(SamplerMessage::Process(p)) if p.pid == spinner_pid => {
                mappings.extend(p.mappings.into_iter().filter(|m| m.path == exe));
            }
            Some(SamplerMessage::Batch(b)) => batches.push(b),
            Some(_) => {}
            None => panic!("no spinner file or mappings:\n{}", log.text()),
        }
    }
    // ... When the relay sends a stop-6 table for it and the spinner runs for 3 more batches
    // after it loaded, then exits.
    send_table(&conn, file_id.expect("file id"), stop_table(STOP_CODE));
    let mut after_load = 0;
    while after_load < 3 {
        let batch = next_batch(&conn, &log, deadline);
        if batch.losses.unwind_tables_loaded == 1 {
            after_load += 1;
        }
        batches.push(batch);
    }
    let (status, _) = workload.terminate_and_read_stdout(Duration::from_secs(10));
    assert!(status.success(), "spinner exited with {status}");
    // Two whole batches after the exit: nothing of the spinner is in flight any more.
    let mut empty = 0;
    while empty < 2 {
        let batch = next_batch(&conn, &log, deadline);
        if batch.sample_count() == 0 {
            empty += 1;
        }
        batches.push(batch);
    }

    // Then the samples ending in the spinner are exactly the ones counted under reason 6.
    let in_spinner = |pc: u64| mappings.iter().any(|m| m.start <= pc && pc < m.end);
    let mut ending_there = 0u64;
    for batch in &batches {
        for row in batch.rows.iter().filter(|r| r.pid == spinner_pid) {
            if let ember_protocol::StackRef::Index(i) = row.user_stack {
                let frames = &batch.user_stacks[i as usize];
                if frames.last().is_some_and(|pc| in_spinner(*pc)) {
                    ending_there += row.count;
                }
            }
        }
    }
    let losses = &batches.last().expect("batches").losses;
    let counted = losses.unwind_stops_with_code(STOP_CODE).expect("code 6");
    let others: Vec<u64> = (1..=8)
        .filter(|c| *c != STOP_CODE)
        .filter_map(|c| losses.unwind_stops_with_code(c))
        .collect();
    eprintln!(
        "stacks ending in the spinner: {ending_there}; counted under reason {STOP_CODE}: \
         {counted}; other codes {others:?}; samples {}",
        losses.samples
    );
    assert!(
        counted >= 100,
        "only {counted} stacks stopped: the table was not used"
    );
    assert_eq!(
        counted, ending_there,
        "samples counted under reason {STOP_CODE} != samples whose stack ends in the spinner"
    );
    assert!(
        others.iter().all(|n| *n == 0),
        "other stop reasons counted: {others:?}"
    );
    assert_eq!(
        losses.unwind_stopped, counted,
        "the total of non-outermost stops"
    );
}

/// Kernel memory budget of the eviction test: about 340,000 rows, room for the executable's,
/// libc's and ld.so's tables and two of the three padded libraries' (about 150,000 rows each).
const EVICTION_BUDGET: &str = "6815744";
/// Rounds of `burn` per phase: about 3 s of CPU here.
const EVICTION_ROUNDS: &str = "15000";

/// Memory budget and eviction: one process dlopen()s three libraries whose tables are large
/// (burnlib.c, 150,000 rows each) under a budget that holds two of them, then burns in each in
/// turn and in the first again. Tables must be evicted to make room: the relay has the sampler
/// drop them within its fair shares (counted in `ember_relay_unwind_tables_withdrawn_total`),
/// or the sampler evicts (`unwindTablesEvicted`); no table is refused. Every stack of the libraries must stay right: the frames from `main` to
/// the leaf are the chain `main -> run_phase -> burn -> libN_outer -> libN_inner` or a part of
/// it in order (a frame-pointer walk may skip a frame in a prologue), never another frame, and
/// at least 95% are the whole chain. An evicted table's frames fall back to frame pointers (the
/// libraries keep them); rows reused by another table while the old entry still pointed at
/// them would give wrong frames (checked: keeping the evicted entry fails this test).
#[test]
fn a_full_budget_evicts_the_least_recently_sampled_table_and_stacks_stay_right() {
    let Some(_lock) = ebpf_gate() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let libs: Vec<String> = (1..=3)
        .map(|n| {
            let define = format!("-DLIB={n}");
            let out = format!("libburn{n}.so");
            let path = compile_workload(
                dir.path(),
                "burnlib",
                &out,
                &["-shared", "-fPIC", "-fno-toplevel-reorder", &define],
            );
            path.to_string_lossy().into_owned()
        })
        .collect();
    let phases = compile_workload(dir.path(), "phases", "phases", &["-ldl"]);
    let mut command = std::process::Command::new(&phases);
    command
        .arg(EVICTION_ROUNDS)
        .args(&libs)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut workload = ChildGuard::spawn("phases", &mut command);
    let pid = workload.pid().to_string();
    let mut scenario = Scenario::new("relay --unwind dwarf")
        .relay_args(["--unwind", "dwarf", "--window", "10m"])
        .relay_args(["--metrics-address", "127.0.0.1:0"])
        .output_dir()
        .sampler_args(["--unwind", "dwarf", "--pid", &pid, "--frequency", "499"])
        .sampler_args([
            "--unwind-memory-bytes",
            EVICTION_BUDGET,
            "--log-format",
            "json",
        ])
        .run();
    let out_dir = scenario.out_dir();
    let metrics = scenario.metrics_address();
    let sampler_log = scenario.sampler().log.clone();
    let relay = &mut scenario.relay;
    relay
        .log
        .expect(0, TIMEOUT, "the sampler's hello", is_sampling);
    // When the workload starts burning (all three libraries are mapped already).
    {
        use std::io::Write as _;
        let stdin = workload.child_mut().stdin.as_mut().expect("piped stdin");
        stdin.write_all(b"go\n").expect("starting the workload");
    }
    let status = workload
        .wait_timeout(Duration::from_secs(180))
        .expect("phases did not finish in 180 s");
    assert!(status.success(), "phases exited with {status}");
    // Two more batches: the last samples reached the relay.
    let seen = relay.log.len();
    let (at, _) = relay.log.expect(seen, TIMEOUT, "a batch", is_batch);
    relay
        .log
        .expect(at + 1, TIMEOUT, "a second batch", is_batch);
    let (_, body) = http_get(&metrics, "/metrics");
    let withdrawn =
        metric_value(&body, "ember_relay_unwind_tables_withdrawn_total").unwrap_or(0.0) as u64;
    relay.stop(TIMEOUT).expect("the relay stopped");
    let folded = fs::read_to_string(out_dir.join("stacks.folded"))
        .unwrap_or_else(|err| panic!("no stacks.folded ({err}):\n{}", relay.log.text()));

    // Then tables were evicted, none refused ...
    let batches = relay.log.matching(is_batch);
    let last = |key: &str| {
        batches
            .iter()
            .filter_map(|(_, line)| batch_counter(line, key))
            .max()
            .unwrap_or(0)
    };
    let (evicted, refused, loaded) = (
        last("unwind_tables_evicted"),
        last("unwind_tables_refused"),
        last("unwind_tables_loaded"),
    );
    let sizes = sampler_log
        .matching(|l| message(l).starts_with("unwind maps sized"))
        .first()
        .map(|(_, l)| l.to_string());
    eprintln!(
        "tables loaded {loaded}, evicted {evicted}, withdrawn by the relay {withdrawn}, refused \
         {refused}; sizes {sizes:?}"
    );
    // ... and every library stack is the chain or an ordered part of it.
    let (mut total, mut whole, mut wrong) = (0u64, 0u64, Vec::new());
    let mut per_lib = [0u64; 3];
    for stack in parse_folded(&folded) {
        let Some(lib) = (1..=3).find(|n| {
            stack
                .frames
                .iter()
                .any(|f| f.starts_with(&format!("lib{n}_")))
        }) else {
            continue;
        };
        total += stack.count;
        per_lib[lib - 1] += stack.count;
        let chain = [
            "main".to_owned(),
            "run_phase".to_owned(),
            "burn".to_owned(),
            format!("lib{lib}_outer"),
            format!("lib{lib}_inner"),
        ];
        let user: Vec<String> = stack.user_frames().map(str::to_owned).collect();
        let tail = user.iter().position(|f| f == "main").map(|m| &user[m..]);
        let in_order = tail.is_some_and(|tail| {
            let mut rest = chain.iter();
            tail.iter().all(|f| rest.any(|c| c == f))
        });
        if !in_order {
            wrong.push((stack.frames.join(";"), stack.count));
        } else if tail.is_some_and(|t| chain.starts_with(t) && t.len() >= 4) {
            whole += stack.count;
        }
    }
    let share = whole as f64 / total.max(1) as f64;
    eprintln!(
        "library stacks: {total} ({per_lib:?} per library), whole chains {:.1}%, wrong {wrong:?}",
        share * 100.0
    );
    assert!(
        per_lib.iter().all(|n| *n >= 100),
        "a library was hardly sampled: {per_lib:?}"
    );
    assert!(wrong.is_empty(), "wrong library stacks: {wrong:?}");
    assert!(share >= 0.95, "only {:.1}% whole chains", share * 100.0);
    assert!(
        evicted + withdrawn >= 1,
        "no table evicted:\n{}",
        sampler_log.text()
    );
    assert_eq!(refused, 0, "a table was refused:\n{}", sampler_log.text());
}

/// What one `run --unwind dwarf --state-dir` saw: the workload's stacks of its second window,
/// and the unwind worker's running totals (cache hits, compiled, cache files rewritten).
struct CachedRun {
    folded: String,
    hits: u64,
    compiled: u64,
    rewritten: u64,
}

/// Profiles `pid` for two 4-s windows with a relay caching tables in `state_dir`.
fn run_with_state_dir(name: &str, pid: u32, state_dir: &str) -> CachedRun {
    let (folded, log) = profile_dwarf(name, pid, &["--state-dir", state_dir]);
    let totals = log.matching(|l| message(l).starts_with("unwind tables sent"));
    let (_, last) = totals
        .last()
        .unwrap_or_else(|| panic!("no unwind totals logged:\n{}", log.text()));
    let field = |key: &str| field_u64(last, key).unwrap_or_else(|| panic!("no {key}: {last}"));
    CachedRun {
        folded,
        hits: field("cache_hits"),
        compiled: field("compiled"),
        rewritten: field("cache_files_rewritten"),
    }
}

/// Profiles `pid` with `run --unwind dwarf` (4-s windows) and `ember-sampler --unwind dwarf`
/// until a whole window began after the relay sent its tables; that window's stacks.folded and
/// the relay's log (the relay stopped).
fn profile_dwarf(name: &str, pid: u32, relay_extra: &[&str]) -> (String, LogReader) {
    profile_dwarf_after(name, pid, relay_extra, 1)
}

/// [`profile_dwarf`] that waits for the unwind worker's running totals to reach `tables` tables
/// sent (compiled, from the cache or kept in memory; e.g. the first image's 3 files plus the
/// exec'd image's one), however the worker split them into bursts, before it waits for the
/// windows.
fn profile_dwarf_after(
    name: &str,
    pid: u32,
    relay_extra: &[&str],
    tables: u64,
) -> (String, LogReader) {
    let mut scenario = dwarf_scenario(&format!("relay {name}"), &pid.to_string())
        .relay_args(relay_extra)
        .run();
    let out_dir = scenario.out_dir();
    let sampler_log = scenario.sampler().log.clone();
    let relay = &mut scenario.relay;
    // The first window that began after the tables were sent: the second file written after
    // the worker's totals line.
    relay.log.expect(0, TIMEOUT, "the unwind totals", |l| {
        message(l).starts_with("unwind tables sent")
            && ["compiled", "cache_hits", "kept_in_memory"]
                .iter()
                .map(|key| field_u64(l, key).unwrap_or(0))
                .sum::<u64>()
                >= tables
    });
    let path = out_dir.join("stacks.folded");
    let modified = || fs::metadata(&path).and_then(|m| m.modified()).ok();
    let mut seen = modified();
    for _ in 0..2 {
        wait_until(TIMEOUT, || {
            let now = modified();
            let changed = now.is_some() && now != seen;
            if changed {
                seen = now;
            }
            changed
        })
        .unwrap_or_else(|| panic!("no new window:\n{}", sampler_log.text()));
    }
    // The sink writes then renames: the file read is whole.
    let folded = fs::read_to_string(&path).expect("stacks.folded");
    relay.stop(TIMEOUT).expect("the relay stopped");
    (folded, relay.log.clone())
}

/// `run --unwind dwarf` writing 4-s windows into the scenario's `out`, and `ember-sampler
/// --unwind dwarf` profiling only `pid` at 499 Hz.
fn dwarf_scenario(name: &str, pid: &str) -> Scenario {
    Scenario::new(name)
        .relay_args(["--unwind", "dwarf", "--window", "4s"])
        .output_dir()
        .sampler_args(["--unwind", "dwarf", "--pid", pid, "--frequency", "499"])
}

/// Samples of `process` whose leaf is `leaf`, and how many of them carry `chain` (root
/// first, ending at `leaf`) from its first frame on after `main`; `any` in `chain` matches
/// one frame of any name.
fn chain_share(folded: &str, process: &str, chain: &[&str]) -> (u64, u64, Vec<(String, u64)>) {
    let leaf = chain.last().copied();
    let (mut total, mut matching, mut other) = (0, 0, Vec::new());
    for stack in parse_folded(folded) {
        if !stack.process.starts_with(process) {
            continue;
        }
        let user: Vec<&str> = stack.user_frames().collect();
        if user.last().copied() != leaf {
            continue;
        }
        total += stack.count;
        let tail = user.iter().position(|f| *f == "main").map(|m| &user[m..]);
        let ok = tail.is_some_and(|t| {
            t.len() == chain.len() && t.iter().zip(chain).all(|(f, c)| *c == "any" || f == c)
        });
        if ok {
            matching += stack.count;
        } else {
            other.push((user.join(";"), stack.count));
        }
    }
    other.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    other.truncate(5);
    (total, matching, other)
}

/// Builds `source` with `flags`, runs it for 120 s and profiles it with `--unwind dwarf`; then
/// asserts that at least `min_share` of its samples whose leaf ends `chain` carry the whole
/// `chain` from `main`, over at least 300 such samples.
fn assert_dwarf_chain(source: &str, flags: &[&str], chain: &[&str], min_share: f64) {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let binary = compile_workload(dir.path(), source, source, flags);
    assert_chain_of(&binary, source, chain, min_share);
}

/// [`assert_dwarf_chain`] for a `binary` built already, whose file name is `source`.
fn assert_chain_of(binary: &std::path::Path, source: &str, chain: &[&str], min_share: f64) {
    let workload = spawn_workload(binary, 120);
    let (folded, _log) = profile_dwarf(source, workload.pid(), &[]);
    drop(workload);
    let (total, matching, other) = chain_share(&folded, source, chain);
    let share = matching as f64 / total.max(1) as f64;
    eprintln!(
        "{source}: {matching} of {total} leaf samples carry {chain:?} ({:.1}%); others {other:?}",
        share * 100.0
    );
    assert!(
        total >= 300,
        "only {total} samples end in {chain:?}:\n{folded}"
    );
    assert!(
        share >= min_share,
        "{source}: only {:.1}% carry {chain:?}; most common others {other:?}",
        share * 100.0
    );
}

/// A frameless leaf (GCC's -momit-leaf-frame-pointer beside -fno-omit-frame-pointer, -O2)
/// keeps its caller: >= 95% of the leaf's samples are main -> caller_work -> leaf_work (a
/// frame-pointer walk skips caller_work: with `--unwind fp` this fails).
#[test]
fn a_frameless_leaf_keeps_its_caller() {
    let Some(_lock) = ebpf_gate() else { return };
    assert_dwarf_chain(
        "frameless",
        &["-O2", "-momit-leaf-frame-pointer"],
        &["main", "caller_work", "leaf_work"],
        0.95,
    );
}

/// C built without unwind tables and without frame pointers, its debug info compressed
/// (`-g -gz=zlib -fno-asynchronous-unwind-tables -fno-unwind-tables -fomit-frame-pointer`):
/// the CFI of its own code is only in a zlib-compressed (`SHF_COMPRESSED`) `.debug_frame`, and
/// `.eh_frame` only describes the C runtime's `_start`. >= 90% of the leaf's samples carry
/// main -> caller_work -> leaf_work. Fails when the relay reads `.eh_frame` alone (main gets no
/// table row and the frame-pointer walk from the frameless leaf loses main).
#[test]
fn a_program_whose_cfi_is_only_in_a_compressed_debug_frame_unwinds_whole() {
    let Some(_lock) = ebpf_gate() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let flags = [
        "-O2",
        "-fomit-frame-pointer",
        "-gz=zlib",
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
    ];
    let binary = compile_workload(dir.path(), "frameless", "frameless", &flags);
    let sections = readelf(&binary, &["-S", "-W"]);
    let debug_frame = sections
        .lines()
        .find(|l| l.contains(" .debug_frame "))
        .unwrap_or_else(|| panic!("no .debug_frame:\n{sections}"));
    assert!(
        debug_frame.split_whitespace().rev().nth(3) == Some("C"),
        ".debug_frame not compressed: {debug_frame}"
    );
    let eh_frame = readelf(&binary, &["--debug-dump=frames"]);
    let eh_frame = eh_frame
        .split("Contents of the .debug_frame")
        .next()
        .unwrap_or_default();
    for func in ["main", "caller_work", "leaf_work"] {
        let addr = symbol_address(&binary, func);
        let described = eh_frame
            .lines()
            .filter_map(fde_range)
            .any(|r| r.contains(&addr));
        assert!(!described, ".eh_frame describes {func}:\n{eh_frame}");
    }
    assert_chain_of(
        &binary,
        "frameless",
        &["main", "caller_work", "leaf_work"],
        0.90,
    );
}

/// `readelf ARGS binary`'s output.
fn readelf(binary: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("readelf")
        .args(args)
        .arg(binary)
        .output()
        .expect("running readelf (binutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The address of `name` in `binary`'s symbol table (`nm`).
fn symbol_address(binary: &std::path::Path, name: &str) -> u64 {
    let out = std::process::Command::new("nm")
        .arg(binary)
        .output()
        .expect("running nm (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            let (addr, _, sym) = (w.next()?, w.next()?, w.next()?);
            (sym == name).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .unwrap_or_else(|| panic!("no symbol {name} in {}", binary.display()))
}

/// The `pc=START..END` range of a readelf FDE line.
fn fde_range(line: &str) -> Option<std::ops::Range<u64>> {
    let (start, end) = line.split_once(" pc=")?.1.split_once("..")?;
    let hex = |s: &str| u64::from_str_radix(s.trim(), 16).ok();
    Some(hex(start)?..hex(end)?)
}

/// A non-PIE executable (-no-pie, no frame pointers) unwinds as well as the PIE one of
/// `dwarf_unwinding_gives_whole_stacks_without_frame_pointers`: >= 95% of the samples in
/// inner_work carry main -> outer_work -> middle_work -> inner_work.
#[test]
fn a_non_pie_executable_unwinds_whole() {
    let Some(_lock) = ebpf_gate() else { return };
    assert_dwarf_chain(
        "groundtruth",
        &["-O2", "-fomit-frame-pointer", "-no-pie"],
        &CHAIN,
        0.95,
    );
}

/// A signal handler burning CPU (SIGPROF from an ITIMER_PROF timer; no frame pointers anywhere)
/// unwinds through the kernel's signal trampoline to the interrupted code: >= 90% of the
/// samples in handler_burn are main -> interrupted_loop -> (the trampoline, __restore_rt in
/// libc) -> on_prof -> handler_burn.
#[test]
fn a_signal_handler_unwinds_through_the_trampoline_to_the_interrupted_code() {
    let Some(_lock) = ebpf_gate() else { return };
    assert_dwarf_chain(
        "sigprof",
        &["-O2", "-fomit-frame-pointer"],
        &["main", "interrupted_loop", "any", "on_prof", "handler_burn"],
        0.90,
    );
}

/// A stack over several pages unwinds whole: `bigframes` recurses 10 levels with a 1,200-byte
/// buffer in each frame (no frame pointers), so each return address lies 1.2 KiB above the
/// last and the walk reads across three pages or more. The walker copies at most the rest of
/// one page per user-memory read and serves the next words from that copy
/// (sampler-ebpf/src/window.rs): >= 95% of the leaf's samples carry main -> deep x 10 ->
/// leaf_work. Fails when the copy is not refilled past its end, or when words past what was
/// copied are served from the window (planted and seen).
#[test]
fn a_stack_over_several_pages_unwinds_whole() {
    let Some(_lock) = ebpf_gate() else { return };
    let mut chain = vec!["main"];
    chain.extend(["deep"; 10]);
    chain.push("leaf_work");
    assert_dwarf_chain("bigframes", &["-O2", "-fomit-frame-pointer"], &chain, 0.95);
}

/// The workload's user-frame chains that hold at least 2% of its samples, and the share of its
/// samples whose chain is whole (`_start` ... `main` -> ... -> leaf).
fn chains(folded: &str, process: &str) -> (std::collections::BTreeSet<String>, f64) {
    let stacks: Vec<FoldedStack> = parse_folded(folded)
        .into_iter()
        .filter(|s| s.process.starts_with(process))
        .collect();
    let total = total_count(&stacks);
    let mut whole = 0;
    let mut set = std::collections::BTreeSet::new();
    for stack in &stacks {
        let user: Vec<&str> = stack.user_frames().collect();
        let main = user.iter().position(|f| *f == "main");
        let leaf = FUNCS.iter().position(|f| user.last() == Some(f));
        if let (Some(m), Some(leaf)) = (main, leaf) {
            if user[m..] == CHAIN[..leaf + 2] && user.first() == Some(&"_start") {
                whole += stack.count;
            }
        }
        if stack.count * 50 >= total {
            set.insert(user.join(";"));
        }
    }
    (set, whole as f64 / total.max(1) as f64)
}

/// The on-disk table cache: a first relay run with a fresh `--state-dir` compiles the tables
/// and stores them; a second run takes every one from the cache (hits = the first run's
/// compiled, nothing compiled) and gives the same stacks (the same chains over 2% of samples,
/// at least 95% whole in both); a third run after every cache file was corrupted (one byte
/// flipped: a table byte in one, the stored input digest in the others) finds each one
/// unusable, counts it rewritten and compiles it again.
#[test]
fn a_second_relay_run_takes_its_tables_from_the_cache_and_a_corrupt_file_is_rewritten() {
    let Some(_lock) = ebpf_gate() else { return };
    let (dir, binary) = nofp_groundtruth("gt-cache");
    let workload = spawn_workload(&binary, 120);
    let state = dir.path().join("state");
    let state_arg = state.to_str().expect("utf-8 path");

    // Given a first run that compiled and stored the tables.
    let first = run_with_state_dir("first", workload.pid(), state_arg);
    let cache_dir = state.join("unwind-cache");
    let files: Vec<std::path::PathBuf> = fs::read_dir(&cache_dir)
        .expect("the cache directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "unw"))
        .collect();
    eprintln!(
        "first run: compiled {}, hits {}, {} cache files",
        first.compiled,
        first.hits,
        files.len()
    );
    assert!(first.compiled >= 2, "the executable and libc at least");
    assert_eq!(first.hits, 0, "a fresh state directory hit");
    assert_eq!(files.len() as u64, first.compiled, "every table stored");

    // When a second run starts, Then it compiles nothing and gives the same stacks.
    let second = run_with_state_dir("second", workload.pid(), state_arg);
    eprintln!(
        "second run: compiled {}, hits {}",
        second.compiled, second.hits
    );
    assert_eq!(
        (second.hits, second.compiled, second.rewritten),
        (first.compiled, 0, 0),
        "(hits, compiled, rewritten) of the second run"
    );
    let (chains_first, whole_first) = chains(&first.folded, "gt-cache");
    let (chains_second, whole_second) = chains(&second.folded, "gt-cache");
    eprintln!(
        "whole stacks: {:.1}% then {:.1}%; chains {chains_first:?}",
        whole_first * 100.0,
        whole_second * 100.0
    );
    assert!(whole_first >= 0.95 && whole_second >= 0.95);
    assert_eq!(
        chains_first, chains_second,
        "the cached tables changed the stacks"
    );

    // When every cache file is corrupted, Then the third run detects each one and rewrites it.
    for (i, file) in files.iter().enumerate() {
        let mut bytes = fs::read(file).expect("a cache file");
        // The first file's table bytes; the others' digest of the input they were compiled
        // from (bytes 8..40, after the magic): a file compiled from other input.
        let at = if i == 0 { bytes.len() - 1 } else { 8 };
        bytes[at] ^= 0x55;
        fs::write(file, bytes).expect("corrupting a cache file");
    }
    let third = run_with_state_dir("third", workload.pid(), state_arg);
    eprintln!(
        "third run: compiled {}, hits {}, rewritten {}",
        third.compiled, third.hits, third.rewritten
    );
    assert_eq!(
        (third.hits, third.compiled, third.rewritten),
        (0, first.compiled, first.compiled),
        "(hits, compiled, rewritten) after corrupting every cache file"
    );
    let (_, whole_third) = chains(&third.folded, "gt-cache");
    assert!(whole_third >= 0.95, "{:.1}% whole", whole_third * 100.0);
}

/// A binary replaced on disk while it runs (another program renamed over its path, as package
/// upgrades do) unwinds with the table of the file it has mapped, not of the path's new file:
/// at least 95% of the running groundtruth's inner_work samples carry the whole chain. A table
/// built from the path (now sigprof) would give wrong frames.
#[test]
fn a_binary_replaced_on_disk_unwinds_with_the_mapped_files_table() {
    let Some(_lock) = ebpf_gate() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let flags = ["-O2", "-fomit-frame-pointer"];
    let binary = compile_workload(dir.path(), "groundtruth", "gt-replaced", &flags);
    let workload = spawn_workload(&binary, 120);
    let other = compile_workload(dir.path(), "sigprof", "other-build", &flags);
    fs::rename(&other, &binary).expect("replacing the running binary");
    let (folded, _log) = profile_dwarf("replaced", workload.pid(), &[]);
    drop(workload);
    let (total, matching, other) = chain_share(&folded, "gt-replaced", &CHAIN);
    let share = matching as f64 / total.max(1) as f64;
    eprintln!(
        "replaced binary: {matching} of {total} inner_work samples whole ({:.1}%); others {other:?}",
        share * 100.0
    );
    assert!(
        total >= 300,
        "only {total} samples in inner_work:\n{folded}"
    );
    assert!(share >= 0.95, "only {:.1}% whole: {other:?}", share * 100.0);
}

/// Exec in an existing pid: a process burns 3 s in one image, then execs another (execer.c);
/// once the new image's table was sent (the worker's second burst), >= 95% of the new image's
/// two_inner samples carry main -> two_outer -> two_inner.
#[test]
fn exec_in_an_existing_pid_uses_the_new_images_table() {
    let Some(_lock) = ebpf_gate() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let flags = |role: &'static str| ["-O2", "-fomit-frame-pointer", role];
    let first = compile_workload(dir.path(), "execer", "execer-one", &flags("-DROLE=1"));
    let second = compile_workload(dir.path(), "execer", "execer-two", &flags("-DROLE=2"));
    let mut command = std::process::Command::new(&first);
    command.arg("3").arg(&second).arg("120");
    let workload = ChildGuard::spawn("execer", &mut command);
    // The first image's 3 files (itself, libc, ld.so), then the exec'd image's own table.
    let (folded, _log) = profile_dwarf_after("exec", workload.pid(), &[], 4);
    drop(workload);
    let (total, matching, other) =
        chain_share(&folded, "execer-two", &["main", "two_outer", "two_inner"]);
    let share = matching as f64 / total.max(1) as f64;
    eprintln!(
        "after exec: {matching} of {total} two_inner samples whole ({:.1}%); others {other:?}",
        share * 100.0
    );
    assert!(total >= 300, "only {total} samples in two_inner:\n{folded}");
    assert!(share >= 0.95, "only {:.1}% whole: {other:?}", share * 100.0);
}

/// Mixed stacks: an executable without frame pointers calls into a library with them, which
/// calls back into the executable: >= 95% of exe_leaf's samples carry main -> exe_outer ->
/// lib_entry -> lib_mid -> exe_callback -> exe_leaf (tables for both files, switching at each
/// boundary).
#[test]
fn a_no_fp_binary_calling_an_fp_library_that_calls_back_unwinds_whole() {
    let Some(_lock) = ebpf_gate() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let lib = compile_workload(dir.path(), "mixlib", "libmix.so", &["-shared", "-fPIC"]);
    let rpath = format!("-Wl,-rpath,{}", dir.path().display());
    let lib_arg = lib.to_str().expect("utf-8 path");
    let binary = compile_workload(
        dir.path(),
        "mixed",
        "mixed",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-Wl,--no-as-needed",
            lib_arg,
            &rpath,
        ],
    );
    let workload = spawn_workload(&binary, 120);
    let (folded, _log) = profile_dwarf("mixed", workload.pid(), &[]);
    drop(workload);
    let chain = [
        "main",
        "exe_outer",
        "lib_entry",
        "lib_mid",
        "exe_callback",
        "exe_leaf",
    ];
    let (total, matching, other) = chain_share(&folded, "mixed", &chain);
    let share = matching as f64 / total.max(1) as f64;
    eprintln!(
        "mixed: {matching} of {total} exe_leaf samples whole ({:.1}%); others {other:?}",
        share * 100.0
    );
    assert!(total >= 300, "only {total} samples in exe_leaf:\n{folded}");
    assert!(share >= 0.95, "only {:.1}% whole: {other:?}", share * 100.0);
}

/// A PLT stub unwinds: a no-FP executable calls a one-instruction library function through the
/// PLT in a tight loop, so a fifth or more of its samples are in the stub itself. At least 95%
/// of all its samples are main -> plt_loop, then the stub or plt_target as the leaf (or nothing:
/// plt_loop itself), and the stub's samples (a leaf in the executable other than plt_loop) are
/// at least 10% of them (else the test would not exercise the PLT rows).
#[test]
fn a_plt_stub_unwinds_to_its_caller() {
    let Some(_lock) = ebpf_gate() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let lib = compile_workload(dir.path(), "pltlib", "libplt.so", &["-shared", "-fPIC"]);
    let rpath = format!("-Wl,-rpath,{}", dir.path().display());
    let lib_arg = lib.to_str().expect("utf-8 path");
    let binary = compile_workload(
        dir.path(),
        "plt",
        "plt",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-Wl,--no-as-needed",
            lib_arg,
            &rpath,
        ],
    );
    let workload = spawn_workload(&binary, 120);
    let (folded, _log) = profile_dwarf("plt", workload.pid(), &[]);
    drop(workload);
    let (mut total, mut whole, mut in_stub) = (0u64, 0u64, 0u64);
    let mut other = Vec::new();
    for stack in parse_folded(&folded) {
        if stack.process != "plt" {
            continue;
        }
        total += stack.count;
        let user: Vec<&str> = stack.user_frames().collect();
        let tail = user.iter().position(|f| *f == "main").map(|m| &user[m..]);
        match tail {
            Some(["main", "plt_loop"] | ["main", "plt_loop", "plt_target"]) => {
                whole += stack.count;
            }
            Some(["main", "plt_loop", _stub]) => {
                whole += stack.count;
                in_stub += stack.count;
            }
            _ => other.push((user.join(";"), stack.count)),
        }
    }
    other.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let share = whole as f64 / total.max(1) as f64;
    eprintln!(
        "plt: {whole} of {total} whole ({:.1}%), {in_stub} in the stub; others {:?}",
        share * 100.0,
        &other[..other.len().min(5)]
    );
    assert!(total >= 300, "only {total} samples:\n{folded}");
    assert!(share >= 0.95, "only {:.1}% whole: {other:?}", share * 100.0);
    assert!(
        in_stub * 10 >= total,
        "only {in_stub} of {total} samples in the PLT stub: the test did not exercise it"
    );
}

/// The sampler's peak resident memory from exec through loading, attaching and its first batch
/// stays within its 16 MiB goal. aya's loader parses the kernel's BTF, which the program does
/// not use, unless the sampler covers it (load.rs, `hide_kernel_btf`): that parse alone holds
/// 17 MiB at once on this kernel, so a sampler that stops hiding it fails here.
#[test]
fn the_sampler_loads_within_16_mib() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().spinner, 60);
    let c = connect_sampler(workload.pid(), &[]);
    let batch = next_batch(&c.conn, &c.log, Instant::now() + TIMEOUT);
    let hwm = vm_hwm_kib(c.sampler.pid()).expect("sampler VmHWM");
    assert!(
        hwm <= 16 << 10,
        "the sampler's peak RSS is {hwm} KiB (> 16 MiB) after its first batch (seq {}):\n{}",
        batch.sequence,
        c.log.text()
    );
    eprintln!("sampler peak RSS after loading and one batch: {hwm} KiB");
}
