#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The deployments run for real: the Compose pair on a real Docker engine and the systemd unit
//! pair under a real systemd, each profiling with the real eBPF program and exporting to an OTLP
//! receiver of the test (tests/src/otlp.rs) on the host's loopback, as shipped but for what the
//! test must change (an offline image build, the receiver instead of Pyroscope), which is said
//! where it is changed.
//!
//! What they need (scripts/setup.sh installs and caches it): `dockerd` and `docker-compose`
//! (Debian's docker.io and docker-compose), `systemd-nspawn` (systemd-container), and the Debian
//! root of scripts/deploy-roots.sh under /var/cache/ember/deploy. Nothing is skipped: a missing
//! piece fails the test naming the fix. Each test starts and stops its own engine or container,
//! also when it fails (Drop guards in tests/src/dockerd.rs and tests/src/nspawn.rs).
//!
//! ```text
//! cargo build --workspace
//! sudo -E cargo test -p ember-tests --test deploy_live -- --test-threads=1 --nocapture
//! ```

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use ember_tests::{
    dockerd::{Dockerd, Project, BASE_IMAGE},
    ebpf_lock,
    nspawn::{debian_root, Booted},
    otlp::{self, Receiver},
    privileged, proc_status, relay_bin, sampler_bin, status_field, wait_until, workloads,
    ChildGuard,
};
use serde_json::Value;

/// How long profiles of a workload may take to arrive: the sampler's 5 s interval, the relay's
/// export, a restart. Only keeps a broken deployment from hanging the suite.
const ARRIVAL: Duration = Duration::from_secs(60);

/// `systemd-analyze security` exposure limits of the live units (tests/tests/deploy.rs holds
/// the same limits for the files read offline).
const RELAY_MAX_EXPOSURE: f64 = 2.0;
const SAMPLER_MAX_EXPOSURE: f64 = 5.0;

/// CapEff of the confined sampler: CAP_DAC_READ_SEARCH (2), CAP_SYS_PTRACE (19) and, where the
/// engine could grant it, CAP_CHECKPOINT_RESTORE (40).
const SAMPLER_CAPS: u64 = 1 << 2 | 1 << 19 | 1 << 40;
const SAMPLER_CAPS_WITHOUT_CHECKPOINT_RESTORE: u64 = 1 << 2 | 1 << 19;

/// The host workload of the Compose test (tests/workloads/spinner.c under a name of its own).
const WORKLOAD: &str = "ember-compose-spin";

/// The systemd test's workload runs in this unit of the container.
const SPINNER_UNIT: &str = "ember-spinner.service";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Fails (never skips) naming the package when `tool` is not installed.
fn require(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{tool} is missing: run `sudo scripts/setup.sh` (it installs {package})"
    );
}

