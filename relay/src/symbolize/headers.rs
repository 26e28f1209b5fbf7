//! The relay's own check of an ELF file's program headers before blazesym parses the file.
//!
//! blazesym 0.2.7 adds `p_offset + p_filesz` of each loadable segment without a bound: a hostile
//! file whose sum overflows panics the relay in a build with overflow checks and yields a wrong
//! translation without them (found by the `elf_symbolize` fuzz target). Files whose loadable
//! segments do not fit the 64-bit address and file-offset spaces are refused here, so their
//! frames stay unnamed and nothing else happens. Reads are `pread`s of at most 64 KiB.

use std::os::fd::AsFd;

use nix::sys::uio::pread;

/// Largest program-header table read (4 KiB headers x 56 bytes fits easily).
const MAX_PHDR_BYTES: usize = 64 << 10;

/// Why a file's program headers were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("loadable segment {index}: offset {offset:#x} + size {size:#x} overflows")]
    FileRangeOverflow {
        index: usize,
        offset: u64,
        size: u64,
    },
    #[error("loadable segment {index}: address {vaddr:#x} + size {size:#x} overflows")]
    AddressOverflow { index: usize, vaddr: u64, size: u64 },
}

/// Checks the 64-bit little-endian ELF file behind `fd`; anything else (not ELF, 32-bit, short
/// reads) is left for blazesym to refuse, since 32-bit fields cannot overflow a u64 sum.
pub fn check(fd: &impl AsFd) -> Result<(), HeaderError> {
    let mut header = [0u8; 64];
    if pread(fd, &mut header, 0).ok() != Some(header.len()) || &header[..4] != b"\x7fELF" {
        return Ok(());
    }
    // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian.
    if header[4] != 2 || header[5] != 1 {
        return Ok(());
    }
    let phoff = u64_at(&header, 0x20);
    let entsize = usize::from(u16_at(&header, 0x36));
    let count = usize::from(u16_at(&header, 0x38));
    if entsize < 56 || count == 0 {
        return Ok(());
    }
    let len = entsize.saturating_mul(count).min(MAX_PHDR_BYTES);
    let mut table = vec![0u8; len];
    let Ok(offset) = i64::try_from(phoff) else {
        return Ok(());
    };
    let Ok(read) = pread(fd, &mut table, offset) else {
        return Ok(());
    };
    for (index, phdr) in table[..read].chunks_exact(entsize).enumerate() {
        check_segment(index, phdr)?;
    }
    Ok(())
}

/// `PT_LOAD`: the only segments blazesym translates offsets through.
const PT_LOAD: u32 = 1;

fn check_segment(index: usize, phdr: &[u8]) -> Result<(), HeaderError> {
    if u32::from_le_bytes([phdr[0], phdr[1], phdr[2], phdr[3]]) != PT_LOAD {
        return Ok(());
    }
    let (offset, vaddr) = (u64_at(phdr, 8), u64_at(phdr, 16));
    let (file_size, memory_size) = (u64_at(phdr, 32), u64_at(phdr, 40));
    if offset.checked_add(file_size).is_none() {
        return Err(HeaderError::FileRangeOverflow {
            index,
            offset,
            size: file_size,
        });
    }
    if vaddr.checked_add(memory_size.max(file_size)).is_none() {
        return Err(HeaderError::AddressOverflow {
            index,
            vaddr,
            size: memory_size.max(file_size),
        });
    }
    Ok(())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

#[cfg(test)]
mod tests {
    use std::{fs::File, io::Write};

    use super::*;

    /// A minimal ELF64 header with one program header at offset 64.
    fn elf_with_segment(p_type: u32, offset: u64, vaddr: u64, filesz: u64, memsz: u64) -> File {
        let mut bytes = vec![0u8; 64 + 56];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2;
        bytes[5] = 1;
        bytes[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        bytes[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        bytes[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let ph = &mut bytes[64..];
        ph[..4].copy_from_slice(&p_type.to_le_bytes());
        ph[8..16].copy_from_slice(&offset.to_le_bytes());
        ph[16..24].copy_from_slice(&vaddr.to_le_bytes());
        ph[32..40].copy_from_slice(&filesz.to_le_bytes());
        ph[40..48].copy_from_slice(&memsz.to_le_bytes());
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        file
    }

    #[test]
    fn sane_segments_pass() {
        assert_eq!(
            check(&elf_with_segment(PT_LOAD, 0x1000, 0x401000, 0x200, 0x300)),
            Ok(())
        );
        // Not loadable: never translated through, so not checked.
        assert_eq!(check(&elf_with_segment(4, u64::MAX, 0, 2, 2)), Ok(()));
    }

    #[test]
    fn overflowing_segments_are_refused() {
        assert_eq!(
            check(&elf_with_segment(PT_LOAD, u64::MAX - 1, 0, 2, 2)),
            Err(HeaderError::FileRangeOverflow {
                index: 0,
                offset: u64::MAX - 1,
                size: 2
            })
        );
        assert!(matches!(
            check(&elf_with_segment(PT_LOAD, 0, u64::MAX, 0, 1)),
            Err(HeaderError::AddressOverflow { .. })
        ));
    }

    #[test]
    fn the_relays_own_executable_passes() {
        let exe = File::open("/proc/self/exe").unwrap();
        assert_eq!(check(&exe), Ok(()));
    }
}
