//! Messages cut to a size: upper bounds of the encoded size of the per-connection state
//! messages, the split of a process's facts into messages under a datagram size, and of one
//! interval's samples into batch parts that each carry the stacks their rows use. What a sender
//! needs to keep every datagram under the receiver's `--max-message-bytes`, from the one crate
//! that knows the encoding (struct words, pointers, text padding).
//!
//! Privilege assumptions: pure arithmetic and copies, run by the privileged sampler on the facts
//! and samples of hostile processes: no input makes it panic, and nothing is dropped (a single
//! mapping or sample over the bound is sent alone; paths are cut long before that matters).

use std::collections::HashMap;

use crate::{
    Batch, FileInfo, IgnoreStats, InterpCodeWire, InterpStackWire, Losses, Mapping, ProcessInfo,
    ProcessMappings, Row, SamplerMessage, StackRef,
};

/// Upper bound of the encoding overhead of a message besides its lists' elements: segment
/// table, root pointer, union, the process header, list tags, and far pointers between the
/// builder's segments.
pub const MESSAGE_OVERHEAD: usize = 1024;

/// Encoded bytes of a Text (NUL-terminated, padded to words) or Data field, plus the landing
/// pad of a far pointer: the builder grows by segments, and a text placed in a later segment than
/// the struct pointing at it costs one more word.
fn text_size(len: usize) -> usize {
    (len + 1).div_ceil(8) * 8 + 8
}

/// Encoded bytes of one `files` list element: the struct's words and pointers, then its texts.
pub fn file_size(f: &FileInfo) -> usize {
    6 * 8 + text_size(f.path.len()) + text_size(f.open_error.len())
}

fn mapping_size(m: &Mapping) -> usize {
    7 * 8 + text_size(m.path.len())
}

/// The messages describing a process, each at most `max_bytes` encoded: a `process` with its
/// header and the mappings that fit, then `processMappings` with the rest.
pub fn process_messages(info: &ProcessInfo, max_bytes: usize) -> Vec<SamplerMessage> {
    let mut first = ProcessInfo {
        mappings: Vec::new(),
        ..info.clone()
    };
    let mut size = MESSAGE_OVERHEAD
        + text_size(info.executable_path.len())
        + text_size(info.executable_name.len())
        + text_size(info.cgroup.len())
        + text_size(info.otel_service_name.as_ref().map_or(0, String::len))
        + text_size(
            info.otel_resource_attributes
                .as_ref()
                .map_or(0, String::len),
        )
        + text_size(info.command_line.as_ref().map_or(0, Vec::len))
        + text_size(info.perf_map_refused.len());
    let mut rest = info.mappings.iter().peekable();
    while let Some(mapping) = rest.next_if(|m| size + mapping_size(m) <= max_bytes) {
        size += mapping_size(mapping);
        first.mappings.push(mapping.clone());
    }
    let mut out = vec![SamplerMessage::Process(first)];
    while rest.peek().is_some() {
        let mut more = ProcessMappings {
            pid: info.pid,
            start_time_unix_ns: info.start_time_unix_ns,
            mappings: Vec::new(),
        };
        let mut size = MESSAGE_OVERHEAD;
        while let Some(mapping) =
            rest.next_if(|m| more.mappings.is_empty() || size + mapping_size(m) <= max_bytes)
        {
            size += mapping_size(mapping);
            more.mappings.push(mapping.clone());
        }
        out.push(SamplerMessage::ProcessMappings(more));
    }
    out
}

/// The fixed part of every batch part of one interval.
pub struct BatchHeader {
    pub sequence: u64,
    pub interval_start_unix_ns: u64,
    pub interval_end_unix_ns: u64,
    pub frequency_hz: u32,
    pub losses: Losses,
    pub ignore: IgnoreStats,
}

impl BatchHeader {
    /// An empty part with this header.
    fn part(&self) -> Batch {
        Batch {
            sequence: self.sequence,
            part: 0,
            parts: 1,
            interval_start_unix_ns: self.interval_start_unix_ns,
            interval_end_unix_ns: self.interval_end_unix_ns,
            frequency_hz: self.frequency_hz,
            losses: Box::new(self.losses),
            ignore: self.ignore,
            ..Batch::default()
        }
    }
}

/// One sample as [`batch_parts`] takes it: its thread, and its two stacks by their ids in the
/// sender's stack table (negative: no stack, and the errno that said why).
pub struct SampleIn<'a> {
    pub pid: u32,
    pub tid: u32,
    /// The thread's name, NUL-padded as the kernel keeps it.
    pub comm: &'a [u8],
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub count: u64,
    /// The key of its interpreter frames in [`InterpTables::stacks`]; 0: none.
    pub interp_stack: u64,
    /// Nanoseconds blocked (an off-CPU row: `count` 0).
    pub off_cpu_ns: u64,
}

