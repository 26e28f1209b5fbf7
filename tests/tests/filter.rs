//! The process filter pushed down to the sampler, with the real sampler and
//! eBPF program. Root only; every test holds `ebpf_lock()`.
//!
//! 1. Two CPU burners, `keeper` and `skipme`, under `ember-relay run --process-filter` that keeps
//!    every name but `skipme*`: once the relay told the sampler, `skipme`'s samples stop reaching
//!    the relay (its `samples_dropped` stops growing) while the batches' `ignored_samples` grows
//!    by its CPU time x frequency; when `skipme` execs a copy named `phoenix` (same pid, same
//!    start time), the sampler notices the new executable, samples it again, and `phoenix`'s
//!    samples reach stacks.folded.
//! 2. A test relay (this process) sends forged entries: a wrong start time, start time 0, a
//!    nonexistent pid, a live pid the sampler never described, pid 0, more entries than one
//!    message may hold, and an undecodable datagram. Each is refused and counted exactly, and
//!    sampling goes on; a true entry is taken (the workload's samples stop, counted), `forgetAll`
//!    undoes it, and a disconnect drops every entry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::PermissionsExt as _,
    },
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use ember_protocol::{
    decode_sampler_message, encode_relay_message,
    transport::{self, Received},
    Batch, IgnoreProcesses, IgnoredProcess, Limits, RelayMessage, SamplerMessage,
    MAX_IGNORE_PER_MESSAGE,
};
use ember_tests::*;
use nix::{
    poll::{poll, PollFd, PollFlags, PollTimeout},
    sys::signal::Signal,
};
use serde_json::Value;

const FREQUENCY: u32 = 99;
const TIMEOUT: Duration = Duration::from_secs(60);
/// Every executable name except those starting with `skipme` (RE2 has no negative lookahead):
/// only the test's `skipme` is filtered, so every ignored sample is its.
/// Every name but `skipme`, the empty name included: a process the sampler sent no facts for
/// (a short-lived one of the host) has no executable name and must not count as filtered here.
const ALL_BUT_SKIPME: &str =
    "|[^s].*|s([^k].*)?|sk([^i].*)?|ski([^p].*)?|skip([^m].*)?|skipm([^e].*)?";

/// A process's CPU time (user + system), polled every 10 ms with the wall clock, so it can be
/// read at the instant a drain happened (`interval_end_unix_ns`), not when the test saw it.
struct CpuTrack {
    points: Arc<Mutex<Vec<(u64, Duration)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn try_cpu_time(pid: u32) -> Option<Duration> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

impl CpuTrack {
    fn start(pid: u32) -> Self {
        let points = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&points), Arc::clone(&stop));
        let thread = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Some(cpu) = try_cpu_time(pid) else { break };
                p.lock().unwrap().push((now_unix_ns(), cpu));
                thread::sleep(Duration::from_millis(10));
            }
        });
        Self {
            points,
            stop,
            thread: Some(thread),
        }
    }

    /// The CPU time at `unix_ns` (the last point before it).
    fn at(&self, unix_ns: u64) -> Duration {
        let points = self.points.lock().unwrap();
        points
            .iter()
            .take_while(|(t, _)| *t <= unix_ns)
            .last()
            .or(points.first())
            .map(|(_, cpu)| *cpu)
            .expect("CPU time polled")
    }
}

