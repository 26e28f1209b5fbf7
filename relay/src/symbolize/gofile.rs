//! Finds a Go binary's `.gopclntab` ([`super::gopclntab`]) in an untrusted ELF file, for the
//! symbolizer (names, lines, inlined calls) and the unwind compiler (stack-pointer deltas): by
//! its section name, else by the `runtime.pclntab` symbol, else (section headers stripped) by
//! scanning the read-only segments for a header that parses. For the inline trees it also finds
//! where the runtime's `gofunc` points (the base of funcdata offsets from Go 1.18 on), from the
//! runtime's `moduledata`, found by its first two fields in the writable segments.
//!
//! Invariant: every read is positional (`pread`: the descriptor's offset, shared with the
//! sampler, is never moved), bounded by [`MAX_TABLE_BYTES`] / [`MAX_FUNCDATA_BYTES`] /
//! [`MAX_SCAN_BYTES`] before anything is allocated, and limited to the file's real length.
//! What the file claims about itself (a section name, a symbol) only says where to look: the
//! bytes found must parse as a table.

use std::{fs::File, os::unix::fs::FileExt};

use object::{
    elf,
    read::{
        elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _, Sym as _},
        ReadCache,
    },
    LittleEndian,
};

use super::gopclntab::{self, FuncData, Table};
use crate::unwind::elf::{Bounded, PositionalReader};

/// Largest table read (the `go` tool's is about 6 MiB, the largest Kubernetes binaries' about
/// 40 MiB).
pub const MAX_TABLE_BYTES: u64 = 64 << 20;
/// Largest funcdata region read (for the inline trees).
pub const MAX_FUNCDATA_BYTES: u64 = 64 << 20;
/// Most bytes read while scanning for a header or for the runtime's `moduledata`.
pub const MAX_SCAN_BYTES: u64 = 256 << 20;
/// Chunk of a scan.
const CHUNK: usize = 1 << 20;
/// Most bytes of ELF structure (headers, section and symbol tables) read at once.
const MAX_STRUCTURE_BYTES: u64 = 64 << 20;

/// How a table was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoundBy {
    Section,
    Symbol,
    Scan,
}

/// A Go binary's table and what goes with it.
#[derive(Debug)]
pub struct GoBinary {
    pub table: Table,
    pub found_by: FoundBy,
    /// The table's own address.
    pub vaddr: u64,
    /// `(file offset, virtual address, file size)` of each loadable segment.
    pub loads: Vec<(u64, u64, u64)>,
    /// The bytes the inline trees are in (1.18 on), when the runtime's `moduledata` was found.
    pub funcdata: Option<FuncData>,
}

impl GoBinary {
    /// The virtual address of a file offset, through the loadable segments.
    pub fn vaddr_of(&self, offset: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|(off, _, size)| offset >= *off && offset - off < *size)
            .map(|(off, vaddr, _)| vaddr + (offset - off))
    }
}

/// Why a file has no table to read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocateError {
    #[error("not a readable little-endian ELF64 file")]
    Elf,
    #[error("no Go pclntab found")]
    NotGo,
    #[error("the Go pclntab is {0} bytes, over the limit of {MAX_TABLE_BYTES}")]
    TooLarge(u64),
    #[error("the Go pclntab does not parse: {0}")]
    Table(#[from] gopclntab::Error),
}

type Header = elf::FileHeader64<LittleEndian>;

/// Reads `len` bytes at `offset` of `file`, at most `cap` (fewer at the end of the file).
fn read_at(file: &File, offset: u64, len: u64, cap: u64) -> Option<Vec<u8>> {
    let size = file.metadata().ok()?.len();
    let len = len.min(cap).min(size.checked_sub(offset)?);
    let mut buf = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut buf, offset).ok()?;
    Some(buf)
}