/// The attributes of every sample received so far with its resource's, decoded as `version`.
fn resources(receiver: &Receiver, version: &str) -> Vec<BTreeMap<String, String>> {
    receiver
        .received()
        .iter()
        .flat_map(|r| otlp::decode(version, &r.body).unwrap().resources)
        .flat_map(|r| {
            r.samples
                .iter()
                .map(|s| {
                    let mut attributes = r.attributes.clone();
                    attributes.extend(s.attributes.clone());
                    attributes
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn cap_eff(status: &[(String, String)]) -> u64 {
    u64::from_str_radix(status_field(status, "CapEff").unwrap_or("?"), 16)
        .unwrap_or_else(|_| panic!("no CapEff in {status:?}"))
}

fn field<'a>(status: &'a [(String, String)], key: &str) -> &'a str {
    status_field(status, key).unwrap_or_else(|| panic!("no {key} in {status:?}"))
}

// ---------------------------------------------------------------------------------------------
// Compose

#[test]
fn compose_pair_profiles_the_host() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    require("dockerd", "docker.io");
    require("docker-compose", "docker-compose");
    let dir = tempfile::Builder::new()
        .prefix("ember-compose-")
        .tempdir()
        .unwrap();
    let engine = Dockerd::start(dir.path().join("dockerd.log"));
    let version = engine.version();
    engine.ensure_base_image();

    // Given the shipped compose.yaml, plus compose.docker20.yaml on an engine before 23.0 (which
    // refuses CAP_BPF), plus the test's own override: the image built offline from the cached
    // Debian root with this build's binaries (no Rust compiled in the image), the relay on the
    // host's network exporting to the test's receiver instead of Pyroscope.
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("engine version {version:?}"));
    let mut files = vec![repo_root().join("compose/compose.yaml")];
    let sampler_service = if major < 23 {
        files.push(repo_root().join("compose/compose.docker20.yaml"));
        "sampler-docker20"
    } else {
        "sampler"
    };
    println!("Docker Engine {version}: services relay and {sampler_service}");
    let context = dir.path().join("context");
    fs::create_dir(&context).unwrap();
    for binary in [sampler_bin(), relay_bin()] {
        fs::copy(&binary, context.join(binary.file_name().unwrap())).unwrap();
    }
    let receiver = Receiver::grpc(None);
    // The relay's descriptor limit as shipped (65536) is above what this machine lets any
    // process have when it lacks CAP_SYS_RESOURCE in its bounding set; an engine started by
    // systemd has LimitNOFILE=infinity. The test asks for what it can get.
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    let nofile = hard.min(65536);
    let override_file = dir.path().join("compose.test.yaml");
    fs::write(
        &override_file,
        format!(
            "services:\n  relay:\n    build:\n      context: {context}\n      dockerfile: {dockerfile}\n      \
             target: prebuilt\n      args:\n        BASE: {BASE_IMAGE}\n    network_mode: host\n    \
             environment:\n      OTEL_EXPORTER_OTLP_ENDPOINT: {url}\n    ulimits:\n      nofile:\n        \
             soft: {nofile}\n        hard: {nofile}\n",
            context = context.display(),
            dockerfile = repo_root().join("compose/Dockerfile").display(),
            url = receiver.url(),
        ),
    )
    .unwrap();
    files.push(override_file);
    let project = Project::new(&engine, "embertest", files);

    // When the pair is built and brought up (Pyroscope and Grafana are left out: no registry)
    project.run(&["build", "relay"]);
    project.run(&["up", "--detach", "--no-deps", "relay", sampler_service]);
    // and a workload runs on the host, under a name of its own
    let exe = dir.path().join(WORKLOAD);
    fs::copy(&workloads().spinner, &exe).unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = Command::new(&exe);
    command
        .arg("120")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let workload = ChildGuard::spawn(WORKLOAD, &mut command);
    let of_workload = |a: &BTreeMap<String, String>| {
        a.get("process.executable.name").map(String::as_str) == Some(WORKLOAD)
    };

    // Then profiles of the host's workload reach the receiver
    let arrived = wait_until(ARRIVAL, || {
        resources(&receiver, "1.9").iter().any(of_workload)
    });
    assert!(
        arrived.is_some(),
        "no profile of the workload arrived ({} requests); the project's logs:\n{}",
        receiver.received().len(),
        project.logs()
    );
    let spinner = resources(&receiver, "1.9")
        .into_iter()
        .find(of_workload)
        .unwrap();
    if let Some(pid) = spinner.get("process.pid") {
        assert_eq!(*pid, workload.pid().to_string(), "{spinner:?}");
    }
    assert_eq!(
        spinner
            .get("deployment.environment.name")
            .map(String::as_str),
        Some("compose"),
        "the compose file's --tags: {spinner:?}"
    );

    // And the relay runs as 10001 with no capability at all, the sampler confined as designed
    let relay = proc_status(Path::new(&format!(
        "/proc/{}/status",
        engine.container_pid(&project.container("relay"))
    )))
    .expect("the relay's status");
    assert_eq!(field(&relay, "Uid"), "10001\t10001\t10001\t10001");
    for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        assert_eq!(field(&relay, set), "0000000000000000", "relay {set}");
    }
    assert_eq!(field(&relay, "NoNewPrivs"), "1");
    let sampler = proc_status(Path::new(&format!(
        "/proc/{}/status",
        engine.container_pid(&project.container(sampler_service))
    )))
    .expect("the sampler's status");
    assert_eq!(field(&sampler, "Uid"), "65534\t65534\t65534\t65534");
    let expected = if major < 23 {
        SAMPLER_CAPS_WITHOUT_CHECKPOINT_RESTORE
    } else {
        SAMPLER_CAPS
    };
    assert_eq!(cap_eff(&sampler), expected, "sampler CapEff: {sampler:?}");
    assert_eq!(field(&sampler, "NoNewPrivs"), "1");
    assert_eq!(field(&sampler, "Seccomp"), "2", "its own filter");
    drop(workload);
    drop(project);
    drop(engine);
}

