//! `ember-relay record` as a user drives it: Ctrl-C ends a recording early and every output is
//! still written, from the samples taken until then; a mostly idle recording still covers the
//! whole time asked for; `--format` writes only the chosen files (speedscope's read by its
//! schema and importer rules); `--open` starts the browser as the sudo user, never as root;
//! bad input is refused before anything starts.

// Test support: a failed expectation should panic with its message, as in a test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap, fs, os::unix::fs::PermissionsExt as _, path::Path, process::Command,
    time::Duration,
};

use ember_tests::{otlp::Receiver, *};
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

/// The `over N.Ns` duration of record's summary line.
fn summary_seconds(stdout: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("recorded "))
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}"));
    line.rsplit_once(" over ")
        .and_then(|(_, s)| s.trim_end_matches('s').parse().ok())
        .unwrap_or_else(|| panic!("no duration in {line:?}"))
}

#[test]
fn an_idle_recording_covers_the_whole_duration_in_the_summary_pprof_and_otlp() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    const SECONDS: f64 = 10.0;
    const INTERVAL: f64 = 1.0;
    // Given a target that burns CPU for one second of the ten recorded, then exits: every later
    // interval is observed without a sample.
    let workload = spawn_workload(&workloads().spinner, 1);
    let pid = workload.pid().to_string();
    let receiver = Receiver::grpc(None);
    // At record's default log level: its stderr (not a terminal) is checked below.
    let recorded = spawn_record_logging(
        &[
            "--duration",
            "10s",
            "--interval",
            "1s",
            "--pid",
            &pid,
            "--otlp-endpoint",
            &receiver.url(),
            "--otlp-protocol",
            "grpc",
        ],
        false,
    )
    .finish(RECORD_TIMEOUT);
    // Quiet by default: no info log (of the relay or the sampler it started) and, stderr not
    // being a terminal, no progress line; the summary is on stdout.
    for quiet in [" INFO ", "batch received", "samples   "] {
        assert!(
            !recorded.stderr.contains(quiet),
            "record's stderr has {quiet:?} without -v:\n{}",
            recorded.stderr
        );
    }
    // The recording starts its clock when the sampler's first message arrives, after the
    // sampler's first interval began, and stops within one poll (0.2 s) plus the last drain
    // after that: the window is at least the duration (less the summary's rounding to 0.1 s) and
    // less than one interval more.
    let in_window = |seconds: f64| (SECONDS - 0.05..SECONDS + INTERVAL).contains(&seconds);
    let summary = summary_seconds(&recorded.stdout);
    assert!(
        in_window(summary),
        "the summary says {summary}s for a {SECONDS}s recording:\n{}",
        recorded.stdout
    );
    let profile = recorded.profile();
    let pprof_seconds = profile.duration_nanos as f64 / 1e9;
    assert!(
        in_window(pprof_seconds),
        "profile.pb.gz says duration_nanos {} for a {SECONDS}s recording",
        profile.duration_nanos
    );
    assert!(
        (pprof_seconds - summary).abs() < 0.051,
        "the summary ({summary}s) and pprof ({pprof_seconds}s) disagree"
    );
    // OTLP carries each interval that had samples, each as long as the interval it covers and
    // inside the recording's window.
    let window = (
        profile.time_nanos as u64,
        (profile.time_nanos + profile.duration_nanos) as u64,
    );
    let exported: Vec<otlp::Decoded> = receiver
        .received()
        .iter()
        .map(|r| otlp::decode("1.10", &r.body).expect("an OTLP v1.10 request"))
        .collect();
    assert!(!exported.is_empty(), "nothing reached the OTLP receiver");
    for d in &exported {
        let (start, end) = (d.time_unix_nano, d.time_unix_nano + d.duration_nano);
        assert!(
            d.duration_nano > 0 && (d.duration_nano as f64) < (INTERVAL + 0.2) * 1e9,
            "an OTLP profile lasts {} ns, not one {INTERVAL}s interval",
            d.duration_nano
        );
        assert!(
            window.0 <= start && end <= window.1,
            "an OTLP profile ({start}..{end}) lies outside the recording ({window:?})"
        );
    }
    // `ember-relay report` on the saved profile lists what `go tool pprof -top` lists.
    report_matches_go_pprof(&recorded.out_dir.join("profile.pb.gz"));
    eprintln!(
        "summary {summary}s, pprof {pprof_seconds}s, {} OTLP profiles of {} samples",
        exported.len(),
        exported.iter().map(otlp::Decoded::total).sum::<i64>()
    );
}

