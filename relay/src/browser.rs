//! `record --open`: shows flamegraph.svg in a browser once it is written, as the user who ran
//! `sudo`, never as root.
//!
//! The browser must start after the outputs are written, when the relay is no longer root
//! (it drops to an unprivileged user before reading anything) and so can no longer become the
//! invoking user. The opener is therefore started while `record` is still root ([`prepare`],
//! before the drop and before any thread): a `/bin/sh` that has already become the invoking
//! user (`SUDO_UID`/`SUDO_GID`, with that user's groups), in a session of its own, with
//! stdout and stderr on /dev/null, waits on a pipe. [`Opener::open`] writes `open` to it and
//! the shell, with stdin on /dev/null, execs the browser on the path fixed when it was
//! started: the unprivileged relay can trigger the open, never choose what is opened or by
//! what. When `record` ends any other way, the pipe closes and the shell exits.
//!
//! Nothing here fails a recording: every reason not to open is one line on stdout saying where
//! the file is and why it was not opened.

use std::{
    ffi::OsString,
    io::{PipeWriter, Write as _},
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use nix::unistd::{Gid, Uid, User};

use crate::sink::files::writer::Owner;

/// The opener's shell: waits for `open` on stdin, then execs `$0 "$1"` with stdin on /dev/null.
const WAIT_THEN_OPEN: &str = "read -r go || exit 0; [ \"$go\" = open ] || exit 0; \
                              exec \"$0\" \"$1\" </dev/null";

/// What `--open` will do at the end of the recording.
pub(crate) enum Opener {
    /// Nothing was asked.
    Off,
    /// An opener waits as the invoking user for the go.
    Waiting {
        child: Child,
        go: PipeWriter,
        shown: PathBuf,
        program: PathBuf,
        uid: Uid,
    },
    /// Why the file will not be opened.
    Refused { shown: PathBuf, why: String },
}

/// Starts the opener for `file` (shown to the user as `shown`) when a browser can be opened, as
/// root before the privileges are dropped. `env` reads the environment (a seam for tests).
pub(crate) fn prepare(shown: &Path, env: &dyn Fn(&str) -> Option<String>) -> Opener {
    let refused = |why: String| Opener::Refused {
        shown: shown.to_path_buf(),
        why,
    };
    let set = |name: &str| env(name).is_some_and(|v| !v.is_empty());
    if !set("DISPLAY") && !set("WAYLAND_DISPLAY") {
        return refused("no graphical session (DISPLAY and WAYLAND_DISPLAY are unset)".to_owned());
    }
    let Some(owner) = Owner::from_sudo(env) else {
        return refused(
            "no user to open it as (SUDO_UID/SUDO_GID are unset), and a browser is never \
             started as root"
                .to_owned(),
        );
    };
    // `sudo` from a root shell sets SUDO_UID=0: the invoking user is root, and root never gets
    // a browser (it would run every page's code, and every helper it starts, as uid 0).
    if owner.uid.is_root() {
        return refused(
            "the invoking user is root (SUDO_UID=0), and a browser is never started as root"
                .to_owned(),
        );
    }
    let Some(program) = browser(env) else {
        return refused("no browser found ($BROWSER is unset and xdg-open is not on PATH)".into());
    };
    let file = std::path::absolute(shown).unwrap_or_else(|_| shown.to_path_buf());
    match spawn(&program, &file, owner) {
        Ok((child, go)) => Opener::Waiting {
            child,
            go,
            shown: shown.to_path_buf(),
            program,
            uid: owner.uid,
        },
        Err(err) => refused(format!(
            "could not start {} as uid {}: {err}",
            program.display(),
            owner.uid
        )),
    }
}

impl Opener {
    /// After the outputs are written: lets the waiting opener exec the browser, or prints why
    /// the file is not opened. Reaps the shell if it already ended; never waits for it.
    pub(crate) fn open(self) {
        match self {
            Self::Off => {}
            Self::Refused { shown, why } => println!(
                "not opening {}: {why}; open it in a browser",
                shown.display()
            ),
            Self::Waiting {
                mut child,
                mut go,
                shown,
                program,
                uid,
            } => {
                match go.write_all(b"open\n") {
                    Ok(()) => println!(
                        "opening {} with {} as uid {uid}",
                        shown.display(),
                        program.display()
                    ),
                    Err(err) => println!(
                        "not opening {}: the opener is gone ({err}); open it in a browser",
                        shown.display()
                    ),
                }
                drop(go);
                let _ = child.try_wait();
            }
        }
    }
}

/// `$BROWSER` (its first entry, `:`-separated) or `xdg-open`, as an executable path.
fn browser(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let path = env("PATH").unwrap_or_default();
    let requested = env("BROWSER")
        .and_then(|b| b.split(':').next().map(str::to_owned))
        .filter(|b| !b.is_empty());
    find_program(requested.as_deref().unwrap_or("xdg-open"), &path)
}

/// `name` if it contains a `/`, else its first executable file on `path`.
fn find_program(name: &str, path: &str) -> Option<PathBuf> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return executable(&p).then_some(p);
    }
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|p| executable(p))
}