// ---------------------------------------------------------------------------------------------
// systemd

/// The relay's batches from its journal: (interval start, interval end) of each, first parts
/// only, in order.
fn batch_intervals(journal: &str) -> Vec<(u64, u64)> {
    let mut intervals: Vec<(u64, u64)> = journal
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|v| v["message"] == "batch received" && v["part"] == 0)
        .filter_map(|v| {
            Some((
                v["interval_start_unix_ns"].as_u64()?,
                v["interval_end_unix_ns"].as_u64()?,
            ))
        })
        .collect();
    intervals.sort_unstable();
    intervals.dedup();
    intervals
}

/// `Overall exposure level for UNIT: 1.2 OK` from `systemd-analyze security`.
fn exposure(output: &str, unit: &str) -> Option<f64> {
    let prefix = format!("Overall exposure level for {unit}:");
    let line = output.lines().find_map(|l| {
        l.find(&prefix)
            .map(|at| l[at + prefix.len()..].trim().to_owned())
    })?;
    line.split_whitespace().next()?.parse().ok()
}

#[test]
fn systemd_pair_profiles_the_host() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    require("systemd-nspawn", "systemd-container");
    require("nsenter", "util-linux");
    // Two systemd versions: they differ in what a unit's settings grant (systemd >= 255 took
    // CAP_SETUID from the sampler unless it is ambient).
    for suite in ["bookworm", "trixie"] {
        println!("Debian {suite}:");
        systemd_pair_in(&debian_root(suite));
    }
}

