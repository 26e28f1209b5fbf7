//! Regression tests: each attack an unprivileged local user (or root's own mistake)
//! demonstrated against ember (the numbered rows of SECURITY.md's attack table), replayed by an attacker uid the test picks (an unused uid in
//! 45000..46000, no passwd entry, no groups, no capabilities), asserting what must hold once it
//! is fixed: an unrelated workload profiled at the same time keeps >= 90% of its expected
//! samples (its own CPU time x the sampling frequency), the relay stays alive with bounded memory
//! and descriptors, the victim's function names are its own, no other user can read the relay's
//! memory or descriptors, a root-only file is never written, the sampler runs confined.
//!
//! They load eBPF and switch uids, so they need root; run them one at a time under the
//! machine-wide lock:
//!
//! ```text
//! cargo build && flock /tmp/ember-ebpf.lock cargo test -p ember-tests --test attacks -- --test-threads=1 --nocapture
//! ```
//!
//! Timeouts only keep a broken build from hanging; no test asserts speed. Every test prints the
//! figures it asserts on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    fs,
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::{MetadataExt as _, PermissionsExt as _},
    },
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use ember_protocol::{
    encode_sampler_message, transport, Batch, FileInfo, Hello, Mapping, ProcessInfo, Row,
    SamplerMessage, StackRef, NO_FD, PROTOCOL_VERSION,
};
use ember_tests::{
    attack::*,
    scenario::{ebpf_gate, Scenario},
    *,
};
use nix::{errno::Errno, sys::signal::Signal};
use serde_json::Value;

/// Sampling frequency of the attack recordings.
/// The fake samplers below are this (root) test process: the relay must accept uid 0.
const FAKE_SAMPLER: &[&str] = &["--sampler-uid", "0"];
const FREQUENCY: u32 = 199;
/// The witness (tests/workloads/spinner.c) must keep at least this share of its expected samples.
const MIN_SHARE: f64 = 0.90;
const RECORD_TIMEOUT: Duration = Duration::from_secs(90);
const FIRST_BATCH_TIMEOUT: Duration = Duration::from_secs(60);
const LOG_TIMEOUT: Duration = Duration::from_secs(20);
/// Peak anonymous + shared-memory resident set the relay may reach in the memory attacks (its
/// heap and mapped private copies).
const MAX_RELAY_ANON_KIB: u64 = 300 * 1024;
/// Peak resident memory (VmHWM) the relay may reach in the memory attacks. VmHWM also counts the
/// file-backed pages of every binary the relay maps to symbolize and, with DWARF unwinding (the
/// default), reads to compile its table; a debug `record` of a busy machine (other agents'
/// compilers running) peaked at 490-533 MiB without the attack touching it (RssAnon+RssShmem
/// 183-193 MiB), hence the looser bound: still a third of the 3 GiB file the attack maps, which
/// is what this catches (the anonymous bound above is the tight one).
const MAX_RELAY_HWM_KIB: u64 = 1024 * 1024;
/// CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_CHECKPOINT_RESTORE (sampler/src/harden.rs).
const SAMPLER_CAPS: &str = "0000010000080004";
const NOBODY: u32 = 65534;

// ---------------------------------------------------------------------------------------------
// The witness: an unrelated workload whose samples must survive the attack

/// A spinner started inside a recording that exits on its own before the recording ends, so
/// its whole CPU time was sampled.
struct Witness {
    child: ChildGuard,
}

impl Witness {
    fn start(seconds: u32) -> Self {
        Self {
            child: spawn_workload(&workloads().spinner, seconds),
        }
    }

    /// Waits for it to exit and returns the CPU time it used in its whole life.
    fn cpu_time(&self) -> Duration {
        cpu_time_at_exit(self.child.pid(), Duration::from_secs(60))
            .expect("the witness spinner did not exit on its own")
    }
}

/// Asserts the witness `spinner` has >= 90% of `cpu` x FREQUENCY samples in `folded`.
fn assert_witness_kept(folded: &str, cpu: Duration, what: &str) {
    let stacks = parse_folded(folded);
    let samples = total_count(stacks.iter().filter(|s| s.process == "spinner"));
    let expected = cpu.as_secs_f64() * f64::from(FREQUENCY);
    let share = samples as f64 / expected.max(1.0);
    eprintln!(
        "witness spinner: {samples} samples, expected {expected:.0} ({:.2} s CPU x {FREQUENCY} Hz): \
         {:.1}%",
        cpu.as_secs_f64(),
        share * 100.0
    );
    assert!(
        expected >= 200.0,
        "the witness only got {:.2} s of CPU: too little to measure",
        cpu.as_secs_f64()
    );
    assert!(
        share >= MIN_SHARE,
        "{what}: the unrelated witness spinner kept only {samples} of {expected:.0} expected \
         samples ({:.1}% < {:.0}%)",
        share * 100.0,
        MIN_SHARE * 100.0
    );
}

/// An attack's `record` of `duration` at [`FREQUENCY`].
fn recording(name: &str, duration: &str) -> Scenario {
    Scenario::new(name).relay_args([
        "--duration",
        duration,
        "--frequency",
        &FREQUENCY.to_string(),
    ])
}

fn process_stacks<'a>(stacks: &'a [FoldedStack], process: &str) -> Vec<&'a FoldedStack> {
    stacks.iter().filter(|s| s.process == process).collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Huge process facts must not stop everyone's profiling

/// Attack 1: a process with 1,200 executable mappings of a file under a 3.9 KB path (process
/// facts of several MB). The record succeeds, an unrelated spinner keeps >= 90% of its samples,
/// and batches keep arriving after the attacker exits.
#[test]
fn attack1_huge_process_facts_do_not_stop_profiling() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let programs = attack_programs();
    let dir = attacker_dir(who, "ember-attack1-");
    let mut record = recording("attack1 record", "14s").record();
    record.first_batch(FIRST_BATCH_TIMEOUT);

    let witness = Witness::start(6);
    let mut attack = spawn_attacker(
        who,
        &programs.mappings,
        &["same", dir.path().to_str().unwrap(), "1200", "3900", "3"],
    );
    attack.wait_ready(Duration::from_secs(20));
    let status = attack
        .child
        .wait_timeout(Duration::from_secs(30))
        .expect("the attacker did not exit");
    let attacker_gone = now_unix_ns();
    eprintln!("attacker exited ({status})");
    let cpu = witness.cpu_time();

    // Batches whose interval started after the attacker was gone.
    let after = record.log.wait_for(0, Duration::from_secs(30), |v| {
        is_batch(v)
            && field_u64(v, "interval_start_unix_ns").is_some_and(|t| t > attacker_gone)
            && field_u64(v, "samples").is_some_and(|n| n > 0)
    });
    let folded = record.finish(RECORD_TIMEOUT);
    let batches_after: Vec<Value> = record
        .log
        .matching(|v| {
            is_batch(v) && field_u64(v, "interval_start_unix_ns").is_some_and(|t| t > attacker_gone)
        })
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    eprintln!(
        "batches after the attacker exited: {}; samples in them: {}",
        batches_after.len(),
        batches_after
            .iter()
            .filter_map(|v| field_u64(v, "samples"))
            .sum::<u64>()
    );
    assert!(
        after.is_some(),
        "no batch with samples arrived after the attacker exited"
    );
    assert_witness_kept(&folded, cpu, "1,200 mappings under a 3.9 KB path");
}

// ---------------------------------------------------------------------------------------------
// 2. Files that kill the relay

/// Attack 2a: a 3 GiB sparse mode-0700 file mapped executable, the attacker spinning in it. The
/// relay stays alive (the record succeeds), its memory stays bounded (VmHWM and the memfd copies
/// it holds: never the whole file), and the witness keeps its samples.
#[test]
fn attack2a_a_huge_sparse_file_does_not_exhaust_the_relay() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let programs = attack_programs();
    let dir = attacker_dir(who, "ember-attack2a-");
    let big = dir.path().join("huge.bin");
    let mut record = recording("attack2a record", "12s").record();
    // Safety net for a vulnerable relay: kill it before it holds more than 6 GiB.
    let watch = Watch::start(record.pid(), Some(6 * 1024 * 1024));
    record.first_batch(FIRST_BATCH_TIMEOUT);

    let witness = Witness::start(6);
    let mut attack = spawn_attacker(
        who,
        &programs.bigfile,
        &[big.to_str().unwrap(), "3072", "7"],
    );
    attack.wait_ready(Duration::from_secs(20));
    let cpu = witness.cpu_time();
    let _ = attack.child.wait_timeout(Duration::from_secs(20));
    let (status, stdout) = record.wait(RECORD_TIMEOUT);
    let seen = watch.stop();
    eprintln!(
        "relay VmHWM {} MiB (limit {} MiB); RssAnon+RssShmem at most {} MiB (limit {} MiB); \
         memfd copies held at most {} MiB; {} polls",
        seen.max_hwm_kib / 1024,
        MAX_RELAY_HWM_KIB / 1024,
        seen.max_anon_shmem_kib / 1024,
        MAX_RELAY_ANON_KIB / 1024,
        seen.max_memfd_bytes >> 20,
        seen.polls
    );
    let log = tail(&record.log.text(), 40);
    assert!(
        status.is_some_and(|s| s.success()),
        "the record did not succeed ({status:?}) with a 3 GiB mapped file:\nstdout:\n{stdout}\nlog:\n{log}"
    );
    assert!(
        seen.max_anon_shmem_kib < MAX_RELAY_ANON_KIB,
        "relay RssAnon+RssShmem reached {} MiB (limit {} MiB)",
        seen.max_anon_shmem_kib / 1024,
        MAX_RELAY_ANON_KIB / 1024
    );
    assert!(
        seen.max_hwm_kib < MAX_RELAY_HWM_KIB,
        "relay VmHWM reached {} MiB (limit {} MiB)",
        seen.max_hwm_kib / 1024,
        MAX_RELAY_HWM_KIB / 1024
    );
    assert!(
        seen.max_memfd_bytes < 512 << 20,
        "the relay held {} MiB of private copies: it copied the 3 GiB file",
        seen.max_memfd_bytes >> 20
    );
    let folded = fs::read_to_string(record.out_dir.join("stacks.folded")).expect("stacks.folded");
    assert_witness_kept(&folded, cpu, "a 3 GiB sparse mapped file");
}