/// Finds and parses the Go table of `file`; with `with_funcdata`, also the inline trees'
/// bytes (the unwind compiler needs none).
pub fn locate(file: &File, with_funcdata: bool) -> Result<GoBinary, LocateError> {
    let cache = ReadCache::new(PositionalReader::new(file));
    let data = Bounded::new(&cache, MAX_STRUCTURE_BYTES);
    let header = Header::parse(data).map_err(|_| LocateError::Elf)?;
    let endian = header.endian().map_err(|_| LocateError::Elf)?;
    let loads: Vec<(u64, u64, u64, u32)> = header
        .program_headers(endian, data)
        .map_err(|_| LocateError::Elf)?
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| {
            (
                p.p_offset(endian),
                p.p_vaddr(endian),
                p.p_filesz(endian),
                p.p_flags(endian),
            )
        })
        .collect();
    let file_offset_of = |vaddr: u64| {
        loads
            .iter()
            .find(|(_, va, size, _)| vaddr >= *va && vaddr - va < *size)
            .map(|(off, va, size, _)| (off + (vaddr - va), size - (vaddr - va)))
    };
    let sections = header.sections(endian, data).ok();
    let text_hint = sections
        .as_ref()
        .and_then(|s| s.section_by_name(endian, b".text"))
        .map(|(_, s)| s.sh_addr(endian))
        .or_else(|| {
            loads
                .iter()
                .filter(|l| l.3 & elf::PF_X != 0)
                .map(|l| l.1)
                .min()
        })
        .unwrap_or(0);

    // 1. The section, by name.
    let mut found: Option<(Table, u64, FoundBy)> = None;
    if let Some((_, section)) = sections
        .as_ref()
        .and_then(|s| s.section_by_name(endian, b".gopclntab"))
    {
        let size = section.sh_size(endian);
        if size > MAX_TABLE_BYTES {
            return Err(LocateError::TooLarge(size));
        }
        if section.sh_type(endian) == elf::SHT_PROGBITS {
            let (offset, _) = section.file_range(endian).unwrap_or((0, 0));
            if let Some(bytes) = read_at(file, offset, size, MAX_TABLE_BYTES) {
                let table = Table::parse(bytes, text_hint)?;
                found = Some((table, section.sh_addr(endian), FoundBy::Section));
            }
        }
    }
    // Without that section, only a file that says it is Go (its build id note or build info
    // section) or that has no section table at all is searched further: a C library is not
    // scanned at every open.
    let go_marked = sections.as_ref().is_some_and(|s| {
        s.section_by_name(endian, b".note.go.buildid").is_some()
            || s.section_by_name(endian, b".go.buildinfo").is_some()
    });
    let no_sections = sections.as_ref().is_none_or(|s| s.is_empty());
    if found.is_none() && !go_marked && !no_sections {
        return Err(LocateError::NotGo);
    }
    // 2. The symbol the linker puts at its start (a position-independent binary keeps the
    // table in `.data.rel.ro`).
    if found.is_none() {
        if let Some(vaddr) = sections.as_ref().and_then(|s| {
            let symbols = s.symbols(endian, data, elf::SHT_SYMTAB).ok()?;
            symbols.iter().find_map(|sym| {
                (symbols.symbol_name(endian, sym).ok()? == b"runtime.pclntab")
                    .then(|| sym.st_value(endian))
            })
        }) {
            if let Some((offset, left)) = file_offset_of(vaddr) {
                if let Some(bytes) = read_at(file, offset, left, MAX_TABLE_BYTES) {
                    let table = Table::parse(bytes, text_hint)?;
                    found = Some((table, vaddr, FoundBy::Symbol));
                }
            }
        }
    }
    // 3. A header that parses, in the read-only segments.
    if found.is_none() {
        found = scan_for_table(file, &loads, text_hint);
    }
    let (table, vaddr, found_by) = found.ok_or(LocateError::NotGo)?;
    let funcdata = if with_funcdata {
        funcdata(file, &table, vaddr, &loads)
    } else {
        None
    };
    Ok(GoBinary {
        table,
        found_by,
        vaddr,
        loads: loads.iter().map(|l| (l.0, l.1, l.2)).collect(),
        funcdata,
    })
}

