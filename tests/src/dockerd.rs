//! A Docker engine of the test's own, and Compose projects on it, for
//! tests/tests/deploy_live.rs to bring up compose/compose.yaml for real.
//!
//! The engine is the machine's `dockerd` (Debian's docker.io) with its own socket, pidfile and
//! exec root under /run, and its data root in the deploy cache (scripts/deploy-roots.sh), so the
//! base image imported from the cached Debian root is imported once. It touches no firewall
//! rule and makes no default bridge (`--iptables=false --bridge=none`): the relay uses the host's
//! network and the sampler none. A daemon a failed run left behind (its pidfile names a live
//! dockerd) is stopped first.
//!
//! Dropping a [`Project`] runs `docker-compose down -v`; dropping the [`Dockerd`] removes untagged
//! images, stops it (SIGTERM: it stops its containers; SIGKILL after 30 s) and unmounts whatever
//! it left mounted under its roots.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};

use crate::{nspawn::deploy_cache, ChildGuard};

const EXEC_ROOT: &str = "/run/ember-test-docker";
const SOCKET: &str = "/run/ember-test-docker.sock";
const PIDFILE: &str = "/run/ember-test-docker.pid";

/// The base image the test builds on, imported from the cached Debian root.
pub const BASE_IMAGE: &str = "ember-deploy-base:bookworm";

/// A running engine.
pub struct Dockerd {
    daemon: ChildGuard,
    data_root: PathBuf,
    log: PathBuf,
}

fn docker_cli() -> &'static str {
    // Debian's docker.io client; another `docker` earlier on PATH may be of another version.
    if Path::new("/usr/bin/docker").is_file() {
        "/usr/bin/docker"
    } else {
        "docker"
    }
}

impl Dockerd {
    /// Starts the engine, logging to `log`, and waits until it answers.
    pub fn start(log: PathBuf) -> Self {
        stop_stale();
        let data_root = deploy_cache().join("docker");
        fs::create_dir_all(&data_root).expect("creating the engine's data root");
        let out = fs::File::create(&log).expect("creating the dockerd log");
        let mut command = Command::new("dockerd");
        command
            .arg("--data-root")
            .arg(&data_root)
            .args(["--exec-root", EXEC_ROOT, "--pidfile", PIDFILE])
            .arg("--host")
            .arg(format!("unix://{SOCKET}"))
            .args([
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
                "--bridge=none",
            ])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dockerd log"))
            .stderr(out);
        let daemon = ChildGuard::spawn("dockerd", &mut command);
        let mut engine = Self {
            daemon,
            data_root,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if engine.docker(&["version"]).status.success() {
                break;
            }
            if let Some(status) = engine.daemon.try_wait() {
                panic!("dockerd exited ({status}):\n{}", engine.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "dockerd did not answer within 60 s:\n{}",
                engine.log_text()
            );
            thread::sleep(Duration::from_millis(200));
        }
        engine
    }

    /// `DOCKER_HOST` for clients of this engine.
    pub fn host(&self) -> String {
        format!("unix://{SOCKET}")
    }

    /// Runs the docker client against this engine.
    pub fn docker(&self, args: &[&str]) -> Output {
        Command::new(docker_cli())
            .args(args)
            .env("DOCKER_HOST", self.host())
            .output()
            .unwrap_or_else(|err| panic!("docker {args:?}: {err}"))
    }

    /// The engine's version, e.g. `20.10.24+dfsg1`.
    pub fn version(&self) -> String {
        let output = self.docker(&["version", "--format", "{{.Server.Version}}"]);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Imports [`BASE_IMAGE`] from the cached root's tar unless the engine has it already.
    pub fn ensure_base_image(&self) {
        if self
            .docker(&["image", "inspect", BASE_IMAGE])
            .status
            .success()
        {
            return;
        }
        let tar = deploy_cache().join("bookworm.tar");
        assert!(
            tar.is_file(),
            "{} is missing: run `sudo scripts/deploy-roots.sh` (scripts/setup.sh does)",
            tar.display()
        );
        let output = self.docker(&["import", &tar.display().to_string(), BASE_IMAGE]);
        assert!(
            output.status.success(),
            "docker import {}: {}",
            tar.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The host pid of a container's main process.
    pub fn container_pid(&self, id: &str) -> u32 {
        let output = self.docker(&["inspect", "--format", "{{.State.Pid}}", id]);
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        // Each run builds the image anew: the previous one, untagged, would pile up in the
        // cached data root. The base image is tagged and stays.
        let _ = self.docker(&["image", "prune", "--force"]);
        self.daemon.signal(Signal::SIGTERM);
        if self.daemon.wait_timeout(Duration::from_secs(30)).is_none() {
            eprintln!("dockerd did not stop within 30 s of SIGTERM: killing it");
            self.daemon.kill();
        }
        unmount_under(&[Path::new(EXEC_ROOT), &self.data_root]);
        let _ = fs::remove_file(SOCKET);
    }
}

/// Stops a dockerd a failed run left behind (its pidfile names a live dockerd).
fn stop_stale() {
    let Some(pid) = fs::read_to_string(PIDFILE)
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok())
    else {
        return;
    };
    let is_dockerd =
        fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "dockerd");
    if !is_dockerd {
        return;
    }
    eprintln!("stopping dockerd {pid} left by an earlier run");
    let pid = Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while nix::sys::signal::kill(pid, None).is_ok() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    unmount_under(&[Path::new(EXEC_ROOT), &deploy_cache().join("docker")]);
}

/// Lazily unmounts every mount point under `roots`, deepest first.
fn unmount_under(roots: &[&Path]) {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| roots.iter().any(|root| point.starts_with(root)))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A Compose project on a [`Dockerd`]: `docker-compose -p NAME -f FILE...`, taken down (with
/// its volumes) when dropped.
pub struct Project<'a> {
    engine: &'a Dockerd,
    name: String,
    files: Vec<PathBuf>,
}

impl<'a> Project<'a> {
    /// A project over `files`; whatever an earlier run left of it is taken down first.
    pub fn new(engine: &'a Dockerd, name: &str, files: Vec<PathBuf>) -> Self {
        let project = Self {
            engine,
            name: name.to_owned(),
            files,
        };
        project.down();
        project
    }

    /// Runs `docker-compose ARGS` on this project.
    pub fn compose(&self, args: &[&str]) -> Output {
        let mut command = Command::new("docker-compose");
        command.arg("--project-name").arg(&self.name);
        for file in &self.files {
            command.arg("--file").arg(file);
        }
        command
            .args(args)
            .env("DOCKER_HOST", self.engine.host())
            .output()
            .unwrap_or_else(|err| panic!("docker-compose {args:?}: {err}"))
    }

    /// Like [`Self::compose`], panicking with its output when it fails.
    pub fn run(&self, args: &[&str]) -> String {
        let output = self.compose(args);
        assert!(
            output.status.success(),
            "docker-compose {args:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The container id of `service`.
    pub fn container(&self, service: &str) -> String {
        self.run(&["ps", "-q", service]).trim().to_owned()
    }

    /// Everything the project's containers logged.
    pub fn logs(&self) -> String {
        let output = self.compose(&["logs", "--no-color"]);
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn down(&self) {
        let output = self.compose(&["down", "--volumes", "--remove-orphans", "--timeout", "5"]);
        if !output.status.success() {
            eprintln!(
                "docker-compose down: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

impl Drop for Project<'_> {
    fn drop(&mut self) {
        self.down();
    }
}