/// One interval's interpreter frames and code objects, as the sampler drained them.
#[derive(Clone, Debug, Default)]
pub struct InterpTables {
    /// Interpreter stacks by the kernel's hash of their frames.
    pub stacks: HashMap<u64, InterpStackWire>,
    /// Code objects by (pid, address); `pid` is the rows' pid.
    pub codes: HashMap<(u32, u64), InterpCodeWire>,
}

/// Encoded bytes of an interpreter stack and of a code object, bounded above.
fn interp_stack_size(stack: &InterpStackWire) -> usize {
    24 + 32 * stack.frames.len()
}

fn interp_code_size(code: &InterpCodeWire) -> usize {
    48 + text_size(code.name.len())
        + text_size(code.filename.len())
        + text_size(code.linetable.len())
}

/// Splits one interval's samples into batch parts of at most about `max_bytes` encoded bytes
/// each; every part carries the stacks its rows use (`stacks`: frames by id, leaf first), the
/// interpreter stacks they use and the code objects those name (`interp`). A sample whose stack
/// id is not in `stacks` (it vanished) keeps its count with the stack reported missing (ENOENT),
/// so no sample is dropped here; one whose interpreter stack vanished has none.
pub fn batch_parts<'a>(
    samples: impl IntoIterator<Item = SampleIn<'a>>,
    stacks: &HashMap<u32, Vec<u64>>,
    interp: &InterpTables,
    header: &BatchHeader,
    max_bytes: usize,
) -> Vec<Batch> {
    const ROW_BYTES: usize = 96;
    const FRAME_BYTES: usize = 8;
    const STACK_BYTES: usize = 16;
    let stack_len = |id: i32| {
        u32::try_from(id)
            .ok()
            .and_then(|id| stacks.get(&id))
            .map_or(0, Vec::len)
    };
    let mut parts: Vec<Batch> = Vec::new();
    let mut current = header.part();
    let mut user_index: HashMap<u32, u32> = HashMap::new();
    let mut kernel_index: HashMap<u32, u32> = HashMap::new();
    let mut interp_index: HashMap<u64, u32> = HashMap::new();
    let mut codes_in_part: std::collections::HashSet<(u32, u64)> = std::collections::HashSet::new();
    let mut size = 0usize;
    for sample in samples {
        let mut added = ROW_BYTES + sample.comm.len();
        let user_new =
            u32::try_from(sample.user_stack).is_ok_and(|id| !user_index.contains_key(&id));
        let kernel_new =
            u32::try_from(sample.kernel_stack).is_ok_and(|id| !kernel_index.contains_key(&id));
        if user_new {
            added += STACK_BYTES + FRAME_BYTES * stack_len(sample.user_stack);
        }
        if kernel_new {
            added += STACK_BYTES + FRAME_BYTES * stack_len(sample.kernel_stack);
        }
        let interp_stack = interp.stacks.get(&sample.interp_stack);
        if let Some(stack) = interp_stack {
            if !interp_index.contains_key(&sample.interp_stack) {
                // Counted in full (its codes too) even when some are in the part already: an
                // upper bound is all the split needs.
                added += interp_stack_size(stack)
                    + stack
                        .frames
                        .iter()
                        .filter_map(|f| interp.codes.get(&(sample.pid, f.code)))
                        .map(interp_code_size)
                        .sum::<usize>();
            }
        }
        if size + added > max_bytes && !current.rows.is_empty() {
            parts.push(std::mem::replace(&mut current, header.part()));
            user_index.clear();
            kernel_index.clear();
            interp_index.clear();
            codes_in_part.clear();
            size = 0;
        }
        size += added;
        let user_stack = stack_ref(
            sample.user_stack,
            stacks,
            &mut user_index,
            &mut current.user_stacks,
        );
        let kernel_stack = stack_ref(
            sample.kernel_stack,
            stacks,
            &mut kernel_index,
            &mut current.kernel_stacks,
        );
        let interp_stack = interp_stack.map(|stack| {
            interp_ref(
                sample.pid,
                sample.interp_stack,
                stack,
                interp,
                &mut interp_index,
                &mut codes_in_part,
                &mut current,
            )
        });
        current.rows.push(Row {
            pid: sample.pid,
            tid: sample.tid,
            comm: comm_str(sample.comm),
            user_stack,
            kernel_stack,
            count: sample.count,
            interp_stack,
            off_cpu_ns: sample.off_cpu_ns,
        });
    }
    parts.push(current);
    number_parts(&mut parts);
    parts
}

