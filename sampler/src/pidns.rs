//! Which pid namespace the eBPF program numbers tasks in: the sampler's own, when it is not the
//! initial one (a systemd-nspawn container, a pod without `hostPID`), so that the pids it
//! reports are those of the /proc it reads. Read once, before load, from the kernel's own
//! /proc/self/ns/pid (a stat, no parsing).

use std::os::unix::fs::MetadataExt as _;

use anyhow::Context as _;

/// Inode of the initial pid namespace (`PROC_PID_INIT_INO` in include/linux/proc_ns.h): fixed by
/// the kernel, the same on every host.
const INITIAL_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// (device, inode) of the sampler's pid namespace, or None in the initial one (the program then
/// keeps the kernel's ids, which every container's tasks have too).
pub fn own() -> anyhow::Result<Option<(u64, u64)>> {
    let meta = std::fs::metadata("/proc/self/ns/pid")
        .context("reading /proc/self/ns/pid (which pid namespace the sampler is in)")?;
    Ok((meta.ino() != INITIAL_PID_NS_INO).then(|| (meta.dev(), meta.ino())))
}
