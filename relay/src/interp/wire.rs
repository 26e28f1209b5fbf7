//! The batch's interpreter walks, as the protocol carries them, mapped onto the relay's raw
//! types ([`InterpBatch`]): the one place that knows both.
//!
//! The wire has no "copied" bits: the sampler sends an empty copy for a read that failed, so a
//! non-empty copy is a read one.

use ember_protocol::Batch;

use super::raw::{InterpBatch, RawCode, RawCodeCopy, RawInterpFrame};

/// The interpreter stacks, each row's stack and the code copies of `batch`.
pub fn interp_batch(batch: &Batch) -> InterpBatch {
    if batch.interp_stacks.is_empty() && batch.interp_codes.is_empty() {
        return InterpBatch::default();
    }
    let stacks = batch
        .interp_stacks
        .iter()
        .map(|stack| {
            stack
                .frames
                .iter()
                .map(|f| RawInterpFrame {
                    code: f.code,
                    instruction: f.instruction,
                    marker: f.marker,
                })
                .collect()
        })
        .collect();
    let row_stacks = batch
        .rows
        .iter()
        .map(|row| row.interp_stack.map_or(0, |i| i.saturating_add(1)))
        .collect();
    let codes = batch
        .interp_codes
        .iter()
        .map(|c| {
            let bit = |bytes: &[u8], bit: u32| if bytes.is_empty() { 0 } else { bit };
            RawCodeCopy {
                pid: c.pid,
                code: c.code,
                raw: RawCode {
                    first_line: c.first_line,
                    copied: bit(&c.name, RawCode::NAME)
                        | bit(&c.filename, RawCode::FILENAME)
                        | bit(&c.linetable, RawCode::LINETABLE),
                    name: c.name.clone(),
                    filename: c.filename.clone(),
                    linetable: c.linetable.clone(),
                },
            }
        })
        .collect();
    InterpBatch {
        stacks,
        row_stacks,
        codes,
    }
}

#[cfg(test)]
mod tests {
    use ember_protocol::{InterpCodeWire, InterpFrameWire, InterpStackWire, Row, StackRef};

    use super::*;

    #[test]
    fn rows_point_at_their_stacks_and_empty_copies_are_unread() {
        // Given a batch with one interpreter stack used by the second row, and a code copy
        // whose file name could not be read
        let row = |interp_stack| Row {
            pid: 7,
            tid: 7,
            comm: String::new(),
            user_stack: StackRef::Missing(14),
            kernel_stack: StackRef::Missing(14),
            count: 1,
            interp_stack,
            off_cpu_ns: 0,
        };
        let batch = Batch {
            rows: vec![row(None), row(Some(0))],
            interp_stacks: vec![InterpStackWire {
                frames: vec![InterpFrameWire {
                    code: 0x1000,
                    instruction: 8,
                    marker: 1,
                }],
                end: 0,
            }],
            interp_codes: vec![InterpCodeWire {
                pid: 7,
                code: 0x1000,
                first_line: 3,
                name: vec![1; 8],
                filename: Vec::new(),
                linetable: vec![2; 8],
            }],
            ..Batch::default()
        };
        // When it is mapped
        let interp = interp_batch(&batch);
        // Then the first row has no stack, the second the one stack, and the copy says which
        // reads were made
        assert_eq!(interp.stack_of_row(0), None);
        let (index, frames) = interp.stack_of_row(1).expect("a stack");
        assert_eq!((index, frames.len(), frames[0].marker), (0, 1, 1));
        let raw = &interp.codes[0].raw;
        assert!(raw.has(RawCode::NAME) && raw.has(RawCode::LINETABLE));
        assert!(!raw.has(RawCode::FILENAME));
    }
}
