//! `no_new_privs`, which both binaries set before they touch anything untrusted.

use anyhow::Context as _;

/// Forbids gaining privileges through execve (setuid binaries, file capabilities) for this
/// process and its children, for good; it is also what lets an unprivileged process install a
/// seccomp filter.
pub fn set_no_new_privs() -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes plain integers and affects only this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_SET_NO_NEW_PRIVS)");
    }
    Ok(())
}