/// Runs `ember-relay record ARGS` with a stand-in sampler that would leave a mark if it were
/// started; asserts the command was refused with exit status 2, that nothing was started and no
/// output directory made (unless `out` is given by the caller), and returns its stderr.
fn refused(args: &[&str], out: Option<&std::path::Path>) -> String {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mark = tmp.path().join("sampler-started");
    let sampler = tmp.path().join("sampler");
    fs::write(&sampler, format!("#!/bin/sh\ntouch {}\n", mark.display())).expect("write");
    fs::set_permissions(&sampler, fs::Permissions::from_mode(0o755)).expect("chmod");
    let default_out = tmp.path().join("out");
    let out = out.unwrap_or(&default_out);
    let output = Command::new(relay_bin())
        .arg("record")
        .arg("--sampler")
        .arg(&sampler)
        .arg("--output")
        .arg(out)
        .args(args)
        .output()
        .expect("running ember-relay record");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(
        output.status.code(),
        Some(2),
        "record {args:?} was not refused as a usage error:\n{stderr}"
    );
    assert!(!mark.exists(), "record {args:?} started the sampler");
    if out == default_out {
        assert!(!out.exists(), "record {args:?} made its output directory");
    }
    stderr
}

#[test]
fn bad_input_is_refused_before_anything_starts() {
    // A pid nobody has: the kernel's pid_max is at most 4194304.
    let stderr = refused(&["--pid", "4194305"], None);
    assert!(
        stderr.contains(
            "--pid 4194305: no such process; pass the pid of a running process (`pgrep NAME` \
             lists them), or leave --pid out to record the whole machine"
        ),
        "{stderr}"
    );
    let stderr = refused(&["--frequency", "0"], None);
    assert!(
        stderr.contains("0 samples per second is out of range: use 1 to 10000 (default 97)"),
        "{stderr}"
    );
    let stderr = refused(&["--frequency", "20000"], None);
    assert!(
        stderr.contains("20000 samples per second is out of range: use 1 to 10000"),
        "{stderr}"
    );
    let stderr = refused(&["--duration", "0"], None);
    assert!(
        stderr.contains("`0` is out of range (10ms to 24h)"),
        "{stderr}"
    );
}

#[test]
fn bad_format_choices_are_refused_before_anything_starts() {
    let stderr = refused(&["--format", "svg,html"], None);
    assert!(
        stderr.contains("invalid value 'html' for '--format <LIST>'")
            && stderr.contains("[possible values: svg, pprof, folded, speedscope]"),
        "{stderr}"
    );
    let stderr = refused(&["--format", "pprof,speedscope", "--open"], None);
    assert!(
        stderr.contains(
            "--open opens flamegraph.svg, which --format leaves out: add svg to --format (e.g. \
             --format svg,speedscope) or leave --open out"
        ),
        "{stderr}"
    );
}

/// `--format speedscope,folded` writes those two files only; the speedscope file passes
/// speedscope's schema and its importer's rules, has one profile per recorded process, and
/// gives every frame the same total as stacks.folded.
#[test]
fn format_writes_only_the_chosen_files_and_speedscope_agrees_with_folded() {
    if !privileged() {
        return;
    }
    let Some((schema, python)) = speedscope::reader() else {
        return;
    };
    let _lock = ebpf_lock();
    let workload = spawn_workload(&workloads().spinner, 60);
    let pid = workload.pid().to_string();
    let names = ["profile.speedscope.json", "stacks.folded"];
    let recorded = spawn_record(&[
        "--duration",
        "3s",
        "--pid",
        &pid,
        "--format",
        "speedscope,folded",
    ])
    .finish_writing(RECORD_TIMEOUT, &names);
    // Only the chosen files, and the summary names no other
    let mut written: Vec<String> = fs::read_dir(&recorded.out_dir)
        .expect("reading the output dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(
        written, names,
        "--format speedscope,folded wrote {written:?}"
    );
    for other in ["flamegraph.svg", "profile.pb.gz"] {
        assert!(
            !recorded.stdout.contains(other),
            "the summary lists {other}, which was not chosen:\n{}",
            recorded.stdout
        );
    }
    let file = speedscope::read(
        &schema,
        &python,
        &recorded.out_dir.join("profile.speedscope.json"),
    );
    // One profile per process: the one recorded
    assert_eq!(
        file.order,
        [format!("spinner (pid {pid})")],
        "profiles: {:?}",
        file.order
    );
    // Every frame's total equals stacks.folded's (each frame once per stack, process root
    // left out: speedscope has a profile per process instead)
    let stacks = recorded.folded();
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &stacks {
        let mut frames: Vec<&String> = stack.frames.iter().collect();
        frames.sort_unstable();
        frames.dedup();
        for frame in frames {
            *folded.entry(frame.clone()).or_insert(0) += stack.count;
        }
    }
    let totals = file.frame_totals();
    assert_eq!(
        totals, folded,
        "per-frame totals differ between profile.speedscope.json and stacks.folded"
    );
    let hot = totals.get("spin_hot").copied().unwrap_or(0);
    assert!(hot > 0, "no spin_hot samples:\n{}", recorded.folded_text());
    assert_eq!(file.weights.values().sum::<u64>(), total_count(&stacks));
    eprintln!(
        "speedscope: {} frames named, spin_hot {hot} of {} samples",
        totals.len(),
        total_count(&stacks)
    );
}