/// Attack 2b: the attacker maps a copy of libc it owns and spins with a crafted frame-pointer
/// chain whose return addresses are functions all over the copy (so the relay maps and reads
/// it), then truncates the copy to 0 and keeps spinning with new addresses. The fake frames are
/// named (the relay read the file: the attack was exercised), the relay stays alive and the
/// witness keeps its samples. The attack is on the frame-pointer chain, so it runs with
/// `--unwind fp`: the DWARF unwinder (the default) walks the attacker's real stack with the
/// copy's tables and never follows the crafted chain, so the fake frames would not appear.
/// The copy is mapped after the attacker's facts may have been read: the sampler reads them
/// again for the addresses outside them from the next interval on, well before the truncation.
#[test]
fn attack2b_truncating_a_mapped_file_does_not_kill_the_relay() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let programs = attack_programs();
    let dir = attacker_dir(who, "ember-attack2b-");
    let copy = dir.path().join("libc-copy.so");
    let mut record = recording("attack2b record", "14s")
        .relay_args(["--unwind", "fp"])
        .record();
    let watch = Watch::start(record.pid(), None);
    record.first_batch(FIRST_BATCH_TIMEOUT);

    let witness = Witness::start(6);
    let mut attack = spawn_attacker(who, &programs.truncate, &[copy.to_str().unwrap(), "5", "9"]);
    let ready = attack.wait_ready(Duration::from_secs(20));
    eprintln!("attacker: {ready}");
    attack
        .stdout
        .expect(0, Duration::from_secs(20), "{\"truncated\":true}", |v| {
            v.get("truncated").is_some()
        });
    eprintln!(
        "attacker truncated its copy to {} bytes",
        fs::metadata(&copy).map(|m| m.len()).unwrap_or(0)
    );
    let cpu = witness.cpu_time();
    let _ = attack.child.wait_timeout(Duration::from_secs(20));
    let (status, stdout) = record.wait(RECORD_TIMEOUT);
    let seen = watch.stop();
    eprintln!(
        "record: {status:?}; relay VmHWM {} MiB, RssAnon+RssShmem at most {} MiB, at most {} fds",
        seen.max_hwm_kib / 1024,
        seen.max_anon_shmem_kib / 1024,
        seen.max_fds
    );
    let log = tail(&record.log.text(), 40);
    assert!(
        status.is_some_and(|s| s.success()),
        "the record did not survive the truncation of a mapped file ({status:?}):\nstdout:\n{stdout}\nlog:\n{log}"
    );
    let folded = fs::read_to_string(record.out_dir.join("stacks.folded")).expect("stacks.folded");
    let stacks = parse_folded(&folded);
    let ours = process_stacks(&stacks, "attack_truncate");
    // Named frames that only reading the copy can give: neither the attacker's own code nor
    // unknown nor kernel frames.
    let named_fake = |s: &FoldedStack| {
        s.user_frames()
            .filter(|f| !is_unknown_frame(f) && !f.contains("fake_spin") && *f != "main")
            .count()
    };
    let deep: u64 = total_count(ours.iter().copied().filter(|s| named_fake(s) >= 8));
    let total = total_count(ours.iter().copied());
    eprintln!(
        "attacker: {total} samples, {deep} with >= 8 fake frames named from the libc copy; e.g. {:?}",
        ours.iter()
            .max_by_key(|s| named_fake(s))
            .map(|s| s.frames.iter().take(6).collect::<Vec<_>>())
    );
    assert!(
        deep >= 5,
        "the fake frames into the libc copy were not named before the truncation, so the relay \
         never read the file and the test proves nothing; attacker stacks:\n{:#?}",
        &ours[..ours.len().min(5)]
    );
    assert_witness_kept(&folded, cpu, "a truncated mapped file");
}

// ---------------------------------------------------------------------------------------------
// 3. Descriptors

/// `--max-open-files` of attack 3: far below the 1,100 files and the 1024 descriptors.
const ATTACK3_MAX_OPEN_FILES: usize = 100;

/// Attack 3: 1,100 distinct executable-mapped files against a relay whose RLIMIT_NOFILE is
/// 1024 (soft = hard, so it cannot raise it) and whose `--max-open-files` is 100. The files are
/// mapped before the sampler starts, so that its first look at the attacker passes all it may
/// (1,024 per process; a process described while still mapping would pass only those mapped
/// so far). The relay stays alive, the witness keeps its samples, and while the attacker still
/// maps every file, once the relay has taken in what it was passed, it holds at most
/// `--max-open-files` passed descriptors more than before the sampler connected (plus a small
/// slack); they fall after the attacker exits. (Its peak meanwhile is bounded only by its
/// RLIMIT_NOFILE: the descriptors waiting in its intake queue are open too.)
#[test]
fn attack3_many_files_do_not_exhaust_the_relays_descriptors() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let programs = attack_programs();
    let files = attacker_dir(who, "ember-attack3-");
    let sampler_uid = if sampler_drops_to_nobody() { NOBODY } else { 0 }.to_string();
    let mut scenario = Scenario::new("relay (nofile 1024)")
        .relay_args(["--sampler-uid", &sampler_uid])
        .relay_args(["--max-open-files", &ATTACK3_MAX_OPEN_FILES.to_string()])
        .output_dir()
        .nofile(1024)
        .run();
    let out = scenario.out_dir();
    let relay_pid = scenario.relay.child.pid();
    let watch = Watch::start(relay_pid, None);
    let baseline = fd_count(relay_pid).expect("relay fd count");
    // The attacker keeps its files mapped (so the sampler keeps holding them) for up to 60 s,
    // until it is stopped below.
    let mut attack = spawn_attacker(
        who,
        &programs.mappings,
        &[
            "distinct",
            files.path().to_str().unwrap(),
            "1100",
            "0",
            "60",
        ],
    );
    attack.wait_ready(Duration::from_secs(30));
    let freq = FREQUENCY.to_string();
    let mut sampler_args = vec!["--frequency", freq.as_str()];
    if sampler_drops_to_nobody() {
        // The confined sampler connects as nobody: let it reach the root relay's socket.
        fs::set_permissions(&scenario.socket, fs::Permissions::from_mode(0o666))
            .expect("chmod socket");
        sampler_args.extend(["--user", "nobody"]);
    }
    let _sampler = scenario.start_sampler("sampler", &sampler_args);
    let relay = &mut scenario.relay;
    relay
        .log
        .expect(0, FIRST_BATCH_TIMEOUT, "first \"batch received\"", is_batch);
    // (10 s: the attacker spins beside it the whole time.)
    let witness = Witness::start(10);
    let mapped = now_unix_ns();
    // Two batches recorded wholly after the first: the attacker's descriptors were passed and
    // taken in, while it still maps them.
    let mut from = 0;
    for _ in 0..2 {
        let (i, _) = relay.log.expect(
            from,
            Duration::from_secs(30),
            "a batch recorded after the attacker mapped its files",
            |v| is_batch(v) && field_u64(v, "interval_start_unix_ns").is_some_and(|t| t > mapped),
        );
        from = i + 1;
    }
    // Once what the connection's thread took in has reached the pipeline (the intake queue,
    // up to 64 datagrams of 250 descriptors, is what lets the peak reach the limit), at most
    // --max-open-files passed descriptors stay open, the attacker's and the host's other
    // processes' (the least recently used closed), plus 32 for the connection, memfd copies
    // and log files. Without the eviction the relay keeps about 1,000 (its limit).
    let bound = baseline + ATTACK3_MAX_OPEN_FILES + 32;
    let mut held = fd_count(relay_pid).unwrap_or(usize::MAX);
    let settled = wait_until(Duration::from_secs(15), || {
        held = fd_count(relay_pid).unwrap_or(usize::MAX);
        held <= bound
    });
    assert!(
        attack.child.try_wait().is_none(),
        "the attacker exited before the relay's descriptors were measured with its files mapped"
    );
    attack.child.signal(Signal::SIGTERM);
    let _ = attack.child.wait_timeout(Duration::from_secs(30));
    let cpu = witness.cpu_time();
    let gone = now_unix_ns();
    // Two batches recorded wholly after both exited: everything before is processed.
    let mut after = 0;
    let mut from = 0;
    while after < 2 {
        match relay.log.wait_for(from, Duration::from_secs(30), |v| {
            is_batch(v) && field_u64(v, "interval_start_unix_ns").is_some_and(|t| t > gone)
        }) {
            Some((i, _)) => {
                after += 1;
                from = i + 1;
            }
            None => break,
        }
    }
    // (The host's other processes' files stay, at most --max-open-files of them.)
    let dropped = wait_until(Duration::from_secs(15), || {
        fd_count(relay_pid).is_some_and(|n| n <= baseline + ATTACK3_MAX_OPEN_FILES + 64)
    });
    let seen = watch.stop();
    let now = fd_count(relay_pid);
    eprintln!(
        "relay fds: {baseline} before the sampler connected, {held} settled while the attacker \
         mapped its files (at most {} in all), {now:?} after it; {after} batches after the \
         attacker exited",
        seen.max_fds
    );
    let alive = relay.child.try_wait().is_none();
    let ctrunc = relay.log.matching(|v| {
        level(v) == "WARN" && {
            let text = v.to_string().to_lowercase();
            (text.contains("ctrunc") || text.contains("truncated"))
                && (text.contains("limitnofile") || text.contains("ulimit"))
        }
    });
    let protocol_errors = relay.log.matching(is_closing_error).len();
    eprintln!(
        "relay alive: {alive}; MSG_CTRUNC warnings: {}; connections closed with an error: \
         {protocol_errors}",
        ctrunc.len()
    );
    assert!(alive, "the relay died:\n{}", tail(&relay.log.text(), 40));
    // The output files are written when a window closes or the relay stops (never per batch):
    // stop it, so they hold the whole run.
    assert!(
        relay.stop(Duration::from_secs(30)).is_some(),
        "the relay did not stop on SIGTERM:\n{}",
        tail(&relay.log.text(), 40)
    );
    let folded = fs::read_to_string(out.join("stacks.folded")).unwrap_or_default();
    assert_witness_kept(&folded, cpu, "1,100 mapped files against 1024 descriptors");
    assert!(
        after >= 2,
        "batches stopped arriving after the attacker exited:\n{}",
        tail(&relay.log.text(), 40)
    );
    // Whether the kernel had to drop descriptors (MSG_CTRUNC) depends on how far the relay's
    // least-recently-used eviction (--max-open-files, at most the soft limit minus 256) got
    // before a burst of Files datagrams arrived; both runs happen here. Either way no connection
    // may be closed for it. The MSG_CTRUNC path itself is tested
    // deterministically in protocol/src/transport.rs and relay/src/source.
    assert_eq!(
        protocol_errors,
        0,
        "the relay closed connections during the attack (MSG_CTRUNC warnings: {}):\n{}",
        ctrunc.len(),
        tail(&relay.log.text(), 40)
    );
    assert!(
        settled.is_some(),
        "the relay holds {held} descriptors with the attacker's files passed and mapped: more \
         than {baseline} before the sampler connected + --max-open-files \
         {ATTACK3_MAX_OPEN_FILES} + 32"
    );
    let evicted = relay.log.matching(|v| {
        level(v) == "WARN"
            && v.to_string()
                .contains("more files passed than --max-open-files")
    });
    assert!(
        !evicted.is_empty(),
        "the relay never said it closed descriptors over --max-open-files:\n{}",
        tail(&relay.log.text(), 40)
    );
    assert!(
        dropped.is_some(),
        "the relay still holds {now:?} descriptors after the attacker exited (baseline {baseline})"
    );
}

/// Whether this sampler drops root for a user of its own (`--user`): then a separately
/// started sampler connects to a `run` relay as that user, not as root.
fn sampler_drops_to_nobody() -> bool {
    let help = Command::new(sampler_bin())
        .arg("--help")
        .output()
        .expect("ember-sampler --help");
    String::from_utf8_lossy(&help.stdout).contains("--user")
}

// ---------------------------------------------------------------------------------------------
// 4. Build-id collisions

/// 20 bytes, as GNU ld's --build-id=0x... takes them.
const FORGED_BUILD_ID: &str = "e7be5e1dba5ec0de0ddba11c0ffee0ddfacade17";

fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Attack 4: a victim (spinner.c, root-owned, run as root) and an attacker binary of the same
/// build id whose functions are renamed PWND_*; the attacker runs first, so its file is
/// symbolized first. The victim's stacks name spin_hot and never PWND_*; the attacker's show
/// PWND_hot (the collision was exercised).
#[test]
fn attack4_a_forged_build_id_does_not_rename_the_victims_functions() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let build_id = format!("-Wl,--build-id=0x{FORGED_BUILD_ID}");
    let dir = program_dir();
    let victim = compile_workload(&dir, "spinner", "victim_spin", &[&build_id]);
    let forged = compile_workload(
        &dir,
        "spinner",
        "forged_spin",
        &[&build_id, "-Dspin_hot=PWND_hot", "-Dspin_outer=PWND_outer"],
    );
    let adir = attacker_dir(who, "ember-attack4-");
    let pwn = adir.path().join("pwn_spin");
    fs::copy(&forged, &pwn).expect("copying the forged binary");
    std::os::unix::fs::chown(&pwn, Some(who.uid), Some(who.gid)).expect("chown");
    fs::set_permissions(&pwn, fs::Permissions::from_mode(0o755)).expect("chmod");
    let id_bytes: Vec<u8> = (0..FORGED_BUILD_ID.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&FORGED_BUILD_ID[i..i + 2], 16).unwrap())
        .collect();
    for path in [&victim, &pwn] {
        let bytes = fs::read(path).unwrap();
        assert!(
            contains_bytes(&bytes, &id_bytes),
            "{} does not carry the forged build id",
            path.display()
        );
    }

    let mut attack = spawn_attacker(who, &pwn, &["30"]);
    // A long duration, ended by SIGINT once the victim has run: on a loaded machine the three
    // batches below can take longer than a short fixed duration, which once ended the recording
    // before the victim started (0 victim samples).
    let mut record = recording("attack4 record", "120s").record();
    let first = record.first_batch(FIRST_BATCH_TIMEOUT);
    // Two more batches: the attacker's file has been symbolized.
    let (second, _) = record
        .log
        .expect(first + 1, LOG_TIMEOUT, "second batch", is_batch);
    record
        .log
        .expect(second + 1, LOG_TIMEOUT, "third batch", is_batch);
    let victim_run = spawn_workload(&victim, 4);
    let _ = cpu_time_at_exit(victim_run.pid(), Duration::from_secs(30));
    // The victim's last samples are in the first batch whose interval ends after its exit.
    let exited_ns = now_unix_ns();
    record.log.expect(
        second,
        LOG_TIMEOUT,
        "a batch drained after the victim exited",
        |v| is_batch(v) && field_u64(v, "interval_end_unix_ns").is_some_and(|end| end > exited_ns),
    );
    record.child.signal(Signal::SIGINT);
    let folded = record.finish(RECORD_TIMEOUT);
    attack.child.kill();

    let stacks = parse_folded(&folded);
    let victim_stacks = process_stacks(&stacks, "victim_spin");
    let pwn_stacks = process_stacks(&stacks, "pwn_spin");
    let victim_hot = total_count(
        victim_stacks
            .iter()
            .copied()
            .filter(|s| s.has_frame("spin_hot")),
    );
    let victim_pwned = total_count(
        victim_stacks
            .iter()
            .copied()
            .filter(|s| s.frames.iter().any(|f| f.contains("PWND"))),
    );
    let attacker_pwnd = total_count(
        pwn_stacks
            .iter()
            .copied()
            .filter(|s| s.has_frame("PWND_hot")),
    );
    eprintln!(
        "victim: {} samples, {victim_hot} in spin_hot, {victim_pwned} naming PWND_*; attacker: {} \
         samples, {attacker_pwnd} in PWND_hot",
        total_count(victim_stacks.iter().copied()),
        total_count(pwn_stacks.iter().copied())
    );
    assert!(
        attacker_pwnd > 0,
        "the attacker's own stacks do not show PWND_hot, so the collision was not exercised:\n{folded}"
    );
    assert_eq!(
        victim_pwned, 0,
        "the victim's stacks carry the attacker's function names:\n{folded}"
    );
    assert!(
        victim_hot > 0,
        "the victim's stacks do not name spin_hot:\n{folded}"
    );
}

// ---------------------------------------------------------------------------------------------
// 10. A debug link to a FIFO

/// Attack 10 (found by a later review): the attacker's binary carries split debug info the way
/// distributions ship it, a `.gnu_debuglink` to `fifo_spin.debug` beside it, and that file is a
/// FIFO. blazesym opens what a debug link names, and opening a FIFO with no writer blocks: the
/// relay stopped in `open` for ever, and with it symbolization for every process (a 5 s record
/// was still running after 10 minutes). The record ends, the witness keeps its samples, the
/// attacker's own frames are named from its symbol table and the relay says why.
#[test]
fn attack10_a_debug_link_to_a_fifo_does_not_stop_symbolization() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let built = compile_workload(&program_dir(), "spinner", "fifo_spin_src", &["-g"]);
    let adir = attacker_dir(who, "ember-attack10-");
    let bin = adir.path().join("fifo_spin");
    let debug = adir.path().join("fifo_spin.debug");
    fs::copy(&built, &bin).expect("copying the spinner");
    let objcopy = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("objcopy")
            .current_dir(adir.path())
            .args(args)
            .output()
            .expect("running objcopy (binutils)");
        assert!(
            out.status.success(),
            "objcopy {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    objcopy(&[
        "--only-keep-debug".as_ref(),
        bin.as_os_str(),
        debug.as_os_str(),
    ]);
    objcopy(&["--strip-debug".as_ref(), bin.as_os_str()]);
    objcopy(&[
        "--add-gnu-debuglink=fifo_spin.debug".as_ref(),
        bin.as_os_str(),
    ]);
    fs::remove_file(&debug).expect("removing the debug file");
    nix::unistd::mkfifo(&debug, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    for path in [&bin, &debug] {
        std::os::unix::fs::chown(path, Some(who.uid), Some(who.gid)).expect("chown");
    }
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod");
    // Open to all, so the relay's user may open it (and then waits for a writer).
    fs::set_permissions(&debug, fs::Permissions::from_mode(0o666)).expect("chmod");

    let mut attack = spawn_attacker(who, &bin, &["60"]);
    let mut record = recording("attack10 record", "12s").record();
    record.first_batch(FIRST_BATCH_TIMEOUT);
    let witness = Witness::start(6);
    let cpu = witness.cpu_time();
    let folded = record.finish(RECORD_TIMEOUT);
    attack.child.kill();

    let stacks = parse_folded(&folded);
    let ours = process_stacks(&stacks, "fifo_spin");
    let named = total_count(ours.iter().copied().filter(|s| s.has_frame("spin_hot")));
    eprintln!(
        "attacker: {} samples, {named} naming spin_hot",
        total_count(ours.iter().copied())
    );
    assert!(
        named > 0,
        "the attacker's frames are not named from its symbol table:\n{folded}"
    );
    let log = record.log.text();
    assert!(
        log.contains("links to separate debug info are not followed") && log.contains("fifo_spin"),
        "the relay did not say why it left the debug link alone:\n{}",
        tail(&log, 40)
    );
    assert_witness_kept(&folded, cpu, "a debug link to a FIFO");
}

// ---------------------------------------------------------------------------------------------
// 5. The relay's memory and descriptors

fn uid_fields(pid: u32) -> Option<Vec<u32>> {
    let status = proc_status(Path::new(&format!("/proc/{pid}/status")))?;
    Some(
        status_field(&status, "Uid")?
            .split_whitespace()
            .filter_map(|s| s.parse().ok())
            .collect(),
    )
}

