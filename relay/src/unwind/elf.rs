//! Reads what the unwind compiler needs from an untrusted ELF file: the CFI sections
//! (`.eh_frame` and `.debug_frame` or `.zdebug_frame`, decompressed within bounds by
//! [`compressed`]), where they are loaded, the executable address range and the build id.
//! Nothing else of the file is read.
//!
//! Invariant: every read goes through [`Bounded`], which refuses any single read over
//! `Limits::max_read_bytes` before allocating, and through positional reads (`pread`), so a
//! descriptor shared with the symbolizer keeps its file offset. Sizes the file claims are
//! checked against the file's real length by `object` and against our limits here.

use std::{fs::File, ops::Range, os::unix::fs::FileExt};

use object::{
    elf,
    read::{
        elf::{FileHeader, ProgramHeader, SectionHeader},
        ReadCache, ReadCacheOps, ReadRef,
    },
    LittleEndian,
};

use super::{compressed, Error, Limits};
use crate::symbolize::{gofile, gopclntab::Table};

/// Which sections the CFI came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfiSection {
    EhFrame,
    DebugFrame,
    /// Both: `.eh_frame` first, `.debug_frame` for the code it does not describe (a C program
    /// built without unwind tables still links the C runtime's `.eh_frame` for `_start`; a Go
    /// program linked with cgo has `.eh_frame` for its C part only).
    Both,
    /// No CFI read: a Go binary without `.eh_frame`, whose rows all come from its Go table.
    GoPclntab,
}

impl CfiSection {
    pub fn name(self) -> &'static str {
        match self {
            Self::EhFrame => ".eh_frame",
            Self::DebugFrame => ".debug_frame",
            Self::Both => ".eh_frame+.debug_frame",
            Self::GoPclntab => ".gopclntab",
        }
    }
}

/// How a CFI section was stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// `SHF_COMPRESSED` with an `Elf64_Chdr` of type `ELFCOMPRESS_ZLIB` (what `-gz=zlib`, Go's
    /// linker and `objcopy --compress-debug-sections` write).
    ElfZlib,
    /// The older GNU form: a `.zdebug_frame` section holding `ZLIB`, the size as a big-endian
    /// u64, then a zlib stream.
    GnuZlib,
}

/// One CFI section's bytes (decompressed) and where it is loaded.
#[derive(Debug)]
pub struct CfiData {
    /// At most `Limits::max_section_bytes`, compressed or not.
    pub data: Vec<u8>,
    /// The section's load address (`sh_addr`): the base of pc-relative pointers in `.eh_frame`
    /// (0 for `.debug_frame`, whose addresses are absolute).
    pub addr: u64,
    /// `None` when stored as is.
    pub compression: Option<Compression>,
}

/// What the compiler reads from one binary.
#[derive(Debug)]
pub struct Input {
    pub section: CfiSection,
    /// `.eh_frame`, when the file has one (`SHT_PROGBITS`).
    pub eh_frame: Option<CfiData>,
    /// `.debug_frame` (or `.zdebug_frame`), when the file has one.
    pub debug_frame: Option<CfiData>,
    /// The `.text` address (base of `DW_EH_PE_textrel` pointers), 0 without `.text`.
    pub text_addr: u64,
    /// The `.got` address (base of `DW_EH_PE_datarel` pointers), 0 without `.got`.
    pub got_addr: u64,
    /// Lowest to highest executable address (executable `PT_LOAD`s, else executable sections).
    pub exec: Range<u64>,
    /// `p_vaddr - p_offset` of the lowest executable `PT_LOAD` (0 without one): what turns a
    /// file offset (what `/proc/PID/maps` gives the sampler) into a table address.
    pub vaddr_minus_offset: i64,
    /// The GNU build id note, if any: a name for the cache, never trusted for content.
    pub build_id: Option<Vec<u8>>,
    /// A Go binary's Go table (`crate::symbolize::gofile`): rows for its Go functions.
    pub go: Option<Table>,
}

impl Input {
    /// CFI bytes of both sections (decompressed).
    pub fn cfi_bytes(&self) -> u64 {
        [&self.eh_frame, &self.debug_frame]
            .into_iter()
            .flatten()
            .map(|c| c.data.len() as u64)
            .sum()
    }
}

/// `pread`-based reader: keeps the shared descriptor's file offset untouched. Also the reader of
/// the interpreter recognizers (`crate::interp`), so every ELF read of the relay is bounded alike.
pub(crate) struct PositionalReader<'f> {
    file: &'f File,
    pos: u64,
}

impl<'f> PositionalReader<'f> {
    pub(crate) fn new(file: &'f File) -> Self {
        Self { file, pos: 0 }
    }
}