impl Drop for CpuTrack {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Samples expected for `cpu` at `hz`, and the bound: counting noise (4 sigma), plus two
/// scheduler ticks of CPU-time resolution and two of the poller's 10 ms at each edge.
fn expected_samples(cpu: Duration, hz: u32) -> (f64, f64) {
    // SAFETY: sysconf has no preconditions.
    let tick_hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let expected = cpu.as_secs_f64() * f64::from(hz);
    let slack = 2.0 * f64::from(hz) / tick_hz + 2.0 * 0.010 * f64::from(hz) + 2.0;
    (expected, 4.0 * expected.sqrt() + slack)
}

fn spawn_burner(path: &Path, args: &[&str]) -> ChildGuard {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let mut command = Command::new(path);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    ChildGuard::spawn(&name, &mut command)
}

fn counter(line: &Value, name: &str) -> u64 {
    field_u64(line, name).unwrap_or_else(|| panic!("no {name} in {line}"))
}

/// The relay's `samples_dropped` as of log line `upto` (0 before any labels-stage line).
fn samples_dropped_upto(relay: &RunningRelay, upto: usize) -> u64 {
    relay
        .log
        .matching(|v| message(v).starts_with("labels stage"))
        .iter()
        .filter(|(i, _)| *i < upto)
        .filter_map(|(_, v)| field_u64(v, "samples_dropped"))
        .max()
        .unwrap_or(0)
}

#[test]
fn a_filtered_process_stops_costing_samples_and_comes_back_after_exec() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let keeper = compile_workload(dir.path(), "reexec", "keeper", &[]);
    let (skipme, phoenix) = (dir.path().join("skipme"), dir.path().join("phoenix"));
    fs::copy(&keeper, &skipme).unwrap();
    fs::copy(&keeper, &phoenix).unwrap();
    // Given two burners; the relay's filter keeps `keeper` and will keep `phoenix`
    let _keep = spawn_burner(&keeper, &["120"]);
    let skip = spawn_burner(&skipme, &["120", phoenix.to_str().unwrap()]);
    let cpu = CpuTrack::start(skip.pid());
    let socket = dir.path().join("ember.sock");
    let out = dir.path().join("out");
    let mut relay = spawn_relay_run(
        "relay",
        &socket,
        &[
            "--output-dir",
            out.to_str().unwrap(),
            "--process-filter",
            ALL_BUT_SKIPME,
        ],
    );
    let hz = FREQUENCY.to_string();
    let (mut sampler, sampler_log) = spawn_sampler(
        "sampler",
        &socket,
        &["--frequency", &hz, "--log-format", "json"],
    );

    // When the relay's filter left `skipme` out and told the sampler (batch j is the first
    // drained with it ignored: the last that may hold samples taken before the sampler knew)
    let (j, _) = relay
        .log
        .expect(0, TIMEOUT, "a batch with a process ignored", |v| {
            is_batch(v) && field_u64(v, "ignored_processes").is_some_and(|n| n >= 1)
        });
    let (after_j, start) = relay.log.expect(j + 1, TIMEOUT, "the next batch", is_batch);
    let mut last = (after_j, start.clone());
    for _ in 0..6 {
        last = relay
            .log
            .expect(last.0 + 1, TIMEOUT, "a later batch", is_batch);
    }
    let (end_index, end) = last;
    // Then no sample of `skipme` reached the relay after batch j
    let dropped_at_j = samples_dropped_upto(&relay, after_j);
    let dropped_at_end = samples_dropped_upto(&relay, end_index + 1);
    assert!(
        dropped_at_j > 0,
        "the relay never saw skipme's first samples"
    );
    assert_eq!(
        dropped_at_end, dropped_at_j,
        "skipme's samples kept reaching the relay after it was ignored"
    );
    // And the sampler counted them instead: CPU time x frequency over the same drains
    let from_ns = counter(&start, "interval_end_unix_ns");
    let to_ns = counter(&end, "interval_end_unix_ns");
    let ignored = counter(&end, "ignored_samples") - counter(&start, "ignored_samples");
    let (expected, bound) = expected_samples(cpu.at(to_ns) - cpu.at(from_ns), FREQUENCY);
    eprintln!(
        "ignored {ignored} samples over {:.1} s; skipme's CPU time x {FREQUENCY} Hz = \
         {expected:.0} +- {bound:.0}",
        (to_ns - from_ns) as f64 / 1e9
    );
    assert!(
        (ignored as f64 - expected).abs() <= bound,
        "ignored {ignored}, expected {expected:.0} +- {bound:.0}"
    );
    assert!(
        expected > bound,
        "skipme barely ran ({expected:.0} samples): 0 would pass"
    );
    assert_eq!(
        counter(&end, "ignore_refused"),
        0,
        "the relay's true entry was refused"
    );

