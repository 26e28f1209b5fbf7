//! The sampler's loss counters: [`Losses`] (what each batch reports) and [`LOSS_COUNTERS`], the
//! one list of them that says, per counter, its key in the relay's `batch received` log line,
//! its metric name and help text, and how `record`'s summary shows it. The relay's log, its
//! metrics and `record`'s summary iterate the list, so a counter is named and explained here
//! only (the schema and the codec name the fields too: tests below fail when the struct, the
//! list and the codec disagree).

/// Totals since the sampler started (see `Losses` in the schema). Every field is one entry of
/// [`LOSS_COUNTERS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Losses {
    pub samples: u64,
    pub idle: u64,
    pub filtered: u64,
    pub user_stack_lost: u64,
    pub kernel_stack_lost: u64,
    pub counts_full: u64,
    pub backlog_dropped_batches: u64,
    pub backlog_dropped_samples: u64,
    pub proc_errors: u64,
    pub facts_dropped: u64,
    pub facts_truncated: u64,
    pub files_unopened: u64,
    pub unwind_tables_loaded: u64,
    pub unwind_tables_refused: u64,
    pub unwind_stopped: u64,
    pub unwind_cut: u64,
    pub unwind_map_full: u64,
    /// Stacks that ended at a stop row of code 1: the outermost frame (_start, thread start), the normal end.
    pub unwind_outermost: u64,
    /// Stacks cut at a stop row of code 2: CFA from a register other than rsp/rbp.
    pub unwind_stop_cfa_register: u64,
    /// Code 3: CFA a DWARF expression other than PLT/signal.
    pub unwind_stop_cfa_expression: u64,
    /// Code 4: an offset over the row's field.
    pub unwind_stop_offset_range: u64,
    /// Code 5: return address not at CFA - 8.
    pub unwind_stop_return_address_rule: u64,
    /// Code 6: rbp restored by a rule without a row kind.
    pub unwind_stop_rbp_rule: u64,
    /// Code 7: malformed CFI.
    pub unwind_stop_malformed: u64,
    /// Code 8: FDE over the compiler's budget.
    pub unwind_stop_budget: u64,
    /// Stacks ended by a failed read of user memory.
    pub unwind_read_failed: u64,
    /// Stacks ended at rbp 0 or a return address 0 (end of a frame-pointer chain).
    pub unwind_zero_end: u64,
    /// Frames unwound by frame pointers: pc in no known file mapping.
    pub unwind_fp_no_mapping: u64,
    /// Frames unwound by frame pointers: their file has no table loaded (absent, refused, evicted).
    pub unwind_fp_no_table: u64,
    /// Frames unwound by frame pointers: a gap row or outside the table.
    pub unwind_fp_gap: u64,
    /// User-mode samples of processes whose mappings the unwinder does not know yet (frame-pointer stack kept).
    pub unwind_no_process: u64,
    /// Loaded tables evicted (least recently sampled first) to make room under --unwind-memory-bytes.
    pub unwind_tables_evicted: u64,
    /// Interpreter walks that ended at a null frame (the whole interpreter stack).
    pub interp_walked: u64,
    /// Samples of an interpreter process whose thread state was not found.
    pub interp_no_thread: u64,
    /// Interpreter walks ended by a failed read of the process's memory.
    pub interp_read_failed: u64,
    /// Interpreter walks cut at the frame cap.
    pub interp_cut: u64,
    /// Interpreter stacks lost because the kernel's stack map was full.
    pub interp_stacks_full: u64,
    /// Code objects not copied because the kernel's code map was full.
    pub interp_codes_full: u64,
    /// Frames whose code pointer was not a code object (left unnamed).
    pub interp_bad_code: u64,
    /// `interpreterProcess` messages the sampler refused.
    pub interp_refused: u64,
    /// Off-CPU waits kept, each weighed into an off-CPU row (not a loss).
    pub off_cpu_kept: u64,
    /// Off-CPU waits under `--off-cpu-min` left out by the draw (by design, not a loss).
    pub off_cpu_sampled_out: u64,
    /// Off-CPU waits dropped because the counts map was full.
    pub off_cpu_counts_full: u64,
}

