#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Deployment gates: the systemd units (systemd/), the Compose file (compose/) and the Kubernetes
//! manifests (deploy/kubernetes/) are checked by the real tools users would run, plus a few
//! promises the files make that no tool checks (the sampler's capability list is the same
//! everywhere, the relay holds none and runs as its own uid, the two sides name each other's
//! uids, nothing runs `privileged`, Grafana is not anonymous Admin and nothing listens beyond
//! 127.0.0.1 in Compose, the only cluster role reads pods and only the relay holds its token, the
//! relay learns its node's name from the downward API, the Pyroscope image and the OTLP proto
//! version match).
//!
//! The tools come from `scripts/setup.sh`: `systemd-analyze` (Debian's systemd),
//! `docker-compose` (Debian's v1; `config` needs no Docker engine) and `kubernetes-validate`
//! (PyPI, in `.tools/venv`, with the Kubernetes schemas it ships, so it runs offline). A missing
//! tool skips its test through `ember_tests::skip` (printed and recorded), except under `CI` or
//! `EMBER_REQUIRE_ALL=1` (scripts/test.sh), where it fails.
//!
//! ```text
//! cargo build && cargo test -p ember-tests --test deploy -- --nocapture
//! ```

use std::{
    collections::BTreeSet,
    env, fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use ember_tests::{relay_bin, sampler_bin, skip};

/// `systemd-analyze security` exposure limits (0 = locked down, 10 = unconfined). For scale: the
/// single-process agent unit of the OpenTelemetry eBPF profiler's setup guide scores 7.4.
const RELAY_MAX_EXPOSURE: f64 = 2.0;
const SAMPLER_MAX_EXPOSURE: f64 = 5.0;

/// The capabilities the sampler starts with, in every deployment that lists them (systemd's
/// CapabilityBoundingSet=, Compose's cap_add, the DaemonSet's capabilities.add). Once attached
/// it becomes nobody keeping only CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and
/// CAP_CHECKPOINT_RESTORE (sampler/src/harden.rs).
const SAMPLER_START_CAPS: [&str; 9] = [
    "CAP_BPF",
    "CAP_PERFMON",
    "CAP_SYS_PTRACE",
    "CAP_DAC_READ_SEARCH",
    "CAP_CHECKPOINT_RESTORE",
    "CAP_SETPCAP",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SYSLOG",
];

/// The uid the sampler runs as once attached (its `--user` default, nobody), as the relay sees
/// it through SO_PEERCRED: every relay's `--sampler-uid`.
const SAMPLER_UID: &str = "65534";

/// The relay's own uid in Compose and the DaemonSet (not nobody, which the sampler becomes):
/// the sampler's `--relay-uid` there.
const RELAY_UID: &str = "10001";

/// The relay's metrics and health port (`DEFAULT_PORT` in relay/src/metrics/mod.rs).
const METRICS_PORT: u16 = 17471;

/// The relay's descriptor limit where a deployment sets one.
const RELAY_NOFILE: &str = "65536";

/// Where the units expect the binaries (docs/running.md, Deployments).
const INSTALL_DIR: &str = "/usr/local/bin/";

/// kubernetes-validate's schema versions the manifests are checked against: the oldest
/// Kubernetes they target (securityContext.appArmorProfile is GA since 1.30) and the newest the
/// pinned kubernetes-validate ships.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31.0", "1.37.0"];

// ---------------------------------------------------------------------------------------------
// Helpers

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The first executable among `candidates` (absolute paths, or names looked up on PATH). None,
/// skipped through `ember_tests::skip`, when there is none (a failure where skips are not allowed).
fn require_tool(candidates: &[PathBuf], what: &str) -> Option<PathBuf> {
    let path_dirs: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    for candidate in candidates {
        let found = if candidate.is_absolute() {
            Some(candidate.clone()).filter(|p| is_executable(p))
        } else {
            path_dirs
                .iter()
                .map(|dir| dir.join(candidate))
                .find(|p| is_executable(p))
        };
        if found.is_some() {
            return found;
        }
    }
    let tried: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    skip(&format!(
        "{what} not found (tried {}); run `sudo scripts/setup.sh` to install it",
        tried.join(", ")
    ));
    None
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `command`, echoing it and its output to the test log.
fn run(command: &mut Command) -> Output {
    let output = run_quiet(command);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !stdout.trim().is_empty() {
        eprintln!("stdout:\n{stdout}");
    }
    if !stderr.trim().is_empty() {
        eprintln!("stderr:\n{stderr}");
    }
    eprintln!("exit: {}", output.status);
    output
}

/// Runs `command`, echoing only the command line.
fn run_quiet(command: &mut Command) -> Output {
    eprintln!("running {command:?}");
    command
        .output()
        .unwrap_or_else(|err| panic!("starting {command:?}: {err}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// The values of `key=` in a unit file's text (every occurrence, in order; comments skipped).
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#') && !line.starts_with(';'))
        .filter_map(|line| line.split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
        .collect()
}

/// The one value of `key=` in a unit; panics if it is absent or set more than once.
fn unit_value<'a>(unit: &'a str, name: &str, key: &str) -> &'a str {
    match unit_values(unit, key).as_slice() {
        [value] => value,
        other => panic!("{name}: expected exactly one {key}=, found {other:?}"),
    }
}

/// `Overall exposure level for NAME: 1.2 OK` from `systemd-analyze security`.
fn parse_exposure(output: &str, unit: &str) -> Option<f64> {
    let prefix = format!("Overall exposure level for {unit}:");
    let line = output.lines().find_map(|l| {
        l.find(&prefix)
            .map(|at| l[at + prefix.len()..].trim().to_owned())
    })?;
    line.split_whitespace().next()?.parse().ok()
}

/// The lines of the block under `path` in an indented YAML text (as `docker-compose config`
/// prints it and as our manifests are written). A key is `name` (a mapping key) or `key: value`
/// (a list item such as `name: relay`); a leading `- ` is ignored when matching.
fn yaml_block<'a>(yaml: &'a str, path: &[&str]) -> Vec<&'a str> {
    let mut lines: Vec<&str> = yaml.lines().collect();
    for key in path {
        let header = if key.contains(": ") {
            (*key).to_owned()
        } else {
            format!("{key}:")
        };
        // Direct children only: the least indented lines of the current block.
        let base = lines
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| indent_of(l))
            .min()
            .unwrap_or(0);
        let start = lines
            .iter()
            .position(|l| indent_of(l) == base && l.trim().trim_start_matches("- ") == header)
            .unwrap_or_else(|| panic!("no `{header}` on the path {path:?} in:\n{yaml}"));
        let indent = indent_of(lines[start]);
        let header_is_item = lines[start].trim_start().starts_with("- ");
        lines = lines[start + 1..]
            .iter()
            .copied()
            .take_while(|l| {
                l.trim().is_empty()
                    || indent_of(l) > indent
                    // `key:` followed by its list at the same indent (docker-compose's style).
                    || (!header_is_item
                        && indent_of(l) == indent
                        && l.trim_start().starts_with("- "))
            })
            .collect();
    }
    lines
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// The `- item` entries directly under `key` in `block`, unquoted.
fn yaml_list(block: &[&str], key: &str) -> Vec<String> {
    yaml_block(&block.join("\n"), &[key])
        .iter()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|item| item.trim().trim_matches(['"', '\'']).to_owned())
        .collect()
}

