//! Makes SIGBUS from a shrunken file mapping harmless. blazesym memory-maps the files it parses
//! (through `/proc/self/fd/N`), and the owner of a mapped file may truncate it while the relay
//! reads it: touching a page past the new end raises SIGBUS (si_code `BUS_ADRERR`), whose
//! default action kills the relay. The handler installed here maps an anonymous zero page over
//! the faulting page instead and returns, so the read retries and sees zeros (the parser then
//! finds garbage, which it must handle anyway), and counts the repair; the pipeline checks
//! [`repaired`] after each batch, warns and drops every open resolver so no damaged mapping
//! stays in use. Any other SIGBUS keeps its default, fatal action.
//!
//! Invariants: the handler only makes async-signal-safe calls (`mmap`, `sigaction`, `raise`, and
//! lock-free atomics); it never allocates or logs. It replaces the SIGBUS handler Rust's standard
//! library installs for stack-overflow reports; on Linux stack overflows raise SIGSEGV, whose
//! handler stays as it is.

use std::{
    ffi::c_void,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
};

/// Faulting pages replaced by zero pages since start.
static REPAIRED: AtomicU64 = AtomicU64::new(0);
/// The page size, read once at install time (sysconf is not async-signal-safe).
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);

/// Why the guard could not be installed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SigbusError {
    #[error("`sigaction(SIGBUS)` failed: {0}")]
    Sigaction(std::io::Error),
}

/// How many faulting pages the handler has replaced with zero pages since start.
pub fn repaired() -> u64 {
    REPAIRED.load(Ordering::SeqCst)
}

/// Installs the process-wide SIGBUS handler. Call once, early (it is idempotent).
pub fn install() -> Result<(), SigbusError> {
    // SAFETY: sysconf has no preconditions; a failure returns -1, which we ignore.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if let Ok(page) = usize::try_from(page) {
        if page.is_power_of_two() {
            PAGE_SIZE.store(page, Ordering::SeqCst);
        }
    }
    // SAFETY: an all-zero `sigaction` is a valid value of this plain C struct (empty mask, no
    // flags); every field we rely on is set below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as *const () as usize;
    // SA_SIGINFO: we need si_code and si_addr. SA_ONSTACK: use the thread's alternate stack when
    // it has one (Rust's runtime sets one up per thread), harmless otherwise.
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `action.sa_mask` is a valid sigset_t we own; sigemptyset only writes it.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is fully initialised, the handler has the signature SA_SIGINFO requires
    // and is async-signal-safe (see the module docs); we do not need the old action.
    let rc = unsafe { libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(SigbusError::Sigaction(std::io::Error::last_os_error()));
    }
    Ok(())
}

extern "C" fn on_sigbus(_signal: libc::c_int, info: *mut libc::siginfo_t, _context: *mut c_void) {
    // SAFETY: for an SA_SIGINFO handler the kernel passes a valid siginfo_t; si_addr is the
    // faulting address for SIGBUS (we only use it when si_code says it is a fault).
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr()) };
    if code == libc::BUS_ADRERR {
        let page = PAGE_SIZE.load(Ordering::SeqCst);
        let base = (addr as usize) & !(page - 1);
        // SAFETY: MAP_FIXED replaces exactly the one page that faults, which belongs to a file
        // mapping that can no longer be read past the file's new end; the replacement is a
        // private, read-only zero page, so the faulting load retries and reads zeros. mmap is a
        // plain system call (async-signal-safe in practice: no locks, no allocation in libc).
        let mapped = unsafe {
            libc::mmap(
                base as *mut c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            REPAIRED.fetch_add(1, Ordering::SeqCst);
            return;
        }
    }
    // Any other SIGBUS: restore the default action. A fault re-faults on return and kills the
    // process as it would have without us; a SIGBUS sent with kill() is raised again (it is
    // blocked while we run, so it is delivered when we return).
    // SAFETY: an all-zero sigaction with SIG_DFL (0) is the default disposition; sigaction and
    // raise are async-signal-safe.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
        if code <= 0 {
            libc::raise(libc::SIGBUS);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, os::fd::AsRawFd as _};

    use super::*;

    #[test]
    fn a_truncated_mapping_reads_zeros_instead_of_killing_the_process() {
        // Given the guard and a read-only mapping of a two-page file full of 0xab
        install().expect("install the guard");
        let page = PAGE_SIZE.load(Ordering::SeqCst);
        let mut file = tempfile::tempfile().expect("temp file");
        file.write_all(&vec![0xab; 2 * page]).expect("fill");
        // SAFETY: a fresh read-only private mapping of a file we own, unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap");
        let before = repaired();
        // When the file is truncated to nothing and the mapping is read past the new end
        file.set_len(0).expect("truncate");
        // SAFETY: inside the mapping; volatile so the load really happens.
        let value = unsafe { std::ptr::read_volatile(map.cast::<u8>().add(page + 10)) };
        // Then the process lives, the page reads as zeros and the repair was counted
        assert_eq!(value, 0);
        assert!(repaired() > before, "counter moved");
        // SAFETY: unmapping what we mapped (including the zero page laid over it).
        unsafe { libc::munmap(map, 2 * page) };
    }
}
