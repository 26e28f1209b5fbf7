//! Privilege separation made checkable: the sampler's uid (nobody once attached), groups,
//! capability sets, no_new_privs and seccomp while it records; both sides refusing a peer of the wrong uid; the unprivileged relay
//! symbolizing a binary it could not open itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use ember_protocol::{
    encode_sampler_message,
    transport::{self, Received},
    Hello, SamplerMessage, NO_FD, PROTOCOL_VERSION,
};
use ember_tests::*;
use std::os::fd::AsFd as _;

const RECORD_TIMEOUT: Duration = Duration::from_secs(180);
const LOG_TIMEOUT: Duration = Duration::from_secs(60);

/// CAP_DAC_READ_SEARCH (2), CAP_SYS_PTRACE (19), CAP_CHECKPOINT_RESTORE (40): the documented
/// steady-state set of the sampler (sampler/src/harden.rs).
const SAMPLER_CAPS: &str = "0000010000080004";
const NOBODY: u32 = 65534;

#[test]
fn sampler_is_confined_while_recording() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let workload = spawn_workload(&workloads().spinner, 120);
    let mut run = spawn_record(&[
        "--duration",
        "5s",
        "--frequency",
        "199",
        "--pid",
        &workload.pid().to_string(),
    ]);
    let relay = run.pid();
    // The sampler is the record process's child; it confines itself once attached.
    let mut seen = None;
    wait_until(LOG_TIMEOUT, || {
        if run.child.try_wait().is_some() {
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
    let (sampler, status) = seen.expect("the sampler never showed Seccomp: 2 during the recording");
    let field = |key: &str| status_field(&status, key).unwrap_or("<missing>").to_owned();
    eprintln!(
        "sampler {sampler}: Uid {} Gid {} Groups [{}] CapEff {} CapPrm {} CapBnd {} CapInh {} CapAmb {} NoNewPrivs {} Seccomp {}",
        field("Uid"),
        field("Gid"),
        field("Groups"),
        field("CapEff"),
        field("CapPrm"),
        field("CapBnd"),
        field("CapInh"),
        field("CapAmb"),
        field("NoNewPrivs"),
        field("Seccomp")
    );
    for key in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(field(key), SAMPLER_CAPS, "sampler {key}");
    }
    for key in ["CapInh", "CapAmb"] {
        assert_eq!(field(key), "0000000000000000", "sampler {key}");
    }
    assert_eq!(field("NoNewPrivs"), "1");
    assert_eq!(field("Seccomp"), "2");
    // It left uid 0 for nobody (its --user default) once attached: real, effective, saved and
    // filesystem ids alike, and, without --relay-uid (record's inherited socket), no
    // supplementary groups.
    let nobody = vec![NOBODY.to_string(); 4].join("\t");
    assert_eq!(field("Uid"), nobody, "sampler Uid");
    assert_eq!(field("Gid"), nobody, "sampler Gid");
    assert_eq!(field("Groups"), "", "sampler Groups");

    let recorded = run.finish(RECORD_TIMEOUT);
    let hot = total_count(
        recorded
            .folded()
            .iter()
            .filter(|s| s.process == "spinner" && s.leaf() == Some("spin_hot")),
    );
    assert!(
        hot > 0,
        "a confined sampler recorded no spin_hot samples:\n{}",
        recorded.folded_text()
    );
}

/// Root copies a workload to a 0700 root-only file; the relay, unprivileged, cannot open it, yet
/// names its functions through the descriptor the sampler passed.
#[test]
fn relay_symbolizes_a_root_only_binary_through_the_passed_fd() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let secret = dir.path().join("secret-spinner");
    fs::copy(&workloads().spinner, &secret).expect("copy workload");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    // An unprivileged uid cannot open the file: the relay (whose uid `record` picks at run time,
    // so nobody stands in for it here) must use the passed descriptor.
    let probe = Command::new("cat")
        .arg(&secret)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run cat as nobody");
    assert!(
        !probe.success(),
        "nobody could read the 0700 binary; the test proves nothing"
    );

    let workload = spawn_workload(&secret, 120);
    let recorded = record(
        &[
            "--duration",
            "4s",
            "--frequency",
            "199",
            "--pid",
            &workload.pid().to_string(),
        ],
        RECORD_TIMEOUT,
    );
    let stacks = recorded.folded();
    let hot = total_count(
        stacks
            .iter()
            .filter(|s| s.leaf() == Some("spin_hot") && s.has_frame("main")),
    );
    assert!(
        hot > 0,
        "no symbolized spin_hot frames from the root-only binary:\n{}",
        recorded.folded_text()
    );
    // The relay read the binary through its private sealed copy (a memfd), yet every mapping
    // keeps the path the process mapped, the binary's own first: a reader of profile.pb.gz
    // titles it by that file and finds it, never the relay's copy.
    let profile = recorded.profile();
    let files = profile.mapping_files();
    println!("pprof mappings: {files:?}");
    assert_eq!(files.first().copied(), secret.to_str(), "{files:?}");
    assert!(
        !files
            .iter()
            .any(|f| f.contains("memfd:") || f.contains("/proc/self/fd")),
        "a mapping names the relay's descriptor or copy: {files:?}"
    );
    // And the binary's mapping keeps its build id, read through the descriptor (the relay may
    // not reopen the file by path), so a reader can also find the binary by it.
    let readelf = Command::new("readelf").arg("-n").arg(&secret).output();
    let expected = readelf.ok().and_then(|out| {
        let notes = String::from_utf8_lossy(&out.stdout).into_owned();
        let id = notes
            .split("Build ID: ")
            .nth(1)?
            .split_whitespace()
            .next()?;
        Some(id.to_owned())
    });
    if let Some(expected) = expected {
        let first = profile.mapping.first().expect("a mapping");
        assert_eq!(profile.string(first.build_id), expected, "{files:?}");
    }
    let Some((top, warnings)) = go_pprof::top_symbolized(&recorded.out_dir.join("profile.pb.gz"))
    else {
        return;
    };
    println!(
        "go tool pprof -top -symbolize=demangle=full: {warnings}{}",
        top.lines().next().unwrap_or("")
    );
    assert!(top.starts_with("File: secret-spinner"), "{top}");
    assert!(!warnings.contains("symbolization failed"), "{warnings}");
}

