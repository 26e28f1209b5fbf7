//! Reads what the runtime recognizers need from an untrusted ELF file: the named symbols they
//! ask for (dynamic table, and on request the full `.symtab`), the loadable segments (to turn a
//! symbol's address into file bytes), the `.rodata` range and whether the file is a shared
//! library. Nothing else of the file is read.
//!
//! Invariant: the parse goes through the unwind compiler's bounded, positional reader
//! (`unwind::elf::Bounded`: no single read over `Limits::max_read_bytes`, the descriptor's file
//! offset untouched); after it only plain facts are kept, and every later read
//! ([`ElfFacts::read_vaddr`], [`ElfFacts::read_rodata`]) is checked against them and bounded
//! again. A hostile file may claim any size or address: a claim outside the file is an error,
//! never a panic.

use std::{collections::HashMap, fs::File, os::unix::fs::FileExt};

use object::{
    elf,
    read::{
        elf::{FileHeader, ProgramHeader, SectionHeader, Sym},
        ReadCache,
    },
    LittleEndian,
};

use super::{Error, Limits};
use crate::unwind::elf::{Bounded, PositionalReader};

type Header = elf::FileHeader64<LittleEndian>;

/// A defined symbol: its ELF virtual address and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Symbol {
    pub value: u64,
    pub size: u64,
}

/// A `PT_LOAD` segment.
#[derive(Clone, Copy, Debug)]
struct Segment {
    vaddr: u64,
    offset: u64,
    filesz: u64,
}

/// The facts one parse produced.
#[derive(Debug)]
pub(crate) struct ElfFacts {
    symbols: HashMap<&'static str, Symbol>,
    segments: Vec<Segment>,
    /// `.rodata`: file offset and size.
    rodata: Option<(u64, u64)>,
    /// `ET_DYN` without `PT_INTERP`: a shared library (a PIE executable has an interpreter).
    pub shared_library: bool,
    /// The lowest `PT_LOAD` address: what a mapping of file offset 0 is loaded at, before bias.
    pub first_vaddr: u64,
}

/// Which symbol tables to search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tables {
    /// `.dynsym` only (what every CPython exports; a few KiB to read).
    Dynamic,
    /// `.dynsym`, then `.symtab` for what it did not have (local symbols; absent when stripped).
    All,
}

/// Parses `file` and finds the defined symbols named in `wanted`.
pub(crate) fn read(
    file: &File,
    wanted: &[&'static str],
    tables: Tables,
    limits: &Limits,
) -> Result<ElfFacts, Error> {
    let cache = ReadCache::new(PositionalReader::new(file));
    let data = Bounded::new(&cache, limits.max_read_bytes);
    let elf_error = |e: object::read::Error| Error::Elf(e.to_string());
    let header = Header::parse(data).map_err(elf_error)?;
    let endian = header.endian().map_err(elf_error)?;
    let machine = header.e_machine(endian);
    if machine != elf::EM_X86_64 {
        return Err(Error::Machine(machine));
    }
    let program_headers = header.program_headers(endian, data).map_err(elf_error)?;
    let segments: Vec<Segment> = program_headers
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| Segment {
            vaddr: p.p_vaddr(endian),
            offset: p.p_offset(endian),
            filesz: p.p_filesz(endian),
        })
        .collect();
    let has_interp = program_headers
        .iter()
        .any(|p| p.p_type(endian) == elf::PT_INTERP);
    let sections = header.sections(endian, data).map_err(elf_error)?;
    let rodata = sections
        .section_by_name(endian, b".rodata")
        .filter(|(_, s)| s.sh_type(endian) == elf::SHT_PROGBITS)
        .map(|(_, s)| (s.sh_offset(endian), s.sh_size(endian)));

    let mut symbols = HashMap::new();
    let kinds: &[u32] = match tables {
        Tables::Dynamic => &[elf::SHT_DYNSYM],
        Tables::All => &[elf::SHT_DYNSYM, elf::SHT_SYMTAB],
    };
    for &kind in kinds {
        if symbols.len() == wanted.len() {
            break;
        }
        let table = sections.symbols(endian, data, kind).map_err(elf_error)?;
        if table.is_empty() {
            continue;
        }
        // The names in one bounded read, then looked up in memory: a name read per symbol
        // would be a read per symbol (libc has thousands).
        let strings = sections
            .section(table.string_section())
            .and_then(|s| s.data(endian, data))
            .map_err(elf_error)?;
        for sym in table.iter() {
            if sym.is_undefined(endian) {
                continue;
            }
            let start = usize::try_from(sym.st_name(endian)).unwrap_or(usize::MAX);
            let Some(name) = strings
                .get(start..)
                .and_then(|rest| rest.split(|&b| b == 0).next())
            else {
                continue;
            };
            let Some(&found) = wanted.iter().find(|w| w.as_bytes() == name) else {
                continue;
            };
            symbols.entry(found).or_insert(Symbol {
                value: sym.st_value(endian),
                size: sym.st_size(endian),
            });
        }
    }
    Ok(ElfFacts {
        symbols,
        first_vaddr: segments.iter().map(|s| s.vaddr).min().unwrap_or(0),
        segments,
        rodata,
        shared_library: header.e_type(endian) == elf::ET_DYN && !has_interp,
    })
}

impl ElfFacts {
    pub(crate) fn symbol(&self, name: &str) -> Option<Symbol> {
        self.symbols.get(name).copied()
    }

    /// The file offset of `len` bytes at ELF address `vaddr`: they must lie in the file-backed
    /// part of one `PT_LOAD` (never in its zero-filled tail, which the file does not hold).
    fn file_offset(&self, vaddr: u64, len: u64) -> Option<u64> {
        let end = vaddr.checked_add(len)?;
        self.segments.iter().find_map(|s| {
            let seg_end = s.vaddr.checked_add(s.filesz)?;
            (s.vaddr <= vaddr && end <= seg_end).then(|| s.offset.checked_add(vaddr - s.vaddr))?
        })
    }

    /// Reads `len` bytes (at most `limits.max_read_bytes`) of the initial data at `vaddr`.
    pub(crate) fn read_vaddr(
        &self,
        file: &File,
        vaddr: u64,
        len: u64,
        limits: &Limits,
    ) -> Result<Vec<u8>, Error> {
        if len > limits.max_read_bytes {
            return Err(Error::TooLarge {
                what: "read",
                size: len,
                limit: limits.max_read_bytes,
            });
        }
        let offset = self
            .file_offset(vaddr, len)
            .ok_or(Error::NotInFile { vaddr, len })?;
        read_exact(file, offset, len)
    }

    /// The whole `.rodata` section, at most `limits.max_rodata_bytes`.
    pub(crate) fn read_rodata(&self, file: &File, limits: &Limits) -> Result<Vec<u8>, Error> {
        let (offset, size) = self.rodata.ok_or(Error::NoRodata)?;
        if size > limits.max_rodata_bytes {
            return Err(Error::TooLarge {
                what: ".rodata",
                size,
                limit: limits.max_rodata_bytes,
            });
        }
        read_exact(file, offset, size)
    }
}

fn read_exact(file: &File, offset: u64, len: u64) -> Result<Vec<u8>, Error> {
    let len = usize::try_from(len).map_err(|_| Error::NotInFile { vaddr: offset, len })?;
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, offset)
        .map_err(|source| Error::Read { offset, source })?;
    Ok(buf)
}