fn probe(uid: u32, gid: u32, pid: u32, fds: &[u32]) -> Value {
    let mut command = Command::new(&attack_programs().probe);
    command
        .arg(pid.to_string())
        .args(fds.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    run_as(&mut command, uid, gid);
    let out = command.output().expect("running attack_probe");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    serde_json::from_str(text.trim())
        .unwrap_or_else(|err| panic!("attack_probe printed {text:?}: {err}"))
}

/// What a probe managed: `["mem", "fd 3 open", "fd 3 getfd", ...]`.
fn probe_successes(result: &Value) -> Vec<String> {
    let mut ok = Vec::new();
    if result["mem_open"] == "ok" {
        ok.push(format!("open /proc/PID/mem (read: {})", result["mem_read"]));
    }
    if let Some(fds) = result["fds"].as_object() {
        for (fd, r) in fds {
            if r["open"] == "ok" {
                ok.push(format!("open /proc/PID/fd/{fd}"));
            }
            if r["getfd"] == "ok" {
                ok.push(format!("pidfd_getfd({fd})"));
            }
        }
    }
    ok
}

/// Attack 5: while `record` runs (symbolizing a root-only 0700 binary, so it holds a private
/// copy), its relay runs as a uid of its own (not root, not nobody, no other process), and
/// neither a process of that same uid nor one of nobody can open /proc/<relay>/mem, open
/// /proc/<relay>/fd/N or pidfd_getfd a relay descriptor.
#[test]
fn attack5_no_other_process_can_read_the_relays_copies() {
    let Some(_lock) = ebpf_gate() else { return };
    let secret_dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(secret_dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let secret = secret_dir.path().join("secret_spin");
    fs::copy(&workloads().spinner, &secret).expect("copy spinner");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    let workload = spawn_workload(&secret, 60);
    let mut record = recording("attack5 record", "8s")
        .relay_args(["--pid", &workload.pid().to_string()])
        .record();
    let relay = record.pid();
    record.first_batch(FIRST_BATCH_TIMEOUT);
    // The private copy of the 0700 binary, when the relay makes one.
    let _ = wait_until(Duration::from_secs(5), || memfd_bytes(relay) > 0);
    let uids = uid_fields(relay).expect("relay status");
    let gid: u32 = proc_status(Path::new(&format!("/proc/{relay}/status")))
        .and_then(|s| {
            status_field(&s, "Gid")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .expect("relay gid");
    let uid = uids[0];
    let fds: Vec<u32> = fds_of(relay)
        .into_iter()
        .filter(|(n, _)| *n > 2)
        .map(|(n, _)| n)
        .take(24)
        .collect();
    let sharing: Vec<u32> = running_uids()
        .get(&uid)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| *p != relay)
        .collect();
    eprintln!(
        "relay {relay}: Uid {uids:?} Gid {gid}; memfd copies {} bytes; fds {:?}; other processes \
         of uid {uid}: {sharing:?}",
        memfd_bytes(relay),
        fds_of(relay)
    );
    let same_uid = probe(uid, gid, relay, &fds);
    let as_nobody = probe(NOBODY, NOBODY, relay, &fds);
    eprintln!("probe as the relay's uid: {same_uid}");
    eprintln!("probe as nobody: {as_nobody}");
    let still_running = record.child.try_wait().is_none();
    let _ = record.finish(RECORD_TIMEOUT);
    assert!(still_running, "the record ended before it could be probed");

    for (who, result) in [("the relay's own uid", &same_uid), ("nobody", &as_nobody)] {
        let ok = probe_successes(result);
        assert!(
            ok.is_empty(),
            "a process running as {who} could: {ok:?} (probe: {result})"
        );
    }
    assert!(
        uids.iter().all(|&u| u == uid) && uid != 0 && uid != NOBODY,
        "record's relay runs as uid {uids:?}: it must be a uid of its own, not root or nobody"
    );
    assert!(
        sharing.is_empty(),
        "other processes run as the relay's uid {uid}: {sharing:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Outputs

/// Attack 6: a symlink named flamegraph.svg in an attacker-owned output dir points at a
/// root-only 0600 file; `record` runs with SUDO_UID/SUDO_GID of the attacker. The root-only file
/// is unchanged; the three outputs are regular files, mode 0600, owned by the attacker.
#[test]
fn attack6_record_never_writes_through_a_symlink() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let root_dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(root_dir.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
    let secret = root_dir.path().join("root-only.conf");
    let content = b"root-only content that no output may replace\n";
    fs::write(&secret, content).expect("writing the root-only file");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).expect("chmod 0600");
    let out = attacker_dir(who, "ember-attack6-");
    let link = out.path().join("flamegraph.svg");
    std::os::unix::fs::symlink(&secret, &link).expect("symlink");
    std::os::unix::fs::lchown(&link, Some(who.uid), Some(who.gid)).expect("lchown");

    let workload = spawn_workload(&workloads().spinner, 60);
    let mut record = recording("attack6 record", "3s")
        .relay_args(["--pid", &workload.pid().to_string()])
        .output(out.path())
        .env("SUDO_UID", who.uid.to_string())
        .env("SUDO_GID", who.gid.to_string())
        .record();
    let (status, stdout) = record.wait(RECORD_TIMEOUT);
    let after = fs::read(&secret).expect("reading the root-only file");
    let meta = fs::metadata(&secret).unwrap();
    eprintln!(
        "root-only file: {} bytes, mode {:o}, uid {} (was {} bytes)",
        after.len(),
        meta.mode() & 0o7777,
        meta.uid(),
        content.len()
    );
    assert!(
        after == content,
        "record wrote through the symlink into the root-only file (now {} bytes, starting {:?})",
        after.len(),
        String::from_utf8_lossy(&after[..after.len().min(60)])
    );
    assert_eq!(meta.mode() & 0o7777, 0o600, "root-only file mode changed");
    assert_eq!(meta.uid(), 0, "root-only file owner changed");
    assert!(
        status.is_some_and(|s| s.success()),
        "record failed ({status:?}):\n{stdout}\n{}",
        tail(&record.log.text(), 30)
    );
    for name in ["flamegraph.svg", "profile.pb.gz", "stacks.folded"] {
        let path = out.path().join(name);
        let meta =
            fs::symlink_metadata(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        eprintln!(
            "{name}: {:?}, mode {:o}, uid {} gid {}, {} bytes",
            meta.file_type(),
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid(),
            meta.len()
        );
        assert!(meta.file_type().is_file(), "{name} is not a regular file");
        assert_eq!(meta.mode() & 0o7777, 0o600, "{name} mode");
        assert_eq!(meta.uid(), who.uid, "{name} owner (SUDO_UID)");
        assert_eq!(meta.gid(), who.gid, "{name} group (SUDO_GID)");
        assert!(meta.len() > 0, "{name} is empty");
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Sampler containment

/// Attack 7: while recording, the sampler child has dropped uid 0 (no 0 in Uid or Gid), has no
/// supplementary groups, keeps exactly its three capabilities (effective, permitted, bounding),
/// NoNewPrivs 1 and Seccomp 2. Its forbidden syscalls under the real filter are unit tests in
/// sampler/src/harden.rs.
#[test]
fn attack7_the_sampler_is_contained() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().spinner, 60);
    let mut record = recording("attack7 record", "5s")
        .relay_args(["--pid", &workload.pid().to_string()])
        .record();
    let relay = record.pid();
    let mut seen = None;
    wait_until(Duration::from_secs(60), || {
        if record.child.try_wait().is_some() {
            return true;
        }
        for child in children_of(relay) {
            let Some(status) = proc_status(Path::new(&format!("/proc/{child}/status"))) else {
                continue;
            };
            if status_field(&status, "Seccomp") == Some("2") {
                seen = Some((child, status));
                return true;
            }
        }
        false
    });
    let (sampler, status) = seen.expect("the sampler never showed Seccomp: 2 while recording");
    // Read again a moment later: the drop is complete once seccomp is on, but be sure.
    thread::sleep(Duration::from_millis(200));
    let status = proc_status(Path::new(&format!("/proc/{sampler}/status"))).unwrap_or(status);
    let field = |key: &str| status_field(&status, key).unwrap_or("<missing>").to_owned();
    eprintln!(
        "sampler {sampler}: Uid {} Gid {} Groups [{}] CapEff {} CapPrm {} CapBnd {} NoNewPrivs {} \
         Seccomp {}",
        field("Uid"),
        field("Gid"),
        field("Groups"),
        field("CapEff"),
        field("CapPrm"),
        field("CapBnd"),
        field("NoNewPrivs"),
        field("Seccomp")
    );
    let _ = record.finish(RECORD_TIMEOUT);
    let mut problems = Vec::new();
    for key in ["Uid", "Gid"] {
        if field(key).split_whitespace().any(|id| id == "0") {
            problems.push(format!("{key} {} still has 0", field(key)));
        }
    }
    if !field("Groups").is_empty() {
        problems.push(format!("supplementary groups [{}]", field("Groups")));
    }
    for key in ["CapEff", "CapPrm", "CapBnd"] {
        if field(key) != SAMPLER_CAPS {
            problems.push(format!("{key} {} (expected {SAMPLER_CAPS})", field(key)));
        }
    }
    if field("NoNewPrivs") != "1" {
        problems.push(format!("NoNewPrivs {}", field("NoNewPrivs")));
    }
    if field("Seccomp") != "2" {
        problems.push(format!("Seccomp {}", field("Seccomp")));
    }
    assert!(
        problems.is_empty(),
        "the sampler is not contained: {problems:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Smaller attacks (fake samplers against `ember-relay run`, and record's sampler child)

fn fake_hello(kallsyms_fd: i32) -> Vec<u8> {
    encode_sampler_message(&SamplerMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        sampler_version: "attack-test".to_owned(),
        hostname: "attack".to_owned(),
        frequency_hz: 99,
        kallsyms_fd,
        ..Hello::default()
    }))
}

fn fake_batch(sequence: u64, pid: u32, addresses: Vec<u64>) -> Vec<u8> {
    let end = now_unix_ns();
    let (user_stacks, rows) = if addresses.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        (
            vec![addresses],
            vec![Row {
                pid,
                tid: pid,
                comm: "victim".to_owned(),
                user_stack: StackRef::Index(0),
                kernel_stack: StackRef::Missing(14),
                count: 1,
                interp_stack: None,
                off_cpu_ns: 0,
            }],
        )
    };
    encode_sampler_message(&SamplerMessage::Batch(Batch {
        sequence,
        part: 0,
        parts: 1,
        interval_start_unix_ns: end.saturating_sub(1_000_000_000),
        interval_end_unix_ns: end,
        frequency_hz: 99,
        user_stacks,
        rows,
        ..Batch::default()
    }))
}

fn fake_connect(socket: &Path) -> OwnedFd {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match transport::connect(socket) {
            Ok(fd) => return fd,
            Err(err @ (Errno::ECONNREFUSED | Errno::ENOENT)) if Instant::now() < deadline => {
                eprintln!("connect: {err}; retrying");
                thread::sleep(Duration::from_millis(50));
            }
            Err(err) => panic!("connecting to {}: {err}", socket.display()),
        }
    }
}

fn send(sock: &OwnedFd, bytes: &[u8], fds: &[&OwnedFd]) -> Result<(), Errno> {
    let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
    transport::send(sock.as_fd(), bytes, &borrowed, false)
}

fn is_batch_seq(seq: u64) -> impl Fn(&Value) -> bool {
    move |v| is_batch(v) && field_u64(v, "sequence") == Some(seq)
}

/// Attack 8a: a peer passes /dev/zero as the kallsyms descriptor. The relay reads a bounded
/// amount, logs an error about kallsyms, keeps a bounded VmHWM and goes on serving the
/// connection. (The relay runs with RLIMIT_AS 4 GiB and is killed above 1 GiB resident, so a
/// vulnerable build fails the test instead of eating the machine's memory.)
#[test]
fn attack8a_an_endless_kallsyms_is_bounded() {
    let Some(_lock) = ebpf_gate() else { return };
    let mut scenario = Scenario::new("attack8a relay")
        .relay_args(FAKE_SAMPLER)
        .address_space(4 << 30)
        .run();
    let (relay, socket) = (&mut scenario.relay, &scenario.socket);
    let watch = Watch::start(relay.child.pid(), Some(1024 * 1024));
    let zero: OwnedFd = fs::File::open("/dev/zero").expect("/dev/zero").into();
    let sock = fake_connect(socket);
    send(&sock, &fake_hello(0), &[&zero]).expect("sending the hello");
    drop(zero);
    let complained = relay.log.wait_for(0, LOG_TIMEOUT, |v| {
        matches!(level(v), "WARN" | "ERROR") && v.to_string().to_lowercase().contains("kallsyms")
    });
    let sent = send(&sock, &fake_batch(1, 0, Vec::new()), &[]);
    let served = relay.log.wait_for(0, LOG_TIMEOUT, is_batch_seq(1));
    let alive = relay.child.try_wait().is_none();
    let seen = watch.stop();
    eprintln!(
        "relay alive: {alive}; VmHWM {} MiB; RssAnon+RssShmem at most {} MiB; kallsyms complaint: {:?}; batch send: {sent:?}; \
         batch served: {}",
        seen.max_hwm_kib / 1024,
        seen.max_anon_shmem_kib / 1024,
        complained.as_ref().map(|(_, v)| v.to_string()),
        served.is_some()
    );
    assert!(alive, "the relay died:\n{}", tail(&relay.log.text(), 20));
    assert!(
        seen.max_anon_shmem_kib < MAX_RELAY_ANON_KIB && seen.max_hwm_kib < MAX_RELAY_HWM_KIB,
        "relay VmHWM {} MiB, RssAnon+RssShmem {} MiB",
        seen.max_hwm_kib / 1024,
        seen.max_anon_shmem_kib / 1024
    );
    assert!(
        complained.is_some(),
        "no WARN/ERROR about the endless kallsyms:\n{}",
        tail(&relay.log.text(), 20)
    );
    assert!(
        served.is_some(),
        "the relay did not go on serving the connection:\n{}",
        tail(&relay.log.text(), 20)
    );
}

/// Attack 8b: a peer sends Files messages with ~1,000 descriptors that no process refers to,
/// then a batch: the relay closes them (its descriptor count falls back near where it was).
#[test]
fn attack8b_unreferenced_files_are_closed() {
    let Some(_lock) = ebpf_gate() else { return };
    let mut scenario = Scenario::new("attack8b relay")
        .relay_args(FAKE_SAMPLER)
        .run();
    let (relay, socket) = (&mut scenario.relay, &scenario.socket);
    let pid = relay.child.pid();
    let sock = fake_connect(socket);
    send(&sock, &fake_hello(NO_FD), &[]).expect("hello");
    relay
        .log
        .expect(0, LOG_TIMEOUT, "\"sampler connected\"", is_connected);
    thread::sleep(Duration::from_millis(300));
    let baseline = fd_count(pid).expect("fd count");

    let binary = &workloads().spinner;
    let meta = fs::metadata(binary).unwrap();
    let mut next_id = 1u64;
    for _ in 0..4 {
        let fds: Vec<OwnedFd> = (0..250)
            .map(|_| fs::File::open(binary).expect("open").into())
            .collect();
        let infos: Vec<FileInfo> = (0..250)
            .map(|i| {
                next_id += 1;
                FileInfo {
                    file_id: next_id,
                    device: meta.dev(),
                    inode: meta.ino(),
                    path: binary.display().to_string(),
                    fd: i,
                    open_error: String::new(),
                }
            })
            .collect();
        let refs: Vec<&OwnedFd> = fds.iter().collect();
        send(
            &sock,
            &encode_sampler_message(&SamplerMessage::Files(infos)),
            &refs,
        )
        .expect("sending files");
    }
    thread::sleep(Duration::from_millis(500));
    let peak = fd_count(pid).unwrap_or(0);
    send(&sock, &fake_batch(1, 0, Vec::new()), &[]).expect("batch");
    relay
        .log
        .expect(0, LOG_TIMEOUT, "\"batch received\"", is_batch_seq(1));
    let fell = wait_until(Duration::from_secs(10), || {
        fd_count(pid).is_some_and(|n| n <= baseline + 16)
    });
    let after = fd_count(pid);
    eprintln!("relay fds: {baseline} before, {peak} after 1,000 unreferenced files, {after:?} after a batch");
    assert!(
        relay.child.try_wait().is_none(),
        "the relay died:\n{}",
        tail(&relay.log.text(), 20)
    );
    assert!(
        fell.is_some(),
        "the relay still holds {after:?} descriptors (baseline {baseline}) for files no process \
         refers to"
    );
}

/// Attack 8c: a peer describes a process whose mapping has file_offset near u64::MAX and sends a
/// sample inside it: the relay neither panics nor dies and processes the following batch.
#[test]
fn attack8c_an_overflowing_file_offset_is_harmless() {
    let Some(_lock) = ebpf_gate() else { return };
    let mut scenario = Scenario::new("attack8c relay")
        .relay_args(FAKE_SAMPLER)
        .run();
    let (relay, socket) = (&mut scenario.relay, &scenario.socket);
    let sock = fake_connect(socket);
    send(&sock, &fake_hello(NO_FD), &[]).expect("hello");
    let binary = &workloads().spinner;
    let meta = fs::metadata(binary).unwrap();
    let file: OwnedFd = fs::File::open(binary).unwrap().into();
    let files = SamplerMessage::Files(vec![FileInfo {
        file_id: 7,
        device: meta.dev(),
        inode: meta.ino(),
        path: binary.display().to_string(),
        fd: 0,
        open_error: String::new(),
    }]);
    send(&sock, &encode_sampler_message(&files), &[&file]).expect("files");
    let fake_pid = 4_000_000;
    let process = SamplerMessage::Process(ProcessInfo {
        pid: fake_pid,
        start_time_unix_ns: 1,
        executable_path: binary.display().to_string(),
        executable_name: "victim".to_owned(),
        mappings: vec![Mapping {
            start: 0x40_0000,
            end: 0x50_0000,
            file_offset: u64::MAX - 0xfff,
            path: binary.display().to_string(),
            device: meta.dev(),
            inode: meta.ino(),
            file_id: 7,
        }],
        ..ProcessInfo::default()
    });
    send(&sock, &encode_sampler_message(&process), &[]).expect("process");
    let first = send(
        &sock,
        &fake_batch(1, fake_pid, vec![0x48_0000, 0x4f_fff0]),
        &[],
    );
    let second = send(&sock, &fake_batch(2, fake_pid, vec![0x40_1000]), &[]);
    let served = relay.log.wait_for(0, LOG_TIMEOUT, is_batch_seq(2));
    thread::sleep(Duration::from_millis(300));
    let alive = relay.child.try_wait().is_none();
    let panicked = relay.log.text().contains("panicked");
    eprintln!(
        "sends: {first:?} {second:?}; batch 2 processed: {}; relay alive: {alive}; panic in log: \
         {panicked}",
        served.is_some()
    );
    assert!(alive, "the relay died:\n{}", tail(&relay.log.text(), 20));
    assert!(
        !panicked,
        "the relay panicked:\n{}",
        tail(&relay.log.text(), 20)
    );
    assert!(
        served.is_some(),
        "the relay did not process the batch after the overflowing one:\n{}",
        tail(&relay.log.text(), 20)
    );
}

/// Kills a process this test started indirectly (record's sampler child), by its pid, if it is
/// still running when the test ends.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if is_running(self.0) && comm_of(self.0).as_deref() == Some("ember-sampler") {
            if let Ok(pid) = i32::try_from(self.0) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// Attack 8d: `record` killed with SIGKILL while recording, with attack 1's huge process
/// running (today it makes the sampler lose its connection, after which nothing told it that
/// its relay was gone): its sampler child is gone within 10 s.
#[test]
fn attack8d_the_sampler_dies_with_record() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let dir = attacker_dir(who, "ember-attack8d-");
    let mut attack = spawn_attacker(
        who,
        &attack_programs().mappings,
        &["same", dir.path().to_str().unwrap(), "1200", "3900", "30"],
    );
    attack.wait_ready(Duration::from_secs(20));
    let mut record = recording("attack8d record", "60s").record();
    let relay = record.pid();
    record
        .log
        .expect(0, FIRST_BATCH_TIMEOUT, "\"sampler hello\"", |v| {
            message(v) == "sampler hello"
        });
    let samplers: Vec<u32> = children_of(relay)
        .into_iter()
        .filter(|p| comm_of(*p).as_deref() == Some("ember-sampler"))
        .collect();
    assert_eq!(
        samplers.len(),
        1,
        "record's children: {:?}",
        children_of(relay)
    );
    let sampler = samplers[0];
    let _cleanup = KillOnDrop(sampler);
    // Let the sampler describe the attacker (today: EMSGSIZE and a lost connection).
    thread::sleep(Duration::from_secs(3));
    eprintln!(
        "record {} before SIGKILL",
        if record.child.try_wait().is_none() {
            "still running"
        } else {
            "already exited"
        }
    );
    record.child.signal(Signal::SIGKILL);
    let _ = record.wait(Duration::from_secs(10));
    let gone = wait_until(Duration::from_secs(10), || !is_running(sampler));
    let mut states = BTreeMap::new();
    states.insert(
        "sampler running 10 s after record's SIGKILL",
        is_running(sampler),
    );
    eprintln!("{states:?}");
    assert!(
        gone.is_some(),
        "record's sampler (pid {sampler}) still runs 10 s after record was killed"
    );
}

// ---------------------------------------------------------------------------------------------
// 14. Names that drive a terminal, or pass for kernel frames

/// What a hostile symbol name may carry that a terminal or a bidi renderer obeys.
fn drives_a_terminal(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        c.is_control() && c != '\n' && c != '\t' || ('\u{202a}'..='\u{202e}').contains(&c)
    })
}