/// The index of interpreter stack `hash` in `part` (added on first use, with the code objects
/// of `pid` it names that the part does not carry yet).
fn interp_ref(
    pid: u32,
    hash: u64,
    stack: &InterpStackWire,
    interp: &InterpTables,
    index: &mut HashMap<u64, u32>,
    codes_in_part: &mut std::collections::HashSet<(u32, u64)>,
    part: &mut Batch,
) -> u32 {
    for frame in &stack.frames {
        let key = (pid, frame.code);
        if let Some(code) = interp.codes.get(&key) {
            if codes_in_part.insert(key) {
                part.interp_codes.push(code.clone());
            }
        }
    }
    if let Some(&i) = index.get(&hash) {
        return i;
    }
    let i = u32::try_from(part.interp_stacks.len()).unwrap_or(u32::MAX);
    part.interp_stacks.push(stack.clone());
    index.insert(hash, i);
    i
}

/// Numbers `parts` as the parts of one interval, in order.
pub fn number_parts<'b>(parts: impl IntoIterator<Item = &'b mut Batch>) {
    let parts: Vec<&mut Batch> = parts.into_iter().collect();
    let total = u32::try_from(parts.len()).unwrap_or(u32::MAX);
    for (i, part) in (0..).zip(parts) {
        part.part = i;
        part.parts = total;
    }
}

/// Thread name from a NUL-padded `comm`.
fn comm_str(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// Where a sample's stack is in the part: its index in `table` (added on first use), or why
/// it has none.
fn stack_ref(
    id: i32,
    stacks: &HashMap<u32, Vec<u64>>,
    index: &mut HashMap<u32, u32>,
    table: &mut Vec<Vec<u64>>,
) -> StackRef {
    let Ok(id) = u32::try_from(id) else {
        return StackRef::Missing(id.saturating_neg());
    };
    if let Some(&i) = index.get(&id) {
        return StackRef::Index(i);
    }
    match stacks.get(&id) {
        Some(frames) => {
            let i = u32::try_from(table.len()).unwrap_or(u32::MAX);
            table.push(frames.clone());
            index.insert(id, i);
            StackRef::Index(i)
        }
        None => StackRef::Missing(libc::ENOENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InterpFrameWire;

    fn header() -> BatchHeader {
        BatchHeader {
            sequence: 1,
            interval_start_unix_ns: 1,
            interval_end_unix_ns: 2,
            frequency_hz: 99,
            losses: Losses::default(),
            ignore: IgnoreStats::default(),
        }
    }

    #[test]
    fn every_part_carries_the_interp_stacks_and_codes_its_rows_name() {
        // Given 40 interpreter stacks of 10 frames over 200 codes, each code copied for pid 7
        // only, and 400 rows of pids 7 and 8 using them (stack 0: none)
        let mut interp = InterpTables::default();
        for hash in 1..=40u64 {
            let frames = (0..10)
                .map(|f| InterpFrameWire {
                    code: 0x1000 * ((hash * 10 + f) % 200),
                    instruction: hash,
                    marker: 0,
                })
                .collect();
            interp
                .stacks
                .insert(hash, InterpStackWire { frames, end: 0 });
        }
        for c in 0..200u64 {
            let code = InterpCodeWire {
                pid: 7,
                code: 0x1000 * c,
                name: vec![b'n'; 40],
                ..InterpCodeWire::default()
            };
            interp.codes.insert((7, code.code), code);
        }
        let comm = [0u8; 16];
        let samples = (0..400u32).map(|i| SampleIn {
            pid: 7 + i % 2,
            tid: i,
            comm: &comm,
            user_stack: -14,
            kernel_stack: -14,
            count: 1,
            interp_stack: u64::from(i % 41),
            off_cpu_ns: 0,
        });
        // When split into parts of 16 KiB
        let parts = batch_parts(samples, &HashMap::new(), &interp, &header(), 16 << 10);
        // Then there are several, and each row's stack is the one it named, with every code of
        // its pid that the stack names in the same part (and no code of another pid)
        assert!(parts.len() > 2, "{} parts", parts.len());
        let mut rows = 0;
        for part in &parts {
            let codes: HashMap<(u32, u64), &InterpCodeWire> = part
                .interp_codes
                .iter()
                .map(|c| ((c.pid, c.code), c))
                .collect();
            assert_eq!(
                codes.len(),
                part.interp_codes.len(),
                "a code twice in a part"
            );
            for row in &part.rows {
                rows += 1;
                let Some(index) = row.interp_stack else {
                    assert_eq!(row.tid % 41, 0, "row {} lost its stack", row.tid);
                    continue;
                };
                let stack = &part.interp_stacks[index as usize];
                assert_eq!(stack.frames[0].instruction, u64::from(row.tid % 41));
                for frame in &stack.frames {
                    assert_eq!(codes.contains_key(&(row.pid, frame.code)), row.pid == 7);
                }
            }
        }
        assert_eq!(rows, 400);
    }
}
