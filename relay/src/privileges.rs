//! The relay's confinement: choosing the unprivileged user `record` becomes, dropping from root
//! to it with no supplementary groups, no capabilities in any set and no_new_privs, keeping the
//! process non-dumpable, and reading back what the kernel says the process now holds.
//!
//! Invariants: once [`drop_to`] returned, the process has no way back to root, and no other
//! process of its uid can read its memory or take its descriptors (PR_SET_DUMPABLE 0 makes
//! /proc/PID/{mem,fd,environ} root's and fails ptrace and pidfd_getfd for that uid). The user is
//! never a shared account such as `nobody`: by default a dedicated `ember` account, else a uid no
//! account, group or running process uses.

use std::{collections::BTreeSet, fs, ops::RangeInclusive};

use anyhow::{anyhow, bail, Context as _};
use caps::CapSet;
pub use ember_common::set_no_new_privs;
use ember_common::ProcStatus;
use nix::unistd::{Gid, Group, Uid, User};

/// The dedicated account `record` becomes when it exists (`useradd --system ember`).
pub const DEDICATED_ACCOUNT: &str = "ember";

/// Where a uid is picked when there is no dedicated account: systemd's range for dynamic users
/// (DynamicUser=), which no package allocates statically.
pub const PICK_RANGE: RangeInclusive<u32> = 61184..=65519;

/// What /proc/self/status says about our privileges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub uid: String,
    pub gid: String,
    pub groups: String,
    pub cap_eff: String,
    pub cap_prm: String,
    pub cap_bnd: String,
    pub no_new_privs: String,
}

/// Reads /proc/self/status (bounded, see [`ProcStatus`]); fields are "" when it cannot be read.
pub fn status() -> Status {
    let status = ProcStatus::read_self();
    let field = |name: &str| status.field(name).to_owned();
    Status {
        uid: field("Uid"),
        gid: field("Gid"),
        groups: field("Groups"),
        cap_eff: field("CapEff"),
        cap_prm: field("CapPrm"),
        cap_bnd: field("CapBnd"),
        no_new_privs: field("NoNewPrivs"),
    }
}

/// Why the relay runs as the uid it does (logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `--user` named it.
    Requested,
    /// The dedicated `ember` account exists.
    DedicatedAccount,
    /// No dedicated account: a uid nothing else uses, picked at run time.
    Picked,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "requested with --user",
            Self::DedicatedAccount => "dedicated `ember` account",
            Self::Picked => "picked: an unused uid (no account, no group, no process)",
        }
    }
}

/// The identity the relay drops to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The account name, or the number for a uid without one.
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    pub reason: Reason,
}

/// Chooses the user `record` becomes: `requested` (a name, or a uid with or without an account:
/// gid = uid then), else the `ember` account, else an unused uid from [`PICK_RANGE`]. Must run as
/// root (it reads every process's status) and before any other process of ours could take the
/// picked uid.
pub fn choose_user(requested: Option<&str>) -> anyhow::Result<Target> {
    let target = match requested {
        Some(text) => resolve(text)?,
        None => match User::from_name(DEDICATED_ACCOUNT)
            .with_context(|| format!("looking up user `{DEDICATED_ACCOUNT}`"))?
        {
            Some(account) => Target {
                name: account.name,
                uid: account.uid,
                gid: account.gid,
                reason: Reason::DedicatedAccount,
            },
            None => {
                let running = process_uids();
                let uid = pick_uid(PICK_RANGE, |uid| taken(&running, uid)).ok_or_else(|| {
                    anyhow!(
                        "no unused uid in {}..={}; create a dedicated `{DEDICATED_ACCOUNT}` \
                         account (`useradd --system {DEDICATED_ACCOUNT}`) or pass --user",
                        PICK_RANGE.start(),
                        PICK_RANGE.end()
                    )
                })?;
                Target {
                    name: uid.to_string(),
                    uid: Uid::from_raw(uid),
                    gid: Gid::from_raw(uid),
                    reason: Reason::Picked,
                }
            }
        },
    };
    if target.uid.is_root() || target.gid.as_raw() == 0 {
        bail!(
            "user `{}` is root or in group root; choose an unprivileged user",
            target.name
        );
    }
    Ok(target)
}

