//! The unwind-table compiler: from a binary handed over as a file, the CFI of
//! `.eh_frame`, and of `.debug_frame` (plain, `SHF_COMPRESSED` or GNU `.zdebug_frame`: what
//! C built without unwind tables carries) for the code `.eh_frame` does not describe, and for a
//! Go binary the stack-pointer deltas of its Go table (`go`), evaluated into a compact, sorted
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
//! Addresses are ELF virtual addresses (the `p_vaddr` space of the file): the unwinder subtracts
//! the mapping's load bias from a pc before the lookup. A table covers the file's executable
//! range `[base, base + len)` exactly once, so a lookup there always finds one row.
//!
//! `.eh_frame_hdr` is not read: it is a lookup index over the FDEs, and the compiler evaluates
//! every FDE anyway; sorting happens in [`table`].
//!
//! Layout: `elf` reads the file, `compressed` inflates compressed sections within bounds, `cfi`
//! evaluates and classifies, `go` reads a Go binary's pcsp tables, `table` sorts, fills gaps and
//! merges, `row` is the 12-byte row encoding, `cache` the on-disk cache; `sender` is the worker
//! that compiles and sends tables, taking files hottest first from `queue` and keeping recent
//! tables in memory (`recent`), within the sampler's rows as `budget` shares them.

pub(crate) mod budget;
pub mod cache;
mod cfi;
mod compressed;
pub(crate) mod elf;
mod go;
pub(crate) mod queue;
mod recent;
pub mod row;
pub(crate) mod sender;
#[cfg(any(test, feature = "fuzzing"))]
pub mod synthetic;
pub mod table;

use std::{
    fs::File,
    time::{Duration, Instant},
};

#[cfg(test)]
use self::row::{Cfa, Rbp, Rule, StopReason};
pub use self::{
    elf::{CfiSection, Compression},
    table::UnwindTable,
};

/// Bounds on what one compilation may read, do and produce.
///
/// Evaluation time is proportional to the CFI bytes evaluated (each instruction is at least one
/// byte and costs at most a copy of one row's register rules), so work is bounded in bytes: a
/// CIE's initial instructions run again for every FDE that uses it, which is how a hostile file
/// would amplify a small section into a lot of work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest single read from the file (ELF headers, tables, notes).
    pub max_read_bytes: u64,
    /// Largest CFI section accepted, stored or decompressed (each of `.eh_frame` and
    /// `.debug_frame`); a larger one is an error.
    pub max_section_bytes: u64,
    /// Largest CIE entry evaluated (real CIEs hold a few instructions); FDEs of a larger CIE
    /// become stop rows.
    pub max_cie_bytes: u64,
    /// Largest CIE + FDE entry evaluated; a larger FDE becomes one stop row.
    pub max_fde_bytes: u64,
    /// Total CIE + FDE bytes evaluated, at most `max_work_factor` times the section size plus
    /// 1 MiB and never more than this; past it the table is truncated.
    pub max_work_bytes: u64,
    /// See `max_work_bytes`. Real binaries need about 1.3 times their section size.
    pub max_work_factor: u64,
    /// Wall-clock safety net, checked between FDEs; past it the table is truncated.
    pub max_time: Duration,
    /// Most rows (before merging) produced; past it the table is truncated. Peak memory is
    /// about 32 bytes per row while sorting, plus 12 per row kept, plus the section.
    pub max_rows: usize,
}

impl Limits {
    /// The work budget for a section of `section_bytes`.
    pub fn work_budget(&self, section_bytes: u64) -> u64 {
        section_bytes
            .saturating_mul(self.max_work_factor)
            .saturating_add(1 << 20)
            .min(self.max_work_bytes)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_read_bytes: 32 << 20,
            max_section_bytes: 32 << 20,
            max_cie_bytes: 4 << 10,
            max_fde_bytes: 64 << 10,
            max_work_bytes: 128 << 20,
            max_work_factor: 4,
            max_time: Duration::from_secs(10),
            max_rows: 4 << 20,
        }
    }
}

/// Why a table is shorter than the section it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Truncation {
    /// The work budget was spent: the FDEs after it are stop rows ([`StopReason::Budget`]).
    WorkBudget,
    /// `Limits::max_rows` were produced: the addresses of the FDEs after it are gaps.
    RowBudget,
    /// The section's entry framing is broken; entries after the break were not read.
    MalformedSection,
    /// `Limits::max_time` passed: the addresses of the FDEs after it are gaps.
    TimeBudget,
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
    /// `.debug_frame` FDEs over code `.eh_frame` already describes: skipped.
    pub fdes_described_twice: u64,
    /// How `.debug_frame` was stored, when it was read and compressed.
    pub debug_frame_compression: Option<Compression>,
    /// FDE rows that overlapped an earlier one and lost the overlap.
    pub fdes_overlapping: u64,
    /// Rows gimli evaluated (and pcsp runs of Go functions read), before merging.
    pub cfi_rows: u64,
    /// Go functions whose rows came from the binary's Go table (`go`).
    pub go_funcs: u64,
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
    #[error("{section} is compressed with {format}, which is not supported")]
    UnsupportedCompression {
        section: &'static str,
        format: &'static str,
    },
    /// A compressed section that claims too much or does not inflate to what it claims: a
    /// broken or hostile file, counted by the sender.
    #[error("{section}: compressed data refused: {reason}")]
    BadCompression {
        section: &'static str,
        reason: String,
    },
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
    /// `p_vaddr - p_offset` of the executable segment: table address = mapped address -
    /// mapping start + mapping file offset + this.
    pub vaddr_minus_offset: i64,
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
        section_bytes: input.cfi_bytes(),
        fdes: 0,
        fdes_malformed: 0,
        fdes_empty: 0,
        fdes_out_of_range: 0,
        fdes_over_budget: 0,
        fdes_described_twice: 0,
        debug_frame_compression: input.debug_frame.as_ref().and_then(|d| d.compression),
        fdes_overlapping: 0,
        cfi_rows: 0,
        go_funcs: 0,
        work_bytes: 0,
        truncated: None,
        elapsed: Duration::ZERO,
    };
    // Go functions first: at equal starts the earlier span wins (a cgo binary's `.eh_frame`
    // covers its C code, not the Go functions).
    let mut spans = match &input.go {
        Some(table) => go::evaluate(table, &input.exec, limits, &mut stats),
        None => Vec::new(),
    };
    spans.extend(cfi::evaluate(input, limits, &mut stats));
    let table = UnwindTable::from_spans(spans, input.exec.clone(), &mut stats.fdes_overlapping);
    stats.elapsed = started.elapsed();
    Compiled {
        table,
        stats,
        vaddr_minus_offset: input.vaddr_minus_offset,
    }
}

#[cfg(test)]
mod tests;