    // When `skipme` execs `phoenix`, a name the filter keeps
    skip.signal(Signal::SIGUSR1);
    let (released, released_line) = relay.log.expect(
        end_index + 1,
        TIMEOUT,
        "a batch with no process ignored",
        |v| is_batch(v) && field_u64(v, "ignored_processes") == Some(0),
    );
    let mut last = (released, released_line.clone());
    for _ in 0..3 {
        last = relay
            .log
            .expect(last.0 + 1, TIMEOUT, "a later batch", is_batch);
    }
    // Then the sampler samples it again: nothing more is ignored after the release...
    assert_eq!(
        counter(&last.1, "ignored_samples"),
        counter(&released_line, "ignored_samples"),
        "samples still ignored after the exec"
    );
    sampler.signal(Signal::SIGTERM);
    let status = sampler.wait_timeout(TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "the sampler did not stop cleanly ({status:?}; 159 = seccomp):\n{}",
        sampler_log.text()
    );
    relay.child.signal(Signal::SIGTERM);
    assert!(
        relay.child.wait_timeout(TIMEOUT).is_some(),
        "the relay did not stop"
    );
    // ...and its samples reach the profile under the new name, the filtered name's never
    let stacks = parse_folded(&fs::read_to_string(out.join("stacks.folded")).unwrap());
    let total = |name: &str| total_count(stacks.iter().filter(|s| s.process == name));
    eprintln!(
        "stacks.folded: keeper {}, phoenix {}, skipme {}",
        total("keeper"),
        total("phoenix"),
        total("skipme")
    );
    assert!(total("keeper") > 0, "the kept burner is missing");
    assert!(total("phoenix") > 0, "the exec'd process never came back");
    assert_eq!(total("skipme"), 0, "a filtered process was exported");
    assert_eq!(
        samples_dropped_upto(&relay, relay.log.len()),
        dropped_at_j,
        "phoenix's samples were dropped by the relay"
    );
}

/// Waits for the next datagram; `None` at `deadline`.
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
        Received::Closed => None,
        other => panic!("unexpected datagram from the sampler: {other:?}"),
    }
}

/// Reads batches until one satisfies `done`; panics with the sampler's log on timeout.
fn batch_until(
    conn: &OwnedFd,
    log: &LogReader,
    what: &str,
    done: impl Fn(&Batch) -> bool,
) -> Batch {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match next(conn, deadline) {
            Some(SamplerMessage::Batch(batch)) if done(&batch) => return batch,
            Some(_) => {}
            None => panic!("no batch where {what}:\n{}", log.text()),
        }
    }
}

fn ignore(sock: &OwnedFd, forget_all: bool, processes: Vec<IgnoredProcess>) {
    let message = RelayMessage::IgnoreProcesses(IgnoreProcesses {
        forget_all,
        processes,
        excess: 0,
    });
    transport::send(sock.as_fd(), &encode_relay_message(&message), &[], false)
        .expect("sending ignoreProcesses");
}

fn listen_and_accept(dir: &Path, pid: u32) -> (OwnedFd, ChildGuard, LogReader, OwnedFd) {
    let socket = dir.join("relay.sock");
    let listener = transport::listen(&socket).expect("listen");
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666)).expect("chmod socket");
    let (pid, hz) = (pid.to_string(), FREQUENCY.to_string());
    let (sampler, log) = spawn_sampler(
        "sampler",
        &socket,
        &["--pid", &pid, "--frequency", &hz, "--log-format", "json"],
    );
    let conn = accept(&listener, &log);
    (listener, sampler, log, conn)
}

fn accept(listener: &OwnedFd, log: &LogReader) -> OwnedFd {
    let mut ready = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let polled = poll(&mut ready, PollTimeout::from(60_000u16)).expect("poll");
    assert_eq!(polled, 1, "the sampler did not connect:\n{}", log.text());
    transport::accept(listener.as_fd()).expect("accept")
}