/// Attack 14: a user's binary whose symbol table names its functions with an OSC title, an
/// OSC 52 clipboard write, colours and a bidi override, and its hot leaf `do_syscall_64_[k]`.
/// Every text output (stacks.folded, flamegraph.svg, the speedscope file, record's summary and
/// `ember-relay report` of profile.pb.gz) holds none of those characters raw, and the user
/// function is not drawn as a kernel frame: `main;do_syscall_64_[k]` never appears, its
/// samples are under `do_syscall_64_(k)`.
#[test]
fn attack14_names_neither_drive_the_terminal_nor_pass_for_kernel_frames() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    // The spinner, stripped of DWARF (so names come from the symbol table) and renamed.
    let dir = attacker_dir(who, "ember-attack14-");
    let binary = dir.path().join("hostile-names");
    let title = "\u{1b}]0;pwned\u{7}\u{1b}]52;c;cHduZWQ=\u{7}outer";
    let colour = "\u{1b}[31mevil\u{202e}gnp.exe\u{1b}[0m";
    let status = Command::new("objcopy")
        .arg("--strip-debug")
        .arg("--redefine-sym")
        .arg("spin_hot=do_syscall_64_[k]")
        .arg("--redefine-sym")
        .arg(format!("spin_outer={title}"))
        .arg("--redefine-sym")
        .arg(format!("main={colour}"))
        .arg(&workloads().spinner)
        .arg(&binary)
        .status()
        .expect("running objcopy");
    assert!(status.success(), "objcopy failed");
    fs::set_permissions(&binary, fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(&binary, Some(who.uid), Some(who.gid)).expect("chown");
    let mut command = Command::new(&binary);
    command.arg("60").stdin(Stdio::null()).stdout(Stdio::null());
    run_as(&mut command, who.uid, who.gid);
    let victim = ChildGuard::spawn("hostile-names", &mut command);

    let mut record = recording("attack14 record", "4s")
        .relay_args(["--pid", &victim.pid().to_string()])
        .relay_args(["--format", "svg,pprof,folded,speedscope"])
        .record();
    let (status, stdout) = record.wait(RECORD_TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "record failed ({status:?}):\n{stdout}\n{}",
        tail(&record.log.text(), 30)
    );
    let read = |name: &str| {
        let path = record.out_dir.join(name);
        fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
    };
    let report = Command::new(relay_bin())
        .arg("report")
        .arg(record.out_dir.join("profile.pb.gz"))
        .output()
        .expect("running ember-relay report");
    assert!(report.status.success(), "report failed");
    let outputs = [
        ("stacks.folded", read("stacks.folded")),
        ("flamegraph.svg", read("flamegraph.svg")),
        ("profile.speedscope.json", read("profile.speedscope.json")),
        ("record's summary", stdout.clone().into_bytes()),
        ("ember-relay report", report.stdout.clone()),
    ];
    for (what, bytes) in &outputs {
        let text = String::from_utf8_lossy(bytes);
        let found = drives_a_terminal(&text);
        eprintln!(
            "{what}: {} bytes, raw control or bidi character: {found:?}",
            bytes.len()
        );
        assert!(
            found.is_none(),
            "{what} holds {found:?} raw from a process's symbol names:\n{}",
            tail(&text, 20)
        );
    }
    eprintln!("report:\n{}", String::from_utf8_lossy(&report.stdout));

    let folded = String::from_utf8_lossy(&outputs[0].1).into_owned();
    let stacks = parse_folded(&folded);
    let victims = process_stacks(&stacks, "hostile-names");
    let total = total_count(victims.iter().copied());
    let imitated: u64 = total_count(victims.iter().copied().filter(|s| {
        s.frames
            .windows(2)
            .any(|w| w[1] == "do_syscall_64_[k]" && !w[0].ends_with("_[k]"))
    }));
    let disarmed = total_count(
        victims
            .iter()
            .copied()
            .filter(|s| s.frames.last().is_some_and(|f| f == "do_syscall_64_(k)")),
    );
    eprintln!(
        "hostile-names: {total} samples; {imitated} with a user frame drawn as the kernel's \
         do_syscall_64, {disarmed} under do_syscall_64_(k)"
    );
    assert!(
        total >= 100,
        "too few samples of the victim: {total}\n{folded}"
    );
    assert_eq!(
        imitated, 0,
        "a user function passed for a kernel frame:\n{folded}"
    );
    assert!(
        disarmed * 10 >= total * 8,
        "the renamed hot leaf holds {disarmed} of {total} samples:\n{folded}"
    );
    let svg = String::from_utf8_lossy(&outputs[1].1);
    assert!(
        svg.contains("do_syscall_64_(k)"),
        "the SVG does not name the user frame as such"
    );
}

// ---------------------------------------------------------------------------------------------
// 15. A planted output-directory symlink

/// Attack 15: root runs `record` in a directory the attacker owns, where her `ember-out` is a
/// symlink to a root-only 0700 directory holding root's own flamegraph.svg, profile.pb.gz and
/// stacks.folded. The record refuses the link (naming it, exit 2) and root's files are
/// unchanged.
#[test]
fn attack15_record_never_follows_a_planted_output_symlink() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let secret = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(secret.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
    let names = ["flamegraph.svg", "profile.pb.gz", "stacks.folded"];
    for name in names {
        fs::write(secret.path().join(name), format!("root's own {name}\n")).expect("write");
    }
    let hers = attacker_dir(who, "ember-attack15-");
    let link = hers.path().join("ember-out");
    std::os::unix::fs::symlink(secret.path(), &link).expect("symlink");
    std::os::unix::fs::lchown(&link, Some(who.uid), Some(who.gid)).expect("lchown");

    let workload = spawn_workload(&workloads().spinner, 30);
    let mut record = recording("attack15 record", "2s")
        .relay_args(["--pid", &workload.pid().to_string()])
        .output(&link)
        .record();
    let (status, stdout) = record.wait(RECORD_TIMEOUT);
    let log = record.log.text();
    eprintln!("record: {status:?}\n{stdout}\n{}", tail(&log, 5));
    for name in names {
        let content = fs::read(secret.path().join(name)).unwrap_or_default();
        let start = String::from_utf8_lossy(&content[..content.len().min(40)]).into_owned();
        eprintln!(
            "{name} in the root-only directory: {} bytes, {start:?}",
            content.len()
        );
        assert!(
            content == format!("root's own {name}\n").as_bytes(),
            "record wrote {name} through the attacker's symlink ({} bytes, {start:?})",
            content.len()
        );
    }
    let entries = fs::read_dir(secret.path()).expect("read_dir").count();
    assert_eq!(
        entries,
        names.len(),
        "record left files in the root-only directory"
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(2),
        "record was not refused"
    );
    assert!(
        log.contains("is a symlink that uid") && log.contains("not following it"),
        "the refusal does not name the link:\n{}",
        tail(&log, 10)
    );
}

