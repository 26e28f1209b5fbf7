//! The sampler's in-kernel side under pressure, and binaries that are hard to reach, with the
//! real eBPF program and real workloads (the paths no other test reached):
//!
//! - a counts map too small for the workload: every sample it could not keep is counted
//!   (`counts_full`), and recorded + counted add up to what the workload earned;
//! - a stack map too small: a lost stack is a marker frame carrying the sample, as many marker
//!   samples as the kernel counted;
//! - the double-buffer flip: many drains in a row lose no sample;
//! - an executable unlinked while it runs, and one that exists only in another mount namespace:
//!   still named, through the fds the sampler passes;
//! - a function that exists only as DWARF inlined-subroutine: named, below its caller.
//!
//! Counts are compared with the workload's own CPU time the way `ground_truth_split_matches_the_
//! workload` (tests/e2e.rs) derives it: expected = CPU time x frequency, within 4 x sqrt(expected)
//! plus the /proc tick truncation. Root only (they load eBPF); every test holds `ebpf_lock()`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use ember_tests::{attack::*, scenario::Scenario, *};
use nix::sys::signal::Signal;
use serde_json::Value;

const FIRST_BATCH_TIMEOUT: Duration = Duration::from_secs(90);
const LOG_TIMEOUT: Duration = Duration::from_secs(30);
const RECORD_TIMEOUT: Duration = Duration::from_secs(120);

/// The frames a frame-pointer walk reaches below `main` on this host (see `LIBC_ENTRY` in
/// tests/e2e.rs): glibc's `__libc_start_call_main`, whose caller frames are not walkable.
const LIBC_ENTRY: &str = "__libc_start_call_main";

/// State letter of /proc/PID/stat (R, S, T, Z, ...).
fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Expected samples of `cpu` seconds of CPU at `frequency` Hz and the allowed deviation: one
/// sample per period the workload ran, each stretch's floor/ceiling an independent error of
/// variance <= p, so 4 x sqrt(expected); plus the truncation of /proc's clock ticks at the two
/// readings and a stretch cut at each end.
fn expected_samples(cpu: Duration, frequency: u32) -> (f64, f64) {
    // SAFETY: sysconf has no preconditions.
    let tick_hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let expected = cpu.as_secs_f64() * f64::from(frequency);
    let slack = 2.0 * f64::from(frequency) / tick_hz + 2.0;
    (expected, 4.0 * expected.sqrt() + slack)
}

/// Starts `workload` for `seconds`, lets it run `warmup` (past its start-up), then stops it
/// (SIGSTOP) so it uses no CPU until the sampler is attached.
fn stopped_workload(path: &Path, seconds: u32, warmup: Duration) -> ChildGuard {
    let workload = spawn_workload(path, seconds);
    thread::sleep(warmup);
    workload.signal(Signal::SIGSTOP);
    let pid = workload.pid();
    wait_until(LOG_TIMEOUT, || process_state(pid) == Some('T'))
        .unwrap_or_else(|| panic!("workload {pid} did not stop on SIGSTOP"));
    workload
}

/// Lets a stopped workload run for `run` (SIGCONT .. SIGTERM) and returns the CPU time it used
/// from SIGCONT to its exit (all of it inside the sampling).
fn run_stopped_workload(workload: ChildGuard, run: Duration) -> Duration {
    let pid = workload.pid();
    let before = process_cpu_time(pid);
    workload.signal(Signal::SIGCONT);
    thread::sleep(run);
    workload.signal(Signal::SIGTERM);
    let after = cpu_time_at_exit(pid, LOG_TIMEOUT).expect("the workload did not exit on SIGTERM");
    let (status, _) = workload.terminate_and_read_stdout(Duration::from_secs(10));
    assert!(status.success(), "the workload exited with {status}");
    let cpu = after.saturating_sub(before);
    // The bounds scale with the CPU time the workload got, however loaded the machine is; this
    // only rules out a comparison over too few samples to mean anything.
    assert!(
        cpu.as_secs_f64() >= 0.5,
        "the workload got only {:.2} s of CPU in {run:?}: too few samples to compare; is the \
         machine overloaded?",
        cpu.as_secs_f64()
    );
    cpu
}

