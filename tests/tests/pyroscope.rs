//! What lands in Pyroscope is what ember saw: whole-machine captures by the real sampler and
//! `ember-relay record` into the real OTLP receiver, walked through the model of Pyroscope's
//! ingestion ([`ember_tests::pyroscope`]) under the rules of 1.18/1.19 and of 1.20 on. Root only
//! (eBPF); every test holds `ebpf_lock()`.
//!
//! The machine runs copies of the `spinner` workload (one service, one to four processes) and a
//! stripped copy (no symbols: its own frames are unnamed). Checked: the series of the one service
//! do not grow with its processes under either rule set, no sample's stack is empty and no frame
//! is lost in Pyroscope's view, the stripped binary's frames arrive named after it, and no
//! service is a thread's name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt as _,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use ember_tests::{
    otlp::{self, Decoded, Receiver},
    pyroscope::{self, Rules},
    *,
};

const RECORD_TIMEOUT: Duration = Duration::from_secs(180);

/// Starts `copies` processes of the spinner binary copied to `dir/spinner` (one executable, so
/// one service), and one stripped copy `dir/stripped`.
fn start(dir: &std::path::Path, copies: usize) -> Vec<ChildGuard> {
    let spinner = dir.join("spinner");
    if !spinner.exists() {
        fs::copy(&workloads().spinner, &spinner).unwrap();
        fs::set_permissions(&spinner, fs::Permissions::from_mode(0o755)).unwrap();
        let stripped = dir.join("stripped");
        fs::copy(&workloads().spinner, &stripped).unwrap();
        let status = Command::new("strip")
            .arg("--strip-all")
            .arg(&stripped)
            .status()
            .expect("run strip");
        assert!(status.success(), "strip failed");
        fs::set_permissions(&stripped, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut children = Vec::new();
    let names = std::iter::repeat_n("spinner", copies).chain(["stripped"]);
    for name in names {
        let mut command = Command::new(dir.join(name));
        command.arg("60").stdin(Stdio::null()).stdout(Stdio::null());
        children.push(ChildGuard::spawn(name, &mut command));
    }
    thread::sleep(Duration::from_millis(300));
    children
}

/// Records the whole machine for 3 s into a gRPC receiver in `version`; the decoded requests.
fn capture(version: &str) -> Vec<Decoded> {
    let receiver = Receiver::grpc(None);
    let url = receiver.url();
    let recorded = record(
        &[
            "--duration",
            "3s",
            "--frequency",
            "199",
            "--otlp-endpoint",
            &url,
            "--otlp-protocol",
            "grpc",
            "--otlp-proto-version",
            version,
            "--log-format",
            "json",
        ],
        RECORD_TIMEOUT,
    );
    let received = receiver.received();
    assert!(
        !received.is_empty(),
        "nothing arrived:\n{}",
        recorded.stderr
    );
    received
        .iter()
        .map(|r| otlp::decode(version, &r.body).expect("decodes"))
        .collect()
}

/// The checks every capture passes, whatever the number of processes.
fn check_capture(decoded: &[Decoded], label: &str) {
    for rules in [Rules::V1_18, Rules::V1_20] {
        let view = pyroscope::ingest(decoded, rules);
        assert_eq!(view.empty_stack, 0, "{label} {rules:?}: empty stacks");
        assert_eq!(view.lost_frame, 0, "{label} {rules:?}: lost frames");
        assert_eq!(view.over_label_limit, 0, "{label} {rules:?}");
        assert!(
            view.series.keys().all(|l| !l.contains_key("process_pid")),
            "{label} {rules:?}: a pid is a label"
        );
    }
    // No service is a thread's name: where a service equals a sample's thread name, it is
    // also the executable's name (a process's main thread is named after it).
    let mut thread_named = BTreeSet::new();
    for d in decoded {
        for resource in &d.resources {
            let service = &resource.attributes["service.name"];
            let executable = resource.attributes.get("process.executable.name");
            for sample in &resource.samples {
                if sample.attributes.get("thread.name") == Some(service)
                    && executable != Some(service)
                {
                    thread_named.insert(service.clone());
                }
            }
        }
    }
    assert!(
        thread_named.is_empty(),
        "{label}: services named after a thread: {thread_named:?}"
    );
    // The stripped binary's own frames arrive named after it, and every stack of it has one.
    let stripped: Vec<_> = decoded
        .iter()
        .flat_map(Decoded::samples)
        .filter(|(r, _)| r.attributes["service.name"] == "stripped")
        .map(|(_, s)| s)
        .collect();
    assert!(
        !stripped.is_empty(),
        "{label}: no sample of the stripped copy"
    );
    let named = stripped
        .iter()
        .filter(|s| s.line_names.iter().any(|n| n == "[unknown] stripped"))
        .map(|s| s.count)
        .sum::<i64>();
    let total = stripped.iter().map(|s| s.count).sum::<i64>();
    eprintln!("{label}: {named} of {total} samples of the stripped copy show `[unknown] stripped`");
    assert!(named > 0, "{label}: the stripped copy's frames are unnamed");
}

#[test]
fn series_do_not_grow_with_the_processes_of_a_service() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for version in ["1.9", "1.10"] {
        let mut captures = Vec::new();
        for copies in [1, 4] {
            // Given `copies` processes of one service on the machine
            let children = start(dir.path(), copies);
            // When the whole machine is captured and walked through Pyroscope's rules
            let decoded = capture(version);
            drop(children);
            captures.push((format!("v{version}, {copies} spinner(s)"), decoded));
        }
        let mut series = Vec::new();
        for (label, decoded) in &captures {
            let processes = decoded
                .iter()
                .flat_map(|d| &d.resources)
                .filter(|r| r.attributes["service.name"] == "spinner")
                .count();
            assert!(processes > 0, "{label}: the service is missing");
            let counts = [Rules::V1_18, Rules::V1_20].map(|rules| {
                let view = pyroscope::ingest(decoded, rules);
                pyroscope::report(&format!("{label} {rules:?}"), &view);
                view.series_of("spinner")
            });
            eprintln!(
                "{label}: {processes} resources of the service in all requests, its series under 1.18 / 1.20 \
                 rules: {counts:?}"
            );
            series.push(counts);
        }
        // Then the service has as many series with four processes as with one, under both
        // rule sets (one per thread name: every spinner thread has the same name)
        assert_eq!(
            series[0], series[1],
            "v{version}: series grew with processes"
        );
        assert_eq!(series[1], [1, 1], "v{version}");
        // And every capture keeps its stacks and frames, with no pid label and no service named
        // after a thread
        for (label, decoded) in &captures {
            check_capture(decoded, label);
        }
    }
}