/// Starts the waiting shell as `owner`, its stdin the read end of a pipe; returns it and the
/// write end (close-on-exec: the sampler started later does not inherit it).
fn spawn(program: &Path, file: &Path, owner: Owner) -> std::io::Result<(Child, PipeWriter)> {
    let (ready, go) = std::io::pipe()?;
    let user = User::from_uid(owner.uid).ok().flatten();
    let groups: Vec<libc::gid_t> = user
        .as_ref()
        .and_then(|u| {
            let name = std::ffi::CString::new(u.name.as_bytes()).ok()?;
            nix::unistd::getgrouplist(&name, owner.gid).ok()
        })
        .unwrap_or_else(|| vec![owner.gid])
        .into_iter()
        .map(Gid::as_raw)
        .collect();
    let (uid, gid) = (owner.uid.as_raw(), owner.gid.as_raw());
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(WAIT_THEN_OPEN)
        .arg(program)
        .arg(file)
        .stdin(ready)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (key, value) in user_environment(user.as_ref(), owner.uid) {
        command.env(key, value);
    }
    // SAFETY: runs in the forked child before execve; calls only setgroups, setgid, setuid,
    // getuid, getgid and setsid (async-signal-safe) on values prepared before the fork, and
    // allocates nothing. The order matters: groups and gid while still root, uid last.
    unsafe {
        command.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // setuid as root changes every uid; make sure none is root any more.
            if libc::getuid() != uid || libc::geteuid() != uid || libc::getegid() != gid {
                return Err(std::io::Error::from_raw_os_error(libc::EPERM));
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok((command.spawn()?, go))
}

/// HOME, USER and LOGNAME of the invoking user (sudo leaves root's or its own), and
/// XDG_RUNTIME_DIR when that user has one (where a browser finds the session bus).
fn user_environment(user: Option<&User>, uid: Uid) -> Vec<(&'static str, OsString)> {
    let mut env = Vec::new();
    if let Some(user) = user {
        env.push(("HOME", user.dir.clone().into_os_string()));
        env.push(("USER", OsString::from(&user.name)));
        env.push(("LOGNAME", OsString::from(&user.name)));
    }
    let runtime = PathBuf::from(format!("/run/user/{uid}"));
    if runtime.is_dir() {
        env.push(("XDG_RUNTIME_DIR", runtime.into_os_string()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn why(opener: Opener) -> String {
        match opener {
            Opener::Refused { why, .. } => why,
            _ => panic!("not refused"),
        }
    }

    #[test]
    fn without_a_display_nothing_is_started() {
        let opener = prepare(
            Path::new("out/flamegraph.svg"),
            &env(&[("SUDO_UID", "1000"), ("SUDO_GID", "1000")]),
        );
        assert_eq!(
            why(opener),
            "no graphical session (DISPLAY and WAYLAND_DISPLAY are unset)"
        );
    }

    #[test]
    fn without_sudo_numbers_a_browser_is_never_started_as_root() {
        let opener = prepare(Path::new("f.svg"), &env(&[("DISPLAY", ":0")]));
        assert!(why(opener).starts_with("no user to open it as"));
    }

    #[test]
    fn sudo_from_a_root_shell_never_starts_a_browser() {
        // Given `sudo` run by root: SUDO_UID=0, a display and a browser that exists
        let opener = prepare(
            Path::new("f.svg"),
            &env(&[
                ("DISPLAY", ":0"),
                ("SUDO_UID", "0"),
                ("SUDO_GID", "0"),
                ("BROWSER", "/bin/true"),
            ]),
        );
        // Then nothing is started (as root the reason is uid 0; unprivileged, no sudo user)
        let why = why(opener);
        if Uid::effective().is_root() {
            assert_eq!(
                why,
                "the invoking user is root (SUDO_UID=0), and a browser is never started as root"
            );
        } else {
            assert!(why.starts_with("no user to open it as"), "{why}");
        }
    }

    #[test]
    fn browser_is_found_on_path_or_named_by_browser() {
        let tmp = tempfile::tempdir().unwrap();
        let exe = tmp.path().join("xdg-open");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = tmp.path().join("not-executable");
        std::fs::write(&plain, "").unwrap();
        let path = format!("/nonexistent:{}", tmp.path().display());
        assert_eq!(find_program("xdg-open", &path), Some(exe.clone()));
        assert_eq!(find_program("not-executable", &path), None);
        assert_eq!(find_program(exe.to_str().unwrap(), ""), Some(exe));
        assert_eq!(find_program("xdg-open", ""), None);
    }
}