fn has_line(block: &[&str], expected: &str) -> bool {
    block.iter().any(|l| l.trim() == expected)
}

/// The OTLP profiles proto version a Pyroscope release speaks (shared/PROTOCOLS.md): 1.18.x
/// speaks v1.9, >= 1.20 speaks v1.10; 1.19 is not listed there, and older releases speak older
/// generations ember does not export.
fn pyroscope_proto_version(tag: &str) -> Option<&'static str> {
    let mut parts = tag.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next()??, parts.next()??);
    match (major, minor) {
        (1, 18) => Some("1.9"),
        (1, 20..) | (2.., _) => Some("1.10"),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// systemd

#[test]
fn systemd_units_verify_and_are_confined() {
    let Some(analyze) = require_tool(&["systemd-analyze".into()], "systemd-analyze") else {
        return;
    };
    let units = [
        ("ember-relay.service", relay_bin(), RELAY_MAX_EXPOSURE),
        ("ember-sampler.service", sampler_bin(), SAMPLER_MAX_EXPOSURE),
    ];

    // `verify` insists that ExecStart= binaries exist: check copies whose ExecStart points at the
    // binaries this build produced instead of /usr/local/bin, and nothing else changed.
    let tmp = tempfile::Builder::new()
        .prefix("ember-units-")
        .tempdir()
        .expect("creating a temp dir");
    let mut copies = Vec::new();
    for (name, binary, _) in &units {
        let unit = read(&format!("systemd/{name}"));
        let exec = unit_value(&unit, name, "ExecStart");
        let program = binary.file_name().expect("binary name").to_string_lossy();
        let installed = format!("{INSTALL_DIR}{program}");
        assert!(
            exec.starts_with(&format!("{installed} ")),
            "{name}: ExecStart= should run {installed} (docs/running.md, Deployments), not {exec:?}"
        );
        let copy = tmp.path().join(name);
        let replaced = unit.replace(&installed, &binary.display().to_string());
        fs::write(&copy, replaced).expect("writing the unit copy");
        copies.push(copy);
    }
    let output = run(Command::new(&analyze)
        .arg("verify")
        .arg("--man=no")
        .args(&copies)
        .env("SYSTEMD_COLORS", "0")
        .env("SYSTEMD_PAGER", ""));
    let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert!(
        output.status.success(),
        "systemd-analyze verify failed ({}):\n{said}",
        output.status
    );
    // verify exits 0 on unknown keys and unparsable values ("..., ignoring"): any line about our
    // units is a mistake in them.
    let complaints: Vec<&str> = said
        .lines()
        .filter(|l| units.iter().any(|(name, _, _)| l.contains(name)))
        .collect();
    assert!(
        complaints.is_empty(),
        "systemd-analyze verify complained about the units:\n{}",
        complaints.join("\n")
    );

    // Exposure, on the files as shipped (the offline review reads the settings only).
    let mut scores = Vec::new();
    for (name, _, max) in &units {
        let output = run_quiet(
            Command::new(&analyze)
                .args(["security", "--offline=true", "--no-pager"])
                .arg(repo_root().join("systemd").join(name))
                .env("SYSTEMD_COLORS", "0"),
        );
        let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
        assert!(
            output.status.success(),
            "systemd-analyze security {name} failed ({}):\n{said}",
            output.status
        );
        // The settings that still add exposure, and the total.
        for line in said
            .lines()
            .filter(|l| l.starts_with('✗') || l.starts_with('→'))
        {
            eprintln!("  {}", line.trim_end());
        }
        let score = parse_exposure(&said, name)
            .unwrap_or_else(|| panic!("no overall exposure for {name} in:\n{said}"));
        scores.push((*name, score, *max));
    }
    for (name, score, max) in &scores {
        println!(
            "systemd-analyze security --offline=true {name}: exposure {score:.1} (limit {max:.1})"
        );
    }
    for (name, score, max) in &scores {
        assert!(
            score <= max,
            "{name}: exposure {score:.1} is above the limit {max:.1}"
        );
    }

    // What the scores do not pin down.
    let relay = read("systemd/ember-relay.service");
    let sampler = read("systemd/ember-sampler.service");
    let one = |unit: &str, name: &str, key: &str| unit_value(unit, name, key).to_owned();
    assert_eq!(one(&relay, "relay", "CapabilityBoundingSet"), "");
    assert_eq!(one(&relay, "relay", "DynamicUser"), "yes");
    assert_eq!(one(&relay, "relay", "NoNewPrivileges"), "yes");
    assert_eq!(one(&relay, "relay", "ProtectSystem"), "strict");
    assert_eq!(
        one(&relay, "relay", "RestrictAddressFamilies"),
        "AF_UNIX AF_INET AF_INET6"
    );
    assert!(
        unit_values(&relay, "SystemCallFilter").contains(&"@system-service"),
        "relay: SystemCallFilter=@system-service"
    );
    assert!(
        !one(&relay, "relay", "MemoryMax").is_empty(),
        "relay: MemoryMax= bounds it"
    );
    let relay_socket_dir = one(&relay, "relay", "RuntimeDirectory");
    assert_eq!(relay_socket_dir, "ember");
    let caps: BTreeSet<&str> = unit_value(&sampler, "sampler", "CapabilityBoundingSet")
        .split_whitespace()
        .collect();
    assert_eq!(
        caps,
        SAMPLER_START_CAPS.into_iter().collect(),
        "sampler: CapabilityBoundingSet= is the documented start set"
    );
    assert_eq!(one(&sampler, "sampler", "PrivateNetwork"), "yes");
    assert_eq!(
        one(&sampler, "sampler", "RestrictAddressFamilies"),
        "AF_UNIX"
    );
    assert_eq!(one(&sampler, "sampler", "NoNewPrivileges"), "yes");
    // Settings that would hide processes or capabilities from the sampler.
    for key in ["ProtectProc", "ProcSubset", "PrivateUsers", "PrivatePIDs"] {
        assert!(
            unit_values(&sampler, key).is_empty(),
            "sampler: {key}= would stop it from seeing every process"
        );
    }
    assert!(
        unit_values(&sampler, "Wants").contains(&"ember-relay.service")
            && unit_values(&sampler, "After").contains(&"ember-relay.service"),
        "sampler: Wants= and After= ember-relay.service"
    );
    // Both sides agree on the socket and the peer.
    for (name, unit) in [("relay", &relay), ("sampler", &sampler)] {
        assert!(
            one(unit, name, "ExecStart").contains("--socket /run/ember/ember.sock"),
            "{name}: --socket /run/ember/ember.sock (the relay's RuntimeDirectory=ember)"
        );
    }
    assert!(
        one(&relay, "relay", "ExecStart").contains(&format!("--sampler-uid {SAMPLER_UID}")),
        "relay: --sampler-uid {SAMPLER_UID} (the sampler connects as nobody)"
    );
    assert_eq!(
        one(&relay, "relay", "LimitNOFILE"),
        RELAY_NOFILE,
        "relay: LimitNOFILE= (one descriptor per mapped binary)"
    );
    let relay_user = one(&relay, "relay", "User");
    assert!(
        one(&sampler, "sampler", "ExecStart").contains(&format!("--relay-uid {relay_user}")),
        "sampler: --relay-uid {relay_user} (the relay's User=)"
    );
}

// ---------------------------------------------------------------------------------------------
// Compose

#[test]
fn compose_file_is_accepted_by_docker_compose() {
    let Some(compose) = require_tool(&["docker-compose".into()], "docker-compose (v1)") else {
        return;
    };
    let file = repo_root().join("compose/compose.yaml");
    let check = |args: &[&str]| {
        let output = run(Command::new(&compose)
            .current_dir(repo_root())
            .arg("--file")
            .arg(&file)
            .args(args)
            .env("COMPOSE_PROJECT_NAME", "ember"));
        assert!(
            output.status.success(),
            "docker-compose {args:?} rejected {} ({}):\n{}",
            file.display(),
            output.status,
            text(&output.stderr)
        );
        text(&output.stdout)
    };
    let quiet = check(&["config", "-q"]);
    assert!(quiet.trim().is_empty(), "config -q printed:\n{quiet}");
    let services: BTreeSet<String> = check(&["config", "--services"])
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        services,
        ["grafana", "pyroscope", "relay", "sampler"]
            .map(String::from)
            .into(),
        "compose services"
    );

    // The normalized file, as docker-compose resolved it.
    let config = check(&["config"]);
    let relay = yaml_block(&config, &["services", "relay"]);
    let relay_user = format!("user: {RELAY_UID}:{RELAY_UID}");
    for expected in [
        relay_user.as_str(),
        "read_only: true",
        "- no-new-privileges:true",
    ] {
        assert!(
            has_line(&relay, expected),
            "relay: `{expected}` in\n{}",
            relay.join("\n")
        );
    }
    assert_eq!(
        yaml_list(&relay, "cap_drop"),
        ["ALL"],
        "relay: cap_drop: [ALL]"
    );
    assert_eq!(
        yaml_list(&relay, "volumes"),
        ["ember-socket:/run/ember:rw"],
        "relay: shares only the socket volume"
    );
    let relay_text = relay.join("\n");
    let relay_nofile = yaml_block(&relay_text, &["ulimits", "nofile"]);
    for expected in [
        format!("soft: {RELAY_NOFILE}"),
        format!("hard: {RELAY_NOFILE}"),
    ] {
        assert!(
            has_line(&relay_nofile, &expected),
            "relay: ulimits.nofile `{expected}` in\n{}",
            relay_nofile.join("\n")
        );
    }
    assert!(
        !config.lines().any(|l| l.trim().starts_with("privileged:")),
        "no service runs privileged:\n{config}"
    );
    let sampler = yaml_block(&config, &["services", "sampler"]);
    for expected in [
        "pid: host",
        "network_mode: none",
        "- no-new-privileges:true",
    ] {
        assert!(
            has_line(&sampler, expected),
            "sampler: `{expected}` in\n{}",
            sampler.join("\n")
        );
    }
    assert_eq!(
        yaml_list(&sampler, "cap_drop"),
        ["ALL"],
        "sampler: cap_drop: [ALL]"
    );
    let added: BTreeSet<String> = yaml_list(&sampler, "cap_add")
        .into_iter()
        .map(|c| format!("CAP_{c}"))
        .collect();
    assert_eq!(
        added,
        SAMPLER_START_CAPS.map(String::from).into(),
        "sampler: cap_add is the documented start set"
    );
    assert_eq!(
        yaml_list(&sampler, "volumes"),
        ["ember-socket:/run/ember:rw"],
        "sampler: only the socket volume"
    );
    let sampler_command = yaml_list(&sampler, "command");
    let relay_uid = sampler_command
        .windows(2)
        .find(|w| w[0] == "--relay-uid")
        .map(|w| w[1].clone());
    assert_eq!(
        relay_uid.as_deref(),
        Some(RELAY_UID),
        "sampler: --relay-uid is the relay's user"
    );
    assert_eq!(
        flag_value(&yaml_list(&relay, "command"), "--sampler-uid").as_deref(),
        Some(SAMPLER_UID),
        "relay: --sampler-uid is the uid the sampler drops to"
    );

    // Grafana and Pyroscope: this host only, and no anonymous Admin.
    for service in ["grafana", "pyroscope"] {
        let block = yaml_block(&config, &["services", service]);
        let ports = yaml_list(&block, "ports");
        assert!(!ports.is_empty(), "{service}: no ports");
        for port in ports {
            assert!(
                port.starts_with("127.0.0.1:"),
                "{service}: port {port} is not bound to 127.0.0.1"
            );
        }
    }
    let grafana = yaml_block(&config, &["services", "grafana"]);
    let grafana_text = grafana.join("\n");
    let environment = yaml_block(&grafana_text, &["environment"]);
    let env_value = |key: &str| {
        environment.iter().find_map(|l| {
            l.trim()
                .strip_prefix(&format!("{key}:"))
                .map(|v| v.trim().trim_matches(['"', '\'']).to_owned())
        })
    };
    if env_value("GF_AUTH_ANONYMOUS_ENABLED").as_deref() == Some("true") {
        let role = env_value("GF_AUTH_ANONYMOUS_ORG_ROLE");
        assert!(
            matches!(role.as_deref(), Some("Viewer")),
            "grafana: anonymous users must be Viewers at most, not {role:?}"
        );
    }

    // Pyroscope's version and the relay's OTLP proto version go together.
    let pyroscope = yaml_block(&config, &["services", "pyroscope"]);
    let tag = pyroscope
        .iter()
        .find_map(|l| l.trim().strip_prefix("image: grafana/pyroscope:"))
        .unwrap_or_else(|| panic!("pyroscope: no pinned grafana/pyroscope image"));
    let speaks = pyroscope_proto_version(tag)
        .unwrap_or_else(|| panic!("grafana/pyroscope:{tag}: no known OTLP proto version"));
    let relay_command = yaml_list(&relay, "command");
    let sends = relay_command
        .windows(2)
        .find(|w| w[0] == "--otlp-proto-version")
        .map(|w| w[1].clone());
    println!(
        "compose: grafana/pyroscope:{tag} speaks OTLP proto v{speaks}; the relay sends {}",
        sends.as_deref().unwrap_or("<its default>")
    );
    assert_eq!(
        sends.as_deref(),
        Some(speaks),
        "the relay's --otlp-proto-version must be what grafana/pyroscope:{tag} speaks"
    );
    // Third-party images are pinned (ember:dev is built from compose/Dockerfile).
    for image in config
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .filter(|i| !i.starts_with("ember:"))
    {
        let tag = image.rsplit_once(':').map(|(_, tag)| tag);
        assert!(
            tag.is_some_and(|t| t != "latest" && t.starts_with(|c: char| c.is_ascii_digit())),
            "{image}: pin a version"
        );
    }
    let provisioning = read("compose/grafana/provisioning/datasources/pyroscope.yaml");
    assert!(
        provisioning.contains("type: grafana-pyroscope-datasource")
            && provisioning.contains("url: http://pyroscope:4040"),
        "Grafana provisions the Pyroscope data source:\n{provisioning}"
    );
}

