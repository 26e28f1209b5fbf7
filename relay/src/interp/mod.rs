//! Interpreted and managed runtimes recognized from a mapped file: which runtime a binary is,
//! its exact version, and what a kernel-side stack walker needs to know about it (offsets and
//! sizes of the runtime's structures, addresses of its anchors relative to the file).
//!
//! The mechanism: each runtime has a recognizer ([`RECOGNIZERS`]) that looks at a file the relay
//! already holds by descriptor and answers "not mine" (`Ok(None)`), "mine, this version" (a
//! [`Recognized`]) or "mine but unusable, because ..." (the `layout` of a recognized runtime is
//! an error with its reason). CPython ([`cpython`]) is the first; Ruby, PHP, HotSpot and V8 plug
//! in the same way. What a walker needs is computed here, in the unprivileged relay: the
//! sampler will only check and load it (as it does unwind tables), never parse a binary.
//!
//! Invariants: the file is hostile. Every read is bounded ([`Limits`]); a recognizer decides
//! from what the file holds (exported symbols, their initial data, version strings), and a file
//! name is only ever a hint to choose between what the file itself says, never trusted alone.
//! Refusals are values with a reason, never a panic.

pub mod cpython;
pub(crate) mod elf;
pub mod publish;
pub mod raw;
pub(crate) mod seen;
pub mod wire;

use std::{fmt, fs::File};

/// Bounds on what one recognition may read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest single read from the file (ELF headers, symbol and string tables, initial data).
    pub max_read_bytes: u64,
    /// Largest `.rodata` scanned for a version string (a CPython's is 0.6 to 3 MiB).
    pub max_rodata_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_read_bytes: 16 << 20,
            max_rodata_bytes: 16 << 20,
        }
    }
}

/// A runtime a file was recognized as.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Recognized {
    CPython(cpython::Interpreter),
}

impl Recognized {
    /// The runtime's name as metrics and logs show it (`cpython`).
    pub fn runtime(&self) -> &'static str {
        match self {
            Self::CPython(_) => "cpython",
        }
    }

    /// The language its functions are written in (`Python`).
    pub fn language(&self) -> &'static str {
        match self {
            Self::CPython(_) => "Python",
        }
    }

    /// The release line, `major.minor` (`3.11`): the granularity layouts change at.
    pub fn release(&self) -> String {
        match self {
            Self::CPython(i) => format!("{}.{}", i.version.major, i.version.minor),
        }
    }

    /// Why a walker could not use it, if it could not (an unsupported version, a refused
    /// layout).
    pub fn unusable(&self) -> Option<&str> {
        match self {
            Self::CPython(i) => i.layout.as_ref().err().map(String::as_str),
        }
    }
}

impl fmt::Display for Recognized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CPython(i) => write!(f, "CPython {}", i.version),
        }
    }
}

/// A failure to read the file at all (not a refusal of a recognized runtime).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("not a readable little-endian ELF64 file: {0}")]
    Elf(String),
    #[error("ELF machine {0} is not x86-64")]
    Machine(u16),
    #[error("{what} of {size} bytes is over the limit of {limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{len} bytes at {vaddr:#x} are not in the file's loaded data")]
    NotInFile { vaddr: u64, len: u64 },
    #[error("no .rodata section")]
    NoRodata,
    #[error("`pread` at offset {offset} failed")]
    Read {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
}

/// One runtime's recognizer: the file, its name as a hint (the mapped path's last component).
pub type Recognizer = fn(&File, &str, &Limits) -> Result<Option<Recognized>, Error>;

/// Every runtime the relay recognizes, tried in order; the first that claims a file wins.
pub const RECOGNIZERS: &[(&str, Recognizer)] = &[("cpython", cpython::recognize)];

/// Which runtime `file` is, if any. `name_hint` is the file name the sampler reported (never
/// trusted alone). A file no recognizer claims is `Ok(None)`.
pub fn recognize(
    file: &File,
    name_hint: &str,
    limits: &Limits,
) -> Result<Option<Recognized>, Error> {
    for (_, recognizer) in RECOGNIZERS {
        if let Some(found) = recognizer(file, name_hint, limits)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}