impl Losses {
    /// Walked stacks that ended at a stop row of `code` (the relay's `StopReason` codes 1..=8).
    pub fn unwind_stops_with_code(&self, code: u32) -> Option<u64> {
        let counts = [
            self.unwind_outermost,
            self.unwind_stop_cfa_register,
            self.unwind_stop_cfa_expression,
            self.unwind_stop_offset_range,
            self.unwind_stop_return_address_rule,
            self.unwind_stop_rbp_rule,
            self.unwind_stop_malformed,
            self.unwind_stop_budget,
        ];
        counts
            .get(usize::try_from(code.checked_sub(1)?).ok()?)
            .copied()
    }

    /// Each counter with its value, in the order of [`LOSS_COUNTERS`].
    pub fn counters(&self) -> impl Iterator<Item = (&'static LossCounter, u64)> + '_ {
        LOSS_COUNTERS
            .iter()
            .map(move |counter| (counter, (counter.get)(self)))
    }
}

/// How `record`'s summary shows a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Summary {
    /// Not at all: the log and the metrics have it.
    Hidden,
    /// A loss the user needs to know of, printed when not zero: a line in plain words, `{n}`
    /// standing for the count and `{s}` for the plural's "s" (empty when the count is 1).
    Lost(&'static str),
    /// With `record -v`: a reason the DWARF walk of a user stack ended, under this short name.
    StackEnd(&'static str),
    /// With `record -v`: another count of the DWARF unwinder, the words after its number.
    Unwinding(&'static str),
}

/// One counter of [`Losses`] and how each place that shows it names and explains it.
#[derive(Clone, Copy, Debug)]
pub struct LossCounter {
    /// The field of [`Losses`], as its `Debug` form names it.
    pub field: &'static str,
    /// Its key in the relay's `batch received` log line.
    pub log: &'static str,
    /// Its metric name, without the `ember_sampler_` prefix and the `_total` suffix.
    pub metric: &'static str,
    /// The metric's help text.
    pub help: &'static str,
    /// How `record`'s summary shows it.
    pub summary: Summary,
    /// Reads it.
    pub get: fn(&Losses) -> u64,
    /// Its place, to write it (tests give each counter its own value through it).
    pub get_mut: fn(&mut Losses) -> &mut u64,
}

/// One [`LossCounter`] of the field `$field`: the accessors come from the same name as `field`,
/// so they cannot point at another field than the one the entry names.
macro_rules! counter {
    ($field:ident, log: $log:literal, metric: $metric:literal, summary: $summary:expr, help: $help:literal $(,)?) => {
        LossCounter {
            field: stringify!($field),
            log: $log,
            metric: $metric,
            help: $help,
            summary: $summary,
            get: |losses| losses.$field,
            get_mut: |losses| &mut losses.$field,
        }
    };
}

/// "lost: ... marked [lost stack]" for one kind of stack.
macro_rules! stack_lost {
    ($kind:literal) => {
        Summary::Lost(concat!(
            "lost: the ",
            $kind,
            " stack of {n} sample{s} (two stacks collided in the kernel's stack table, or it was \
             full); the samples are kept, their stacks marked [lost stack]"
        ))
    };
}

/// Every counter of [`Losses`], in the order of its fields (and of the metrics).
pub const LOSS_COUNTERS: &[LossCounter] = &[
    counter!(samples, log: "sampler_samples", metric: "samples", summary: Summary::Hidden,
        help: "Samples the eBPF program saw on every CPU (the denominator of the losses)."),
    counter!(idle, log: "idle_samples", metric: "idle_samples", summary: Summary::Hidden,
        help: "Samples of the idle task, not recorded by design."),
    counter!(filtered, log: "filtered_samples", metric: "filtered_samples", summary: Summary::Hidden,
        help: "Samples of other processes while the sampler is limited to one pid."),
    counter!(user_stack_lost, log: "user_stack_lost", metric: "user_stacks_lost", summary: stack_lost!("user"),
        help: "Samples kept without their user stack (stack map collision or full)."),
    counter!(kernel_stack_lost, log: "kernel_stack_lost", metric: "kernel_stacks_lost", summary: stack_lost!("kernel"),
        help: "Samples kept without their kernel stack (stack map collision or full)."),
    counter!(counts_full, log: "counts_full", metric: "counts_map_full_samples",
        summary: Summary::Lost(
            "lost: {n} sample{s}: more distinct stacks came in one interval than the sampler's \
             in-kernel table holds (a lower --frequency or a shorter --interval helps)"
        ),
        help: "Samples dropped because the counts map was full."),
    counter!(backlog_dropped_batches, log: "backlog_dropped_batches", metric: "backlog_dropped_batches", summary: Summary::Hidden,
        help: "Batches dropped from the sampler's backlog while no relay was connected."),
    counter!(backlog_dropped_samples, log: "backlog_dropped_samples", metric: "backlog_dropped_samples", summary: Summary::Hidden,
        help: "Samples in the batches dropped from the backlog."),
    counter!(proc_errors, log: "proc_errors", metric: "proc_errors", summary: Summary::Hidden,
        help: "Processes whose facts could not be read (often: exited first)."),
    counter!(facts_dropped, log: "facts_dropped", metric: "facts_dropped", summary: Summary::Hidden,
        help: "Process-fact datagrams the socket refused: dropped, never retried."),
    counter!(facts_truncated, log: "facts_truncated", metric: "facts_truncated", summary: Summary::Hidden,
        help: "Processes whose facts were cut to the sampler's caps."),
    counter!(files_unopened, log: "files_unopened", metric: "files_unopened", summary: Summary::Hidden,
        help: "Mapped files not opened because of the sampler's open-file caps."),
    counter!(unwind_tables_loaded, log: "unwind_tables_loaded", metric: "unwind_tables_loaded",
        summary: Summary::Unwinding("tables loaded"),
        help: "Unwind tables the sampler checked and accepted."),
    counter!(unwind_tables_refused, log: "unwind_tables_refused", metric: "unwind_tables_refused",
        summary: Summary::Unwinding("tables refused"),
        help: "Unwind tables (or chunks) the sampler refused: malformed, unknown file, over budget."),
    counter!(unwind_stopped, log: "unwind_stopped", metric: "unwind_stopped", summary: Summary::Hidden,
        help: "DWARF-walked user stacks cut at a row the unwinder cannot follow."),
    counter!(unwind_cut, log: "unwind_cut", metric: "unwind_cut", summary: Summary::StackEnd("cut_at_frame_cap"),
        help: "DWARF-walked user stacks cut at the frame cap."),
    counter!(unwind_map_full, log: "unwind_map_full", metric: "unwind_map_full", summary: Summary::Hidden,
        help: "Samples whose walked stack found the stack map full (frame-pointer stack kept)."),
    counter!(unwind_outermost, log: "unwind_outermost", metric: "unwind_outermost", summary: Summary::StackEnd("outermost"),
        help: "Stacks that ended at a stop row of code 1: the outermost frame (_start, thread start), the normal end."),
    counter!(unwind_stop_cfa_register, log: "unwind_stop_cfa_register", metric: "unwind_stop_cfa_register",
        summary: Summary::StackEnd("cfa_register"),
        help: "Stacks cut at a stop row of code 2: CFA from a register other than rsp/rbp."),
    counter!(unwind_stop_cfa_expression, log: "unwind_stop_cfa_expression", metric: "unwind_stop_cfa_expression",
        summary: Summary::StackEnd("cfa_expression"),
        help: "Code 3: CFA a DWARF expression other than PLT/signal."),
    counter!(unwind_stop_offset_range, log: "unwind_stop_offset_range", metric: "unwind_stop_offset_range",
        summary: Summary::StackEnd("offset_range"),
        help: "Code 4: an offset over the row's field."),
    counter!(unwind_stop_return_address_rule, log: "unwind_stop_return_address_rule", metric: "unwind_stop_return_address_rule",
        summary: Summary::StackEnd("return_address_rule"),
        help: "Code 5: return address not at CFA - 8."),
    counter!(unwind_stop_rbp_rule, log: "unwind_stop_rbp_rule", metric: "unwind_stop_rbp_rule",
        summary: Summary::StackEnd("rbp_rule"),
        help: "Code 6: rbp restored by a rule without a row kind."),
    counter!(unwind_stop_malformed, log: "unwind_stop_malformed", metric: "unwind_stop_malformed",
        summary: Summary::StackEnd("malformed"),
        help: "Code 7: malformed CFI."),
    counter!(unwind_stop_budget, log: "unwind_stop_budget", metric: "unwind_stop_budget",
        summary: Summary::StackEnd("budget"),
        help: "Code 8: FDE over the compiler's budget."),
    counter!(unwind_read_failed, log: "unwind_read_failed", metric: "unwind_read_failed",
        summary: Summary::StackEnd("read_failed"),
        help: "Stacks ended by a failed read of user memory."),
    counter!(unwind_zero_end, log: "unwind_zero_end", metric: "unwind_zero_end", summary: Summary::StackEnd("zero_end"),
        help: "Stacks ended at rbp 0 or a return address 0 (end of a frame-pointer chain)."),
    counter!(unwind_fp_no_mapping, log: "unwind_fp_no_mapping", metric: "unwind_fp_no_mapping",
        summary: Summary::Unwinding("frames by frame pointers (no mapping)"),
        help: "Frames unwound by frame pointers: pc in no known file mapping."),
    counter!(unwind_fp_no_table, log: "unwind_fp_no_table", metric: "unwind_fp_no_table",
        summary: Summary::Unwinding("frames by frame pointers (no table)"),
        help: "Frames unwound by frame pointers: their file has no table loaded (absent, refused, evicted)."),
    counter!(unwind_fp_gap, log: "unwind_fp_gap", metric: "unwind_fp_gap",
        summary: Summary::Unwinding("frames by frame pointers (gap)"),
        help: "Frames unwound by frame pointers: a gap row or outside the table."),
    counter!(unwind_no_process, log: "unwind_no_process", metric: "unwind_no_process",
        summary: Summary::Unwinding("samples of processes not known yet"),
        help: "User-mode samples of processes whose mappings the unwinder does not know yet (frame-pointer stack kept)."),
    counter!(unwind_tables_evicted, log: "unwind_tables_evicted", metric: "unwind_tables_evicted",
        summary: Summary::Unwinding("tables evicted"),
        help: "Loaded tables evicted (least recently sampled first) to make room under --unwind-memory-bytes."),
    counter!(interp_walked, log: "interp_walked", metric: "interp_walked", summary: Summary::Hidden,
        help: "Interpreter walks in the kernel that ended at a null frame (the whole interpreter stack)."),
    counter!(interp_no_thread, log: "interp_no_thread", metric: "interp_no_thread", summary: Summary::Hidden,
        help: "Samples of an interpreter process whose thread state was not found (a thread the interpreter does not know, or over the thread cap)."),
    counter!(interp_read_failed, log: "interp_read_failed", metric: "interp_read_failed", summary: Summary::Hidden,
        help: "Interpreter walks ended by a failed read of the process's memory."),
    counter!(interp_cut, log: "interp_cut", metric: "interp_cut", summary: Summary::Hidden,
        help: "Interpreter walks cut at the frame cap."),
    counter!(interp_stacks_full, log: "interp_stacks_full", metric: "interp_stacks_full",
        summary: Summary::Lost(
            "lost: the interpreter frames of {n} sample{s} (the kernel's interpreter stack table was full)"
        ),
        help: "Interpreter stacks lost because the kernel's interpreter stack map was full."),
    counter!(interp_codes_full, log: "interp_codes_full", metric: "interp_codes_full", summary: Summary::Hidden,
        help: "Code objects not copied because the kernel's code map was full (their frames stay unnamed)."),
    counter!(interp_bad_code, log: "interp_bad_code", metric: "interp_bad_code", summary: Summary::Hidden,
        help: "Interpreter code pointers that were not code objects, each counted once per CPU and interval (left unnamed; 3.13 on: its entry frames' None)."),
    counter!(interp_refused, log: "interp_refused", metric: "interp_refused", summary: Summary::Hidden,
        help: "Interpreter descriptions (interpreterProcess) the sampler refused: unknown process, file not mapped or not named like CPython, address outside the file, offset out of range."),
    counter!(off_cpu_kept, log: "off_cpu_kept", metric: "off_cpu_kept", summary: Summary::Hidden,
        help: "Off-CPU waits kept (--off-cpu), each weighed into an off-CPU row."),
    counter!(off_cpu_sampled_out, log: "off_cpu_sampled_out", metric: "off_cpu_sampled_out", summary: Summary::Hidden,
        help: "Off-CPU waits under --off-cpu-min left out by the draw (by design: the kept ones carry their weight)."),
    counter!(off_cpu_counts_full, log: "off_cpu_counts_full", metric: "off_cpu_counts_full",
        summary: Summary::Lost(
            "lost: {n} off-CPU wait{s}: more distinct stacks came in one interval than the sampler's \
             in-kernel table holds (a larger --off-cpu-min helps)"
        ),
        help: "Off-CPU waits dropped because the counts map was full."),
];

/// Losses whose counter `i` of [`LOSS_COUNTERS`] holds `first + i`: every field its own value.
pub fn distinct_losses(first: u64) -> Losses {
    let mut losses = Losses::default();
    for (value, counter) in (first..).zip(LOSS_COUNTERS) {
        *(counter.get_mut)(&mut losses) = value;
    }
    losses
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// `field: value` of every field of `losses`, from its `Debug` form (which lists every
    /// field, so a field added to the struct shows here without any list being edited).
    fn debug_fields(losses: &Losses) -> BTreeMap<String, u64> {
        let text = format!("{losses:?}");
        let body = text
            .strip_prefix("Losses { ")
            .and_then(|t| t.strip_suffix(" }"))
            .expect("Losses { .. }");
        body.split(", ")
            .map(|pair| {
                let (name, value) = pair.split_once(": ").expect("name: value");
                (name.to_owned(), value.parse().expect("a number"))
            })
            .collect()
    }

    #[test]
    fn every_field_of_losses_is_one_counter_of_the_list_and_back() {
        // Given losses whose counter i holds 1000 + i, written through the list's accessors
        let losses = distinct_losses(1000);
        // When its fields are read from its Debug form
        let fields = debug_fields(&losses);
        // Then there are as many fields as counters (a field missing from the list, or a
        // counter of no field, fails here)
        assert_eq!(
            fields.len(),
            LOSS_COUNTERS.len(),
            "fields {:?} vs counters {:?}",
            fields.keys().collect::<Vec<_>>(),
            LOSS_COUNTERS.iter().map(|c| c.field).collect::<Vec<_>>()
        );
        // And each counter names the field that holds its value, which it also reads
        for (i, counter) in LOSS_COUNTERS.iter().enumerate() {
            let value = 1000 + i as u64;
            assert_eq!(fields.get(counter.field), Some(&value), "{}", counter.field);
            assert_eq!((counter.get)(&losses), value, "{}", counter.field);
        }
    }

    #[test]
    fn log_keys_and_metric_names_are_distinct_and_every_counter_is_explained() {
        let logs: BTreeSet<&str> = LOSS_COUNTERS.iter().map(|c| c.log).collect();
        let metrics: BTreeSet<&str> = LOSS_COUNTERS.iter().map(|c| c.metric).collect();
        assert_eq!(logs.len(), LOSS_COUNTERS.len(), "a log key twice");
        assert_eq!(metrics.len(), LOSS_COUNTERS.len(), "a metric name twice");
        for counter in LOSS_COUNTERS {
            let name = counter.metric;
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    && !name.ends_with("_total"),
                "{name}"
            );
            assert!(counter.help.ends_with('.'), "{name}: {}", counter.help);
            if let Summary::Lost(text) = counter.summary {
                assert!(text.contains("{n}"), "{name}: {text}");
            }
        }
    }

    #[test]
    fn counters_pairs_each_counter_with_its_value() {
        let losses = distinct_losses(7);
        let values: Vec<(&str, u64)> = losses.counters().map(|(c, v)| (c.field, v)).collect();
        assert_eq!(values.len(), LOSS_COUNTERS.len());
        assert_eq!(values[0], ("samples", 7));
        assert_eq!(values[5], ("counts_full", 12));
    }
}