// ---------------------------------------------------------------------------------------------
// 16. `--open` from a root shell

/// Attack 16: `sudo ember-relay record --open` from a root shell (SUDO_UID=0) with a display
/// and $BROWSER set: no browser is started (the stand-in leaves no mark), and record says why.
#[test]
fn attack16_open_never_starts_a_browser_as_root() {
    let Some(_lock) = ebpf_gate() else { return };
    let tmp = tempfile::tempdir().expect("temp dir");
    let mark = tmp.path().join("browser-started");
    let browser = tmp.path().join("browser");
    fs::write(&browser, format!("#!/bin/sh\nid -u > {}\n", mark.display())).expect("write");
    fs::set_permissions(&browser, fs::Permissions::from_mode(0o755)).expect("chmod");

    let workload = spawn_workload(&workloads().spinner, 30);
    let mut record = recording("attack16 record", "2s")
        .relay_args(["--pid", &workload.pid().to_string(), "--open"])
        .env("SUDO_UID", "0")
        .env("SUDO_GID", "0")
        .env("DISPLAY", ":0")
        .env("BROWSER", &browser)
        .record();
    let (status, stdout) = record.wait(RECORD_TIMEOUT);
    // The opener would exec the browser at once; give a started one time to leave its mark.
    let started = wait_until(Duration::from_secs(3), || mark.exists()).is_some();
    eprintln!(
        "record: {status:?}; browser mark: {:?}\n{stdout}",
        fs::read_to_string(&mark).ok()
    );
    assert!(!started, "a browser was started as uid 0");
    assert!(status.is_some_and(|s| s.success()), "record failed");
    assert!(
        stdout.contains("not opening") && stdout.contains("never started as root"),
        "record does not say why it did not open the flamegraph:\n{stdout}"
    );
}

// ---------------------------------------------------------------------------------------------
// 17. `record --sampler PATH` runs only root's binaries

