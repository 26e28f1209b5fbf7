//! Entry points for the fuzz targets under `fuzz/` (built only with the `fuzzing` feature): each
//! takes the raw bytes a hostile peer, process or file could hand the relay and drives the same
//! parser the daemon runs on them, with the daemon's own bounds. A panic, a hang past libFuzzer's
//! timeout or growth past its memory limit is a finding; an `Err` is the expected answer to
//! garbage and is ignored here.

use std::{
    fs::File,
    io::Write,
    os::fd::{FromRawFd, OwnedFd},
};

use crate::{config, labels, symbolize, unwind};

/// An anonymous in-memory file holding `data`, as the sampler would pass a descriptor.
fn memfd(data: &[u8]) -> Option<OwnedFd> {
    // SAFETY: a NUL-terminated name and no flags the kernel could misread; a negative return is
    // checked before the descriptor is owned.
    let fd = unsafe { libc::memfd_create(c"ember-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just created by memfd_create and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = File::from(fd);
    file.write_all(data).ok()?;
    Some(OwnedFd::from(file))
}

/// /proc/kallsyms as passed by the sampler: read through its descriptor with the daemon's size
/// and line caps, then looked up at a few addresses taken from the input.
pub fn kallsyms(data: &[u8]) {
    let Some(fd) = memfd(data) else { return };
    if let Ok(symbols) = symbolize::kernel::KernelSymbols::from_fd(fd) {
        for chunk in data.chunks_exact(8).take(16) {
            let mut addr = [0u8; 8];
            addr.copy_from_slice(chunk);
            let _ = symbols.lookup(u64::from_le_bytes(addr));
        }
    }
}

/// An ELF file handed over as a descriptor, symbolized at the file offset in the input's first
/// 8 bytes (the rest is the file), and its build id read.
pub fn elf_symbolize(data: &[u8]) {
    let Some((offset, file)) = data.split_first_chunk::<8>() else {
        return;
    };
    let Some(fd) = memfd(file) else { return };
    let _ = symbolize::elf::build_id(&fd);
    let Ok(key) = symbolize::elf::FileKey::of(&fd) else {
        return;
    };
    let mut cache = symbolize::elf::ElfCache::new(symbolize::elf::DEFAULT_MAX_COPY_BYTES);
    let _ = cache.resolve(&key, &fd, "fuzz", u64::from_le_bytes(*offset));
}

/// An ELF file's `.eh_frame`/`.debug_frame` compiled into an unwind table with the daemon's
/// default limits.
pub fn unwind_compile(data: &[u8]) {
    let Some(fd) = memfd(data) else { return };
    let _ = unwind::compile(&File::from(fd), &unwind::Limits::default());
}

/// A process's cgroup text as the sampler forwards it: container id, runtime, systemd unit.
pub fn cgroup(text: &str) {
    let _ = labels::cgroup::labels(text);
}

/// A process's `OTEL_RESOURCE_ATTRIBUTES` value.
pub fn resource_attributes(text: &str) {
    if let Ok(parsed) = labels::resource_env::ResourceAttributes::parse(text) {
        let _ = parsed.service_name();
        let _ = parsed.labels();
    }
}

/// The relay's YAML config file, including its label and relabel rules.
pub fn config_file(text: &str) {
    let _ = config::parse(text, "fuzz.yaml");
}
