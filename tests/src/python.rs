//! CPython for the Python-frame tests (tests/tests/python.rs): finding each interpreter the
//! tests run (pyenv's builds, the host's, the Debian roots of `scripts/runtime-roots.sh`),
//! starting the workloads of tests/workloads/python under it, reading the windows a relay
//! writes, and parsing Python frames out of ember's outputs.
//!
//! The output contract lives in one place, [`python_frame`]: a Python frame is written
//! `qualname (file.py:LINE)` in stacks.folded and the SVG (file = the last component of the
//! code object's file name; LINE the line of the instruction, or the function's first line when
//! the line table could not be read). If that format changes, only this parser changes.
//!
//! A missing interpreter is a skip through [`skip`] (so a failure under `CI` or
//! `EMBER_REQUIRE_ALL`, naming the commands that install it). Everything here runs as root, like
//! the tests that use it; the Debian roots are entered with `chroot`.

use std::{
    env, fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, SystemTime},
};

use serde_json::Value;

use crate::{
    attack::tail, parse_folded, skip, target_dir, wait_until, ChildGuard, FoldedStack, LogReader,
};

// ---------------------------------------------------------------------------------------------
// Python frames in ember's outputs

/// One Python frame as ember writes it: `name (file:line)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyFrame<'a> {
    /// `co_qualname` (3.11 on) or `co_name` (to 3.10), e.g. `outer`, `Class.method`, `<module>`.
    pub name: &'a str,
    /// The last component of the code object's file name, e.g. `truth.py` (empty when it was
    /// not read).
    pub file: &'a str,
    /// The instruction's line, or the function's first line when the line table could not be
    /// read; 0 when the output has none.
    pub line: u32,
}

impl<'a> PyFrame<'a> {
    /// The name without its class or enclosing function (`Class.method` -> `method`): what the
    /// name is on every release, since releases before 3.11 have no qualified name.
    pub fn base_name(&self) -> &'a str {
        base_name(self.name)
    }
}

/// `Class.method` -> `method`; `<module>` and plain names stay as they are. (`<locals>` parts of
/// a qualified name end in `>.`, so this also gives `inner` for `outer.<locals>.inner`.)
pub fn base_name(name: &str) -> &str {
    name.rsplit_once('.').map_or(name, |(_, last)| last)
}

/// A frame of stacks.folded (or an SVG title) parsed as a Python frame: `name (file:line)`
/// with a decimal line, `name (:line)` (no file name was read) or `name (file)` (no line) for a
/// file named `*.py` or `<...>` (`<string>`, `<frozen ...>`). None for anything else: native,
/// kernel and unknown frames, and [`UNKNOWN_PYTHON`] (a Python frame whose code was not read:
/// see [`is_python`]).
pub fn python_frame(frame: &str) -> Option<PyFrame<'_>> {
    let inner = frame.strip_suffix(')')?;
    // A name holds no space (an identifier, or `<module>`, `<lambda>`, `f.<locals>.g`); a file
    // name may, so the first " (" ends the name.
    let (name, location) = inner.split_once(" (")?;
    if name.is_empty() || location.is_empty() {
        return None;
    }
    let (file, line) = match location.rsplit_once(':') {
        Some((file, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => {
            (file, line.parse().ok()?)
        }
        _ if location.ends_with(".py")
            || (location.starts_with('<') && location.ends_with('>')) =>
        {
            (location, 0)
        }
        _ => return None,
    };
    Some(PyFrame { name, file, line })
}

/// How the relay writes a Python frame whose code object it could not read (no name, file or
/// line): `relay/src/interp/cpython/codes.rs`.
pub const UNKNOWN_PYTHON: &str = "[unknown] python";

/// Whether a frame is a Python frame, named ([`python_frame`]) or not ([`UNKNOWN_PYTHON`]).
pub fn is_python(frame: &str) -> bool {
    python_frame(frame).is_some() || frame == UNKNOWN_PYTHON
}

/// Python frames of a stack, named or not: what the kernel's walk contributed.
pub fn python_depth(stack: &FoldedStack) -> usize {
    stack.frames.iter().filter(|f| is_python(f)).count()
}

/// The Python name of a frame (`qualname`), None when it is no Python frame.
pub fn python_frame_name(frame: &str) -> Option<&str> {
    python_frame(frame).map(|f| f.name)
}

/// The Python frames of a folded stack, root first.
pub fn python_frames(stack: &FoldedStack) -> Vec<PyFrame<'_>> {
    stack
        .frames
        .iter()
        .filter_map(|f| python_frame(f))
        .collect()
}

/// The innermost Python frame of a stack (the function whose code ran), if any.
pub fn python_leaf(stack: &FoldedStack) -> Option<PyFrame<'_>> {
    stack.frames.iter().rev().find_map(|f| python_frame(f))
}

