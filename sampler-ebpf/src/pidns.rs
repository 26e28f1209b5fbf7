//! The current task's (tgid, pid) as the sampler's /proc numbers them.
//!
//! The kernel's own ids (`bpf_get_current_pid_tgid`) are those of the initial pid namespace. A
//! sampler started in a pid namespace of its own (a systemd-nspawn container, a pod without
//! `hostPID`) reads a /proc that numbers tasks in that namespace: there the loader sets
//! [`PIDNS_DEV`] and [`PIDNS_INO`] (the device and inode of its /proc/self/ns/pid) and the ids come
//! from `bpf_get_ns_current_pid_tgid` instead (Linux 5.7+). That helper answers only for tasks
//! whose own pid namespace is exactly that one; every other task (the host's, or one in a nested
//! namespace) is outside what the sampler can read in /proc, so its events are dropped and the
//! caller counts them.
//!
//! Both globals 0 (the loader's default, and what it sets in the initial namespace) keeps the
//! kernel's ids: the helper would refuse every task in a child namespace (containers) there.

use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::{bpf_get_current_pid_tgid, bpf_get_ns_current_pid_tgid},
};

/// Device of the sampler's pid namespace (st_dev of /proc/self/ns/pid); 0 = the initial one.
#[no_mangle]
static PIDNS_DEV: u64 = 0;
/// Inode of the sampler's pid namespace (st_ino of /proc/self/ns/pid); 0 = the initial one.
#[no_mangle]
static PIDNS_INO: u64 = 0;

/// The kernel's (tgid, pid) of the current task: (0, 0) for the idle task, whatever the
/// namespace.
#[inline(always)]
pub fn kernel_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// The current task's (tgid, pid) in the sampler's pid namespace, or None when the task is not
/// in it (see the module header).
#[inline(always)]
pub fn current() -> Option<(u32, u32)> {
    // SAFETY: reads of read-only globals the loader set before load.
    let (dev, ino) = unsafe {
        (
            core::ptr::read_volatile(&PIDNS_DEV),
            core::ptr::read_volatile(&PIDNS_INO),
        )
    };
    if dev == 0 && ino == 0 {
        return Some(kernel_ids());
    }
    let mut info = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: the helper writes exactly `size` bytes into `info`, a local of that size.
    let rc = unsafe {
        bpf_get_ns_current_pid_tgid(
            dev,
            ino,
            &mut info,
            core::mem::size_of::<bpf_pidns_info>() as u32,
        )
    };
    (rc == 0).then_some((info.tgid, info.pid))
}
