//! Minimal x86-64 ELF files carrying a given `.debug_frame`, stored plain, `SHF_COMPRESSED`
//! (zlib) or as a GNU `.zdebug_frame`, with a size claim that may lie: what the unit tests and
//! the `unwind_compile` fuzz target feed the compiler to reach the `.debug_frame` reader and the
//! decompressor with CFI they control (a mutated real binary rarely inflates at all).
//!
//! Test and fuzzing support only: not built into the daemon.

use std::{io::Write, ops::Range};

use flate2::{write::ZlibEncoder, Compression};
use object::elf;

/// The executable range of the file: one `PT_LOAD` (R+X, no file bytes).
pub const TEXT: Range<u64> = 0x40_1000..0x40_3000;

/// How the `.debug_frame` is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Plain,
    /// `SHF_COMPRESSED`, an `Elf64_Chdr` of type zlib.
    ElfZlib,
    /// `.zdebug_frame`: `ZLIB`, the size big-endian, the zlib stream.
    GnuZlib,
}

const EHDR: usize = 64;
const PHDR: usize = 56;
const SHDR: usize = 64;
const SHSTRTAB: &[u8] = b"\0.debug_frame\0.zdebug_frame\0.shstrtab\0";
const NAME_DEBUG_FRAME: u32 = 1;
const NAME_ZDEBUG_FRAME: u32 = 14;
const NAME_SHSTRTAB: u32 = 28;

/// An ELF file whose `.debug_frame` holds `cfi`, stored as `form`; a compressed form claims
/// `cfi.len() + claim_delta` bytes.
pub fn elf_with_debug_frame(cfi: &[u8], form: Form, claim_delta: i64) -> Vec<u8> {
    let claimed = (cfi.len() as u64).wrapping_add_signed(claim_delta);
    let section = match form {
        Form::Plain => cfi.to_vec(),
        Form::ElfZlib => {
            let mut s = Vec::new();
            s.extend_from_slice(&elf::ELFCOMPRESS_ZLIB.to_le_bytes());
            s.extend_from_slice(&0u32.to_le_bytes());
            s.extend_from_slice(&claimed.to_le_bytes());
            s.extend_from_slice(&1u64.to_le_bytes());
            s.extend(zlib(cfi));
            s
        }
        Form::GnuZlib => {
            let mut s = b"ZLIB".to_vec();
            s.extend_from_slice(&claimed.to_be_bytes());
            s.extend(zlib(cfi));
            s
        }
    };
    let strtab_at = EHDR + PHDR;
    let section_at = strtab_at + SHSTRTAB.len();
    let shdrs_at = (section_at + section.len()).next_multiple_of(8);
    let mut out = Vec::with_capacity(shdrs_at + 3 * SHDR);
    // ELF header.
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    out.extend_from_slice(&[0; 8]);
    push16(&mut out, elf::ET_EXEC);
    push16(&mut out, elf::EM_X86_64);
    push32(&mut out, 1);
    push64(&mut out, TEXT.start);
    push64(&mut out, EHDR as u64);
    push64(&mut out, shdrs_at as u64);
    push32(&mut out, 0);
    for v in [EHDR, PHDR, 1, SHDR, 3, 2] {
        push16(&mut out, v as u16);
    }
    // One executable PT_LOAD.
    push32(&mut out, elf::PT_LOAD);
    push32(&mut out, elf::PF_R | elf::PF_X);
    push64(&mut out, 0);
    push64(&mut out, TEXT.start);
    push64(&mut out, TEXT.start);
    push64(&mut out, 0);
    push64(&mut out, TEXT.end - TEXT.start);
    push64(&mut out, 0x1000);
    out.extend_from_slice(SHSTRTAB);
    out.extend_from_slice(&section);
    out.resize(shdrs_at, 0);
    // Section headers: null, the CFI, .shstrtab.
    out.extend_from_slice(&[0; SHDR]);
    let (name, flags) = match form {
        Form::Plain => (NAME_DEBUG_FRAME, 0),
        Form::ElfZlib => (NAME_DEBUG_FRAME, u64::from(elf::SHF_COMPRESSED)),
        Form::GnuZlib => (NAME_ZDEBUG_FRAME, 0),
    };
    shdr(
        &mut out,
        name,
        elf::SHT_PROGBITS,
        flags,
        section_at,
        section.len(),
    );
    shdr(
        &mut out,
        NAME_SHSTRTAB,
        elf::SHT_STRTAB,
        0,
        strtab_at,
        SHSTRTAB.len(),
    );
    out
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut enc = ZlibEncoder::new(Vec::new(), Compression::default());
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

fn shdr(out: &mut Vec<u8>, name: u32, kind: u32, flags: u64, offset: usize, size: usize) {
    push32(out, name);
    push32(out, kind);
    push64(out, flags);
    push64(out, 0);
    push64(out, offset as u64);
    push64(out, size as u64);
    push32(out, 0);
    push32(out, 0);
    push64(out, 1);
    push64(out, 0);
}

fn push16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn push32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn push64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