/// What a separately started sampler recorded of one workload through `ember-relay run`.
struct Sampled {
    cpu: Duration,
    stacks: Vec<FoldedStack>,
    /// The relay's last "batch received" line: its loss counters are the sampler's totals.
    last_batch: Value,
}

/// Samples the stopped groundtruth workload for `run` with `ember-relay run --output-dir` and an
/// `ember-sampler --pid PID --frequency FREQUENCY EXTRA...` of its own (so sampler-only flags
/// such as `--counts-map-size` can be set). The sampler is stopped after the workload exited:
/// its last drain holds the workload's last samples and the final loss counters; the relay is
/// stopped once it logged that batch, and stacks.folded is read after the relay exited.
fn sample_with_run(frequency: u32, run: Duration, extra: &[&str]) -> Sampled {
    let workload = stopped_workload(&workloads().groundtruth, 120, Duration::from_millis(300));
    let pid = workload.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ember.sock");
    let out_dir = dir.path().join("out");
    let mut relay = spawn_relay_run(
        "relay",
        &socket,
        &["--output-dir", out_dir.to_str().unwrap()],
    );
    let frequency_arg = frequency.to_string();
    let mut args = vec!["--pid", pid.as_str(), "--frequency", frequency_arg.as_str()];
    args.extend_from_slice(extra);
    let (mut sampler, _sampler_log) = spawn_sampler("sampler", &socket, &args);
    relay.log.expect(
        0,
        FIRST_BATCH_TIMEOUT,
        "\"sampler connected\"",
        is_connected,
    );

    let cpu = run_stopped_workload(workload, run);
    let exited_ns = now_unix_ns();
    sampler.signal(Signal::SIGTERM);
    let status = sampler
        .wait_timeout(LOG_TIMEOUT)
        .expect("the sampler did not exit on SIGTERM");
    assert!(status.success(), "the sampler exited with {status}");
    let (_, last_batch) = relay.log.expect(
        0,
        LOG_TIMEOUT,
        "batch drained after the workload exited",
        |v| {
            is_batch(v)
                && field_u64(v, "interval_end_unix_ns").is_some_and(|end| end > exited_ns)
                && field_u64(v, "part").map(|p| p + 1) == field_u64(v, "parts")
        },
    );
    relay.child.signal(Signal::SIGTERM);
    let status = relay
        .child
        .wait_timeout(LOG_TIMEOUT)
        .expect("the relay did not exit on SIGTERM");
    assert!(
        status.success(),
        "the relay exited with {status}:\n{}",
        tail(&relay.log.text(), 40)
    );
    let folded = fs::read_to_string(out_dir.join("stacks.folded"))
        .unwrap_or_else(|err| panic!("the relay wrote no stacks.folded: {err}"));
    let stacks = parse_folded(&folded);
    let others: Vec<&str> = stacks
        .iter()
        .filter(|s| s.process != "groundtruth")
        .map(|s| s.process.as_str())
        .collect();
    assert!(others.is_empty(), "--pid {pid} recorded others: {others:?}");
    Sampled {
        cpu,
        stacks,
        last_batch,
    }
}

fn counter(batch: &Value, name: &str) -> u64 {
    field_u64(batch, name).unwrap_or_else(|| panic!("the batch line has no {name}: {batch}"))
}

