//! Process-wide settings both binaries make at start: `no_new_privs`, before they touch anything
//! untrusted, the open-file limit, since each holds one descriptor per mapped binary, and the
//! check that a change of identity took effect whole (the sampler leaving root, `record`'s relay
//! dropping to its user).

use anyhow::{anyhow, Context as _};

/// Who a process becomes when it leaves root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// The supplementary groups, exactly.
    pub groups: Vec<u32>,
}

/// Refuses to go on unless every uid (real, effective, saved), gid and supplementary group is
/// what `identity` asks.
pub fn check_identity(identity: &Identity) -> anyhow::Result<()> {
    let uids = nix::unistd::getresuid()?;
    let gids = nix::unistd::getresgid()?;
    let mut groups: Vec<u32> = nix::unistd::getgroups()?
        .iter()
        .map(|g| g.as_raw())
        .collect();
    groups.sort_unstable();
    let mut wanted = identity.groups.clone();
    wanted.sort_unstable();
    let all_uid = [uids.real, uids.effective, uids.saved]
        .iter()
        .all(|u| u.as_raw() == identity.uid);
    let all_gid = [gids.real, gids.effective, gids.saved]
        .iter()
        .all(|g| g.as_raw() == identity.gid);
    if !all_uid || !all_gid || groups != wanted {
        return Err(anyhow!(
            "after the uid change: uids {uids:?}, gids {gids:?}, groups {groups:?}; expected {identity:?}"
        ));
    }
    Ok(())
}

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

/// Raises the soft RLIMIT_NOFILE to the hard limit and logs the result. Call once at start, while
/// `prlimit64` is still allowed (the sampler's seccomp filter does not have it).
pub fn raise_nofile_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(
                from = soft,
                to = hard,
                "raised the open-file limit (RLIMIT_NOFILE soft) to its hard limit"
            ),
            Err(err) => tracing::warn!(
                soft,
                hard,
                %err,
                "could not raise the open-file limit (RLIMIT_NOFILE) to its hard limit"
            ),
        },
        Ok((soft, hard)) => tracing::info!(soft, hard, "open-file limit (RLIMIT_NOFILE)"),
        Err(err) => tracing::warn!(%err, "cannot read the open-file limit (RLIMIT_NOFILE)"),
    }
}
