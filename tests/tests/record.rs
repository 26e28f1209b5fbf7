//! `ember-relay record` as a user drives it: Ctrl-C ends a recording early and every output is
//! still written, from the samples taken until then.

use std::time::Duration;

use ember_tests::*;
use nix::{sys::signal::Signal, unistd::Pid};

const RECORD_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn ctrl_c_ends_a_recording_early_and_still_writes_every_output() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let workload = spawn_workload(&workloads().spinner, 120);
    let pid = workload.pid().to_string();
    let run = spawn_record(&[
        "--duration",
        "120s",
        "--frequency",
        "199",
        "--log-format",
        "json",
        "--pid",
        &pid,
    ]);
    run.log()
        .expect(0, RECORD_TIMEOUT, "a first \"batch received\"", is_batch);
    // A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the relay and the
    // sampler it started.
    let mut group = vec![run.pid()];
    group.extend(children_of(run.pid()));
    assert!(
        group.len() >= 2,
        "record has no sampler child to interrupt: {group:?}"
    );
    for member in &group {
        let member = Pid::from_raw(i32::try_from(*member).expect("pid fits i32"));
        // ESRCH (already gone) is fine: the point is that nobody outlives the signal.
        let _ = nix::sys::signal::kill(member, Signal::SIGINT);
    }
    let recorded = run.finish(RECORD_TIMEOUT);
    let stacks = recorded.folded();
    let hot = total_count(
        stacks
            .iter()
            .filter(|s| s.process == "spinner" && s.leaf() == Some("spin_hot")),
    );
    assert!(
        hot > 0,
        "the interrupted recording kept no spin_hot samples:\n{}",
        recorded.folded_text()
    );
    // The summary covers what was recorded until Ctrl-C, not the 120 s asked for.
    let line = recorded
        .stdout
        .lines()
        .find(|l| l.starts_with("recorded "))
        .unwrap_or_else(|| panic!("no summary line:\n{}", recorded.stdout));
    let seconds: f64 = line
        .rsplit_once(" over ")
        .and_then(|(_, s)| s.trim_end_matches('s').parse().ok())
        .unwrap_or_else(|| panic!("no duration in {line:?}"));
    assert!(
        seconds < 120.0,
        "the summary claims a full recording after Ctrl-C: {line}"
    );
    let profile = recorded.profile();
    assert!(
        profile.total_samples() > 0,
        "profile.pb.gz of the interrupted recording is empty"
    );
    eprintln!(
        "{line}; spin_hot {hot} samples; pprof total {}",
        profile.total_samples()
    );
}