/// Whether the stack holds a Python frame of `file` (a workload's file name).
pub fn has_python_file(stack: &FoldedStack, file: &str) -> bool {
    python_frames(stack).iter().any(|f| f.file == file)
}

// ---------------------------------------------------------------------------------------------
// Interpreters

/// Where an interpreter the tests run comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// pyenv's build of this line (`3.6` ... `3.13`): `$(pyenv root)/versions/3.X.*/bin/python3`,
    /// a shared build (libpython3.X.so).
    Pyenv(&'static str),
    /// An interpreter of the host (Debian's `/usr/bin/python3.11`: statically linked).
    Host(&'static str),
    /// Debian's python3 in a root of `scripts/runtime-roots.sh` (`trixie`: 3.13, `sid`: 3.14),
    /// run with `chroot ROOT`.
    Root(&'static str),
}

/// One CPython the tests can run.
#[derive(Clone, Debug)]
pub struct Python {
    /// What the test rows print: `pyenv 3.11.7`, `host 3.11.2`, `Debian sid 3.14.0`.
    pub label: String,
    /// `sys.version_info[:3]` as the interpreter reports it.
    pub version: (u8, u8, u8),
    /// The chroot for the Debian roots.
    root: Option<PathBuf>,
    /// The executable, as seen from inside `root` when there is one.
    exe: PathBuf,
    /// `sys.prefix`: PYTHONHOME for a copy of the executable under another name.
    prefix: String,
}

fn pyenv_root() -> PathBuf {
    env::var_os("PYENV_ROOT").map_or_else(
        || PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"),
        PathBuf::from,
    )
}

fn roots_dir() -> PathBuf {
    env::var_os("EMBER_ROOTS")
        .or_else(|| env::var_os("EMBER_PYTHON_ROOTS"))
        .map_or_else(|| PathBuf::from("/var/cache/ember/roots"), PathBuf::from)
}

/// How to install what is missing (the skip's, or under `CI` the failure's, message).
const INSTALL: &str = "run `pyenv install 3.6 3.7 3.8 3.9 3.10 3.11 3.12 3.13` (shared builds: \
                       PYTHON_CONFIGURE_OPTS=--enable-shared), `apt-get install python3.11` and \
                       `sudo scripts/runtime-roots.sh` (Debian's 3.13 and 3.14), or set \
                       PYENV_ROOT / EMBER_ROOTS";

impl Python {
    /// The interpreter of `source`, or None after a skip (a failure under `CI` or
    /// `EMBER_REQUIRE_ALL`) saying what is missing and how to install it.
    pub fn find(source: Source) -> Option<Self> {
        let found = match source {
            Source::Pyenv(line) => {
                let versions = pyenv_root().join("versions");
                let mut dirs: Vec<PathBuf> = fs::read_dir(&versions)
                    .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
                    .unwrap_or_default();
                dirs.sort();
                dirs.into_iter()
                    .filter(|dir| {
                        dir.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&format!("{line}.")))
                    })
                    .map(|dir| dir.join("bin/python3"))
                    .rfind(|exe| exe.exists())
                    .map(|exe| (None, exe, "pyenv"))
            }
            Source::Host(path) => {
                Some((None, PathBuf::from(path), "host")).filter(|(_, exe, _)| exe.exists())
            }
            Source::Root(suite) => {
                let root = roots_dir().join(suite);
                Some((Some(root), PathBuf::from("/usr/bin/python3"), suite))
                    .filter(|(root, exe, _)| root.as_ref().is_some_and(|r| inside(r, exe).exists()))
            }
        };
        let Some((root, exe, origin)) = found else {
            skip(&format!("no CPython for {source:?}: {INSTALL}"));
            return None;
        };
        let mut python = Self {
            label: String::new(),
            version: (0, 0, 0),
            root,
            exe,
            prefix: String::new(),
        };
        let output = python
            .command_as(
                None,
                &[
                    "-c",
                    "import sys; print('%d.%d.%d' % sys.version_info[:3]); print(sys.prefix)",
                ],
            )
            .stderr(Stdio::piped())
            .output();
        let version = output
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .and_then(|out| {
                let mut lines = out.lines();
                let version = parse_version(lines.next()?.trim())?;
                Some((version, lines.next()?.trim().to_owned()))
            });
        let Some((version, prefix)) = version else {
            skip(&format!(
                "{source:?} ({}) does not run: {INSTALL}",
                python.exe.display()
            ));
            return None;
        };
        python.version = version;
        python.prefix = prefix;
        python.label = match source {
            Source::Root(suite) => {
                format!("Debian {suite} {}.{}.{}", version.0, version.1, version.2)
            }
            _ => format!("{origin} {}.{}.{}", version.0, version.1, version.2),
        };
        Some(python)
    }

    /// 3.11 on: the release that names frames by `co_qualname`.
    pub fn has_qualname(&self) -> bool {
        self.version >= (3, 11, 0)
    }

    /// The executable's path, for a program of the host to exec (an interpreter in a Debian
    /// root is only reachable through chroot: panics for one).
    pub fn executable(&self) -> String {
        assert!(self.root.is_none(), "{} runs under chroot", self.label);
        self.exe.display().to_string()
    }

    /// The directory the workloads are copied to, as the host sees it.
    fn host_dir(&self) -> PathBuf {
        match &self.root {
            Some(root) => inside(root, Path::new(WORKLOAD_DIR_IN_ROOT)),
            None => target_dir().join("ember-test-workloads/python"),
        }
    }

    /// The same directory as the interpreter sees it.
    fn own_dir(&self) -> PathBuf {
        match &self.root {
            Some(_) => PathBuf::from(WORKLOAD_DIR_IN_ROOT),
            None => self.host_dir(),
        }
    }

    /// Copies tests/workloads/python/`name` where the interpreter can read it (inside its root
    /// for a chroot) and returns its path as the interpreter sees it.
    pub fn workload(&self, name: &str) -> String {
        let source = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("workloads/python")
            .join(name);
        let dir = self.host_dir();
        fs::create_dir_all(&dir).expect("creating the Python workload dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod workload dir");
        // Copied beside, then renamed: another test process may be reading the previous copy.
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        fs::copy(&source, &tmp).unwrap_or_else(|err| {
            panic!("copying {} to {}: {err}", source.display(), tmp.display())
        });
        fs::rename(&tmp, dir.join(name)).expect("renaming the workload into place");
        self.own_dir().join(name).display().to_string()
    }

    /// A command running this interpreter with `args`; with `name`, through a copy of its
    /// executable of that name (at most 15 bytes) with PYTHONHOME set to its prefix, so that
    /// stacks.folded files the process's samples under `name` (the relay names a process after
    /// its executable's file) whatever else runs Python on the machine. The copy is the same
    /// program: the relay recognizes CPython from a file's contents, never from its name, and
    /// a shared build's executable only loads its libpython.
    pub fn command_as(&self, name: Option<&str>, args: &[&str]) -> Command {
        let exe = match name {
            Some(name) => {
                assert!(name.len() <= 15, "{name:?} is longer than a comm");
                let bin = self.host_dir().join("bin");
                fs::create_dir_all(&bin).expect("creating the interpreter copy dir");
                let real = match &self.root {
                    Some(root) => inside(root, &self.exe),
                    None => self.exe.clone(),
                };
                // Copied beside, then renamed: another test may be running the last copy.
                let tmp = bin.join(format!(".{name}.{}", std::process::id()));
                fs::copy(&real, &tmp).unwrap_or_else(|err| {
                    panic!("copying {} to {}: {err}", real.display(), tmp.display())
                });
                fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
                    .expect("chmod the interpreter copy");
                fs::rename(&tmp, bin.join(name)).expect("renaming the interpreter copy");
                self.own_dir().join("bin").join(name)
            }
            None => self.exe.clone(),
        };
        let mut command = match &self.root {
            Some(root) => {
                let mut command = Command::new("chroot");
                command.arg(root).arg(exe);
                command
            }
            None => Command::new(exe),
        };
        if name.is_some() {
            command.env("PYTHONHOME", &self.prefix);
        }
        command.args(args).stdin(Stdio::null());
        command
    }

    /// Starts workload `script` (tests/workloads/python) with `args` as process `name` (see
    /// [`Python::command_as`]) and waits for its `{"ready":true,"pid":N}` line.
    pub fn spawn(&self, name: &str, script: &str, args: &[&str]) -> PyProcess {
        self.spawn_with_options(name, &[], script, args)
    }

    /// [`Python::spawn`] with interpreter `options` before the script (e.g. `-X perf_jit`).
    pub fn spawn_with_options(
        &self,
        name: &str,
        options: &[&str],
        script: &str,
        args: &[&str],
    ) -> PyProcess {
        let path = self.workload(script);
        let mut all = options.to_vec();
        all.push(path.as_str());
        all.extend_from_slice(args);
        let mut command = self.command_as(Some(name), &all);
        command.stdout(Stdio::piped()).stderr(Stdio::inherit());
        eprintln!("running {command:?} ({})", self.label);
        let mut child = ChildGuard::spawn(name, &mut command);
        let stdout = LogReader::spawn(name, child.child_mut().stdout.take().expect("piped stdout"));
        let (_, ready) = stdout.expect(0, READY_TIMEOUT, "ready line", |v| v["ready"] == true);
        let pid = ready["pid"].as_u64().and_then(|p| u32::try_from(p).ok());
        assert_eq!(
            pid,
            Some(child.pid()),
            "{script} under {} says it is another pid than the one started",
            self.label
        );
        PyProcess {
            child,
            stdout,
            ready,
        }
    }
}