// ---------------------------------------------------------------------------------------------
// Kubernetes

#[test]
fn kubernetes_manifests_validate() {
    let Some(validate) = require_tool(
        &[
            repo_root().join(".tools/venv/bin/kubernetes-validate"),
            "kubernetes-validate".into(),
        ],
        "kubernetes-validate",
    ) else {
        return;
    };
    let dir = repo_root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("reading {}: {err}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    let expected = [
        "namespace/ember",
        "serviceaccount/ember",
        "clusterrole/ember-pod-reader",
        "clusterrolebinding/ember-pod-reader",
        "configmap/ember-relay",
        "daemonset/ember",
        "networkpolicy/ember",
    ];
    for version in KUBERNETES_VERSIONS {
        let output = run(Command::new(&validate)
            .args(["--strict", "--kubernetes-version", version])
            .args(&files));
        let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
        assert!(
            output.status.success(),
            "kubernetes-validate --strict -k {version} failed ({}):\n{said}",
            output.status
        );
        for resource in expected {
            assert!(
                said.lines()
                    .any(|l| l.contains(&format!("passed for resource {resource} "))),
                "kubernetes-validate -k {version} did not report {resource} as passed:\n{said}"
            );
        }
        let passed = said.lines().filter(|l| l.contains(" passed ")).count();
        assert_eq!(
            passed,
            expected.len(),
            "resources validated against {version}:\n{said}"
        );
        println!("kubernetes-validate --strict -k {version}: {passed} resources passed");
    }

    // What the schemas do not check.
    // RBAC: the relay's Kubernetes labels read pods (list + watch) and nothing else; roles are
    // only in 10-rbac.yaml, and only the relay container holds a token.
    let mut role_kinds = Vec::new();
    for file in &files {
        let manifest = fs::read_to_string(file).expect("reading a manifest");
        // Top-level kinds only (a binding's roleRef names its role's kind too).
        for line in manifest.lines().filter(|l| !l.starts_with(' ')) {
            if matches!(
                line,
                "kind: ClusterRole"
                    | "kind: ClusterRoleBinding"
                    | "kind: Role"
                    | "kind: RoleBinding"
            ) {
                assert!(
                    file.ends_with("10-rbac.yaml"),
                    "{}: `{line}`: roles belong in 10-rbac.yaml",
                    file.display()
                );
                role_kinds.push(line.to_owned());
            }
        }
    }
    assert_eq!(
        role_kinds,
        ["kind: ClusterRole", "kind: ClusterRoleBinding"],
        "one ClusterRole and its binding, no namespaced roles"
    );
    let rbac = read("deploy/kubernetes/10-rbac.yaml");
    let documents: Vec<&str> = rbac.split("\n---\n").collect();
    let document = |kind: &str| -> Vec<&str> {
        documents
            .iter()
            .find(|d| d.lines().any(|l| l.trim() == format!("kind: {kind}")))
            .unwrap_or_else(|| panic!("no {kind} in 10-rbac.yaml"))
            .lines()
            .collect()
    };
    let role = document("ClusterRole");
    let role_text = role.join("\n");
    let rules = yaml_block(&role_text, &["rules"]);
    let rule_lines: Vec<&str> = rules
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        rule_lines,
        [
            "- apiGroups: [\"\"]",
            "resources: [\"pods\"]",
            "verbs: [\"list\", \"watch\"]"
        ],
        "the ClusterRole only lists and watches pods"
    );
    let binding = document("ClusterRoleBinding").join("\n");
    let role_ref = yaml_block(&binding, &["roleRef"]);
    let subjects = yaml_block(&binding, &["subjects"]);
    for (block, expected) in [
        (&role_ref, "kind: ClusterRole"),
        (&role_ref, "name: ember-pod-reader"),
        (&subjects, "- kind: ServiceAccount"),
        (&subjects, "name: ember"),
        (&subjects, "namespace: ember"),
    ] {
        assert!(
            has_line(block, expected),
            "ClusterRoleBinding: `{expected}` in\n{binding}"
        );
    }
    assert!(
        has_line(
            &document("ServiceAccount"),
            "automountServiceAccountToken: false"
        ),
        "ServiceAccount: automountServiceAccountToken: false"
    );
    let daemonset = read("deploy/kubernetes/30-daemonset.yaml");
    assert!(
        has_line(&daemonset.lines().collect::<Vec<_>>(), "hostPID: true"),
        "DaemonSet: hostPID"
    );
    let pod = yaml_block(&daemonset, &["spec", "template", "spec"]);
    assert!(
        has_line(&pod, "automountServiceAccountToken: false"),
        "DaemonSet: no API token mounted by default (the relay projects its own)"
    );
    assert_eq!(
        daemonset.matches("serviceAccountToken:").count(),
        1,
        "DaemonSet: one projected token (the relay's)"
    );
    let containers = yaml_block(&daemonset, &["spec", "template", "spec", "containers"]);
    let text = containers.join("\n");
    let relay = yaml_block(&text, &["name: relay"]);
    let sampler = yaml_block(&text, &["name: sampler"]);
    let relay_user = format!("runAsUser: {RELAY_UID}");
    let relay_group = format!("runAsGroup: {RELAY_UID}");
    for expected in [
        relay_user.as_str(),
        relay_group.as_str(),
        "runAsNonRoot: true",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "privileged: false",
        "drop: [\"ALL\"]",
        "type: RuntimeDefault",
    ] {
        assert!(
            has_line(&relay, expected),
            "relay container: `{expected}` in\n{}",
            relay.join("\n")
        );
    }
    assert!(
        !relay.iter().any(|l| l.trim() == "add:"),
        "relay container adds no capabilities"
    );
    let added: BTreeSet<String> = yaml_list(
        &yaml_block(&sampler.join("\n"), &["securityContext", "capabilities"]),
        "add",
    )
    .into_iter()
    .map(|c| format!("CAP_{c}"))
    .collect();
    assert_eq!(
        added,
        SAMPLER_START_CAPS.map(String::from).into(),
        "sampler container: capabilities.add is the documented start set"
    );
    let mounts = |container: &[&str]| -> Vec<String> {
        yaml_block(&container.join("\n"), &["volumeMounts"])
            .iter()
            .filter_map(|l| l.trim().strip_prefix("- name: "))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        mounts(&sampler),
        ["socket"],
        "sampler mounts only the socket"
    );
    let relay_text = relay.join("\n");
    assert_eq!(
        mounts(&relay),
        ["socket", "config", "tmp", "kube-api-access"],
        "relay mounts the socket, its config, a /tmp and its API token"
    );
    let token_mount = yaml_block(&relay_text, &["volumeMounts", "name: kube-api-access"]);
    for expected in [
        "mountPath: /var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly: true",
    ] {
        assert!(
            has_line(&token_mount, expected),
            "relay token mount: `{expected}`"
        );
    }
    // The relay's Kubernetes labels: asked for, and the node's name from the downward API.
    assert!(
        yaml_list(&relay, "command")
            .iter()
            .any(|a| a == "--kubernetes"),
        "relay: --kubernetes"
    );
    let node_name = yaml_block(&relay_text, &["env", "name: NODE_NAME"]);
    assert!(
        has_line(&node_name, "fieldPath: spec.nodeName"),
        "relay: NODE_NAME from the downward API (fieldRef spec.nodeName), in\n{}",
        relay.join("\n")
    );
    assert!(
        !text
            .lines()
            .any(|l| l.trim().starts_with("privileged: true")),
        "no container is privileged"
    );
    assert_eq!(
        flag_value(&yaml_list(&sampler, "command"), "--relay-uid").as_deref(),
        Some(RELAY_UID),
        "sampler: --relay-uid is the relay's runAsUser"
    );
    assert_eq!(
        flag_value(&yaml_list(&relay, "command"), "--sampler-uid").as_deref(),
        Some(SAMPLER_UID),
        "relay: --sampler-uid is the uid the sampler drops to"
    );
    metrics_port_admits_only_the_node_and_prometheus(&relay);
}