/// A counts map of 2 entries cannot hold the workload's hundreds of distinct stacks per
/// interval: the program counts each sample it cannot keep, and the samples recorded plus those
/// counted as `counts_full` are all the workload earned, within the derived bound.
#[test]
fn counts_map_full_is_counted_and_adds_up() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    const FREQUENCY: u32 = 499;
    let sampled = sample_with_run(
        FREQUENCY,
        Duration::from_secs(6),
        &["--counts-map-size", "2"],
    );
    let recorded = total_count(&sampled.stacks);
    let counts_full = counter(&sampled.last_batch, "counts_full");
    let (expected, bound) = expected_samples(sampled.cpu, FREQUENCY);
    eprintln!(
        "recorded {recorded} + counts_full {counts_full} = {}; expected {expected:.0} +- \
         {bound:.0} ({:.3} s of CPU)",
        recorded + counts_full,
        sampled.cpu.as_secs_f64()
    );
    // Each drain empties the map, so every interval keeps at most 2 distinct keys (a key is a
    // thread and its stack pair); which share the other samples get depends on how often the
    // workload's hottest stack comes first, so only the structure is asserted, not a fraction.
    let batches = counter(&sampled.last_batch, "sequence") + 1;
    assert!(
        sampled.stacks.len() as u64 <= 2 * batches,
        "with 2 counts-map entries at most 2 stacks per interval can be kept, but {} distinct \
         stacks were recorded in {batches} intervals",
        sampled.stacks.len()
    );
    assert!(
        counts_full as f64 > 0.2 * expected,
        "with 2 counts-map entries the workload's other stacks must be dropped and counted, but \
         counts_full is {counts_full} of ~{expected:.0}"
    );
    assert!(recorded > 0, "no sample was recorded at all");
    let sum = (recorded + counts_full) as f64;
    assert!(
        (sum - expected).abs() <= bound,
        "recorded {recorded} + counts_full {counts_full} = {sum}, but the workload earned \
         {expected:.0} +- {bound:.0}: samples were {}",
        if sum < expected {
            "dropped without being counted"
        } else {
            "counted twice"
        }
    );
}

/// The marker frames of stacks lost to a stack-map collision.
const USER_COLLISION: &str = "[lost user stack: stack-map collision]";
const KERNEL_COLLISION: &str = "[lost kernel stack: stack-map collision]";

/// A stack map of 4 buckets cannot hold the workload's distinct stacks: a sample whose user or
/// kernel stack collided keeps its count under a marker frame in place of that stack, exactly
/// as many such samples as the program counted (`user_stack_lost`, `kernel_stack_lost`), and no
/// sample is lost for it.
#[test]
fn stack_map_collisions_become_marker_frames() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    const FREQUENCY: u32 = 499;
    let sampled = sample_with_run(
        FREQUENCY,
        Duration::from_secs(6),
        &["--stack-map-size", "4"],
    );
    let recorded = total_count(&sampled.stacks);
    let user_lost = counter(&sampled.last_batch, "user_stack_lost");
    let kernel_lost = counter(&sampled.last_batch, "kernel_stack_lost");
    let counts_full = counter(&sampled.last_batch, "counts_full");
    // Root first: the user part, then the kernel part; a lost part is one marker frame.
    let user_marked = total_count(
        sampled
            .stacks
            .iter()
            .filter(|s| s.frames.first().map(String::as_str) == Some(USER_COLLISION)),
    );
    let kernel_marked = total_count(
        sampled
            .stacks
            .iter()
            .filter(|s| s.leaf() == Some(KERNEL_COLLISION)),
    );
    let misplaced: Vec<&FoldedStack> = sampled
        .stacks
        .iter()
        .filter(|s| {
            s.frames.iter().enumerate().any(|(i, f)| {
                let user_ok = f == USER_COLLISION
                    && i == 0
                    && s.frames[1..]
                        .iter()
                        .all(|f| is_kernel_frame(f) || f == KERNEL_COLLISION);
                let kernel_ok = f == KERNEL_COLLISION
                    && i + 1 == s.frames.len()
                    && s.frames[..i].iter().all(|f| !is_kernel_frame(f));
                f.starts_with("[lost ") && !user_ok && !kernel_ok
            })
        })
        .collect();
    let (expected, bound) = expected_samples(sampled.cpu, FREQUENCY);
    eprintln!(
        "recorded {recorded}: {user_marked} under {USER_COLLISION:?} (user_stack_lost \
         {user_lost}), {kernel_marked} under {KERNEL_COLLISION:?} (kernel_stack_lost \
         {kernel_lost}); expected {expected:.0} +- {bound:.0}"
    );
    assert_eq!(counts_full, 0, "the counts map was not meant to fill");
    assert!(
        user_marked > 0 && user_lost > 0,
        "with 4 stack-map buckets user stacks must collide: {user_marked} marked samples, \
         user_stack_lost {user_lost}"
    );
    assert!(
        misplaced.is_empty(),
        "a lost stack is one marker frame, named for its cause, in place of exactly that stack \
         (user part first, kernel part last): {misplaced:?}"
    );
    assert_eq!(
        user_marked, user_lost,
        "the program counted {user_lost} lost user stacks, the output marks {user_marked} samples"
    );
    assert_eq!(
        kernel_marked, kernel_lost,
        "the program counted {kernel_lost} lost kernel stacks, the output marks {kernel_marked} \
         samples"
    );
    assert!(
        (recorded as f64 - expected).abs() <= bound,
        "{recorded} samples recorded, the workload earned {expected:.0} +- {bound:.0}: a lost \
         stack must not lose its sample"
    );
}

