//! A Debian root booted with `systemd-nspawn -b` (systemd as PID 1 in a pid namespace of its
//! own), for tests/tests/deploy_live.rs to run the shipped units under a real systemd.
//!
//! The root is the one scripts/deploy-roots.sh caches; `--volatile=overlay` puts a tmpfs over
//! it, so a run changes nothing there. Files go in read-only bind mounts. The container shares
//! the host's network (an OTLP receiver on the host's loopback is reachable) and is granted the
//! capabilities and the two syscalls (bpf, perf_event_open) the sampler starts with.
//!
//! Dropping a [`Booted`] powers the container off (SIGTERM to nspawn), and if it is not gone
//! within a few seconds kills its PID 1 (which kills everything in its pid namespace, the
//! sampler's eBPF program with it) and nspawn; the overlay and bind mounts live in nspawn's own
//! mount namespace and go with it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};

use crate::{children_of, ChildGuard};

/// Where scripts/deploy-roots.sh caches what the live deployment tests run on.
pub fn deploy_cache() -> PathBuf {
    std::env::var_os("EMBER_DEPLOY_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/ember/deploy"), PathBuf::from)
}

/// The cached Debian root of `suite` (bookworm: systemd 252, trixie: systemd 257); panics naming
/// the script that makes it.
pub fn debian_root(suite: &str) -> PathBuf {
    let root = deploy_cache().join(suite);
    assert!(
        root.join("usr/lib/systemd/systemd").is_file(),
        "{} has no systemd: run `sudo scripts/deploy-roots.sh` (scripts/setup.sh does)",
        root.display()
    );
    root
}

/// The capabilities the sampler starts with that nspawn does not grant by default.
const EXTRA_CAPS: &str = "CAP_BPF,CAP_PERFMON,CAP_SYSLOG,CAP_CHECKPOINT_RESTORE";

/// A booted container.
pub struct Booted {
    nspawn: ChildGuard,
    /// Host pid of the container's PID 1 (systemd).
    init: u32,
    console: PathBuf,
}

impl Booted {
    /// Boots `root` with `binds` (host path, path inside), read-only. Waits until systemd has
    /// finished starting up (`running`, or `degraded` when a unit of the minimal root failed).
    pub fn boot(root: &Path, binds: &[(PathBuf, &str)], console: PathBuf) -> Self {
        fs::create_dir_all("/run/systemd/nspawn").expect("creating /run/systemd/nspawn");
        let mut command = Command::new("systemd-nspawn");
        command
            .arg("--directory")
            .arg(root)
            .args([
                "--volatile=overlay",
                "--boot",
                "--register=no",
                "--keep-unit",
            ])
            .arg(format!("--machine=ember-test-{}", std::process::id()))
            .arg(format!("--capability={EXTRA_CAPS}"))
            .arg("--system-call-filter=bpf perf_event_open")
            .arg("--console=passive");
        for (host, inside) in binds {
            command.arg(format!("--bind-ro={}:{inside}", host.display()));
        }
        let log = fs::File::create(&console).expect("creating the console log");
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("console log"))
            .stderr(log);
        let nspawn = ChildGuard::spawn("systemd-nspawn", &mut command);
        let mut booted = Self {
            init: 0,
            nspawn,
            console,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while booted.init == 0 {
            booted.init = children_of(booted.nspawn.pid())
                .into_iter()
                .find(|pid| {
                    fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|comm| comm.trim() == "systemd")
                })
                .unwrap_or(0);
            if let Some(status) = booted.nspawn.try_wait() {
                panic!(
                    "systemd-nspawn exited ({status}) before the container booted:\n{}",
                    booted.console()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no systemd in the container after 60 s:\n{}",
                booted.console()
            );
            thread::sleep(Duration::from_millis(100));
        }
        // Until systemd answers on its bus, systemctl prints nothing; then --wait waits for the
        // end of start-up.
        let mut state = String::new();
        while state != "running" && state != "degraded" {
            assert!(
                Instant::now() < deadline,
                "the container's systemd did not finish starting ({state:?}):\n{}",
                booted.console()
            );
            thread::sleep(Duration::from_millis(100));
            let output =
                booted.exec(&["timeout", "60", "systemctl", "is-system-running", "--wait"]);
            state = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        }
        booted
    }

    /// The host pid of the container's systemd.
    pub fn init_pid(&self) -> u32 {
        self.init
    }

    /// Runs `args` inside the container (all of its namespaces), returning its output.
    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["--target", &self.init.to_string(), "--all", "--"])
            .args(args)
            .output()
            .unwrap_or_else(|err| panic!("nsenter {args:?}: {err}"))
    }

    /// Runs `args` inside the container and returns its stdout; panics with its output if it
    /// fails.
    pub fn run(&self, args: &[&str]) -> String {
        let output = self.exec(args);
        assert!(
            output.status.success(),
            "{args:?} in the container failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `systemctl show -P PROPERTY UNIT`.
    pub fn property(&self, unit: &str, property: &str) -> String {
        self.run(&["systemctl", "show", "-P", property, unit])
            .trim()
            .to_owned()
    }

    /// The main pid of `unit`, as the container numbers it (0 when it has none).
    pub fn main_pid(&self, unit: &str) -> u32 {
        self.property(unit, "MainPID").parse().unwrap_or(0)
    }

    /// `/proc/PID/status` of a process of the container, as `key -> value`.
    pub fn status(&self, pid: u32) -> Vec<(String, String)> {
        self.run(&["cat", &format!("/proc/{pid}/status")])
            .lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    }

    /// The journal of `units` so far, for failure messages.
    pub fn journal(&self, units: &[&str]) -> String {
        let mut args = vec!["journalctl", "--no-pager", "-o", "cat"];
        for unit in units {
            args.extend(["-u", unit]);
        }
        String::from_utf8_lossy(&self.exec(&args).stdout).into_owned()
    }

    /// What the container wrote to its console so far.
    pub fn console(&self) -> String {
        fs::read_to_string(&self.console).unwrap_or_default()
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        // An orderly poweroff first: nspawn turns SIGTERM into the container's shutdown.
        self.nspawn.signal(Signal::SIGTERM);
        if self.nspawn.wait_timeout(Duration::from_secs(20)).is_none() {
            eprintln!("the container did not power off within 20 s: killing it");
            if self.init != 0 {
                // PID 1 of a pid namespace: killing it kills every process in it.
                let _ = nix::sys::signal::kill(
                    Pid::from_raw(i32::try_from(self.init).unwrap_or(i32::MAX)),
                    Signal::SIGKILL,
                );
            }
            self.nspawn.kill();
        }
    }
}
