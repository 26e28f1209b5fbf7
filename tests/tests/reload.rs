//! Reloading the label settings end to end: the real sampler profiles a workload for a
//! real `ember-relay run --config FILE` exporting to an OTLP receiver; the file is rewritten while
//! it runs. Root only (eBPF); holds `ebpf_lock()`.
//!
//! One relay, four versions of its file: a rule naming the workload's service `before-reload`;
//! after SIGHUP, `after-sighup`; then a broken file (SIGHUP refused, `after-sighup` stays); then
//! `after-file-change`, with no signal: the relay sees the file change by itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{fs, os::unix::fs::PermissionsExt as _, path::Path, process::Command, time::Duration};

use ember_tests::{
    otlp::{self, Receiver},
    *,
};
use nix::sys::signal::Signal;
use serde_json::Value;

const WORKLOAD: &str = "reloadee";
const WAIT: Duration = Duration::from_secs(60);

fn config(service: &str) -> String {
    format!(
        "labels: {{ stage: e2e }}\n\
         relabel_configs:\n  \
           - source_labels: [process.executable.name]\n    \
             regex: {WORKLOAD}\n    \
             target_label: service.name\n    \
             replacement: {service}\n"
    )
}

/// A rule that names the service (index 0) and one that cannot compile (index 1).
const BROKEN: &str = "relabel_configs:\n  \
    - source_labels: [process.executable.name]\n    \
      target_label: service.name\n    \
      replacement: from-the-broken-file\n  \
    - regex: '(unclosed'\n";

/// The workload's `service.name` in each request received so far, in order (one entry per
/// request; a request holding samples from both sides of a swap names both).
fn names_per_request(receiver: &Receiver) -> Vec<Vec<String>> {
    receiver
        .received()
        .iter()
        .map(|r| {
            let decoded = otlp::decode("1.10", &r.body).unwrap();
            let mut names: Vec<String> = decoded
                .resources
                .iter()
                .filter(|res| {
                    res.attributes
                        .get("process.executable.name")
                        .map(String::as_str)
                        == Some(WORKLOAD)
                })
                .map(|res| res.attributes["service.name"].clone())
                .collect();
            names.sort();
            names.dedup();
            names
        })
        .collect()
}

/// Waits for a request from index `from` on that names the workload's service `name`; returns
/// its index.
fn wait_for_name(receiver: &Receiver, from: usize, name: &str, log: &LogReader) -> usize {
    let mut found = None;
    wait_until(WAIT, || {
        found = names_per_request(receiver)
            .iter()
            .enumerate()
            .skip(from)
            .find(|(_, names)| names.iter().any(|n| n == name))
            .map(|(i, _)| i);
        found.is_some()
    });
    found.unwrap_or_else(|| {
        panic!(
            "no request naming {name} after #{from}: {:?}\nrelay log:\n{}",
            names_per_request(receiver),
            log.text()
        )
    })
}

fn is_reload(line: &Value, outcome: &str, trigger: &str) -> bool {
    message(line) == outcome && field_text(line, "trigger").as_deref() == Some(trigger)
}

fn write_config(path: &Path, text: &str) {
    // Written to a new file and renamed over the old one, as editors and ConfigMaps do.
    let tmp = path.with_extension("new");
    fs::write(&tmp, text).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).unwrap();
    fs::rename(&tmp, path).unwrap();
}