/// The double-buffer flip: drained every 50 ms, ~160 flips in 8 s, the samples recorded are all
/// the workload earned, within the derived bound.
#[test]
fn many_drains_lose_no_sample() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    const FREQUENCY: u32 = 499;
    const RUN: Duration = Duration::from_secs(8);
    let workload = stopped_workload(&workloads().groundtruth, 120, Duration::from_millis(300));
    let pid = workload.pid().to_string();
    let mut record = Scenario::new("many drains record")
        .relay_args(["--duration", "25s", "--interval", "50ms"])
        .relay_args(["--frequency", &FREQUENCY.to_string(), "--pid", &pid])
        .record();
    record
        .log
        .expect(0, FIRST_BATCH_TIMEOUT, "sampler hello", is_sampling);
    let first = record.log.len();
    let cpu = run_stopped_workload(workload, RUN);
    assert!(
        record.child.try_wait().is_none(),
        "the record ended before the workload exited: raise --duration"
    );
    let folded = record.finish(RECORD_TIMEOUT);
    let total = total_count(
        parse_folded(&folded)
            .iter()
            .filter(|s| s.process == "groundtruth"),
    );
    let drains = record
        .log
        .json()
        .iter()
        .skip_while(|(i, _)| *i < first)
        .filter(|(_, v)| is_batch(v))
        .count();
    let (expected, bound) = expected_samples(cpu, FREQUENCY);
    eprintln!(
        "{drains} batches while the workload ran and after; {total} samples, expected \
         {expected:.0} +- {bound:.0} ({:.3} s of CPU)",
        cpu.as_secs_f64()
    );
    assert!(
        drains >= 40,
        "only {drains} batches: the sampler did not drain every 50 ms, so few flips were tested"
    );
    assert!(
        (total as f64 - expected).abs() <= bound,
        "{total} samples over {drains} drains, the workload earned {expected:.0} +- {bound:.0}: \
         samples are {} across flips",
        if (total as f64) < expected {
            "lost"
        } else {
            "counted twice"
        }
    );
}

/// Records `pid` for a few seconds and returns its stacks (process `name`).
fn record_process(pid: u32, name: &str) -> (Vec<FoldedStack>, String) {
    let pid = pid.to_string();
    let recorded = record(
        &[
            "--duration",
            "4s",
            "--frequency",
            "199",
            "--pid",
            &pid,
            "--log-format",
            "json",
        ],
        RECORD_TIMEOUT,
    );
    let text = recorded.folded_text();
    let stacks: Vec<FoldedStack> = parse_folded(&text)
        .into_iter()
        .filter(|s| s.process == name)
        .collect();
    assert!(
        total_count(&stacks) > 0,
        "no samples of process {name:?}:\n{text}"
    );
    (stacks, text)
}