/// Calls `each(file offset, chunk)` over the file bytes of the segments `pick` selects, in
/// chunks overlapping by `overlap` bytes, at most [`MAX_SCAN_BYTES`] read in all; stops when
/// `each` returns something.
fn scan<T>(
    file: &File,
    loads: &[(u64, u64, u64, u32)],
    pick: impl Fn(u32) -> bool,
    overlap: usize,
    mut each: impl FnMut(u64, &[u8]) -> Option<T>,
) -> Option<T> {
    let mut budget = MAX_SCAN_BYTES;
    for &(offset, _, size, flags) in loads {
        if !pick(flags) {
            continue;
        }
        let mut at = offset;
        let end = offset.saturating_add(size);
        while at < end && budget > 0 {
            let want = (end - at).min(CHUNK as u64).min(budget);
            let chunk = read_at(file, at, want, want)?;
            if chunk.is_empty() {
                break;
            }
            budget = budget.saturating_sub(chunk.len() as u64);
            if let Some(found) = each(at, &chunk) {
                return Some(found);
            }
            let step = chunk.len().saturating_sub(overlap).max(1);
            at = at.saturating_add(step as u64);
        }
    }
    None
}

/// Most header-like places tried in a scan (each costs a read of up to [`MAX_TABLE_BYTES`]).
const MAX_CANDIDATES: usize = 8;

/// A table header in the read-only (neither writable nor executable) segments, 8-aligned, that
/// parses: the table over its bytes to the end of the segment (at most [`MAX_TABLE_BYTES`]) and
/// its address.
fn scan_for_table(
    file: &File,
    loads: &[(u64, u64, u64, u32)],
    text_hint: u64,
) -> Option<(Table, u64, FoundBy)> {
    let read_only = |flags: u32| flags & (elf::PF_W | elf::PF_X) == 0 && flags & elf::PF_R != 0;
    let mut candidates = 0;
    for &(offset, vaddr, size, flags) in loads {
        if !read_only(flags) {
            continue;
        }
        let one = [(offset, vaddr, size, flags)];
        let found = scan(
            file,
            &one,
            |_| true,
            8,
            |at, chunk| {
                (0..chunk.len().saturating_sub(8))
                    .step_by(8)
                    .filter(|&i| gopclntab::looks_like_header(&chunk[i..]))
                    .take_while(|_| {
                        candidates += 1;
                        candidates <= MAX_CANDIDATES
                    })
                    .find_map(|i| {
                        let start = at + i as u64;
                        let left = offset.saturating_add(size).saturating_sub(start);
                        let bytes = read_at(file, start, left, MAX_TABLE_BYTES)?;
                        let table = Table::parse(bytes, text_hint).ok()?;
                        Some((table, vaddr + (start - offset), FoundBy::Scan))
                    })
            },
        );
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The funcdata bytes from the runtime's `gofunc` to the end of its segment (or to the table,
/// when that comes first), found through the
/// runtime's `moduledata` (first field: the table's address; second: its name table's).
fn funcdata(
    file: &File,
    table: &Table,
    table_vaddr: u64,
    loads: &[(u64, u64, u64, u32)],
) -> Option<FuncData> {
    let gofunc_at = table.version.moduledata_gofunc_offset()?;
    let names = table_vaddr.checked_add(table.funcname_offset() as u64)?;
    let mut pattern = [0u8; 16];
    pattern[..8].copy_from_slice(&table_vaddr.to_le_bytes());
    pattern[8..].copy_from_slice(&names.to_le_bytes());
    let writable = |flags: u32| flags & elf::PF_W != 0;
    // Where the pattern is, as a file offset.
    let moduledata = scan(file, loads, writable, 16, |at, chunk| {
        (0..chunk.len().saturating_sub(15))
            .step_by(8)
            .find(|&i| chunk[i..i + 16] == pattern)
            .map(|i| at + i as u64)
    })?;
    let field = read_at(file, moduledata.checked_add(gofunc_at as u64)?, 8, 8)?;
    let gofunc = u64::from_le_bytes(field.get(..8)?.try_into().ok()?);
    let (offset, mut left) = loads.iter().find_map(|(off, va, size, _)| {
        (gofunc >= *va && gofunc - va < *size).then(|| (off + (gofunc - va), size - (gofunc - va)))
    })?;
    // The linker puts the table after the funcdata in the same segment: it is held already.
    if table_vaddr > gofunc {
        left = left.min(table_vaddr - gofunc);
    }
    let bytes = read_at(file, offset, left, MAX_FUNCDATA_BYTES)?;
    Some(FuncData {
        vaddr: gofunc,
        bytes,
    })
}
