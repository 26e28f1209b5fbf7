pub mod jitdump;

/// One piece of JIT code a runtime reported about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitEntry {
    pub start: u64,
    pub size: u64,
    /// The name as the runtime wrote it (bounded by the reader).
    pub name: String,
    /// Source file and line of the code's start, when the runtime said (jitdump debug info).
    pub source: Option<(String, u32)>,
}

/// Why a JIT source could not be read further.
#[derive(Debug)]
pub enum JitReadError {
    Io(std::io::Error),
    /// The bytes are not what the format says; the reason.
    Malformed(&'static str),
}

/// An append-only file a process writes about its JIT code, read incrementally.
pub trait JitSource {
    /// Reads what was appended since the last call from `file` (positional reads only: the
    /// descriptor is shared), at most `max_bytes`, handing each complete entry to `out`;
    /// returns the bytes consumed. A partial entry at the end is left for the next call.
    fn read_new(
        &mut self,
        file: &std::fs::File,
        max_bytes: u64,
        out: &mut dyn FnMut(JitEntry),
    ) -> Result<u64, JitReadError>;
}