/// An executable `xdg-open` in `dir` that writes its arguments and `id -u` to `mark` (made
/// whole by a rename, so a reader never sees half of it).
fn fake_xdg_open(dir: &Path, mark: &Path) {
    let script = format!(
        "#!/bin/sh\n{{ echo \"$*\"; id -u; }} > {mark}.tmp && mv {mark}.tmp {mark}\n",
        mark = mark.display()
    );
    let path = dir.join("xdg-open");
    fs::write(&path, script).expect("writing the fake xdg-open");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// `--open` with a display and a sudo user: xdg-open (the first on PATH) runs with the
/// flamegraph's path as that user, never as root nor as the relay's user; without a display it
/// is not run, one line says why, and the recording still succeeds.
#[test]
fn open_starts_the_browser_as_the_sudo_user_and_says_why_not_without_a_display() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    // Given a fake xdg-open first on PATH, in a directory every user can read, writing its
    // mark into one every user can write
    let tmp = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let bin = tmp.path().join("bin");
    let marks = tmp.path().join("marks");
    fs::create_dir(&bin).expect("mkdir");
    fs::create_dir(&marks).expect("mkdir");
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::set_permissions(&marks, fs::Permissions::from_mode(0o1777)).expect("chmod");
    let mark = marks.join("opened");
    fake_xdg_open(&bin, &mark);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // A uid and gid no account has (the relay itself runs as 65534 here, so the two differ)
    let sudo_uid = (62_000..63_000)
        .find(|&id| {
            matches!(nix::unistd::User::from_uid(id.into()), Ok(None))
                && matches!(nix::unistd::Group::from_gid(id.into()), Ok(None))
        })
        .expect("a free uid")
        .to_string();
    let workload = spawn_workload(&workloads().spinner, 60);
    let pid = workload.pid().to_string();
    let args = [
        "--duration",
        "1s",
        "--pid",
        &pid,
        "--user",
        "65534",
        "--open",
    ];
    let env = |display: Option<&'static str>| {
        [
            ("PATH", Some(path.as_str())),
            ("DISPLAY", display),
            ("WAYLAND_DISPLAY", None),
            ("BROWSER", None),
            ("SUDO_UID", Some(sudo_uid.as_str())),
            ("SUDO_GID", Some(sudo_uid.as_str())),
        ]
    };

    // When recording with DISPLAY set
    let recorded = spawn_record_with(&args, false, &env(Some(":99"))).finish(RECORD_TIMEOUT);
    // Then the opener runs with the flamegraph's absolute path, as the sudo user
    let svg = recorded.out_dir.join("flamegraph.svg");
    wait_until(RECORD_TIMEOUT, || mark.exists()).unwrap_or_else(|| {
        panic!(
            "the fake xdg-open never ran:\nstdout:\n{}\nstderr:\n{}",
            recorded.stdout, recorded.stderr
        )
    });
    let seen = fs::read_to_string(&mark).expect("reading the mark");
    assert_eq!(
        seen,
        format!("{}\n{sudo_uid}\n", svg.display()),
        "xdg-open's arguments and uid"
    );
    assert!(
        recorded.stdout.contains(&format!(
            "opening {} with {} as uid {sudo_uid}",
            svg.display(),
            bin.join("xdg-open").display()
        )),
        "{}",
        recorded.stdout
    );
    fs::remove_file(&mark).expect("removing the mark");

    // When recording without a display
    let recorded = spawn_record_with(&args, false, &env(None)).finish(RECORD_TIMEOUT);
    // Then one line says where the file is and why it was not opened, and nothing ran
    let svg = recorded.out_dir.join("flamegraph.svg");
    let line = format!(
        "not opening {}: no graphical session (DISPLAY and WAYLAND_DISPLAY are unset); open it \
         in a browser",
        svg.display()
    );
    assert!(
        recorded.stdout.lines().any(|l| l == line),
        "no {line:?} in:\n{}",
        recorded.stdout
    );
    assert!(!mark.exists(), "xdg-open ran without a display");
    eprintln!("{line}");
}

