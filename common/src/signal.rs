//! The stop and reload signals: SIGINT and SIGTERM set a flag the main loops poll, so the process
//! ends its work in order (last batch sent, files written) instead of dying mid-write; SIGHUP,
//! where a binary asks for it ([`install_reload_handler`]: `ember-relay run`), sets a second flag
//! that asks for the config to be read again. A binary that does not install it keeps SIGHUP's
//! default action (the sampler: it has nothing to reload).
//!
//! Without SA_RESTART (the sampler's choice, kept for both): a blocking call interrupted by the
//! signal returns EINTR at once, so a loop sleeping in `poll` sees the flag without waiting out
//! its timeout, and the sampler never needs `restart_syscall`, which its seccomp allowlist does
//! not have. Every raw call of the relay that can block already retries on EINTR, and std's
//! reads, writes, sleeps and waits do so themselves.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_reload(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

fn install(handler: extern "C" fn(libc::c_int), signals: &[Signal]) -> anyhow::Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(handler),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for &signal in signals {
        // SAFETY: the handlers only store to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }
            .with_context(|| format!("installing a {signal} handler"))?;
    }
    Ok(())
}

/// Makes SIGINT and SIGTERM set the flag [`stop_requested`] reads.
pub fn install_stop_handlers() -> anyhow::Result<()> {
    install(on_signal, &[Signal::SIGINT, Signal::SIGTERM])
}

/// Makes SIGHUP set the flag [`take_reload_request`] reads (instead of ending the process).
pub fn install_reload_handler() -> anyhow::Result<()> {
    install(on_reload, &[Signal::SIGHUP])
}

/// Whether SIGINT or SIGTERM arrived since [`install_stop_handlers`].
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Whether SIGHUP arrived since the last call (the flag is cleared: one reload per request, and
/// several SIGHUPs before the loop looks make one reload).
pub fn take_reload_request() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}
