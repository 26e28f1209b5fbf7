//! Bounded decompression of compressed CFI sections: ELF `SHF_COMPRESSED` sections (an
//! `Elf64_Chdr` then a zlib stream: what Go's linker, `gcc -gz=zlib` and `objcopy
//! --compress-debug-sections` write) and the older GNU `.zdebug_*` form (`ZLIB`, the size as a
//! big-endian u64, then a zlib stream).
//!
//! Invariant: the input is hostile. The size a section claims is checked against the limit
//! before anything is allocated, inflating stops one byte past the claimed size (a stream that
//! would inflate to gigabytes costs at most the limit), and a stream that does not inflate to
//! exactly its claimed size is refused ([`Error::BadCompression`]), never a panic. zstd
//! (`ELFCOMPRESS_ZSTD`) is recognised and refused as unsupported: no zstd decoder is in the tree.

use std::io::Read;

use flate2::read::ZlibDecoder;
use object::elf;

use super::Error;

/// Size of an `Elf64_Chdr`: `ch_type` u32, `ch_reserved` u32, `ch_size` u64, `ch_addralign` u64.
const CHDR_BYTES: usize = 24;
/// `ZLIB` then the uncompressed size, big-endian.
const GNU_HEADER_BYTES: usize = 12;
/// Most bytes reserved up front: a section claiming more grows its buffer as it inflates, so a
/// lying header alone does not cost the whole limit.
const PREALLOCATE_BYTES: u64 = 1 << 20;

/// The contents of an `SHF_COMPRESSED` section of `section`, at most `max` bytes.
pub fn elf_section(section: &'static str, bytes: &[u8], max: u64) -> Result<Vec<u8>, Error> {
    let bad = |reason: String| Error::BadCompression { section, reason };
    let (header, stream) = bytes
        .split_at_checked(CHDR_BYTES)
        .ok_or_else(|| bad(format!("{} bytes, shorter than its header", bytes.len())))?;
    let ch_type = u32::from_le_bytes(array(&header[0..4]));
    let size = u64::from_le_bytes(array(&header[8..16]));
    match ch_type {
        elf::ELFCOMPRESS_ZLIB => inflate(section, stream, size, max),
        elf::ELFCOMPRESS_ZSTD => Err(Error::UnsupportedCompression {
            section,
            format: "zstd",
        }),
        other => Err(bad(format!("unknown compression type {other}"))),
    }
}

/// The contents of a GNU `.zdebug_*` section of `section`, at most `max` bytes.
pub fn gnu_section(section: &'static str, bytes: &[u8], max: u64) -> Result<Vec<u8>, Error> {
    let bad = |reason: String| Error::BadCompression { section, reason };
    let (header, stream) = bytes
        .split_at_checked(GNU_HEADER_BYTES)
        .ok_or_else(|| bad(format!("{} bytes, shorter than its header", bytes.len())))?;
    if &header[..4] != b"ZLIB" {
        return Err(bad("no ZLIB magic".to_owned()));
    }
    let size = u64::from_be_bytes(array(&header[4..12]));
    inflate(section, stream, size, max)
}

/// Inflates `stream` that claims to hold `size` bytes, refusing a claim over `max` before
/// allocating and any stream that does not inflate to exactly `size` bytes.
fn inflate(section: &'static str, stream: &[u8], size: u64, max: u64) -> Result<Vec<u8>, Error> {
    let bad = |reason: String| Error::BadCompression { section, reason };
    if size > max {
        return Err(bad(format!("claims {size} bytes, over the limit of {max}")));
    }
    // Both fit usize: size <= max, and max is a section size the relay could read anyway.
    let mut out = Vec::with_capacity(usize::try_from(size.min(PREALLOCATE_BYTES)).unwrap_or(0));
    ZlibDecoder::new(stream)
        .take(size.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| bad(format!("zlib: {e}")))?;
    let got = out.len() as u64;
    if got > size {
        return Err(bad(format!(
            "inflates past the {size} bytes it claims (stopped after {got})"
        )));
    }
    if got < size {
        return Err(bad(format!(
            "inflates to {got} bytes, not the {size} it claims"
        )));
    }
    Ok(out)
}

