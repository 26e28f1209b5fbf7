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

use crate::{config, interp, jit, labels, model, symbolize, unwind};

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
/// default limits. An input that is not an ELF file (no `\x7fELF` first) is CFI: byte 0 picks
/// how a minimal ELF file stores it as `.debug_frame` (plain, `SHF_COMPRESSED` zlib, GNU
/// `.zdebug_frame`), byte 1 from 0xf0 on makes the compressed size claim lie by -16..-1 bytes
/// (byte 2 odd: by +1..+16), the rest is the section. A mutated real binary almost never
/// inflates, so this is what reaches the `.debug_frame` reader through the decompressor.
pub fn unwind_compile(data: &[u8]) {
    let file = match data {
        [0x7f, b'E', b'L', b'F', ..] => data.to_vec(),
        [form, claim, lie_up, cfi @ ..] => {
            let form = match form % 3 {
                0 => unwind::synthetic::Form::Plain,
                1 => unwind::synthetic::Form::ElfZlib,
                _ => unwind::synthetic::Form::GnuZlib,
            };
            let lie = if *claim >= 0xf0 {
                i64::from(*claim - 0xef)
            } else {
                0
            };
            let delta = if lie_up & 1 == 1 { lie } else { -lie };
            unwind::synthetic::elf_with_debug_frame(cfi, form, delta)
        }
        _ => return,
    };
    let Some(fd) = memfd(&file) else { return };
    let _ = unwind::compile(&File::from(fd), &unwind::Limits::default());
}

/// A Go binary's `.gopclntab` (from the input's 9th byte on; the same bytes stand for the
/// funcdata the inline trees are in), looked up at the pc in the first 8 bytes and at the
/// entries of its first functions, whose stack-pointer runs are read as the unwind compiler
/// reads them. ELF files holding one reach the same parser through `elf_symbolize` and
/// `unwind_compile`.
pub fn go_pclntab(data: &[u8]) {
    use symbolize::gopclntab::{FuncData, Table};
    let Some((pc, bytes)) = data.split_first_chunk::<8>() else {
        return;
    };
    let Ok(table) = Table::parse(bytes.to_vec(), 0x40_1000) else {
        return;
    };
    let funcdata = FuncData {
        vaddr: 0,
        bytes: bytes.to_vec(),
    };
    let pc = u64::from_le_bytes(*pc);
    if let Some(func) = table.find(pc) {
        let _ = table.frames(&func, pc, Some(&funcdata));
    }
    for func in table.funcs().take(256) {
        let _ = table.frames(&func, func.entry, Some(&funcdata));
        table.sp_runs(&func, |_, _| {});
    }
}

/// A jitdump file (`jit-<pid>.dump`) a process writes about its JIT code, read as the relay
/// reads it: incrementally, its first half, then again after the rest is appended, the input's
/// first byte picking the bytes read per call (256-byte steps). Checks that no call consumes
/// past the file's end.
pub fn jitdump(data: &[u8]) {
    use jit::{jitdump::JitDump, JitSource};
    let Some((&budget, rest)) = data.split_first() else {
        return;
    };
    let budget = (u64::from(budget) + 1) * 256;
    let (first, second) = rest.split_at(rest.len() / 2);
    let Some(fd) = memfd(first) else { return };
    let mut file = File::from(fd);
    let mut reader = JitDump::default();
    let drain = |reader: &mut JitDump, file: &File, len: usize| {
        // Each call that returns more than 0 consumed a record or the header: this ends.
        while let Ok(n) = reader.read_new(file, budget, &mut |entry| drop(entry)) {
            assert!(reader.offset() <= len as u64, "consumed past the end");
            if n == 0 {
                break;
            }
        }
    };
    drain(&mut reader, &file, first.len());
    if file.write_all(second).is_err() {
        return;
    }
    drain(&mut reader, &file, rest.len());
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

/// What the kernel copied of a CPython process: the input's first byte picks the release line
/// (3.6 to 3.14), the next 6 bytes the lengths of the name, file name and line table copies
/// (2 bytes each), then those copies, then raw frames (17 bytes each: code, instruction,
/// marker). The copies are named and the frames spliced into a native stack of two eval calls.
pub fn python_code(data: &[u8]) {
    use interp::{
        cpython::{
            naming::{Naming, Runtime},
            table, Version,
        },
        raw::{RawCode, RawInterpFrame},
    };
    let Some((&line, rest)) = data.split_first() else {
        return;
    };
    let minor = 6 + line % 9;
    let version = Version::new(3, minor, 0);
    // 3.13 and 3.14 take their offsets from the file; 3.12's table has the same string and
    // code offsets the decoders read.
    let Some(layout) = table::layout(Version::new(3, minor.min(12), 0)) else {
        return;
    };
    let Some((lengths, mut rest)) = rest.split_first_chunk::<6>() else {
        return;
    };
    let mut take = |at: usize| {
        let n = usize::from(u16::from_le_bytes([lengths[at], lengths[at + 1]])).min(rest.len());
        let (copy, tail) = rest.split_at(n);
        rest = tail;
        copy.to_vec()
    };
    let raw = RawCode {
        first_line: 1,
        copied: u32::from(line >> 4),
        name: take(0),
        filename: take(2),
        linetable: take(4),
    };
    let frames: Vec<RawInterpFrame> = rest
        .chunks_exact(17)
        .map(|f| RawInterpFrame {
            code: u64::from_le_bytes(f[..8].try_into().unwrap_or_default()),
            instruction: u64::from_le_bytes(f[8..16].try_into().unwrap_or_default()),
            marker: f[16],
        })
        .collect();
    let runtime = Runtime {
        version,
        layout: &layout,
        module: None,
    };
    let mut naming = Naming::default();
    let code = frames.first().map_or(0, |f| f.code);
    naming.take_codes((1, 1), runtime, [(code, &raw)]);
    let eval = model::Frame {
        function: "_PyEval_EvalFrameDefault".into(),
        file: None,
        line: None,
        kind: model::FrameKind::Native,
        inlined: false,
        address: 0x1000,
        module: None,
    };
    let native = [eval.clone(), eval];
    for frame in naming.splice_stack((1, 1), runtime, &native, &frames) {
        let _ = frame.text_name();
    }
}