#[test]
fn an_output_directory_that_cannot_be_made_is_refused_before_the_sampler_starts() {
    // As root (record refuses to start otherwise, before it looks at --output).
    if !privileged() {
        return;
    }
    // Given an --output below a regular file: no user, root included, can make it
    let tmp = tempfile::tempdir().expect("temp dir");
    let file = tmp.path().join("a-file");
    fs::write(&file, "").expect("write");
    let out = file.join("out");
    let stderr = refused(&[], Some(&out));
    assert!(
        stderr.contains(&format!(
            "--output {}: cannot create the output files there (",
            out.display()
        )) && stderr.contains("choose a writable directory with -o DIR"),
        "{stderr}"
    );
}

/// `ember-relay report FILE` prints the same functions with the same self and total counts as
/// `go tool pprof -top -sample_index=samples` on the same file.
fn report_matches_go_pprof(profile: &std::path::Path) {
    let Some(go) = go_pprof::top(profile) else {
        return;
    };
    let output = Command::new(relay_bin())
        .args(["report", "--count", "100000"])
        .arg(profile)
        .output()
        .expect("running ember-relay report");
    let ours = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ember-relay report failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (ours_rows, go_rows) = (go_pprof::parse_top(&ours), go_pprof::parse_top(&go));
    assert!(!go_rows.is_empty(), "no rows in go tool pprof -top:\n{go}");
    assert_eq!(
        ours_rows, go_rows,
        "ember-relay report:\n{ours}\ngo tool pprof -top:\n{go}"
    );
    eprintln!("ember-relay report:\n{ours}");
}

/// A recording of a CPython process says which CPython it runs and that its Python functions are
/// named, and they are: the relay recognized the interpreter from the binary the sampler passed
/// (Debian's python3 is statically linked: the executable itself), not from the process's name,
/// and the kernel walked its frames. With `--interpreters off` the summary says they are not.
#[test]
fn the_summary_says_which_cpython_a_process_runs_and_that_its_python_functions_are_named() {
    if !privileged() {
        return;
    }
    let python = Path::new("/usr/bin/python3");
    let version = Command::new(python)
        .args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let Some(version) = version else {
        skip("no /usr/bin/python3 to record (apt-get install python3)");
        return;
    };
    let _lock = ebpf_lock();
    let mut busy = Command::new(python)
        .args([
            "-c",
            "import time\nt = time.time()\nwhile time.time() - t < 60: sum(range(1000))",
        ])
        .spawn()
        .expect("starting python3");
    let pid = busy.id().to_string();
    let recorded = spawn_record(&["--duration", "3s", "--pid", &pid]).finish(RECORD_TIMEOUT);
    let off = spawn_record(&["--duration", "2s", "--pid", &pid, "--interpreters", "off"])
        .finish(RECORD_TIMEOUT);
    let _ = busy.kill();
    let _ = busy.wait();
    let runs = format!("(pid {pid}) runs CPython {version}: its Python functions ");
    let said = |stdout: &str, what: &str| {
        let expected = format!("{runs}{what}");
        let line = stdout
            .lines()
            .find(|l| l.contains(&expected))
            .unwrap_or_else(|| panic!("no {expected:?} in the summary:\n{stdout}"))
            .to_owned();
        eprintln!("{line}");
    };
    said(
        &recorded.stdout,
        "are named from the interpreter's own frames",
    );
    said(&off.stdout, "are not named (--interpreters off)");
    // And the stacks hold the module's Python frame (`python3 -c` code is `<module>` of
    // `<string>`)
    let folded = fs::read_to_string(recorded.out_dir.join("stacks.folded")).expect("stacks.folded");
    assert!(
        folded.contains("<module> (<string>:"),
        "no Python frame in the recording:\n{folded}"
    );
}