/// `N` bytes of a slice the caller checked is `N` long.
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::{write::ZlibEncoder, Compression};

    use super::*;

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut enc = ZlibEncoder::new(Vec::new(), Compression::best());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    fn chdr(ch_type: u32, size: u64) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&ch_type.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        h.extend_from_slice(&1u64.to_le_bytes());
        h
    }

    fn refused(r: Result<Vec<u8>, Error>) -> String {
        match r {
            Err(Error::BadCompression { reason, .. }) => reason,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn both_forms_inflate_to_their_claimed_size() {
        let data: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut elf = chdr(elf::ELFCOMPRESS_ZLIB, data.len() as u64);
        elf.extend(zlib(&data));
        assert_eq!(elf_section(".debug_frame", &elf, 1 << 20).unwrap(), data);
        let mut gnu = b"ZLIB".to_vec();
        gnu.extend_from_slice(&(data.len() as u64).to_be_bytes());
        gnu.extend(zlib(&data));
        assert_eq!(gnu_section(".zdebug_frame", &gnu, 1 << 20).unwrap(), data);
    }

    #[test]
    fn a_zip_bomb_costs_at_most_its_claimed_size() {
        // Given: 64 MiB of zeros (about 64 KiB compressed) claiming 4 KiB, then claiming 64 MiB.
        let zeros = zlib(&vec![0u8; 64 << 20]);
        let mut small_claim = chdr(elf::ELFCOMPRESS_ZLIB, 4096);
        small_claim.extend_from_slice(&zeros);
        let mut big_claim = chdr(elf::ELFCOMPRESS_ZLIB, 64 << 20);
        big_claim.extend_from_slice(&zeros);
        // When / Then: the first stops one byte past 4 KiB, the second is refused unread.
        let reason = refused(elf_section(".debug_frame", &small_claim, 32 << 20));
        assert!(reason.contains("(stopped after 4097)"), "{reason}");
        let reason = refused(elf_section(".debug_frame", &big_claim, 32 << 20));
        assert!(reason.contains("over the limit"), "{reason}");
    }

    #[test]
    fn truncated_corrupt_and_unknown_sections_are_refused() {
        let data = vec![7u8; 5000];
        let mut whole = chdr(elf::ELFCOMPRESS_ZLIB, 5000);
        whole.extend(zlib(&data));
        for cut in [0, 10, CHDR_BYTES, CHDR_BYTES + 5, whole.len() - 1] {
            refused(elf_section(".debug_frame", &whole[..cut], 1 << 20));
        }
        let mut corrupt = whole.clone();
        corrupt[CHDR_BYTES + 3] ^= 0xff;
        corrupt[CHDR_BYTES] ^= 0x0f;
        refused(elf_section(".debug_frame", &corrupt, 1 << 20));
        let mut unknown = whole.clone();
        unknown[0] = 9;
        refused(elf_section(".debug_frame", &unknown, 1 << 20));
        let mut zstd = whole;
        zstd[0] = 2;
        assert!(matches!(
            elf_section(".debug_frame", &zstd, 1 << 20),
            Err(Error::UnsupportedCompression { .. })
        ));
        refused(gnu_section(
            ".zdebug_frame",
            b"ZLIX\0\0\0\0\0\0\0\x01x",
            1 << 20,
        ));
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut base = chdr(elf::ELFCOMPRESS_ZLIB, 3000);
        base.extend(zlib(&[1u8; 3000]));
        for _ in 0..2000 {
            let mut bytes = base.clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state as usize) % bytes.len();
                bytes[at] = (state >> 32) as u8;
            }
            let _ = elf_section(".debug_frame", &bytes, 1 << 20);
            let _ = gnu_section(".zdebug_frame", &bytes, 1 << 20);
        }
    }
}