/// The relay serves metrics and health on the pod's address, port [`METRICS_PORT`] (the kubelet
/// probes the pod IP); 40-networkpolicy.yaml selects the DaemonSet's pods and admits, besides
/// their node (always allowed), one namespace to that port only: no ipBlock, no open rule.
fn metrics_port_admits_only_the_node_and_prometheus(relay: &[&str]) {
    let port = METRICS_PORT.to_string();
    let listen = format!("0.0.0.0:{port}");
    assert_eq!(
        flag_value(&yaml_list(relay, "command"), "--metrics-address").as_deref(),
        Some(listen.as_str()),
        "relay: --metrics-address"
    );
    let container_port = format!("containerPort: {port}");
    assert!(
        has_line(&yaml_block(&relay.join("\n"), &["ports"]), &container_port),
        "relay: `{container_port}`"
    );
    let policy = read("deploy/kubernetes/40-networkpolicy.yaml");
    let spec = yaml_block(&policy, &["spec"]);
    let spec_text = spec.join("\n");
    assert!(
        has_line(
            &yaml_block(&spec_text, &["podSelector", "matchLabels"]),
            "app.kubernetes.io/name: ember"
        ),
        "NetworkPolicy: selects the DaemonSet's pods"
    );
    assert_eq!(
        yaml_list(&spec, "policyTypes"),
        ["Ingress"],
        "NetworkPolicy: ingress only (the relay exports and watches the API)"
    );
    let rules: Vec<&str> = yaml_block(&spec_text, &["ingress"])
        .into_iter()
        .map(|l| l.split(" #").next().unwrap_or(l).trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        rules,
        [
            "- from:",
            "- namespaceSelector:",
            "matchLabels:",
            "kubernetes.io/metadata.name: monitoring",
            "ports:",
            "- protocol: TCP",
            &format!("port: {port}"),
        ],
        "NetworkPolicy: one rule, one namespace, the metrics port"
    );
}

