//! Labels end to end: real processes through the real sampler and `ember-relay record`
//! into a real OTLP receiver, checked from the decoded requests (our decoders for both wire
//! generations, and the official Python `opentelemetry-proto` when scripts/setup.sh installed
//! it). Root only (eBPF); every test holds `ebpf_lock()`.
//!
//! Five copies of the `spinner` workload under different names: one names its service through
//! `OTEL_SERVICE_NAME` (and carries a secret in another variable, which must never reach the
//! relay), one through `OTEL_RESOURCE_ATTRIBUTES` (plus a `team` attribute), one through nothing
//! (its executable names it), one renamed by a `replace` rule of the config file, one dropped by
//! a `drop` rule; a sixth is left out by `--process-filter`. Another copy runs in a systemd-style
//! unit the test creates under /sys/fs/cgroup (v2, or v1's `name=systemd` hierarchy) and must be
//! named after it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, fs, os::unix::fs::PermissionsExt as _, process::Stdio, thread};
use std::{process::Command, time::Duration};

use ember_tests::{
    otlp::{self, Receiver},
    *,
};

const RECORD_TIMEOUT: Duration = Duration::from_secs(180);
const SECRET: &str = "hunter2-never-leaves-the-sampler";

const RULES: &str = "\
labels:
  cluster: e2e
relabel_configs:
  - source_labels: [process.executable.name]
    regex: delta
    target_label: service.name
    replacement: renamed-by-rule
  - source_labels: [process.executable.name]
    regex: noisy
    action: drop
";

/// What each workload copy is called and started with.
fn workloads_to_start() -> [(&'static str, Vec<(&'static str, &'static str)>); 6] {
    [
        (
            "alpha",
            vec![
                ("OTEL_SERVICE_NAME", "checkout"),
                ("EMBER_E2E_SECRET", SECRET),
            ],
        ),
        (
            "beta",
            vec![(
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ledger,team=finance",
            )],
        ),
        ("gamma", vec![]),
        ("delta", vec![]),
        ("noisy", vec![]),
        ("outsider", vec![]),
    ]
}

/// Expected `service.name` per executable name; `None`: nothing of it may arrive.
fn expected_service(executable: &str) -> Option<&'static str> {
    match executable {
        "alpha" => Some("checkout"),
        "beta" => Some("ledger"),
        "gamma" => Some("gamma"),
        "delta" => Some("renamed-by-rule"),
        _ => None,
    }
}

#[test]
fn labels_reach_the_receiver_per_process_for_both_generations() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.path().join("relay.yaml");
    fs::write(&config, RULES).unwrap();
    // Given six copies of a CPU burner under different names and environments
    let mut children = Vec::new();
    for (name, env) in workloads_to_start() {
        let path = dir.path().join(name);
        fs::copy(&workloads().spinner, &path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let mut command = Command::new(&path);
        command
            .arg("120")
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        children.push(ChildGuard::spawn(name, &mut command));
    }
    thread::sleep(Duration::from_millis(300));
    for version in ["1.9", "1.10"] {
        check_generation(version, &config);
    }
    drop(children);
}