fn systemd_pair_in(root: &Path) {
    let dir = tempfile::Builder::new()
        .prefix("ember-systemd-")
        .tempdir()
        .unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();

    // Given a Debian root booted by systemd-nspawn (its own pid namespace), with the shipped
    // units, this build's binaries where the units expect them, a workload, and the relay's
    // environment file pointing OTLP at the test's receiver
    let receiver = Receiver::grpc(None);
    let env = dir.path().join("relay.env");
    fs::write(
        &env,
        format!(
            "OTEL_EXPORTER_OTLP_ENDPOINT={}\nOTEL_EXPORTER_OTLP_PROTOCOL=grpc\n",
            receiver.url()
        ),
    )
    .unwrap();
    let units = repo_root().join("systemd");
    let binds = [
        (sampler_bin(), "/usr/local/bin/ember-sampler"),
        (relay_bin(), "/usr/local/bin/ember-relay"),
        (
            units.join("ember-sampler.service"),
            "/etc/systemd/system/ember-sampler.service",
        ),
        (
            units.join("ember-relay.service"),
            "/etc/systemd/system/ember-relay.service",
        ),
        (env, "/etc/ember/relay.env"),
        (workloads().spinner.clone(), "/usr/local/bin/ember-spinner"),
    ];
    let container = Booted::boot(root, &binds, dir.path().join("console.log"));
    let version = container.run(&["systemctl", "--version"]);
    println!("container: {}", version.lines().next().unwrap_or_default());

    // When both units start, and a workload runs in a unit of its own
    container.run(&[
        "systemctl",
        "start",
        "ember-relay.service",
        "ember-sampler.service",
    ]);
    container.run(&[
        "systemd-run",
        "--unit",
        SPINNER_UNIT,
        "--quiet",
        "/usr/local/bin/ember-spinner",
        "600",
    ]);
    let spinner_pid = container.main_pid(SPINNER_UNIT);
    assert_ne!(spinner_pid, 0, "the workload's unit has no main pid");
    let spinner = spinner_pid.to_string();
    let journal = || container.journal(&["ember-relay.service", "ember-sampler.service"]);
    let of_spinner = |a: &BTreeMap<String, String>| {
        a.get("systemd.unit").map(String::as_str) == Some(SPINNER_UNIT)
    };
    let spinner_profiles = || {
        resources(&receiver, "1.10")
            .iter()
            .filter(|a| of_spinner(a))
            .count()
    };

    // Then both are active, and the workload's profiles arrive under the pid the container
    // gives it (its /proc's, not the host's) and named after its unit
    assert!(
        wait_until(ARRIVAL, || spinner_profiles() > 0).is_some(),
        "no profile of the workload's unit (pid {spinner} in the container) arrived:\n{}",
        journal()
    );
    for unit in ["ember-relay.service", "ember-sampler.service"] {
        assert_eq!(container.property(unit, "ActiveState"), "active", "{unit}");
    }
    let attributes = resources(&receiver, "1.10")
        .into_iter()
        .find(of_spinner)
        .unwrap();
    if let Some(pid) = attributes.get("process.pid") {
        assert_eq!(*pid, spinner, "{attributes:?}");
    }
    assert_eq!(
        attributes.get("service.name").map(String::as_str),
        Some("ember-spinner"),
        "{attributes:?}"
    );

    // And the relay holds no capability, the sampler is confined as designed
    let relay = container.status(container.main_pid("ember-relay.service"));
    assert_ne!(field(&relay, "Uid").split('\t').next(), Some("0"));
    for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        assert_eq!(field(&relay, set), "0000000000000000", "relay {set}");
    }
    assert_eq!(field(&relay, "NoNewPrivs"), "1");
    assert_eq!(field(&relay, "Seccomp"), "2");
    let sampler_pid = container.main_pid("ember-sampler.service");
    let sampler = container.status(sampler_pid);
    assert_eq!(field(&sampler, "Uid"), "65534\t65534\t65534\t65534");
    assert_eq!(
        cap_eff(&sampler),
        SAMPLER_CAPS,
        "sampler CapEff: {sampler:?}"
    );
    assert_eq!(field(&sampler, "NoNewPrivs"), "1");
    assert_eq!(field(&sampler, "Seccomp"), "2");

    // And the host's tasks, outside the container's pid namespace, are dropped and counted
    let filtered = journal()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|v| v["message"] == "batch received")
        .any(|v| {
            v["losses"]
                .as_str()
                .is_some_and(|l| l.contains("filtered_samples="))
        });
    assert!(
        filtered,
        "no batch counted the host's samples as filtered:\n{}",
        journal()
    );

    // When the relay restarts, the sampler keeps going (same process) and its backlog reaches
    // the new relay: the intervals the relay received stay contiguous
    let before = spinner_profiles();
    container.run(&["systemctl", "restart", "ember-relay.service"]);
    assert!(
        wait_until(ARRIVAL, || spinner_profiles() > before).is_some(),
        "nothing arrived after the relay restarted:\n{}",
        journal()
    );
    assert_eq!(
        container.main_pid("ember-sampler.service"),
        sampler_pid,
        "the sampler restarted with the relay"
    );
    let intervals = batch_intervals(&journal());
    let gaps: Vec<_> = intervals.windows(2).filter(|w| w[0].1 != w[1].0).collect();
    assert!(
        intervals.len() >= 2 && gaps.is_empty(),
        "intervals lost across the relay's restart: {gaps:?} in {intervals:?}"
    );

    // When the sampler restarts, the relay keeps going (same process) and profiles arrive again
    let relay_pid = container.main_pid("ember-relay.service");
    let before = spinner_profiles();
    container.run(&["systemctl", "restart", "ember-sampler.service"]);
    assert!(
        wait_until(ARRIVAL, || spinner_profiles() > before).is_some(),
        "nothing arrived after the sampler restarted:\n{}",
        journal()
    );
    assert_eq!(
        container.main_pid("ember-relay.service"),
        relay_pid,
        "the relay restarted with the sampler"
    );
    for unit in ["ember-relay.service", "ember-sampler.service"] {
        assert_eq!(container.property(unit, "ActiveState"), "active", "{unit}");
        assert_eq!(container.property(unit, "NRestarts"), "0", "{unit} failed");
    }

    // And `systemd-analyze security` of the live units stays within the limits
    for (unit, max) in [
        ("ember-relay.service", RELAY_MAX_EXPOSURE),
        ("ember-sampler.service", SAMPLER_MAX_EXPOSURE),
    ] {
        let output = container.exec(&["systemd-analyze", "security", "--no-pager", unit]);
        let said = String::from_utf8_lossy(&output.stdout);
        let score =
            exposure(&said, unit).unwrap_or_else(|| panic!("no exposure for {unit}:\n{said}"));
        println!("systemd-analyze security {unit} (live): exposure {score:.1} (limit {max:.1})");
        assert!(score <= max, "{unit}: exposure {score:.1} above {max:.1}");
    }
    drop(container);
}