/// Attack 17: `record --sampler` with a program the attacker owns, with a root-owned program
/// everyone may write, and with a root-owned program in a directory the attacker owns: each is
/// refused (exit 2, the reason and the fix named) and never run, so a sudo rule for `record`
/// does not run a user's program as root.
#[test]
fn attack17_record_starts_only_a_sampler_root_controls() {
    if !privileged() {
        return;
    }
    let who = attacker();
    let hers = attacker_dir(who, "ember-attack17-");
    let mark = hers.path().join("ran-as-root");
    let script = format!("#!/bin/sh\nid -u >> {}\n", mark.display());
    let plant = |path: &Path, mode: u32, owner: Option<u32>| {
        fs::write(path, &script).expect("write");
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
        std::os::unix::fs::chown(path, owner, owner).expect("chown");
    };
    let owned = hers.path().join("her-sampler");
    plant(&owned, 0o755, Some(who.uid));
    let roots = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(roots.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let writable = roots.path().join("everyones-sampler");
    plant(&writable, 0o777, Some(0));
    let in_her_dir = hers.path().join("roots-sampler-in-her-dir");
    plant(&in_her_dir, 0o755, Some(0));
    for (what, sampler, why) in [
        ("her own program", &owned, "not root"),
        (
            "a program everyone may write",
            &writable,
            "writable by everyone",
        ),
        ("root's program in her directory", &in_her_dir, "not root"),
    ] {
        let out = roots.path().join("out");
        let output = Command::new(relay_bin())
            .args(["record", "--duration", "1s", "--output"])
            .arg(&out)
            .arg("--sampler")
            .arg(sampler)
            .env("SUDO_UID", who.uid.to_string())
            .env("SUDO_GID", who.gid.to_string())
            .stdin(Stdio::null())
            .output()
            .expect("running ember-relay record");
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprintln!("{what}: {:?}\n{}", output.status, tail(&stderr, 3));
        assert!(
            !mark.exists(),
            "record ran {what} as uid {}",
            fs::read_to_string(&mark).unwrap_or_default().trim()
        );
        assert_eq!(output.status.code(), Some(2), "{what} was not refused");
        assert!(
            stderr.contains("not starting") && stderr.contains(why),
            "the refusal of {what} does not say why:\n{stderr}"
        );
    }
}

/// Attack 17b: through the same sudo rule, `record --config` naming a root-only file: the file
/// is read with the sudo user's rights, so the record is refused without quoting a byte of it.
#[test]
fn attack17b_record_reads_named_files_with_the_sudo_users_rights() {
    if !privileged() {
        return;
    }
    let who = attacker();
    let roots = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(roots.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let secret = roots.path().join("shadow");
    let hash = "root:$y$j9T$not-for-alice:19000:0:99999:7:::";
    fs::write(&secret, format!("{hash}\n")).expect("write");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).expect("chmod");
    let output = Command::new(relay_bin())
        .args(["record", "--duration", "1s", "--output"])
        .arg(roots.path().join("out"))
        .arg("--config")
        .arg(&secret)
        .env("SUDO_UID", who.uid.to_string())
        .env("SUDO_GID", who.gid.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("running ember-relay record");
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!(
        "--config of a root-only file: {:?}\n{}",
        output.status,
        tail(&stderr, 3)
    );
    assert!(
        !stderr.contains("not-for-alice"),
        "record quoted a root-only file to the sudo user:\n{stderr}"
    );
    assert!(
        !output.status.success(),
        "record accepted a file its user cannot read"
    );
    assert!(
        stderr.contains("who ran sudo, may not read it"),
        "the refusal does not say why:\n{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// 13. Slow clients against the health probes

/// What the finding requires of each probe: an answer within 1 s (the socket's read timeout;
/// the DaemonSet's probes allow 2 s).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Slow clients: connections that send one byte of a request head per second and never finish
/// it, reopened as soon as the server closes them, like a slowloris. Source addresses are
/// 127.0.0.1 (the probes' own address, as a host-network pod shares the node's) and
/// 127.0.1.1 .. 127.0.1.`others` (other pods); all of 127.0.0.0/8 is the loopback interface's.
struct SlowClients {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    opened: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

impl SlowClients {
    fn start(
        target: std::net::SocketAddr,
        from_probe_address: usize,
        others: u8,
        each: usize,
    ) -> Self {
        use std::{
            io::Write as _,
            net::Ipv4Addr,
            sync::{
                atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
                Arc,
            },
        };
        let mut sources = vec![Ipv4Addr::LOCALHOST; from_probe_address];
        for last in 1..=others {
            sources.extend(std::iter::repeat_n(Ipv4Addr::new(127, 0, 1, last), each));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let (stop_flag, count) = (Arc::clone(&stop), Arc::clone(&opened));
        let thread = thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .expect("a runtime to connect with");
            let open = |source: Ipv4Addr| {
                let stream = slow_connect(&runtime, source, target);
                if stream.is_some() {
                    count.fetch_add(1, Relaxed);
                }
                stream
            };
            let mut streams: Vec<Option<std::net::TcpStream>> =
                sources.iter().map(|&s| open(s)).collect();
            let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
            let mut tick = 0usize;
            while !stop_flag.load(Relaxed) {
                let byte = [head[tick.min(head.len() - 1)]];
                for (stream, &source) in streams.iter_mut().zip(&sources) {
                    let alive = stream
                        .as_mut()
                        .is_some_and(|s| still_open(s) && s.write_all(&byte).is_ok());
                    if !alive {
                        *stream = open(source);
                    }
                }
                tick += 1;
                thread::sleep(Duration::from_secs(1));
            }
        });
        Self {
            stop,
            opened,
            thread: Some(thread),
        }
    }

    /// Connections opened so far (first ones and reopened).
    fn opened(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for SlowClients {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A TCP connection from `source` (port chosen by the kernel) to `target`, nonblocking; None if
/// it could not be made. tokio's `TcpSocket` binds before connecting without unsafe code.
fn slow_connect(
    runtime: &tokio::runtime::Runtime,
    source: std::net::Ipv4Addr,
    target: std::net::SocketAddr,
) -> Option<std::net::TcpStream> {
    runtime
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(std::net::SocketAddr::from((source, 0)))?;
            socket.connect(target).await?.into_std()
        })
        .ok()
}

/// False once the server closed `stream` (end of file or reset); nothing else is ever read.
fn still_open(stream: &mut std::net::TcpStream) -> bool {
    use std::io::Read as _;
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => false,
        Ok(_) => true,
        Err(err) => err.kind() == std::io::ErrorKind::WouldBlock,
    }
}

/// One probe as the kubelet makes it: connect, send the request, read the answer, each step
/// allowed [`PROBE_TIMEOUT`]. The status and body, or what went wrong.
fn health_probe(target: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect_timeout(&target, PROBE_TIMEOUT)
        .map_err(|err| format!("connect: {err}"))?;
    stream
        .set_read_timeout(Some(PROBE_TIMEOUT))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(PROBE_TIMEOUT))
        .expect("write timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|err| format!("send: {err}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|err| format!("read: {err} after {} bytes", answer.len()))?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        return Err(format!("closed without an answer ({} bytes)", answer.len()));
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Attack 13: 64 connections that send their request head one byte a second held the metrics
/// server's 16 connections, and every other connection was closed on accept: 30 of 30 `/healthz`
/// probes failed, and in the DaemonSet (port 17471 on the pod's address) any pod could make the
/// kubelet restart the relay. Here 400 such clients (100 from the probes' own address, 3 from
/// each of 100 others), reopening each connection the server closes, run against `run` with a
/// real sampler (network peers have no uid: they run in this process); 30 rounds of `/healthz`
/// and `/readyz` probes must each be answered 200 within a 1 s read timeout, and a scrape must
/// show the closed connections counted by reason.
#[test]
fn attack13_slow_clients_do_not_stop_health_probes() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().spinner, 120);
    let scenario = Scenario::new("attack13 relay")
        .relay_args(["--metrics-address", "127.0.0.1:0"])
        .sampler_args(["--pid", &workload.pid().to_string(), "--frequency", "99"])
        .run();
    let address: std::net::SocketAddr = scenario.metrics_address().parse().expect("an address");
    scenario.batch(0, FIRST_BATCH_TIMEOUT);
    let relay = &scenario.relay;
    let ready = wait_until(LOG_TIMEOUT, || {
        health_probe(address, "/readyz").is_ok_and(|(status, _)| status == 200)
    });
    assert!(
        ready.is_some(),
        "/readyz never answered 200 before the attack"
    );

    // The attack: every connection open and a few bytes in before the first probe.
    let attack = SlowClients::start(address, 100, 100, 3);
    thread::sleep(Duration::from_secs(4));
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    let rounds = 30;
    for round in 0..rounds {
        for path in ["/healthz", "/readyz"] {
            let started = Instant::now();
            let answer = health_probe(address, path);
            slowest = slowest.max(started.elapsed());
            match answer {
                Ok((200, _)) => {}
                Ok((status, body)) => {
                    failures.push(format!("round {round} {path}: {status} {body:?}"))
                }
                Err(err) => failures.push(format!("round {round} {path}: {err}")),
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    let scrape = health_probe(address, "/metrics");
    let opened = attack.opened();
    drop(attack);

    let closed = |reason: &str| -> Option<f64> {
        let text = &scrape.as_ref().ok()?.1;
        metric_value(
            text,
            &format!("ember_relay_metrics_connections_closed_total{{reason=\"{reason}\"}}"),
        )
    };
    let by_reason: Vec<(&str, Option<f64>)> = [
        "head_timeout",
        "peer_limit",
        "server_full",
        "exchange_timeout",
    ]
    .into_iter()
    .map(|reason| (reason, closed(reason)))
    .collect();
    eprintln!(
        "probes: {} of {} answered 200 within {PROBE_TIMEOUT:?} each (slowest {slowest:?}); slow \
         connections opened: {opened}; scrape: {}; closed by reason: {by_reason:?}",
        2 * rounds - failures.len(),
        2 * rounds,
        scrape
            .as_ref()
            .map_or_else(|e| e.clone(), |(status, _)| status.to_string()),
    );
    for failure in failures.iter().take(10) {
        eprintln!("  {failure}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} health probes failed under slow clients",
        failures.len(),
        2 * rounds
    );
    let (status, _) = scrape
        .as_ref()
        .expect("a scrape answered during the attack");
    assert_eq!(*status, 200);
    let slow_closed: f64 = by_reason.iter().filter_map(|(_, n)| *n).sum();
    assert!(
        closed("head_timeout").is_some_and(|n| n > 0.0)
            && closed("peer_limit").is_some_and(|n| n > 0.0),
        "the scrape does not count the slow connections closed: {by_reason:?}"
    );
    assert!(
        slow_closed >= 100.0,
        "only {slow_closed} slow connections counted as closed"
    );
    let warned = relay
        .log
        .matching(|v| message(v).starts_with("metrics server: closed connections"));
    eprintln!("relay warnings about closed connections: {}", warned.len());
    assert!(
        !warned.is_empty(),
        "the relay did not log the closed connections"
    );
    assert!(
        warned.len() <= 5,
        "the closes were logged {} times in ~15 s (at most one line per 10 s)",
        warned.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 11. Labels forged by the process they describe

/// Runs `exe 60` as `who` with `env`, through `sh -c` when `shell` is given (its script runs
/// as the attacker, then `exec`s the workload: same pid). `enter` is a `cgroup.procs` file the
/// child moves itself into while still root, as systemd places a user's manager in her
/// delegated cgroup.
fn spawn_as_attacker(
    who: Attacker,
    exe: &Path,
    env: &[(&str, String)],
    shell: Option<&str>,
    enter: Option<&Path>,
) -> ChildGuard {
    let mut command = match shell {
        Some(script) => {
            let mut c = Command::new("/bin/sh");
            c.args(["-c", script, "sh"]).arg(exe);
            c
        }
        None => {
            let mut c = Command::new(exe);
            c.arg("60");
            c
        }
    };
    command
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(procs) = enter {
        let path = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).unwrap();
        // Registered before run_as's, so it runs first, as root. "0" moves the writer itself.
        // SAFETY: open, write and close are async-signal-safe; the path lives in the closure.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(error);
                }
                Ok(())
            });
        }
    }
    run_as(&mut command, who.uid, who.gid);
    ChildGuard::spawn(&exe.display().to_string(), &mut command)
}

/// Records `pid` for 3 s exporting OTLP v1.10, and returns the resource attributes of the
/// profiles whose executable is `executable`, with the record's log.
fn record_resources(pid: u32, executable: &str) -> (Vec<BTreeMap<String, String>>, String) {
    let receiver = otlp::Receiver::grpc(None);
    let url = receiver.url();
    let pid = pid.to_string();
    let recorded = record(
        &[
            "--duration",
            "3s",
            "--pid",
            &pid,
            "--otlp-endpoint",
            &url,
            "--otlp-protocol",
            "grpc",
            "--otlp-proto-version",
            "1.10",
            "--log-format",
            "json",
        ],
        RECORD_TIMEOUT,
    );
    let resources: Vec<BTreeMap<String, String>> = receiver
        .received()
        .iter()
        .flat_map(|r| otlp::decode("1.10", &r.body).unwrap().resources)
        .map(|r| r.attributes)
        .filter(|a| a.get("process.executable.name").map(String::as_str) == Some(executable))
        .collect();
    assert!(
        !resources.is_empty(),
        "no profile of {executable} arrived:\n{}",
        tail(&recorded.stderr, 60)
    );
    for attributes in &resources {
        eprintln!(
            "{executable}: {} attributes: {attributes:?}",
            attributes.len()
        );
    }
    (resources, recorded.stderr)
}

/// Attack 11a: a user's process names itself nginx, claims to be kube-system's coredns-0
/// through `OTEL_RESOURCE_ATTRIBUTES`, and adds 30 filler attributes so that the label cap
/// pushes out what the relay observed (today: exported without `process.owner`,
/// `process.executable.path` and `host.id`, with the `k8s.*` claims). It may name itself (the
/// OpenTelemetry specification lets it), but its owner, path and host stay, the claims are
/// gone and counted.
#[test]
fn attack11a_a_process_cannot_forge_its_labels_through_its_environment() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let dir = attacker_dir(who, "ember-attack11a-");
    let exe = dir.path().join("attack11a");
    fs::copy(&workloads().spinner, &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let machine_id = fs::read_to_string("/etc/machine-id")
        .expect("this test checks host.id: /etc/machine-id must exist")
        .trim()
        .to_owned();
    // Given the attacker's process with a forged environment
    let mut attributes: Vec<String> = vec![
        "k8s.namespace.name=kube-system".into(),
        "k8s.pod.name=coredns-0".into(),
    ];
    attributes.extend((0..30).map(|i| format!("filler.{i:02}=x")));
    let env = [
        ("OTEL_SERVICE_NAME", "nginx".to_owned()),
        ("OTEL_RESOURCE_ATTRIBUTES", attributes.join(",")),
    ];
    let workload = spawn_as_attacker(who, &exe, &env, None, None);
    thread::sleep(Duration::from_millis(300));
    // When it is recorded
    let (resources, log) = record_resources(workload.pid(), "attack11a");
    drop(workload);
    // Then every profile of it carries what the relay observed, with the observed values
    let owner = who.uid.to_string();
    for attributes in &resources {
        let get = |key: &str| attributes.get(key).map(String::as_str);
        assert_eq!(get("process.owner"), Some(owner.as_str()), "{attributes:?}");
        assert_eq!(
            get("process.executable.path"),
            exe.to_str(),
            "{attributes:?}"
        );
        assert_eq!(get("host.id"), Some(machine_id.as_str()), "{attributes:?}");
        // And it named itself, as a process may (its owner keeps its series its own)
        assert_eq!(get("service.name"), Some("nginx"), "{attributes:?}");
        // And none of its claims to another pod stands
        let claims: Vec<&String> = attributes
            .keys()
            .filter(|k| k.starts_with("k8s.") || k.starts_with("k8s_"))
            .collect();
        assert!(claims.is_empty(), "forged Kubernetes labels: {claims:?}");
        assert!(
            attributes.len() < 30,
            "{} attributes: over Pyroscope's limit",
            attributes.len()
        );
    }
    // And the relay counted the two claims it dropped
    let counted = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| message(v).starts_with("labels stage"))
        .filter_map(|v| field_u64(&v, "claims_dropped"))
        .max();
    eprintln!("claims_dropped in the labels stage line: {counted:?}");
    assert!(
        counted.is_some_and(|n| n >= 2),
        "no labels stage line counting the dropped claims:\n{}",
        tail(&log, 40)
    );
}

/// A cgroup subtree delegated to the attacker as systemd delegates `user@UID.service` to every
/// user (directory and `cgroup.procs` chowned to her), under a slice of this test, in the
/// hierarchy systemd places processes in (cgroup v2, or v1's `name=systemd`). Every directory
/// under it, the attacker's own included, is removed on drop (processes moved to the root
/// first).
struct DelegatedCgroup {
    root: std::path::PathBuf,
    /// Top to bottom: the test's slice, the user's slice, her manager's delegated cgroup.
    made: Vec<std::path::PathBuf>,
}

impl DelegatedCgroup {
    fn create(who: Attacker) -> Self {
        let base = Path::new("/sys/fs/cgroup");
        let root = if base.join("cgroup.controllers").exists() {
            base.to_owned()
        } else {
            base.join("systemd")
        };
        assert!(
            root.join("cgroup.procs").exists(),
            "no cgroup hierarchy for systemd at {} (this test needs cgroup v2 or v1's \
             name=systemd)",
            root.display()
        );
        eprintln!("cgroup hierarchy: {}", root.display());
        let slice = root.join(format!("ember-attack11-{}.slice", std::process::id()));
        let user_slice = slice.join(format!("user-{}.slice", who.uid));
        let manager = user_slice.join(format!("user@{}.service", who.uid));
        fs::create_dir_all(&manager)
            .unwrap_or_else(|e| panic!("creating {}: {e}", manager.display()));
        let made = vec![slice, user_slice, manager.clone()];
        for path in [
            manager.clone(),
            manager.join("cgroup.procs"),
            manager.join("tasks"),
        ] {
            if path.exists() {
                std::os::unix::fs::chown(&path, Some(who.uid), Some(who.gid))
                    .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
            }
        }
        Self { root, made }
    }

    fn manager(&self) -> &Path {
        &self.made[2]
    }
}

impl Drop for DelegatedCgroup {
    fn drop(&mut self) {
        // Deepest first: what the attacker made under her manager, then ours.
        let mut dirs: Vec<std::path::PathBuf> = Vec::new();
        let mut stack = vec![self.manager().to_owned()];
        while let Some(dir) = stack.pop() {
            if let Ok(entries) = fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .filter_map(Result::ok)
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
            dirs.push(dir);
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        dirs.extend(self.made.iter().rev().skip(1).cloned());
        for dir in dirs {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines() {
                let _ = fs::write(self.root.join("cgroup.procs"), pid);
            }
            if let Err(err) = fs::remove_dir(&dir) {
                eprintln!("removing {}: {err}", dir.display());
            }
        }
    }
}

/// Attack 11b: in the cgroup subtree systemd delegates to her manager, a user makes
/// `nginx.service/docker-<64 hex>.scope` and moves her process into it (today: exported as
/// `systemd.unit="nginx.service"` with that `container.id`, which `--kubernetes` would join to
/// another pod's labels). Her own names give user-scoped labels only.
#[test]
fn attack11b_a_process_cannot_forge_its_labels_through_a_delegated_cgroup() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let dir = attacker_dir(who, "ember-attack11b-");
    let exe = dir.path().join("attack11b");
    fs::copy(&workloads().spinner, &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    // Given her delegated cgroup, where she makes a unit and a container scope of her own
    const ID: &str = "3f4b7a1c9e2d8f6a0b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";
    let cgroup = DelegatedCgroup::create(who);
    let manager = cgroup.manager().to_owned();
    let script = format!(
        "set -e; d={}/nginx.service/docker-{ID}.scope; mkdir -p \"$d\"; \
         echo 0 > \"$d/cgroup.procs\"; exec \"$1\" 60",
        manager.display()
    );
    let mut workload = spawn_as_attacker(
        who,
        &exe,
        &[],
        Some(&script),
        Some(&manager.join("cgroup.procs")),
    );
    let pid = workload.pid();
    let expected = format!("user@{}.service/nginx.service/docker-{ID}.scope", who.uid);
    wait_until(Duration::from_secs(10), || {
        fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|t| t.contains(&expected))
            && fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe)
    })
    .unwrap_or_else(|| {
        panic!(
            "the attacker did not move into her forged scope (exited: {:?}): {}",
            workload.try_wait(),
            fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
        )
    });
    eprintln!(
        "attacker's /proc/{pid}/cgroup:\n{}",
        fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
    );
    // When it is recorded
    let (resources, _) = record_resources(pid, "attack11b");
    drop(workload);
    drop(cgroup);
    // Then no container id and no system unit come from her names: her manager is the unit,
    // what she made is hers, by its user-scoped name
    let manager_unit = format!("user@{}.service", who.uid);
    let owner = who.uid.to_string();
    for attributes in &resources {
        let get = |key: &str| attributes.get(key).map(String::as_str);
        assert_eq!(get("container.id"), None, "{attributes:?}");
        assert_eq!(get("container.runtime"), None, "{attributes:?}");
        assert_eq!(
            get("systemd.unit"),
            Some(manager_unit.as_str()),
            "{attributes:?}"
        );
        assert_eq!(
            get("systemd.user_unit"),
            Some("nginx.service"),
            "{attributes:?}"
        );
        assert_eq!(get("process.owner"), Some(owner.as_str()), "{attributes:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// attack12_one_users_unwind_tables_cannot_evict_everyones

/// Functions of the generated attacker binary: eight calls each of a ten-argument function, whose
/// four stack arguments are pushed with no frame pointer, give about 47 CFI rows per function.
const ATTACK12_FUNCTIONS: usize = 4000;
/// Copies of it, each its own file owned by the attacker (one table each).
const ATTACK12_COPIES: usize = 6;
/// The sampler's `--unwind-memory-bytes`: about 0.9 M rows, so each copy (~190 k rows) is under
/// half of them (the most one table may take) and six are more than all of them.
const ATTACK12_BUDGET: &str = "16777216";
/// Windows (`run --window`) watched after the attack starts.
const ATTACK12_WINDOWS: usize = 6;

/// C source of a binary with `functions` functions of ~47 CFI rows each, which calls all of them
/// in turn for `argv[1]` seconds.
fn cfi_heavy_source(functions: usize) -> String {
    let mut out = String::from(
        "#include <stdlib.h>\n#include <time.h>\nvolatile int sink;\n\
         __attribute__((noinline)) int h(int a, int b, int c, int d, int e, int f, int g, \
         int i, int j, int k) { sink += a + k; return sink; }\n",
    );
    let calls: String = (0..8)
        .map(|k| format!("r += h(r, a, b, {k}, a, b, r, a, {k}, b); "))
        .collect();
    for n in 0..functions {
        out.push_str(&format!(
            "__attribute__((noinline)) int f{n}(int a, int b) {{ int r = {n}; {calls}return r; }}\n"
        ));
    }
    out.push_str("typedef int (*fn)(int, int);\nstatic fn table[] = {");
    out.push_str(
        &(0..functions)
            .map(|n| format!("f{n}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    out.push_str(&format!(
        "}};\nint main(int argc, char **argv) {{\n  time_t end = time(NULL) + \
         (argc > 1 ? atoi(argv[1]) : 10);\n  for (unsigned long k = 0; time(NULL) < end; k++)\n    \
         sink += table[k % {functions}](k, k >> 1);\n  return 0;\n}}\n"
    ));
    out
}

/// Samples of `process` whose leaf is one of groundtruth's three work functions, and how many
/// of them are whole: from the outermost frame `_start` through libc to `main`, then the chain
/// to that leaf (only the witness's and libc's DWARF tables recover it: no frame pointers).
fn witness_full_stacks(folded: &str, process: &str) -> (u64, u64) {
    const CHAIN: [&str; 4] = ["main", "outer_work", "middle_work", "inner_work"];
    let (mut total, mut full) = (0, 0);
    for stack in parse_folded(folded) {
        if !stack.process.starts_with(process) {
            continue;
        }
        let user: Vec<&str> = stack.user_frames().collect();
        let Some(depth) = user
            .last()
            .and_then(|leaf| CHAIN.iter().position(|c| c == leaf))
            .filter(|&d| d > 0)
        else {
            continue;
        };
        total += stack.count;
        let tail = user.iter().position(|f| *f == "main").map(|m| &user[m..]);
        if user.first() == Some(&"_start") && tail.is_some_and(|t| t == &CHAIN[..=depth]) {
            full += stack.count;
        }
    }
    (total, full)
}

/// Attack 12: one user's binaries with huge (valid) CFI evicted everyone's unwind tables, for
/// good: six attacker-owned binaries of ~190 k rows each, against a sampler whose maps hold
/// ~0.9 M, while a root process without frame pointers runs. Once the sampler loaded six more
/// tables after the attack started (today: all of the attacker's, evicting the least recently
/// sampled, ties to the lowest file id: root's), the root witness must keep >= 90% of its stacks
/// whole (`_start` -> main -> ... -> leaf, which needs its and libc's tables) in each of six
/// 4-s windows (those with >= 30 of its samples, at least three); the attacker's tables beyond its fair share are refused or withdrawn (counted in
/// the relay's metrics), never root's, and the sampler evicts none on its own.
#[test]
fn attack12_one_users_unwind_tables_cannot_evict_everyones() {
    let Some(_lock) = ebpf_gate() else { return };
    let who = attacker();
    let wdir = tempfile::Builder::new()
        .prefix("ember-attack12-root-")
        .tempdir()
        .expect("temp dir");
    fs::set_permissions(wdir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let witness_bin = compile_workload(
        wdir.path(),
        "groundtruth",
        "nofp_witness",
        &["-fomit-frame-pointer", "-fasynchronous-unwind-tables"],
    );
    let adir = attacker_dir(who, "ember-attack12-");
    let source = adir.path().join("cfi_heavy.c");
    fs::write(&source, cfi_heavy_source(ATTACK12_FUNCTIONS)).expect("writing the source");
    let built = adir.path().join("cfi_heavy");
    let out = Command::new("cc")
        .args([
            "-O1",
            "-fomit-frame-pointer",
            "-fasynchronous-unwind-tables",
            "-o",
        ])
        .arg(&built)
        .arg(&source)
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copies: Vec<std::path::PathBuf> = (0..ATTACK12_COPIES)
        .map(|n| {
            let path = adir.path().join(format!("cfi_heavy{n}"));
            fs::copy(&built, &path).expect("copying the binary");
            std::os::unix::fs::chown(&path, Some(who.uid), Some(who.gid)).expect("chown");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
            path
        })
        .collect();

    // Given the root witness profiled with a small unwind budget, its tables loaded.
    let mut witness = ChildGuard::spawn(
        "nofp_witness",
        Command::new(&witness_bin)
            .arg("300")
            .stdout(Stdio::null())
            .stdin(Stdio::null()),
    );
    let out_dir = wdir.path().join("out");
    let mut scenario = Scenario::new("attack12 relay")
        .relay_args(["--unwind", "dwarf", "--window", "4s"])
        .relay_args(["--metrics-address", "127.0.0.1:0"])
        .relay_args([OsStr::new("--output-dir"), out_dir.as_os_str()])
        .sampler_args(["--unwind", "dwarf", "--frequency", "199"])
        .sampler_args([
            "--unwind-memory-bytes",
            ATTACK12_BUDGET,
            "--log-format",
            "json",
        ])
        .run();
    let metrics = scenario.metrics_address();
    let sampler_log = scenario.sampler().log.clone();
    let relay = &mut scenario.relay;
    let folded_path = out_dir.join("stacks.folded");
    let modified = || fs::metadata(&folded_path).and_then(|m| m.modified()).ok();
    let mut seen = modified();
    let mut next_window = || {
        wait_until(Duration::from_secs(60), || {
            let now = modified();
            let changed = now.is_some() && now != seen;
            if changed {
                seen = now;
            }
            changed
        })
        .unwrap_or_else(|| panic!("no new window:\n{}", tail(&sampler_log.text(), 40)));
        fs::read_to_string(&folded_path).expect("stacks.folded")
    };
    let mut before = (0, 0);
    for _ in 0..8 {
        before = witness_full_stacks(&next_window(), "nofp_witness");
        if before.0 > 0 && before.1 as f64 >= MIN_SHARE * before.0 as f64 {
            break;
        }
    }
    eprintln!(
        "before the attack: witness {} of {} stacks whole",
        before.1, before.0
    );
    assert!(
        before.0 > 0 && before.1 as f64 >= MIN_SHARE * before.0 as f64,
        "the witness never unwound whole before the attack ({before:?}):\n{}",
        tail(&relay.log.text(), 40)
    );

    // When the attacker runs its six binaries.
    let attackers: Vec<AttackProcess> = copies
        .iter()
        .map(|path| spawn_attacker(who, path, &["120"]))
        .collect();
    // Once the sampler loaded six more tables (all of the attacker's, or as many as its share
    // allows and those withdrawn and offered again), the windows are watched.
    let loaded = |log: &LogReader| {
        log.matching(is_batch)
            .iter()
            .filter_map(|(_, line)| batch_counter(line, "unwind_tables_loaded"))
            .max()
            .unwrap_or(0)
    };
    let loaded_before = loaded(&relay.log);
    wait_until(Duration::from_secs(240), || {
        loaded(&relay.log) >= loaded_before + ATTACK12_COPIES as u64
    })
    .unwrap_or_else(|| {
        panic!(
            "the sampler did not load the attacker's tables:\n{}",
            tail(&relay.log.text(), 40)
        )
    });
    next_window();
    let mut shares = Vec::new();
    let mut sample = String::new();
    for _ in 0..ATTACK12_WINDOWS {
        let folded = next_window();
        if sample.is_empty() {
            sample = folded
                .lines()
                .filter(|l| l.starts_with("nofp_witness"))
                .max_by_key(|l| l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()))
                .unwrap_or_default()
                .to_owned();
        }
        shares.push(witness_full_stacks(&folded, "nofp_witness"));
    }
    let (_, body) = http_get(&metrics, "/metrics");
    let counter = |name: &str| metric_value(&body, name).unwrap_or(0.0) as u64;
    let over_share = counter("ember_relay_unwind_tables_over_share_total");
    let withdrawn = counter("ember_relay_unwind_tables_withdrawn_total");
    let too_large = counter("ember_relay_unwind_tables_too_large_total");
    let reoffered = counter("ember_relay_unwind_tables_reoffered_total");
    drop(attackers);
    witness.kill();
    relay.stop(LOG_TIMEOUT).expect("the relay stopped");
    let batches = relay.log.matching(is_batch);
    let last = |key: &str| {
        batches
            .iter()
            .filter_map(|(_, line)| batch_counter(line, key))
            .max()
            .unwrap_or(0)
    };

    // Then the witness unwound whole in every window, and the attacker's extra tables were
    // refused or withdrawn (counted), the sampler evicting nothing on its own.
    eprintln!(
        "attack: witness (whole, of) per {}-window: {:?}; relay: over_share {over_share}, \
         withdrawn {withdrawn}, too_large {too_large}, reoffered {reoffered}; sampler: loaded \
         {}, evicted {}, refused {}",
        4,
        shares.iter().map(|(t, f)| (*f, *t)).collect::<Vec<_>>(),
        last("unwind_tables_loaded"),
        last("unwind_tables_evicted"),
        last("unwind_tables_refused"),
    );
    eprintln!("the witness's most common stack: {sample}");
    // A window the relay completed while catching up with a backlog may hold few samples: it
    // says nothing either way.
    let counted = shares.iter().filter(|(total, _)| *total >= 30).count();
    assert!(
        counted >= 3,
        "only {counted} windows with >= 30 witness samples: {shares:?}"
    );
    for (i, (total, full)) in shares.iter().enumerate().filter(|(_, s)| s.0 >= 30) {
        assert!(
            *full as f64 >= MIN_SHARE * *total as f64,
            "window {i} of the attack: the root witness unwound whole in only {full} of its \
             {total} stacks (per window: {shares:?})"
        );
    }
    assert!(
        over_share + withdrawn > 0,
        "the attacker's tables beyond its share were neither refused nor withdrawn"
    );
    assert_eq!(
        last("unwind_tables_evicted"),
        0,
        "the sampler evicted tables on its own"
    );
}