/// The value after `flag` in an argument list.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.windows(2).find(|w| w[0] == flag).map(|w| w[1].clone())
}

#[test]
fn pyroscope_versions_map_to_proto_versions() {
    assert_eq!(pyroscope_proto_version("1.18.0"), Some("1.9"));
    assert_eq!(pyroscope_proto_version("1.18.2"), Some("1.9"));
    assert_eq!(pyroscope_proto_version("1.20.0"), Some("1.10"));
    assert_eq!(pyroscope_proto_version("1.17.1"), None);
    assert_eq!(pyroscope_proto_version("latest"), None);
    assert_eq!(
        parse_exposure(
            "→ Overall exposure level for a.service: 1.2 OK 🙂",
            "a.service"
        ),
        Some(1.2)
    );
}

/// compose.docker20.yaml (engines before Docker 23.0) replaces the shipped sampler with
/// `sampler-docker20`: the same service but for its capabilities, where CAP_SYS_ADMIN stands in
/// for the three such engines do not know. Anything else that drifted between the two would be
/// a difference no one meant.
#[test]
fn compose_override_for_old_engines_differs_only_in_capabilities() {
    let Some(compose) = require_tool(&["docker-compose".into()], "docker-compose (v1)") else {
        return;
    };
    let output = run_quiet(
        Command::new(&compose)
            .current_dir(repo_root())
            .args(["--file", "compose/compose.yaml"])
            .args(["--file", "compose/compose.docker20.yaml", "config"])
            .env("COMPOSE_PROJECT_NAME", "ember"),
    );
    assert!(
        output.status.success(),
        "docker-compose config with compose.docker20.yaml: {}",
        text(&output.stderr)
    );
    let config = text(&output.stdout);
    let shipped = yaml_block(&config, &["services", "sampler"]);
    let old = yaml_block(&config, &["services", "sampler-docker20"]);
    let without = |block: &[&str]| -> Vec<String> {
        let joined = block.join("\n");
        let caps = yaml_block(&joined, &["cap_add"]);
        block
            .iter()
            .filter(|l| !caps.contains(l) && l.trim() != "cap_add:")
            // The shipped service's build section (the override's reuses its image) and the
            // profile that keeps it from starting there.
            .filter(|l| !l.trim_start().starts_with("profiles:"))
            .map(|l| (*l).to_owned())
            .collect()
    };
    let shipped_rest: Vec<String> = without(&shipped)
        .into_iter()
        .filter(|l| {
            !matches!(
                l.trim(),
                "build:" | "context: /dev/null" | "- docker-engine-23"
            ) && !l.trim().starts_with("context: ")
                && !l.trim().starts_with("dockerfile: ")
        })
        .collect();
    assert_eq!(
        without(&old),
        shipped_rest,
        "sampler-docker20 and sampler differ beyond cap_add"
    );
    let old_caps: BTreeSet<String> = yaml_list(&old, "cap_add")
        .into_iter()
        .map(|c| format!("CAP_{c}"))
        .collect();
    let expected: BTreeSet<String> = SAMPLER_START_CAPS
        .into_iter()
        .filter(|c| !matches!(*c, "CAP_BPF" | "CAP_PERFMON" | "CAP_CHECKPOINT_RESTORE"))
        .chain(["CAP_SYS_ADMIN"])
        .map(String::from)
        .collect();
    assert_eq!(old_caps, expected, "sampler-docker20: cap_add");
}