#[test]
fn sighup_and_a_changed_file_reload_the_rules_and_a_broken_file_is_refused() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("relay.yaml");
    write_config(&path, &config("before-reload"));
    // Given a workload, a relay with the first rule exporting to a receiver, and a sampler
    let exe = dir.path().join(WORKLOAD);
    fs::copy(&workloads().spinner, &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let workload = ChildGuard::spawn(WORKLOAD, Command::new(&exe).arg("120"));
    let receiver = Receiver::grpc(None);
    let socket = dir.path().join("ember.sock");
    let mut relay = spawn_relay_run(
        "relay",
        &socket,
        &[
            "--config",
            path.to_str().unwrap(),
            "--otlp-endpoint",
            &receiver.url(),
            "--otlp-protocol",
            "grpc",
            "--otlp-proto-version",
            "1.10",
        ],
    );
    let pid = workload.pid().to_string();
    let (_sampler, _sampler_log) = spawn_sampler("sampler", &socket, &["--pid", &pid]);
    let first = wait_for_name(&receiver, 0, "before-reload", &relay.log);

    // When the file gets a new rule and the relay SIGHUP
    write_config(&path, &config("after-sighup"));
    let before_signal = receiver.received().len();
    let log_mark = relay.log.len();
    relay.child.signal(Signal::SIGHUP);
    // Then it logs the reload, and later requests carry the new name, earlier ones the old
    let (reloaded_at, line) = relay.log.expect(log_mark, WAIT, "SIGHUP reload", |l| {
        is_reload(l, "config reloaded", "SIGHUP")
    });
    assert_eq!(field_u64(&line, "relabel_rules"), Some(1), "{line}");
    assert_eq!(field_u64(&line, "reloads_refused"), Some(0), "{line}");
    let renamed = wait_for_name(&receiver, before_signal, "after-sighup", &relay.log);
    let names = names_per_request(&receiver);
    assert!(first < before_signal);
    for (i, request) in names.iter().enumerate() {
        let allowed: &[&str] = match i {
            i if i < before_signal => &["before-reload"],
            i if i <= renamed => &["before-reload", "after-sighup"],
            _ => &["after-sighup"],
        };
        assert!(
            request.iter().all(|n| allowed.contains(&n.as_str())),
            "request #{i} names {request:?}, expected only {allowed:?} (signal at #{before_signal}, \
             renamed at #{renamed}): {names:?}"
        );
    }

    // When the file is broken and the relay SIGHUP
    write_config(&path, BROKEN);
    let log_mark = relay.log.len().max(reloaded_at + 1);
    relay.child.signal(Signal::SIGHUP);
    // Then the reload is refused with the file, the bad rule's index and the fix
    let (_, refusal) = relay.log.expect(log_mark, WAIT, "refused reload", |l| {
        is_reload(l, "config reload refused", "SIGHUP")
    });
    let error = field_text(&refusal, "error").unwrap_or_default();
    assert!(
        error.contains(path.to_str().unwrap()) && error.contains("relabel_configs[1]"),
        "{refusal}"
    );
    assert!(
        field_text(&refusal, "fix").is_some_and(|f| f.contains("validate")),
        "{refusal}"
    );
    assert!(field_u64(&refusal, "reloads_refused").is_some_and(|n| n >= 1));
    // And the rule in effect stays: the next two requests still say after-sighup
    let after_refusal = receiver.received().len();
    let next = wait_for_name(&receiver, after_refusal, "after-sighup", &relay.log);
    wait_for_name(&receiver, next + 1, "after-sighup", &relay.log);
    let names = names_per_request(&receiver);
    assert!(
        names[after_refusal..]
            .iter()
            .flatten()
            .all(|n| n == "after-sighup"),
        "{names:?}"
    );

    // When the file is fixed with no signal
    let log_mark = relay.log.len();
    write_config(&path, &config("after-file-change"));
    // Then the relay notices the change by itself and the new rule applies
    let (_, line) = relay.log.expect(log_mark, WAIT, "file-change reload", |l| {
        is_reload(l, "config reloaded", "file changed")
    });
    // (and the counters say at least two reloads applied (SIGHUP and this one; the watch may
    // also have seen the first edit before the signal), at least one refused)
    assert!(
        field_u64(&line, "reloads_applied").is_some_and(|n| n >= 2),
        "{line}"
    );
    assert!(
        field_u64(&line, "reloads_refused").is_some_and(|n| n >= 1),
        "{line}"
    );
    let changed = receiver.received().len();
    let renamed = wait_for_name(&receiver, changed, "after-file-change", &relay.log);
    wait_for_name(&receiver, renamed + 1, "after-file-change", &relay.log);
    assert!(
        relay.child.try_wait().is_none(),
        "the relay must still run:\n{}",
        relay.log.text()
    );
    drop(workload);
}