/// `--user USER|UID`: an account name, or a number (gid = its account's, else the number).
fn resolve(text: &str) -> anyhow::Result<Target> {
    let account = ember_common::resolve_account("--user", text)?;
    Ok(Target {
        name: account.name,
        uid: Uid::from_raw(account.uid),
        gid: Gid::from_raw(account.gid),
        reason: Reason::Requested,
    })
}

/// The first uid of `range` that `taken` does not claim. Pure: the caller decides what is taken.
pub fn pick_uid(range: RangeInclusive<u32>, taken: impl Fn(u32) -> bool) -> Option<u32> {
    range.into_iter().find(|&uid| !taken(uid))
}

/// Whether `uid` is unusable for the relay: a running process has it, or an account or a
/// group has the number.
fn taken(running: &BTreeSet<u32>, uid: u32) -> bool {
    running.contains(&uid) || has_account_or_group(uid)
}

/// Whether an account (passwd, through NSS) or a group has this number.
fn has_account_or_group(id: u32) -> bool {
    // A failed lookup counts as taken: better skip a number than reuse someone's.
    !matches!(User::from_uid(Uid::from_raw(id)), Ok(None))
        || !matches!(Group::from_gid(Gid::from_raw(id)), Ok(None))
}

/// Every uid (real, effective, saved, filesystem) of every running process.
fn process_uids() -> BTreeSet<u32> {
    let mut uids = BTreeSet::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return uids;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process gone meanwhile has no uid to take.
        if let Ok(status) = ProcStatus::read(entry.path().join("status")) {
            uids.extend(status.uids());
        }
    }
    uids
}

/// Becomes `target` for good: no supplementary groups, no capabilities in any set,
/// no_new_privs, not dumpable. Must be called as root, before the process starts any thread
/// (capability sets are per thread). Fails (rather than continuing privileged) if any step fails.
pub fn drop_to(target: &Target) -> anyhow::Result<()> {
    if target.uid.is_root() {
        bail!("`{}` is root; choose an unprivileged user", target.name);
    }
    // Not dumpable from here on: no other process of the new uid may read our memory (the
    // copies of root-only binaries, OTLP headers, TLS keys) or take our descriptors. The uid
    // change below would also reset it (to fs.suid_dumpable), but only if that is 0.
    set_non_dumpable()?;
    // The bounding set can only be emptied while we still hold CAP_SETPCAP.
    caps::clear(None, CapSet::Bounding).context("emptying the capability bounding set")?;
    caps::clear(None, CapSet::Ambient).context("emptying the ambient capability set")?;
    caps::clear(None, CapSet::Inheritable).context("emptying the inheritable capability set")?;
    nix::unistd::setgroups(&[]).context("dropping supplementary groups")?;
    nix::unistd::setresgid(target.gid, target.gid, target.gid).context("setresgid")?;
    nix::unistd::setresuid(target.uid, target.uid, target.uid).context("setresuid")?;
    // Leaving uid 0 clears the permitted and effective sets; clear them anyway and check.
    caps::clear(None, CapSet::Effective).context("clearing effective capabilities")?;
    caps::clear(None, CapSet::Permitted).context("clearing permitted capabilities")?;
    set_no_new_privs()?;
    set_non_dumpable()?;
    let identity = ember_common::Identity {
        uid: target.uid.as_raw(),
        gid: target.gid.as_raw(),
        groups: Vec::new(),
    };
    ember_common::check_identity(&identity)
        .with_context(|| format!("dropping to `{}` did not take effect", target.name))?;
    for set in [
        CapSet::Effective,
        CapSet::Permitted,
        CapSet::Inheritable,
        CapSet::Ambient,
        CapSet::Bounding,
    ] {
        if !caps::read(None, set)?.is_empty() {
            bail!(
                "{set:?} capabilities remain after dropping to `{}`",
                target.name
            );
        }
    }
    if dumpable()? {
        bail!(
            "the relay is still dumpable after dropping to `{}`",
            target.name
        );
    }
    Ok(())
}

