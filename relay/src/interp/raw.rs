//! What the kernel walked of an interpreter, as the relay takes it in: per sample a list of raw
//! interpreter frames, per interval raw copies of the code objects they named. Plain types with
//! no protocol in them: the source stage maps the wire's `InterpStack` / `InterpCode` onto these
//! ([`InterpBatch`]), and the runtime's decoder (`cpython`) names them.
//!
//! Invariants: every value is the sampled process's memory, copied untouched (hostile); only
//! the decoders read meaning into it.

/// One interpreter frame, as the kernel read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RawInterpFrame {
    /// The code object's address (tag bits already cleared by the kernel).
    pub code: u64,
    /// The 8 bytes at the layout's `frame_instruction` offset.
    pub instruction: u64,
    /// The byte at `frame_marker` (`is_entry` in 3.11, `owner` from 3.12; 0 when absent).
    pub marker: u8,
}

/// A code object as the kernel copied it: raw bytes from each object's start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawCode {
    /// `co_firstlineno`.
    pub first_line: i32,
    /// Which copies were read: [`RawCode::NAME`], [`RawCode::FILENAME`], [`RawCode::LINETABLE`].
    pub copied: u32,
    /// The name (`co_qualname` from 3.11, else `co_name`) `str` object's first bytes.
    pub name: Vec<u8>,
    /// The file name `str` object's first bytes.
    pub filename: Vec<u8>,
    /// The line table `bytes` object's first bytes (`co_linetable` / `co_lnotab`).
    pub linetable: Vec<u8>,
}

impl RawCode {
    /// `copied` bit: the name was read.
    pub const NAME: u32 = 1;
    /// `copied` bit: the file name was read.
    pub const FILENAME: u32 = 1 << 1;
    /// `copied` bit: the line table was read.
    pub const LINETABLE: u32 = 1 << 2;

    /// Whether the copy of `bit` was read.
    pub fn has(&self, bit: u32) -> bool {
        self.copied & bit != 0
    }
}

/// A code object copied from process `pid`, at `code`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawCodeCopy {
    pub pid: u32,
    pub code: u64,
    pub raw: RawCode,
}

/// The interpreter walks of one batch: the seam between the wire and the relay's decoders.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterpBatch {
    /// Distinct interpreter stacks, each leaf first.
    pub stacks: Vec<Vec<RawInterpFrame>>,
    /// Per row of the batch (same order as `Batch.rows`): the index of its stack in `stacks`
    /// plus one, 0 for none (as `Row.interpStack` on the wire). Missing entries are 0.
    pub row_stacks: Vec<u32>,
    /// The code objects copied during the interval (a process's latest copy of a code wins).
    pub codes: Vec<RawCodeCopy>,
}

impl InterpBatch {
    /// The interpreter stack of row `row`, if it has one.
    pub fn stack_of_row(&self, row: usize) -> Option<(usize, &[RawInterpFrame])> {
        let index = usize::try_from(*self.row_stacks.get(row)?)
            .ok()?
            .checked_sub(1)?;
        Some((index, self.stacks.get(index)?.as_slice()))
    }
}