#[test]
fn forged_entries_are_refused_counted_and_sampling_goes_on() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let workload = spawn_workload(&workloads().spinner, 120);
    let pid = workload.pid();
    let cpu = CpuTrack::start(pid);
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let (listener, mut sampler, log, conn) = listen_and_accept(dir.path(), pid);
    // Given the start time the sampler gave for the workload
    let deadline = Instant::now() + TIMEOUT;
    let start = loop {
        match next(&conn, deadline) {
            Some(SamplerMessage::Process(info)) if info.pid == pid => {
                break info.start_time_unix_ns
            }
            Some(_) => {}
            None => panic!("no facts for the workload:\n{}", log.text()),
        }
    };
    assert_ne!(start, 0);
    let entry = |pid: u32, start_time_unix_ns: u64| IgnoredProcess {
        pid,
        start_time_unix_ns,
    };
    // When the relay claims a wrong start time, start time 0, a pid that cannot exist, a live
    // process the sampler never described (this test), pid 0, then a message of 1,100 garbage
    // entries (1,024 read, 76 left unread), and sends an undecodable datagram
    ignore(
        &conn,
        false,
        vec![
            entry(pid, start + 1),
            entry(pid, 0),
            entry(4_000_000_000, start),
            entry(std::process::id(), start),
            entry(0, 0),
        ],
    );
    let over = MAX_IGNORE_PER_MESSAGE + 76;
    ignore(&conn, false, vec![entry(u32::MAX, u64::MAX); over]);
    transport::send(conn.as_fd(), b"not a capnp message", &[], false).expect("garbage");
    // Then each is refused and counted exactly once, nothing is ignored, sampling goes on
    let refused = (5 + over) as u64;
    let counted = batch_until(&conn, &log, "the refusals are counted", |b| {
        assert!(b.ignore.refused <= refused, "over-counted: {:?}", b.ignore);
        b.ignore.refused == refused && b.losses.unwind_tables_refused == 1
    });
    assert_eq!(
        (counted.ignore.processes, counted.ignore.ignored_samples),
        (0, 0)
    );
    let later = batch_until(&conn, &log, "a later batch", |_| true);
    assert!(
        later.sample_count() > 0,
        "sampling stopped after the refusals"
    );

    // When the relay claims the workload truly
    ignore(&conn, false, vec![entry(pid, start)]);
    // Then from the batch after the one that reports it, no sample of it comes, and the
    // program counts them: CPU time x frequency between two drains
    let taken = batch_until(&conn, &log, "the workload is ignored", |b| {
        b.ignore.processes == 1
    });
    assert_eq!(taken.ignore.refused, refused, "the true entry was refused");
    let first = batch_until(&conn, &log, "the next batch", |_| true);
    let mut last = first.clone();
    for _ in 0..5 {
        assert_eq!(
            last.sample_count(),
            0,
            "samples of an ignored process arrived"
        );
        last = batch_until(&conn, &log, "a later batch", |_| true);
    }
    assert_eq!(
        last.sample_count(),
        0,
        "samples of an ignored process arrived"
    );
    let ignored = last.ignore.ignored_samples - first.ignore.ignored_samples;
    let cpu_between = cpu.at(last.interval_end_unix_ns) - cpu.at(first.interval_end_unix_ns);
    let (expected, bound) = expected_samples(cpu_between, FREQUENCY);
    eprintln!(
        "ignored {ignored}; the workload's CPU time x {FREQUENCY} Hz = {expected:.0} +- {bound:.0}"
    );
    assert!(
        (ignored as f64 - expected).abs() <= bound,
        "ignored {ignored}, expected {expected:.0} +- {bound:.0}"
    );
    assert!(
        expected > bound,
        "the workload barely ran ({expected:.0} samples): 0 would pass"
    );

    // When the relay says forgetAll, Then the workload is sampled again
    ignore(&conn, true, Vec::new());
    batch_until(&conn, &log, "samples again after forgetAll", |b| {
        b.ignore.processes == 0 && b.sample_count() > 0
    });
    // When it is ignored again and the relay disconnects, Then the reconnected sampler ignores
    // nothing (a new relay may filter otherwise)
    ignore(&conn, false, vec![entry(pid, start)]);
    batch_until(&conn, &log, "ignored again", |b| b.ignore.processes == 1);
    drop(conn);
    let conn = accept(&listener, &log);
    batch_until(&conn, &log, "samples after the reconnect", |b| {
        b.ignore.processes == 0 && b.sample_count() > 0
    });
    assert!(
        sampler.try_wait().is_none(),
        "the sampler exited:\n{}",
        log.text()
    );
}
