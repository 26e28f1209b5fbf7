//! The unwind-table compiler (issue 10, step 1): from a binary handed over as a file, the CFI of
//! `.eh_frame` (or `.debug_frame` when there is no `.eh_frame`) evaluated into a compact, sorted
//! row table for x86-64 that an eBPF unwinder can binary-search: per address range, where the
//! CFA is (rsp+N, rbp+N, the PLT expression, the signal trampoline), the return address at
//! CFA - 8, and how to restore rbp. Rows the eBPF side cannot express are explicit stop rows
//! with a reason code; addresses without CFI are explicit gaps.
//!
//! Pure and self-contained: no socket, no protocol, no BPF. Parsing untrusted ELF and DWARF
//! happens here, in the unprivileged relay, never in the sampler.
//!
//! Invariants: the input is hostile. Every read is bounded ([`Limits::max_read_bytes`],
//! [`Limits::max_section_bytes`]); evaluation work and output size are bounded
//! ([`Limits::max_work_bytes`], [`Limits::max_fde_bytes`], [`Limits::max_rows`]) and a table cut
//! short says so ([`Stats::truncated`]); malformed entries are counted, never a panic. What the
//! file claims (its build id) only names cache files; a cached table is used only if the CFI bytes
//! it was compiled from are the ones in the file now ([`cache`]).
//!
//! Layout: `elf` reads the file, `cfi` evaluates and classifies, `table` sorts, fills gaps and
//! merges, `row` is the 12-byte row encoding, `cache` the on-disk cache.

pub mod cache;
mod cfi;
mod elf;
pub mod row;
pub mod table;

use std::{
    fs::File,
    time::{Duration, Instant},
};

pub use self::{
    elf::CfiSection,
    row::{Cfa, Rbp, Row, Rule, StopReason, ROW_BYTES},
    table::UnwindTable,
};

/// Bounds on what one compilation may read, do and produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest single read from the file (ELF headers, tables, notes).
    pub max_read_bytes: u64,
    /// Largest CFI section accepted; a larger one is an error.
    pub max_section_bytes: u64,
    /// Largest CIE + FDE entry evaluated; a larger FDE becomes one stop row.
    pub max_fde_bytes: u64,
    /// Total CIE + FDE bytes evaluated; past it the table is truncated.
    pub max_work_bytes: u64,
    /// Most rows (before merging) produced; past it the table is truncated.
    pub max_rows: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_read_bytes: 64 << 20,
            max_section_bytes: 64 << 20,
            max_fde_bytes: 64 << 10,
            max_work_bytes: 512 << 20,
            max_rows: 4 << 20,
        }
    }
}

/// Why a table is shorter than the section it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Truncation {
    /// `Limits::max_work_bytes` was spent.
    WorkBudget,
    /// `Limits::max_rows` were produced.
    RowBudget,
    /// The section's entry framing is broken; entries after the break were not read.
    MalformedSection,
}

/// What one compilation saw and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    pub section: CfiSection,
    pub section_bytes: u64,
    pub fdes: u64,
    /// FDEs that did not parse, or whose instructions failed part-way (their rest is a stop).
    pub fdes_malformed: u64,
    /// FDEs with an empty range or no rows.
    pub fdes_empty: u64,
    /// FDEs outside the executable range: skipped.
    pub fdes_out_of_range: u64,
    /// FDEs over `Limits::max_fde_bytes`: one stop row each.
    pub fdes_over_budget: u64,
    /// FDE rows that overlapped an earlier one and lost the overlap.
    pub fdes_overlapping: u64,
    /// Rows gimli evaluated, before merging.
    pub cfi_rows: u64,
    /// CIE + FDE bytes evaluated.
    pub work_bytes: u64,
    pub truncated: Option<Truncation>,
    pub elapsed: Duration,
}

/// A failure to compile: nothing usable came out of the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("not a readable little-endian ELF64 file: {0}")]
    Elf(String),
    #[error("ELF machine {0} is not x86-64")]
    Machine(u16),
    #[error("no .eh_frame or .debug_frame section")]
    NoCfi,
    #[error("{0} is compressed (not supported)")]
    Compressed(&'static str),
    #[error("{section} is {size} bytes, over the limit of {limit}")]
    SectionTooLarge {
        section: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("no executable segment or section")]
    NoExecutableCode,
    #[error("executable range of {0} bytes does not fit 32-bit row offsets")]
    ExecTooLarge(u64),
}

/// A compiled table with what the compilation saw.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub table: UnwindTable,
    pub stats: Stats,
    /// The file's GNU build id, if any (a name, never a proof of content).
    pub build_id: Option<Vec<u8>>,
}

/// Compiles the unwind table of the ELF file behind `file`.
pub fn compile(file: &File, limits: &Limits) -> Result<Compiled, Error> {
    let started = Instant::now();
    let input = elf::read(file, limits)?;
    let mut compiled = compile_input(&input, limits);
    compiled.stats.elapsed = started.elapsed();
    Ok(compiled)
}

/// Compiles a table from what [`elf::read`] found.
fn compile_input(input: &elf::Input, limits: &Limits) -> Compiled {
    let started = Instant::now();
    let mut stats = Stats {
        section: input.section,
        section_bytes: input.data.len() as u64,
        fdes: 0,
        fdes_malformed: 0,
        fdes_empty: 0,
        fdes_out_of_range: 0,
        fdes_over_budget: 0,
        fdes_overlapping: 0,
        cfi_rows: 0,
        work_bytes: 0,
        truncated: None,
        elapsed: Duration::ZERO,
    };
    let spans = cfi::evaluate(input, limits, &mut stats);
    let table = UnwindTable::from_spans(spans, input.exec.clone(), &mut stats.fdes_overlapping);
    stats.elapsed = started.elapsed();
    Compiled {
        table,
        stats,
        build_id: input.build_id.clone(),
    }
}

#[cfg(test)]
mod tests;