/// Makes the process non-dumpable: its /proc/PID entries (mem, fd, environ, maps) belong to
/// root, and ptrace, process_vm_readv and pidfd_getfd fail for processes of the same uid. The
/// process itself still reads /proc/self/status and reopens /proc/self/fd/N (the kernel lets a
/// thread group into its own entries).
pub fn set_non_dumpable() -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) takes plain integers and affects only this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_SET_DUMPABLE, 0)");
    }
    Ok(())
}

fn dumpable() -> anyhow::Result<bool> {
    // SAFETY: prctl(PR_GET_DUMPABLE) takes plain integers and only reads.
    let rc = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_GET_DUMPABLE)");
    }
    Ok(rc != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_uid_nothing_claims_is_picked() {
        // Given the start of the range and the next uid taken (by an account, a group or a
        // process: the picker does not care which)
        let taken: BTreeSet<u32> = [61184, 61185, 61187].into();
        // When picking
        let picked = pick_uid(PICK_RANGE, |uid| taken.contains(&uid));
        // Then the first free one comes out, and holes are used
        assert_eq!(picked, Some(61186));
        assert_eq!(pick_uid(PICK_RANGE, |_| false), Some(61184));
    }

    #[test]
    fn a_fully_taken_range_picks_nothing() {
        assert_eq!(pick_uid(PICK_RANGE, |_| true), None);
        assert_eq!(pick_uid(10..=12, |uid| uid != 12), Some(12));
    }

    #[test]
    fn the_picked_range_stays_clear_of_nobody_and_system_ids() {
        // 65534 is nobody, 65535 is the invalid uid; below 61184 are static allocations.
        assert!(!PICK_RANGE.contains(&65534) && !PICK_RANGE.contains(&65535));
        assert!(*PICK_RANGE.start() >= 60000);
    }

    /// A number no account and no group has on this machine, far above the usual ranges.
    fn unused_number() -> u32 {
        pick_uid(4_000_000..=4_100_000, has_account_or_group).expect("an unused number")
    }

    #[test]
    fn a_uid_a_process_an_account_or_a_group_has_is_taken() {
        let free = unused_number();
        let running: BTreeSet<u32> = [free].into();
        // A uid only a running process has is taken
        assert!(taken(&running, free));
        // root's uid (an account and a group) is taken even when no process is listed
        assert!(taken(&BTreeSet::new(), 0));
        // So is a number only a group has (Debian's base-passwd has several, e.g. staff, 50):
        // the relay's gid is its uid, and sharing a group's number would give it that group
        let group_only = (1..=1000)
            .find(|&n| {
                matches!(User::from_uid(Uid::from_raw(n)), Ok(None))
                    && matches!(Group::from_gid(Gid::from_raw(n)), Ok(Some(_)))
            })
            .expect("this system has a group without an account of the same number");
        assert!(taken(&BTreeSet::new(), group_only), "gid {group_only}");
        // And a number nothing has is free
        assert!(!taken(&BTreeSet::new(), free));
        assert!(!has_account_or_group(free));
        // The picker over the real predicate skips the running uid and any account: what it
        // picks is free by every count
        let picked = pick_uid(free..=free + 1000, |uid| taken(&running, uid)).expect("a uid");
        assert_ne!(picked, free);
        assert!(!running.contains(&picked) && !has_account_or_group(picked));
    }

    #[test]
    fn root_is_refused_as_the_user_to_become() {
        // Given root asked for by name and by number
        for requested in ["root", "0"] {
            // When choosing the user, it is refused, saying why
            let err = choose_user(Some(requested)).expect_err("root must be refused");
            assert!(err.to_string().contains("is root"), "{requested}: {err:#}");
        }
        // A uid without an account is accepted, with the number as its group
        let free = unused_number();
        let target = choose_user(Some(&free.to_string())).expect("an unused uid is accepted");
        assert_eq!(
            (target.name, target.uid, target.gid, target.reason),
            (
                free.to_string(),
                Uid::from_raw(free),
                Gid::from_raw(free),
                Reason::Requested
            )
        );
    }

    #[test]
    fn drop_to_refuses_root_before_changing_anything() {
        // Given a target that is root (a caller that skipped choose_user's check)
        let root = Target {
            name: "root".to_owned(),
            uid: Uid::from_raw(0),
            gid: Gid::from_raw(0),
            reason: Reason::Requested,
        };
        let dumpable_before = dumpable().expect("PR_GET_DUMPABLE");
        // When dropping to it (on a thread of its own: capability sets are per thread, so a
        // broken check cannot strip the other tests' thread)
        let result = std::thread::spawn(move || drop_to(&root).map_err(|e| format!("{e:#}")))
            .join()
            .expect("the drop thread panicked");
        // Then it is refused for being root, before anything changed (the process is as
        // dumpable as before)
        let err = result.expect_err("dropping to root must be refused");
        assert!(err.contains("is root"), "{err}");
        assert_eq!(dumpable().expect("PR_GET_DUMPABLE"), dumpable_before);
        // What needs root and is left to the root-only end-to-end tests: that the drop really
        // empties the supplementary groups and every capability set, and sets no_new_privs.
    }

    /// Set, in the child process of [`the_drop_leaves_no_group_no_capability_and_no_way_back`],
    /// to the uid the child drops to.
    const DROP_CHILD_UID: &str = "EMBER_TEST_DROP_CHILD_UID";

    #[test]
    fn the_drop_leaves_no_group_no_capability_and_no_way_back() {
        // Needs root: only root can drop. Skipping is a failure where everything must run.
        let euid = nix::unistd::geteuid();
        if !euid.is_root() {
            let required = std::env::var("CI").as_deref() == Ok("true")
                || std::env::var("EMBER_REQUIRE_ALL").as_deref() == Ok("1");
            assert!(
                !required,
                "this test drops privileges and needs root (euid {euid})"
            );
            eprintln!("SKIPPED: this test drops privileges and needs root (euid {euid})");
            return;
        }
        // Given a child process of this test binary that runs only `drop_child_process` and
        // starts as root with supplementary groups (the drop must remove them)
        let uid = unused_number();
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"));
        child
            .args([
                "--exact",
                "privileges::tests::drop_child_process",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(DROP_CHILD_UID, uid.to_string());
        // SAFETY: the closure runs in the forked child before exec and only calls setgroups(2)
        // on a local array; it allocates nothing and takes no lock.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut child, || {
                let groups: [libc::gid_t; 2] = [4, 24];
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // When it drops to an unused uid, Then it passes its checks (and really ran them)
        let output = child.output().expect("run the child test");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "the dropped child failed:\n{stdout}\n{stderr}"
        );
    }

    /// The child half of [`the_drop_leaves_no_group_no_capability_and_no_way_back`]; does
    /// nothing unless started by it.
    #[test]
    fn drop_child_process() {
        let Ok(uid) = std::env::var(DROP_CHILD_UID) else {
            return;
        };
        let uid: u32 = uid.parse().expect("a uid");
        assert!(
            !nix::unistd::getgroups().expect("getgroups").is_empty(),
            "the child must start with supplementary groups"
        );
        drop_to(&Target {
            name: uid.to_string(),
            uid: Uid::from_raw(uid),
            gid: Gid::from_raw(uid),
            reason: Reason::Picked,
        })
        .expect("drop_to");
        // The kernel's view of this thread (capability sets are per thread), read directly
        // rather than through the calls drop_to checks itself with
        let status = fs::read_to_string("/proc/thread-self/status").expect("status");
        let field = |name: &str| -> String {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|| panic!("no {name} in status"))
        };
        let four = format!("{uid} {uid} {uid} {uid}");
        assert_eq!(field("Uid:"), four);
        assert_eq!(field("Gid:"), four);
        assert_eq!(field("Groups:"), "");
        for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            assert_eq!(field(set), "0000000000000000", "{set}");
        }
        assert_eq!(field("NoNewPrivs:"), "1");
        // No way back, and not dumpable
        assert!(nix::unistd::setuid(Uid::from_raw(0)).is_err());
        assert!(nix::unistd::setgid(Gid::from_raw(0)).is_err());
        assert!(!dumpable().expect("PR_GET_DUMPABLE"));
    }

    #[test]
    fn this_process_uid_is_seen_as_running() {
        let me = nix::unistd::getuid().as_raw();
        assert!(process_uids().contains(&me));
    }
}
