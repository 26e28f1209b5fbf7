//! Go toolchains for the end-to-end tests: the host's `go` (Debian 12's golang-go, Go 1.19) and
//! Debian trixie's (golang-go, Go 1.24) in its root of `scripts/runtime-roots.sh` (under
//! `$EMBER_ROOTS`, else `$EMBER_PYTHON_ROOTS`, else `/var/cache/ember/roots`), run with `chroot`
//! inside a private mount namespace that mounts its own /proc (the Go tool needs
//! `/proc/self/exe`). Workloads are
//! built from tests/workloads/go, unstripped or with `-ldflags='-s -w'`, and cached under
//! target/ember-test-workloads/go by toolchain, flags and source, so reruns do not build again.
//! The binaries are static: they run on the host whichever toolchain built them.
//!
//! Nothing is fetched: `GOTOOLCHAIN=local`, `GOPROXY=off`, `GOFLAGS=` and a `GOCACHE` /
//! `GOPATH` / `HOME` of the tests' own.

use std::{
    collections::hash_map::DefaultHasher,
    env, fs,
    hash::{Hash, Hasher},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::{skip, target_dir};

/// A Go toolchain the tests use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toolchain {
    /// The host's `go` (Debian 12: 1.19).
    Host,
    /// `/usr/bin/go` of the Debian trixie root (1.24).
    Trixie,
}

impl Toolchain {
    /// What test output calls it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Host => "host go 1.19",
            Self::Trixie => "trixie go 1.24",
        }
    }

    /// The `go version` it must report.
    fn version(self) -> &'static str {
        match self {
            Self::Host => "go1.19",
            Self::Trixie => "go1.24",
        }
    }

    fn root(self) -> Option<PathBuf> {
        match self {
            Self::Host => None,
            Self::Trixie => Some(
                env::var_os("EMBER_ROOTS")
                    .or_else(|| env::var_os("EMBER_PYTHON_ROOTS"))
                    .map_or_else(|| PathBuf::from("/var/cache/ember/roots"), PathBuf::from)
                    .join("trixie"),
            ),
        }
    }

    /// Where builds happen, as the host sees it and as the toolchain does.
    fn work_dirs(self) -> (PathBuf, PathBuf) {
        match self.root() {
            Some(root) => (
                root.join("tmp/ember-go-work"),
                PathBuf::from("/tmp/ember-go-work"),
            ),
            None => {
                let dir = target_dir().join("ember-test-workloads/go/host-work");
                (dir.clone(), dir)
            }
        }
    }

    /// Runs `go ARGS`; its stdout, or `None` (with the reason printed) when it failed.
    fn go(self, args: &[&str]) -> Option<String> {
        let (host_work, work) = self.work_dirs();
        fs::create_dir_all(&host_work).ok()?;
        let envs = [
            ("GOCACHE", work.join("gocache").display().to_string()),
            ("GOPATH", work.join("gopath").display().to_string()),
            ("HOME", work.display().to_string()),
            ("GOTOOLCHAIN", "local".to_owned()),
            ("GOPROXY", "off".to_owned()),
            ("GOFLAGS", String::new()),
            ("GOTELEMETRY", "off".to_owned()),
            ("CGO_ENABLED", "0".to_owned()),
        ];
        let mut command = match self.root() {
            None => {
                let mut c = Command::new("go");
                c.envs(envs.iter().map(|(k, v)| (k, v)));
                c.args(args);
                c
            }
            Some(root) => {
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg("mount -t proc proc \"$0/proc\" && exec chroot \"$0\" /usr/bin/env \"$@\"")
                    .arg(root);
                c.args(envs.iter().map(|(k, v)| format!("{k}={v}")));
                c.arg("/usr/bin/go").args(args);
                c
            }
        };
        let out = command
            .current_dir(&host_work)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "{}: go {args:?} failed: {}",
                self.label(),
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        String::from_utf8(out.stdout).ok()
    }

    /// Whether the toolchain runs here and is the expected version; a skip (a failure under
    /// `CI` or `EMBER_REQUIRE_ALL`) when not.
    pub fn available(self) -> bool {
        if self
            .go(&["version"])
            .is_some_and(|v| v.contains(self.version()))
        {
            return true;
        }
        skip(&format!(
            "{} is not installed: the tests need Debian's golang-go on the host (1.19) and in \
             the trixie root of scripts/runtime-roots.sh (1.24)",
            self.label()
        ));
        false
    }

    /// tests/workloads/go/`source`.go built as `name` (at most 15 bytes: the process's name),
    /// stripped with `-ldflags='-s -w'` when asked; cached under target/, mode 0755 (the
    /// relay reads it as an unprivileged user).
    pub fn build(self, source: &str, name: &str, stripped: bool) -> PathBuf {
        assert!(name.len() <= 15, "{name:?} is longer than a comm");
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("workloads/go")
            .join(format!("{source}.go"));
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
        let mut hasher = DefaultHasher::new();
        (&text, self.label(), stripped).hash(&mut hasher);
        let dir = target_dir()
            .join("ember-test-workloads/go")
            .join(format!("{:016x}", hasher.finish()));
        let out = dir.join(name);
        if out.is_file() {
            return out;
        }
        let (host_work, work) = self.work_dirs();
        fs::create_dir_all(&host_work).expect("creating the Go work dir");
        let unique = format!("{name}-{}", std::process::id());
        fs::write(host_work.join(format!("{unique}.go")), &text).expect("writing the Go source");
        let built = work.join(&unique).display().to_string();
        let src = work.join(format!("{unique}.go")).display().to_string();
        let mut args = vec!["build", "-o", &built];
        if stripped {
            args.push("-ldflags=-s -w");
        }
        args.push(&src);
        self.go(&args)
            .unwrap_or_else(|| panic!("{}: building {source}.go failed", self.label()));
        fs::create_dir_all(&dir).expect("creating the workload dir");
        for d in [dir.as_path(), dir.parent().expect("go dir")] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).expect("chmod dir");
        }
        // Copied beside, then renamed: another test process may be running the previous binary.
        let tmp = dir.join(format!(".{unique}"));
        fs::copy(host_work.join(&unique), &tmp).expect("copying the built workload");
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).expect("chmod workload");
        fs::rename(&tmp, &out).expect("renaming the workload into place");
        let _ = fs::remove_file(host_work.join(&unique));
        let _ = fs::remove_file(host_work.join(format!("{unique}.go")));
        out
    }
}
