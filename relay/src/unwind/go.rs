//! Unwind rows of a Go binary's Go functions from its own table (`.gopclntab`), which the Go
//! runtime needs for its tracebacks and so every Go binary carries, stripped or not; Go
//! binaries have no `.eh_frame`, and their `.debug_frame` is compressed and gone when stripped.
//!
//! The table's `pcsp` run of each function gives the stack pointer's distance below the frame
//! at every pc: the CFA (the caller's stack pointer) is rsp + that + 8 and the return address
//! at CFA - 8, as for any x86-64 call. So a frameless leaf (no frame pointer pushed) keeps its
//! caller, which a frame-pointer walk loses. A function with a frame has saved the caller's rbp
//! at CFA - 16 (the Go compiler's prologue on amd64 since Go 1.7), which the rows say so that a
//! walk leaving Go code for C (cgo) keeps a valid rbp.
//!
//! Functions that the Go runtime's own traceback stops at become stop rows: the outermost frame
//! of a stack (`FLAG_TOPFRAME`: `runtime.goexit`, `runtime.mstart`, `runtime.rt0_go`) and
//! functions that switch stacks (`FLAG_SPWRITE`: `runtime.systemstack`, `runtime.morestack`,
//! `runtime.mcall`), whose caller is on another stack. Go 1.16 has no flags (1.17 has them in
//! the same layout); those functions are recognized by name there.
//!
//! Invariant: the table is hostile; [`crate::symbolize::gopclntab`] reads it within its bytes.
//! Rows stay inside the executable range, at most `Limits::max_rows` of them, within
//! `Limits::max_time` and within the work budget of the table's size (in entries decoded; kept
//! apart from the CFI's, so a cgo binary's `.eh_frame` keeps its own); a delta no row can
//! express is a stop row.

use std::{ops::Range, time::Instant};

use super::{
    cfi::Span,
    row::{Cfa, Rbp, Rule, StopReason},
    Limits, Stats, Truncation,
};
use crate::symbolize::gopclntab::{Table, Version, FLAG_SPWRITE, FLAG_TOPFRAME};

/// Largest stack-pointer delta taken as real (Go's largest frames are a few MiB).
const MAX_DELTA: i32 = 1 << 28;

/// Go 1.16's functions that its later versions flag (see the module header).
const STOP_NAMES_116: [&str; 6] = [
    "runtime.goexit",
    "runtime.mstart",
    "runtime.rt0_go",
    "runtime.systemstack",
    "runtime.morestack",
    "runtime.mcall",
];

/// Spans of every Go function of `table` inside `exec`, in table order.
pub fn evaluate(table: &Table, exec: &Range<u64>, limits: &Limits, stats: &mut Stats) -> Vec<Span> {
    let started = Instant::now();
    // Entries decoded in all: functions may share one pcsp table, so a hostile table could
    // make the work far larger than its bytes; real ones decode fewer entries than they have
    // bytes.
    let budget = limits.work_budget(table.byte_len() as u64);
    let mut work = 0u64;
    let mut spans = Vec::new();
    for func in table.funcs() {
        if work > budget {
            stats.truncated.get_or_insert(Truncation::WorkBudget);
            break;
        }
        if func.entry < exec.start || func.end > exec.end {
            stats.fdes_out_of_range += 1;
            continue;
        }
        if spans.len() >= limits.max_rows {
            stats.truncated.get_or_insert(Truncation::RowBudget);
            break;
        }
        if started.elapsed() > limits.max_time {
            stats.truncated.get_or_insert(Truncation::TimeBudget);
            break;
        }
        stats.go_funcs += 1;
        let stops = match table.version {
            Version::Go116 if table.flag(&func) == 0 => table
                .name(&func)
                .is_some_and(|name| STOP_NAMES_116.contains(&name)),
            _ => table.flag(&func) & (FLAG_TOPFRAME | FLAG_SPWRITE) != 0,
        };
        if stops {
            spans.push(Span {
                start: func.entry,
                end: func.end,
                rule: Rule::Stop(StopReason::Outermost),
            });
            continue;
        }
        let before = spans.len();
        work += table.sp_runs(&func, |run, delta| {
            stats.cfi_rows += 1;
            spans.push(Span {
                start: run.start,
                end: run.end,
                rule: rule(delta),
            });
        }) as u64;
        if spans.len() == before {
            stats.fdes_empty += 1;
        }
    }
    spans
}

/// The rule at a pc whose stack pointer is `delta` bytes below the return address's slot.
fn rule(delta: i32) -> Rule {
    if !(0..=MAX_DELTA).contains(&delta) {
        return Rule::Stop(StopReason::OffsetRange);
    }
    Rule::Frame {
        cfa: Cfa::Rsp(delta + 8),
        rbp: if delta > 0 {
            Rbp::AtCfa(-16)
        } else {
            Rbp::Unchanged
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_is_a_frame_above_the_return_address() {
        // A frameless leaf: the return address is at rsp.
        assert_eq!(
            rule(0),
            Rule::Frame {
                cfa: Cfa::Rsp(8),
                rbp: Rbp::Unchanged
            }
        );
        // A 0x28-byte frame: rbp saved just below the return address.
        assert_eq!(
            rule(0x28),
            Rule::Frame {
                cfa: Cfa::Rsp(0x30),
                rbp: Rbp::AtCfa(-16)
            }
        );
        assert_eq!(rule(-8), Rule::Stop(StopReason::OffsetRange));
        assert_eq!(rule(i32::MAX), Rule::Stop(StopReason::OffsetRange));
    }
}