impl ReadCacheOps for PositionalReader<'_> {
    fn len(&mut self) -> Result<u64, ()> {
        self.file.metadata().map(|m| m.len()).map_err(|_| ())
    }

    fn seek(&mut self, pos: u64) -> Result<u64, ()> {
        self.pos = pos;
        Ok(pos)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize, ()> {
        let n = self.file.read_at(buf, self.pos).map_err(|_| ())?;
        self.pos = self.pos.saturating_add(n as u64);
        Ok(n)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ()> {
        self.file.read_exact_at(buf, self.pos).map_err(|_| ())?;
        self.pos = self.pos.saturating_add(buf.len() as u64);
        Ok(())
    }
}

/// A `ReadRef` that refuses any single read larger than `cap` before anything is allocated.
#[derive(Clone, Copy)]
pub(crate) struct Bounded<'a, 'f> {
    cache: &'a ReadCache<PositionalReader<'f>>,
    cap: u64,
}

impl<'a, 'f> Bounded<'a, 'f> {
    pub(crate) fn new(cache: &'a ReadCache<PositionalReader<'f>>, cap: u64) -> Self {
        Self { cache, cap }
    }
}

impl<'a> ReadRef<'a> for Bounded<'a, '_> {
    fn len(self) -> Result<u64, ()> {
        self.cache.len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size > self.cap {
            return Err(());
        }
        self.cache.read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let end = range.end.min(range.start.saturating_add(self.cap));
        self.cache.read_bytes_at_until(range.start..end, delimiter)
    }
}

type Header = elf::FileHeader64<LittleEndian>;

/// Reads the CFI section and the facts around it from `file`, within `limits`.
pub fn read(file: &File, limits: &Limits) -> Result<Input, Error> {
    let cache = ReadCache::new(PositionalReader::new(file));
    let data = Bounded::new(&cache, limits.max_read_bytes);
    let header = Header::parse(data).map_err(|e| Error::Elf(e.to_string()))?;
    let endian = header.endian().map_err(|e| Error::Elf(e.to_string()))?;
    let machine = header.e_machine(endian);
    if machine != elf::EM_X86_64 {
        return Err(Error::Machine(machine));
    }
    let sections = header
        .sections(endian, data)
        .map_err(|e| Error::Elf(e.to_string()))?;
    let section_addr_of = |name: &[u8]| {
        sections
            .section_by_name(endian, name)
            .map(|(_, s)| s.sh_addr(endian))
    };

    // A Go binary's Go functions are unwound from its Go table, which stripping keeps; its
    // `.debug_frame` (compressed, and gone when stripped) is not read. A cgo binary's
    // `.eh_frame` still covers its C code.
    let go = gofile::locate(file, false).ok().map(|found| found.table);
    let eh_frame = sections
        .section_by_name(endian, b".eh_frame")
        .filter(|(_, s)| s.sh_type(endian) == elf::SHT_PROGBITS)
        .map(|(_, s)| section_data(CfiSection::EhFrame, s, false, endian, data, limits))
        .transpose()?;
    if eh_frame.is_none() && go.is_some() {
        return go_only(header, endian, data, &sections, go);
    }
    let debug_frame = match debug_frame(&sections, endian, data, limits) {
        // Compressed data that lies about its size refuses the file (counted); any other
        // `.debug_frame` we cannot read (too large, zstd) beside `.eh_frame` leaves that alone.
        Err(err @ Error::BadCompression { .. }) => return Err(err),
        Err(_) if eh_frame.is_some() => None,
        other => other?,
    };
    let section = match (&eh_frame, &debug_frame) {
        (Some(_), Some(_)) => CfiSection::Both,
        (Some(_), None) => CfiSection::EhFrame,
        (None, Some(_)) => CfiSection::DebugFrame,
        (None, None) => return Err(Error::NoCfi),
    };

    let exec = exec_range(header, endian, data, &sections)?;
    if exec.end - exec.start > u64::from(u32::MAX) {
        return Err(Error::ExecTooLarge(exec.end - exec.start));
    }
    Ok(Input {
        section,
        eh_frame,
        debug_frame,
        text_addr: section_addr_of(b".text").unwrap_or(0),
        got_addr: section_addr_of(b".got").unwrap_or(0),
        exec,
        vaddr_minus_offset: vaddr_minus_offset(header, endian, data),
        build_id: build_id(endian, data, &sections),
        go,
    })
}

/// The input of a Go binary without `.eh_frame`: its Go table only.
fn go_only<'a, 'f>(
    header: &Header,
    endian: LittleEndian,
    data: Bounded<'a, 'f>,
    sections: &object::read::elf::SectionTable<'a, Header, Bounded<'a, 'f>>,
    go: Option<Table>,
) -> Result<Input, Error> {
    let exec = exec_range(header, endian, data, sections)?;
    if exec.end - exec.start > u64::from(u32::MAX) {
        return Err(Error::ExecTooLarge(exec.end - exec.start));
    }
    Ok(Input {
        section: CfiSection::GoPclntab,
        eh_frame: None,
        debug_frame: None,
        text_addr: 0,
        got_addr: 0,
        exec,
        vaddr_minus_offset: vaddr_minus_offset(header, endian, data),
        build_id: build_id(endian, data, sections),
        go,
    })
}

/// The bytes of CFI section `shdr` (named `kind`), decompressed when stored compressed:
/// `SHF_COMPRESSED`, or `gnu` (a `.zdebug_*` section).
fn section_data<'a, 'f>(
    kind: CfiSection,
    shdr: &elf::SectionHeader64<LittleEndian>,
    gnu: bool,
    endian: LittleEndian,
    data: Bounded<'a, 'f>,
    limits: &Limits,
) -> Result<CfiData, Error> {
    let size = shdr.sh_size(endian);
    if size > limits.max_section_bytes {
        return Err(Error::SectionTooLarge {
            section: kind.name(),
            size,
            limit: limits.max_section_bytes,
        });
    }
    let bytes = shdr
        .data(endian, data)
        .map_err(|e| Error::Elf(format!("{}: {e}", kind.name())))?;
    let max = limits.max_section_bytes;
    let (data, compression) = if shdr.sh_flags(endian) & u64::from(elf::SHF_COMPRESSED) != 0 {
        let inflated = compressed::elf_section(kind.name(), bytes, max)?;
        (inflated, Some(Compression::ElfZlib))
    } else if gnu {
        let inflated = compressed::gnu_section(kind.name(), bytes, max)?;
        (inflated, Some(Compression::GnuZlib))
    } else {
        (bytes.to_vec(), None)
    };
    Ok(CfiData {
        data,
        addr: shdr.sh_addr(endian),
        compression,
    })
}

/// `.debug_frame`, else the GNU `.zdebug_frame`; `None` when the file has neither.
fn debug_frame<'a, 'f>(
    sections: &object::read::elf::SectionTable<'a, Header, Bounded<'a, 'f>>,
    endian: LittleEndian,
    data: Bounded<'a, 'f>,
    limits: &Limits,
) -> Result<Option<CfiData>, Error> {
    let (shdr, gnu) = if let Some((_, s)) = sections.section_by_name(endian, b".debug_frame") {
        (s, false)
    } else if let Some((_, s)) = sections.section_by_name(endian, b".zdebug_frame") {
        (s, true)
    } else {
        return Ok(None);
    };
    section_data(CfiSection::DebugFrame, shdr, gnu, endian, data, limits).map(Some)
}

/// The executable address range: executable `PT_LOAD` segments, else (no program headers, e.g.
/// a separate debug file) executable sections.
fn exec_range<'a, 'f>(
    header: &Header,
    endian: LittleEndian,
    data: Bounded<'a, 'f>,
    sections: &object::read::elf::SectionTable<'a, Header, Bounded<'a, 'f>>,
) -> Result<Range<u64>, Error> {
    let segments = header
        .program_headers(endian, data)
        .map_err(|e| Error::Elf(e.to_string()))?;
    let mut from_segments = segments
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD && p.p_flags(endian) & elf::PF_X != 0)
        .map(|p| (p.p_vaddr(endian), p.p_memsz(endian)));
    let mut from_sections = sections
        .iter()
        .filter(|s| s.sh_flags(endian) & u64::from(elf::SHF_EXECINSTR) != 0)
        .map(|s| (s.sh_addr(endian), s.sh_size(endian)));
    let mut range: Option<Range<u64>> = None;
    let mut widen = |(start, size): (u64, u64)| -> Result<(), Error> {
        let end = start.checked_add(size).ok_or(Error::NoExecutableCode)?;
        if size > 0 {
            range = Some(match range.take() {
                Some(r) => r.start.min(start)..r.end.max(end),
                None => start..end,
            });
        }
        Ok(())
    };
    let any_segment = segments.iter().any(|p| p.p_type(endian) == elf::PT_LOAD);
    if any_segment {
        from_segments.try_for_each(&mut widen)?;
    } else {
        from_sections.try_for_each(&mut widen)?;
    }
    range.ok_or(Error::NoExecutableCode)
}

/// `p_vaddr - p_offset` of the executable `PT_LOAD` with the lowest address; 0 without one.
fn vaddr_minus_offset<'a, 'f>(header: &Header, endian: LittleEndian, data: Bounded<'a, 'f>) -> i64 {
    let Ok(segments) = header.program_headers(endian, data) else {
        return 0;
    };
    segments
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD && p.p_flags(endian) & elf::PF_X != 0)
        .min_by_key(|p| p.p_vaddr(endian))
        // Two's-complement difference: any pair of u64 gives a defined i64.
        .map_or(0, |p| {
            p.p_vaddr(endian).wrapping_sub(p.p_offset(endian)) as i64
        })
}

/// The GNU build id from any note section; `None` when absent or unreadable.
fn build_id<'a, 'f>(
    endian: LittleEndian,
    data: Bounded<'a, 'f>,
    sections: &object::read::elf::SectionTable<'a, Header, Bounded<'a, 'f>>,
) -> Option<Vec<u8>> {
    for section in sections.iter() {
        let Ok(Some(mut notes)) = section.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                return Some(note.desc().to_vec());
            }
        }
    }
    None
}