/// The sampler refuses a relay listening as another uid than --relay-uid; with the right one
/// (given by name) it joins the relay's group, reaches the 0660 socket and delivers batches.
#[test]
fn sampler_refuses_a_relay_of_another_uid() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();

    // A relay running as root: a sampler expecting `nobody` must refuse it.
    let dir = tempfile::tempdir().expect("temp dir");
    let root_socket = dir.path().join("root.sock");
    let root_relay = spawn_relay_run("relay as root", &root_socket, &[]);
    // Open the socket to everyone, so the connect succeeds (the confined sampler is nobody and
    // not in root's group) and what refuses the relay is the sampler's SO_PEERCRED check.
    fs::set_permissions(&root_socket, fs::Permissions::from_mode(0o666)).expect("chmod socket");
    let (wrong, wrong_log) = spawn_sampler(
        "sampler expecting nobody",
        &root_socket,
        &["--relay-uid", "nobody", "--log-format", "json"],
    );
    wrong_log.expect(0, LOG_TIMEOUT, "the sampler's refusal", |line| {
        message(line).contains("refusing the process listening on the socket")
    });
    drop(wrong);
    assert!(
        root_relay.log.matching(is_batch).is_empty(),
        "a relay of the wrong uid received batches:\n{}",
        root_relay.log.text()
    );
    drop(root_relay);

    // A relay running as nobody: a sampler expecting `nobody` is served.
    let open_dir = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(open_dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod");
    let socket = open_dir.path().join("ember.sock");
    let mut command = Command::new(relay_bin());
    command
        .args(["run", "--log-format", "json", "--socket"])
        .arg(&socket)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut relay = ChildGuard::spawn("relay as nobody", &mut command);
    let relay_log = LogReader::spawn("relay", relay.child_mut().stderr.take().expect("stderr"));
    wait_until(LOG_TIMEOUT, || socket.exists()).expect("the relay never created its socket");
    let mode = fs::metadata(&socket)
        .expect("socket metadata")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660, "relay socket mode");
    let (_right, right_log) = spawn_sampler(
        "sampler expecting nobody",
        &socket,
        &["--relay-uid", "nobody", "--log-format", "json"],
    );
    relay_log.expect(
        0,
        LOG_TIMEOUT,
        "a batch from the accepted sampler",
        is_batch,
    );
    assert!(
        !right_log.text().contains("refusing"),
        "the right relay was refused:\n{}",
        right_log.text()
    );
}

/// The relay closes connections from any uid but --sampler-uid.
#[test]
fn relay_refuses_a_sampler_of_another_uid() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("ember.sock");
    let me = nix::unistd::geteuid().as_raw();
    let other = (me + 1).to_string();
    let relay = spawn_relay_run("relay", &socket, &["--sampler-uid", &other]);
    let conn = transport::connect(&socket).expect("connect");
    let hello = encode_sampler_message(&SamplerMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        kallsyms_fd: NO_FD,
        ..Hello::default()
    }));
    // The relay may already have closed the connection: a send error is the refusal too.
    let _ = transport::send(conn.as_fd(), &hello, &[], false);
    let mut buf = [0u8; 64];
    match transport::recv(conn.as_fd(), &mut buf) {
        Ok(Received::Closed) | Err(_) => {}
        Ok(other) => panic!("expected the relay to close the connection, got {other:?}"),
    }
    relay
        .log
        .expect(0, LOG_TIMEOUT, "the relay's refusal", |line| {
            level(line) == "ERROR" && message(line).contains("is not the sampler's")
        });
}