/// Asserts that at least 90% of the samples carry exactly the user stack `expected` (root
/// first, from the outermost walkable frame); kernel frames on top are allowed.
fn assert_named_stack(stacks: &[FoldedStack], expected: &[&str], text: &str, what: &str) {
    let total = total_count(stacks);
    let exact = total_count(stacks.iter().filter(|s| {
        // `--unwind dwarf` (the default) also walks glibc below LIBC_ENTRY to `_start`.
        let user: Vec<&str> = s.user_frames().collect();
        let user = user
            .strip_prefix(&["_start", "__libc_start_main_impl"][..])
            .unwrap_or(&user);
        user == expected
    }));
    eprintln!(
        "{what}: {exact} of {total} samples carry exactly {}",
        expected.join(";")
    );
    assert!(
        exact as f64 >= 0.9 * total as f64,
        "{what}: only {exact} of {total} samples carry exactly the named stack {}:\n{text}",
        expected.join(";")
    );
}

/// A temp dir the unprivileged relay can traverse.
fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// An executable unlinked while it runs: /proc/PID/exe says "(deleted)" and no path reaches the
/// file, yet its frames are named from the object the process maps.
#[test]
fn a_deleted_executable_is_still_named() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = open_tempdir();
    let binary = dir.path().join("doomed");
    fs::copy(&workloads().spinner, &binary).unwrap();
    let workload = spawn_workload(&binary, 60);
    let pid = workload.pid();
    wait_until(LOG_TIMEOUT, || {
        fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == binary)
    })
    .expect("the workload did not exec the copy");
    fs::remove_file(&binary).unwrap();
    let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(
        exe.to_string_lossy().ends_with(" (deleted)"),
        "the kernel does not see the executable as deleted: {}",
        exe.display()
    );
    let (stacks, text) = record_process(pid, "doomed");
    assert_named_stack(
        &stacks,
        &[LIBC_ENTRY, "main", "spin_outer", "spin_hot"],
        &text,
        "deleted executable",
    );
}

/// An executable that exists only on a tmpfs mounted in a private mount namespace: the path in
/// its maps names nothing in the relay's (and sampler's) namespace, yet its frames are named.
#[test]
fn an_executable_in_another_mount_namespace_is_named() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = open_tempdir();
    let mountpoint = dir.path().join("mnt");
    fs::create_dir(&mountpoint).unwrap();
    let hidden = mountpoint.join("hidden");
    let script = format!(
        "mount -t tmpfs ember-test {mnt} && cp {src} {bin} && exec {bin} 60",
        mnt = mountpoint.display(),
        src = workloads().spinner.display(),
        bin = hidden.display()
    );
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let workload = ChildGuard::spawn("unshare workload", &mut command);
    let pid = workload.pid();
    wait_until(LOG_TIMEOUT, || {
        fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == hidden)
    })
    .expect("the workload did not exec the binary in its own mount namespace");
    let own_ns = fs::read_link("/proc/self/ns/mnt").unwrap();
    let its_ns = fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(own_ns, its_ns, "the workload shares our mount namespace");
    assert!(
        !hidden.exists(),
        "{} is visible from our mount namespace: the test would prove nothing",
        hidden.display()
    );
    let (stacks, text) = record_process(pid, "hidden");
    assert_named_stack(
        &stacks,
        &[LIBC_ENTRY, "main", "spin_outer", "spin_hot"],
        &text,
        "executable in another mount namespace",
    );
    drop(workload);
}

/// A hot loop that exists only as an inlined subroutine (-O2 -g, `always_inline`): the inlined
/// function is a frame of its own, directly below the function it was inlined into.
#[test]
fn inlined_functions_are_frames_below_their_caller() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = target_dir().join("ember-test-workloads");
    fs::create_dir_all(&dir).unwrap();
    let binary = compile_workload(&dir, "inlined", "inlined", &["-O2"]);
    let symbols = Command::new("nm").arg(&binary).output().unwrap();
    let symbols = String::from_utf8_lossy(&symbols.stdout);
    assert!(
        !symbols.contains("hot_inlined"),
        "hot_inlined has a symbol of its own, so it was not inlined:\n{symbols}"
    );
    let workload = spawn_workload(&binary, 60);
    let (stacks, text) = record_process(workload.pid(), "inlined");
    assert_named_stack(
        &stacks,
        &[LIBC_ENTRY, "main", "calls_inlined", "hot_inlined"],
        &text,
        "inlined function",
    );
}
