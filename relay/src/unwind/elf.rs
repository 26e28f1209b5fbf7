//! Reads what the unwind compiler needs from an untrusted ELF file: the CFI section
//! (`.eh_frame`, else `.debug_frame`), where it is loaded, the executable address range and the
//! build id. Nothing else of the file is read.
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

use super::{Error, Limits};
use crate::symbolize::{gofile, gopclntab::Table};

/// Which section the CFI came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfiSection {
    EhFrame,
    DebugFrame,
    /// No CFI section: a Go binary whose rows all come from its Go table.
    GoPclntab,
}

impl CfiSection {
    pub fn name(self) -> &'static str {
        match self {
            Self::EhFrame => ".eh_frame",
            Self::DebugFrame => ".debug_frame",
            Self::GoPclntab => ".gopclntab",
        }
    }
}

/// What the compiler reads from one binary.
#[derive(Debug)]
pub struct Input {
    pub section: CfiSection,
    /// The section's bytes, at most `Limits::max_section_bytes`.
    pub data: Vec<u8>,
    /// The section's load address (`sh_addr`): the base of pc-relative pointers in `.eh_frame`.
    pub section_addr: u64,
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
        .filter(|(_, s)| s.sh_type(endian) == elf::SHT_PROGBITS);
    let (kind, (_, cfi)) = if let Some(found) = eh_frame {
        (CfiSection::EhFrame, found)
    } else if go.is_some() {
        return go_only(header, endian, data, &sections, go);
    } else if let Some(found) = sections.section_by_name(endian, b".debug_frame") {
        (CfiSection::DebugFrame, found)
    } else {
        return Err(Error::NoCfi);
    };
    if cfi.sh_flags(endian) & u64::from(elf::SHF_COMPRESSED) != 0 {
        return Err(Error::Compressed(kind.name()));
    }
    let size = cfi.sh_size(endian);
    if size > limits.max_section_bytes {
        return Err(Error::SectionTooLarge {
            section: kind.name(),
            size,
            limit: limits.max_section_bytes,
        });
    }
    let bytes = cfi
        .data(endian, data)
        .map_err(|e| Error::Elf(format!("{}: {e}", kind.name())))?
        .to_vec();

    let exec = exec_range(header, endian, data, &sections)?;
    if exec.end - exec.start > u64::from(u32::MAX) {
        return Err(Error::ExecTooLarge(exec.end - exec.start));
    }
    Ok(Input {
        section: kind,
        data: bytes,
        section_addr: cfi.sh_addr(endian),
        text_addr: section_addr_of(b".text").unwrap_or(0),
        got_addr: section_addr_of(b".got").unwrap_or(0),
        exec,
        vaddr_minus_offset: vaddr_minus_offset(header, endian, data),
        build_id: build_id(endian, data, &sections),
        go,
    })
}

/// The input of a Go binary without CFI: its Go table only.
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
        data: Vec::new(),
        section_addr: 0,
        text_addr: 0,
        got_addr: 0,
        exec,
        vaddr_minus_offset: vaddr_minus_offset(header, endian, data),
        build_id: build_id(endian, data, sections),
        go,
    })
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
