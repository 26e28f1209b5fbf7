//! The relay's confinement: dropping from root to an unprivileged user with no capabilities and
//! no_new_privs, and reading back what the kernel says the process now holds.

use anyhow::{anyhow, bail, Context as _};
use caps::CapSet;
use nix::unistd::{Gid, Uid, User};

/// What /proc/self/status says about our privileges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub uid: String,
    pub cap_eff: String,
    pub cap_prm: String,
    pub cap_bnd: String,
    pub no_new_privs: String,
}

pub fn status() -> Status {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    Status {
        uid: field("Uid:"),
        cap_eff: field("CapEff:"),
        cap_prm: field("CapPrm:"),
        cap_bnd: field("CapBnd:"),
        no_new_privs: field("NoNewPrivs:"),
    }
}

/// Becomes `user` for good: no supplementary groups, no capabilities in any set, no_new_privs.
/// Must be called as root. Fails (rather than continuing privileged) if any step fails.
pub fn drop_to(user: &str) -> anyhow::Result<()> {
    let account = User::from_name(user)
        .with_context(|| format!("looking up user `{user}`"))?
        .ok_or_else(|| {
            anyhow!(
                "no user `{user}` on this system; pass --user with an existing unprivileged user"
            )
        })?;
    if account.uid.is_root() {
        bail!("--user `{user}` is root; choose an unprivileged user");
    }
    // The bounding set can only be emptied while we still hold CAP_SETPCAP.
    caps::clear(None, CapSet::Bounding).context("emptying the capability bounding set")?;
    caps::clear(None, CapSet::Ambient).context("emptying the ambient capability set")?;
    nix::unistd::setgroups(&[]).context("dropping supplementary groups")?;
    nix::unistd::setresgid(account.gid, account.gid, account.gid).context("setresgid")?;
    nix::unistd::setresuid(account.uid, account.uid, account.uid).context("setresuid")?;
    // Leaving uid 0 clears the permitted and effective sets; clear them anyway and check.
    caps::clear(None, CapSet::Effective).context("clearing effective capabilities")?;
    caps::clear(None, CapSet::Permitted).context("clearing permitted capabilities")?;
    set_no_new_privs()?;
    // Let our own /proc entries belong to us again (the uid change made them root's).
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    if Uid::current() != account.uid
        || Uid::effective() != account.uid
        || Gid::effective() != account.gid
    {
        bail!("dropping to `{user}` did not take effect");
    }
    if !caps::read(None, CapSet::Effective)?.is_empty()
        || !caps::read(None, CapSet::Permitted)?.is_empty()
    {
        bail!("capabilities remain after dropping to `{user}`");
    }
    Ok(())
}

/// Forbids gaining privileges through execve (setuid binaries, file capabilities).
pub fn set_no_new_privs() -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes plain integers and affects only this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_SET_NO_NEW_PRIVS)");
    }
    Ok(())
}