/// Where the workloads go inside a Debian root.
const WORKLOAD_DIR_IN_ROOT: &str = "/tmp/ember-test-workloads/python";
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// `path` (absolute) inside `root`.
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn parse_version(text: &str) -> Option<(u8, u8, u8)> {
    let mut parts = text.split('.').map(|p| p.parse::<u8>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// A running Python workload.
pub struct PyProcess {
    pub child: ChildGuard,
    /// Its stdout, one line at a time (JSON lines parsed).
    pub stdout: LogReader,
    /// Its `ready` line.
    pub ready: Value,
}

impl PyProcess {
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Waits up to `timeout` for it to exit on its own and returns its last JSON line whose
    /// key `key` is present (e.g. truth.py's split).
    pub fn wait_for_line(&mut self, key: &str, timeout: Duration) -> Value {
        let status = self.child.wait_timeout(timeout);
        assert!(
            status.is_some_and(|s| s.success()),
            "{} did not exit cleanly within {timeout:?} ({status:?}); its output:\n{}",
            self.child.name(),
            self.stdout.text()
        );
        self.stdout.wait_closed(Duration::from_secs(5));
        self.stdout
            .json()
            .into_iter()
            .rev()
            .find(|(_, v)| v.get(key).is_some())
            .map(|(_, v)| v)
            .unwrap_or_else(|| {
                panic!(
                    "{} printed no line with {key:?}:\n{}",
                    self.child.name(),
                    self.stdout.text()
                )
            })
    }
}

// ---------------------------------------------------------------------------------------------
// Windows of a relay's --output-dir

/// Reads the stacks.folded that `ember-relay run --window W --output-dir DIR` rewrites as each
/// window closes: [`Windows::next`] waits for the next rewrite.
pub struct Windows {
    path: PathBuf,
    seen: Option<SystemTime>,
}

impl Windows {
    /// The windows of the relay writing to `out_dir`, from the next one on.
    pub fn new(out_dir: &Path) -> Self {
        let path = out_dir.join("stacks.folded");
        let seen = modified(&path);
        Self { path, seen }
    }

    /// Waits (up to `timeout`) for the file to be rewritten and returns its stacks; `log` is
    /// shown when none comes.
    pub fn next(&mut self, timeout: Duration, log: &LogReader) -> Vec<FoldedStack> {
        wait_until(timeout, || {
            let now = modified(&self.path);
            let changed = now.is_some() && now != self.seen;
            if changed {
                self.seen = now;
            }
            changed
        })
        .unwrap_or_else(|| {
            panic!(
                "no new window in {} within {timeout:?}:\n{}",
                self.path.display(),
                tail(&log.text(), 40)
            )
        });
        // A rewrite of the same second may still be under way: read until two reads agree.
        let mut text = fs::read_to_string(&self.path).unwrap_or_default();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let again = fs::read_to_string(&self.path).unwrap_or_default();
            if again == text {
                break;
            }
            text = again;
        }
        parse_folded(&text)
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_frames_are_parsed_from_the_folded_format_and_nothing_else_is() {
        assert_eq!(
            python_frame("alpha (truth.py:42)"),
            Some(PyFrame {
                name: "alpha",
                file: "truth.py",
                line: 42
            })
        );
        let method = python_frame("Class.method (x (1).py:7)").expect("a method");
        assert_eq!(
            (method.name, method.file, method.base_name()),
            ("Class.method", "x (1).py", "method")
        );
        assert_eq!(
            python_frame("<module> (<frozen importlib._bootstrap>:1)").map(|f| f.name),
            Some("<module>")
        );
        assert_eq!(base_name("outer.<locals>.inner"), "inner");
        assert_eq!(
            python_frame("f (x.py)"),
            Some(PyFrame {
                name: "f",
                file: "x.py",
                line: 0
            })
        );
        assert_eq!(
            python_frame("f (:3)").map(|f| (f.file, f.line)),
            Some(("", 3))
        );
        assert!(is_python(UNKNOWN_PYTHON) && python_frame(UNKNOWN_PYTHON).is_none());
        for native in [
            "[unknown]",
            "f (x.c)",
            "main",
            "_PyEval_EvalFrameDefault",
            "do_syscall_64_[k]",
            "[unknown] stripped",
            "(anonymous namespace)::f()",
            "operator() (a.py:x)",
            " (a.py:1)",
        ] {
            assert_eq!(python_frame(native), None, "{native}");
        }
    }
}