/// Records the whole machine for a few seconds with the rules, `--tags`, `--process-filter` and
/// `--folded-root service`, exporting over gRPC in `version`, and checks what arrived.
fn check_generation(version: &str, config: &std::path::Path) {
    let receiver = Receiver::grpc(None);
    let url = receiver.url();
    let recorded = record(
        &[
            "--duration",
            "5s",
            "--frequency",
            "199",
            "--config",
            config.to_str().unwrap(),
            "--tags",
            "region=lab;cluster=from-flag",
            "--process-filter",
            "alpha|beta|gamma|delta|noisy",
            "--folded-root",
            "service",
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
    // When the requests are decoded
    let mut services: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for r in &received {
        // Then the secret is in no request's bytes
        let needle = SECRET.as_bytes();
        assert!(
            !r.body.windows(needle.len()).any(|w| w == needle),
            "v{version}: the secret reached the receiver"
        );
        let decoded = otlp::decode(version, &r.body).unwrap();
        for resource in decoded.resources {
            let attributes = resource.attributes;
            let executable = attributes["process.executable.name"].clone();
            let expected = expected_service(&executable).unwrap_or_else(|| {
                panic!("v{version}: {executable} must not arrive: {attributes:?}")
            });
            // And each process has its service name by the precedence, the tags and its facts
            assert_eq!(attributes["service.name"], expected, "{attributes:?}");
            assert_eq!(
                attributes["cluster"], "from-flag",
                "--tags wins over labels:"
            );
            assert_eq!(attributes["region"], "lab");
            assert_eq!(attributes["process.owner"], "root");
            assert_eq!(attributes["os.type"], "linux");
            assert!(
                attributes.contains_key("host.name") && !attributes.contains_key("process.pid")
            );
            assert!(
                !attributes
                    .keys()
                    .any(|k| k.starts_with("__") || k == "thread.id"),
                "meta labels and per-sample attributes stay out of the resource: {attributes:?}"
            );
            services.insert(executable, attributes);
        }
    }
    assert_eq!(
        services.keys().map(String::as_str).collect::<Vec<_>>(),
        ["alpha", "beta", "delta", "gamma"],
        "v{version}: each kept process arrives"
    );
    assert_eq!(
        services["beta"].get("team").map(String::as_str),
        Some("finance")
    );
    assert_eq!(services["alpha"].get("team"), None);
    // And the official decoder of this generation reads the same resources
    if let Some(python) = otlp::python_decoder(version) {
        let bodies: Vec<&[u8]> = received.iter().map(|r| r.body.as_slice()).collect();
        let facts = otlp::python_decode(&python, &bodies, false);
        let names: std::collections::BTreeSet<String> = facts["requests"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|request| request["profiles"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| {
                p["resource_attributes"]["service.name"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["checkout", "gamma", "ledger", "renamed-by-rule"],
            "v{version}: official decoder"
        );
    } else {
        skip("the Python OTLP decoders (.tools/py-otlp-*) are missing; official-decoder check left out");
    }
    // And stacks.folded is rooted at service names, with nothing of the dropped processes
    let folded = recorded.folded_text();
    for service in ["checkout;", "ledger;", "gamma;", "renamed-by-rule;"] {
        assert!(
            folded.lines().any(|l| l.starts_with(service)),
            "no {service} root in stacks.folded:\n{folded}"
        );
    }
    assert!(
        !folded.contains("noisy") && !folded.contains("outsider"),
        "{folded}"
    );
    // And the relay said what it left out (the drop rule, the filter)
    let counted = recorded
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|v| {
            message(&v).starts_with("labels stage")
                && field_u64(&v, "processes_dropped").is_some_and(|n| n >= 1)
                && field_u64(&v, "processes_filtered").is_some_and(|n| n >= 1)
                && field_u64(&v, "samples_dropped").is_some_and(|n| n >= 1)
        });
    assert!(
        counted,
        "no labels stage line counting the drop and the filter:\n{}",
        recorded.stderr
    );
}

/// A cgroup this test made for one workload, in the hierarchy systemd places processes in:
/// cgroup v2 (`/sys/fs/cgroup` is the unified mount) or v1's `name=systemd` hierarchy
/// (`/sys/fs/cgroup/systemd`). On v1 the process is moved in that hierarchy only, as on a host
/// without the unified one (CentOS 7), so its `/proc/PID/cgroup` names the unit on the
/// `name=systemd` line alone: the relay must read the v1 line the sampler forwards. Removed on
/// drop, the process moved back to the root first, whatever the test did.
struct TestCgroup {
    root: std::path::PathBuf,
    slice: std::path::PathBuf,
    unit: std::path::PathBuf,
}

impl TestCgroup {
    const SLICE: &'static str = "ember-test.slice";

    /// The hierarchy to use and its layout's name.
    fn hierarchy() -> (std::path::PathBuf, &'static str) {
        let base = std::path::Path::new("/sys/fs/cgroup");
        if base.join("cgroup.controllers").exists() {
            (base.to_owned(), "v2")
        } else {
            (base.join("systemd"), "v1 name=systemd")
        }
    }

    fn create(unit: &str) -> Self {
        let (root, layout) = Self::hierarchy();
        assert!(
            root.join("cgroup.procs").exists(),
            "no cgroup hierarchy for systemd at {} ({layout})",
            root.display()
        );
        eprintln!("cgroup layout: {layout} at {}", root.display());
        let slice = root.join(Self::SLICE);
        let unit = slice.join(unit);
        fs::create_dir_all(&unit).unwrap_or_else(|e| panic!("creating {}: {e}", unit.display()));
        Self { root, slice, unit }
    }

    fn enter(&self, pid: u32) {
        fs::write(self.unit.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.unit.display()));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let procs = fs::read_to_string(self.unit.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = fs::write(self.root.join("cgroup.procs"), pid);
        }
        for dir in [&self.unit, &self.slice] {
            if let Err(err) = fs::remove_dir(dir) {
                eprintln!("removing {}: {err}", dir.display());
            }
        }
    }
}

#[test]
fn a_process_in_a_systemd_unit_is_named_after_it() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // Given a workload moved into a systemd-style unit of a slice
    let unit = format!("ember-test-{}.service", std::process::id());
    let exe = dir.path().join("unitworker");
    fs::copy(&workloads().spinner, &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let cgroup = TestCgroup::create(&unit);
    let mut command = Command::new(&exe);
    command.arg("60").stdin(Stdio::null()).stdout(Stdio::null());
    let workload = ChildGuard::spawn("unitworker", &mut command);
    cgroup.enter(workload.pid());
    let text = fs::read_to_string(format!("/proc/{}/cgroup", workload.pid())).unwrap();
    assert!(
        text.contains(&format!("/{}/{unit}", TestCgroup::SLICE)),
        "{text}"
    );
    // When it is recorded with a --service-name default, exporting over OTLP
    let receiver = Receiver::grpc(None);
    let pid = workload.pid().to_string();
    let recorded = record(
        &[
            "--duration",
            "3s",
            "--pid",
            &pid,
            "--service-name",
            "flag-default",
            "--otlp-endpoint",
            &receiver.url(),
            "--otlp-protocol",
            "grpc",
            "--otlp-proto-version",
            "1.10",
            "--log-format",
            "json",
        ],
        RECORD_TIMEOUT,
    );
    // Then its resource names the unit and the slice, and the unit (without .service) names
    // the service, over the --service-name default and the executable name
    let resources: Vec<BTreeMap<String, String>> = receiver
        .received()
        .iter()
        .flat_map(|r| otlp::decode("1.10", &r.body).unwrap().resources)
        .map(|r| r.attributes)
        .filter(|a| a.get("process.executable.name").map(String::as_str) == Some("unitworker"))
        .collect();
    assert!(
        !resources.is_empty(),
        "no profile of the workload arrived:\n{}",
        recorded.stderr
    );
    let service = unit.trim_end_matches(".service");
    for attributes in &resources {
        assert_eq!(
            attributes.get("systemd.unit"),
            Some(&unit),
            "{attributes:?}"
        );
        assert_eq!(
            attributes.get("systemd.slice").map(String::as_str),
            Some(TestCgroup::SLICE),
            "{attributes:?}"
        );
        assert_eq!(
            attributes.get("service.name").map(String::as_str),
            Some(service),
            "{attributes:?}"
        );
    }
    drop(workload);
    drop(cgroup);
}

/// The workload's resources (attributes) in what `receiver` got, and whether any request's
/// bytes hold `needle`.
fn resources_of(
    receiver: &Receiver,
    executable: &str,
    needle: &str,
) -> (Vec<BTreeMap<String, String>>, bool) {
    let received = receiver.received();
    let leaked = received
        .iter()
        .any(|r| r.body.windows(needle.len()).any(|w| w == needle.as_bytes()));
    let resources = received
        .iter()
        .flat_map(|r| otlp::decode("1.10", &r.body).unwrap().resources)
        .map(|r| r.attributes)
        .filter(|a| a.get("process.executable.name").map(String::as_str) == Some(executable))
        .collect();
    (resources, leaked)
}

#[test]
fn the_command_line_leaves_the_sampler_only_when_asked() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // Given a workload with an argument that must not leave the machine by default
    const ARGUMENT: &str = "--token=argv-secret-4711";
    let exe = dir.path().join("cmdworker");
    fs::copy(&workloads().spinner, &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = Command::new(&exe);
    command
        .args(["60", ARGUMENT, "two words"])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let workload = ChildGuard::spawn("cmdworker", &mut command);
    let pid = workload.pid().to_string();
    for with_flag in [false, true] {
        // When it is recorded without, then with --command-line
        let receiver = Receiver::grpc(None);
        let url = receiver.url();
        let mut args = vec![
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
        ];
        if with_flag {
            args.push("--command-line");
        }
        let recorded = record(&args, RECORD_TIMEOUT);
        let (resources, leaked) = resources_of(&receiver, "cmdworker", "argv-secret-4711");
        assert!(
            !resources.is_empty(),
            "no profile of the workload arrived:\n{}",
            recorded.stderr
        );
        for attributes in &resources {
            if with_flag {
                // Then with it, the attribute is the argv joined by spaces
                assert_eq!(
                    attributes.get("process.command_line").map(String::as_str),
                    Some(format!("{} 60 {ARGUMENT} two words", exe.display()).as_str()),
                    "{attributes:?}"
                );
            } else {
                assert_eq!(
                    attributes.get("process.command_line"),
                    None,
                    "{attributes:?}"
                );
            }
        }
        // And without it, no byte of any request holds the argument
        assert_eq!(leaked, with_flag, "the argument in the requests: {leaked}");
    }
    drop(workload);
}