/// The three deployments side by side, each read from its own file: the sampler's start
/// capabilities, the relay's uid, what the sampler mounts, and the uids each side names for the
/// other. The per-deployment tests above hold each to the documented values; this one fails on
/// any disagreement between them, whatever the documented values become.
#[test]
fn the_three_deployments_agree() {
    let Some(compose) = require_tool(&["docker-compose".into()], "docker-compose (v1)") else {
        return;
    };
    let output = run_quiet(
        Command::new(&compose)
            .current_dir(repo_root())
            .args(["--file", "compose/compose.yaml", "config"])
            .env("COMPOSE_PROJECT_NAME", "ember"),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let config = text(&output.stdout);
    let compose_sampler = yaml_block(&config, &["services", "sampler"]);
    let compose_relay = yaml_block(&config, &["services", "relay"]);
    let daemonset = read("deploy/kubernetes/30-daemonset.yaml");
    let containers = yaml_block(&daemonset, &["spec", "template", "spec", "containers"]);
    let containers = containers.join("\n");
    let pod_sampler = yaml_block(&containers, &["name: sampler"]);
    let pod_relay = yaml_block(&containers, &["name: relay"]);
    let unit = read("systemd/ember-sampler.service");
    let relay_unit = read("systemd/ember-relay.service");

    let caps = |list: Vec<String>| -> BTreeSet<String> {
        list.into_iter().map(|c| format!("CAP_{c}")).collect()
    };
    let unit_caps: BTreeSet<String> = unit_value(&unit, "sampler", "CapabilityBoundingSet")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let compose_caps = caps(yaml_list(&compose_sampler, "cap_add"));
    let pod_caps = caps(yaml_list(
        &yaml_block(
            &pod_sampler.join("\n"),
            &["securityContext", "capabilities"],
        ),
        "add",
    ));
    assert_eq!(
        unit_caps, compose_caps,
        "systemd unit vs Compose: sampler capabilities"
    );
    assert_eq!(
        compose_caps, pod_caps,
        "Compose vs DaemonSet: sampler capabilities"
    );

    // The relay's uid: Compose's user and the DaemonSet's runAsUser; each sampler names it.
    let compose_uid = compose_relay
        .iter()
        .find_map(|l| l.trim().strip_prefix("user: "))
        .and_then(|u| u.trim_matches(['"', '\'']).split(':').next())
        .map(str::to_owned)
        .expect("relay user");
    let pod_uid = pod_relay
        .iter()
        .find_map(|l| l.trim().strip_prefix("runAsUser: "))
        .map(str::to_owned)
        .expect("relay runAsUser");
    assert_eq!(
        compose_uid, pod_uid,
        "Compose vs DaemonSet: the relay's uid"
    );
    for (name, sampler) in [("Compose", &compose_sampler), ("DaemonSet", &pod_sampler)] {
        assert_eq!(
            flag_value(&yaml_list(sampler, "command"), "--relay-uid").as_deref(),
            Some(compose_uid.as_str()),
            "{name}: the sampler's --relay-uid names the relay's uid"
        );
    }
    let relay_user = unit_value(&relay_unit, "relay", "User");
    assert!(
        unit_value(&unit, "sampler", "ExecStart").contains(&format!("--relay-uid {relay_user}")),
        "systemd: the sampler's --relay-uid names the relay's User="
    );

    // The uid the sampler becomes, as every relay expects it.
    let relay_flags = [
        (
            "Compose",
            flag_value(&yaml_list(&compose_relay, "command"), "--sampler-uid"),
        ),
        (
            "DaemonSet",
            flag_value(&yaml_list(&pod_relay, "command"), "--sampler-uid"),
        ),
        (
            "systemd",
            unit_value(&relay_unit, "relay", "ExecStart")
                .split_whitespace()
                .skip_while(|w| *w != "--sampler-uid")
                .nth(1)
                .map(str::to_owned),
        ),
    ];
    for (name, uid) in &relay_flags {
        assert_eq!(uid, &relay_flags[0].1, "{name}: --sampler-uid");
    }

    // The sampler mounts the socket and nothing else: Compose's only volume is the socket's,
    // and it is the DaemonSet sampler's only mount.
    let compose_volumes = yaml_list(&compose_sampler, "volumes");
    assert_eq!(
        compose_volumes.len(),
        1,
        "Compose sampler volumes: {compose_volumes:?}"
    );
    assert!(
        compose_volumes[0].contains(":/run/ember"),
        "{compose_volumes:?}"
    );
    let pod_sampler_text = pod_sampler.join("\n");
    let pod_mounts: Vec<&str> = yaml_block(&pod_sampler_text, &["volumeMounts"])
        .into_iter()
        .filter_map(|l| l.trim().strip_prefix("mountPath: "))
        .collect();
    assert_eq!(pod_mounts, ["/run/ember"], "DaemonSet sampler mounts");
    assert_eq!(
        unit_value(&relay_unit, "relay", "RuntimeDirectory"),
        "ember",
        "systemd: the socket directory is /run/ember"
    );
}
