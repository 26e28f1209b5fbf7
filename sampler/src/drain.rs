//! Drains the in-kernel sample counts without losing samples that arrive meanwhile, splits a
//! drained generation at reused pids, and hands it to the protocol's batch splitter. Never
//! panics; every loss is counted.
//!
//! The program writes to generation `CONTROL[0] & 1` (`CONTROL[0]` counts the flips). A drain
//! flips it, waits for program runs that
//! already read the old value to finish (a run takes microseconds), then reads and clears the old
//! generation's counts and stacks, which nothing writes to any more. Its hash maps are read and
//! cleared in batches ([`crate::bulk`]), a few system calls per map instead of three per entry.

use std::{
    collections::{HashMap, HashSet},
    mem::size_of,
    thread,
    time::Duration,
};

use aya::{
    maps::{HashMap as AyaHashMap, IterableMap as _, MapData, MapError},
    Pod,
};
use ember_protocol::{
    split::{self, BatchHeader, SampleIn},
    Batch, InterpCodeWire, InterpFrameWire, InterpStackWire, Losses,
};
use ember_sampler_ebpf::{
    counter, InterpCode, InterpStack, SampleKey, OFF_CPU_TID_BIT, REUSED_TGID_BIT,
};

/// "No such entry": the stack the key names is not in the map.
const ERRNO_ENOENT: i32 = 2;

use crate::{bulk, clock::monotonic_ns, load::Loaded};

/// How long a flip waits for in-flight program runs on the old generation.
const FLIP_GRACE: Duration = Duration::from_millis(5);

/// One generation's content, read out of the kernel.
#[derive(Debug, Default)]
pub struct Drained {
    pub rows: Vec<(SampleKey, u64)>,
    /// Frames by stack id, leaf first.
    pub stacks: HashMap<u32, Vec<u64>>,
    /// Interpreter stacks by hash and the code objects they name, by the sample key's tgid
    /// (reuse bit included until [`split_reused`]) and address: copied raw.
    pub interp: split::InterpTables,
    /// Map operations that failed (the affected samples are still counted in `rows`).
    pub read_errors: u64,
}

pub struct Drainer {
    generation: u32,
    /// Flips so far: `CONTROL[0]`, whose low bit is the generation.
    epoch: u32,
    /// CLOCK_MONOTONIC when each generation became the one the program writes to.
    started_ns: [u64; 2],
    /// Hash maps are read in batches ([`bulk`]); cleared for good once the kernel (before 5.6)
    /// refuses the command, and the drain goes key by key.
    bulk: bool,
}

impl Drainer {
    pub fn new() -> Self {
        Self {
            generation: 0,
            epoch: 0,
            started_ns: [monotonic_ns(), 0],
            bulk: true,
        }
    }

    /// When the generation the last [`Drainer::drain`] read began (CLOCK_MONOTONIC).
    pub fn drained_since_ns(&self) -> u64 {
        self.started_ns[(1 - self.generation) as usize]
    }

    /// Flips generations and returns everything recorded in the old one.
    pub fn drain(&mut self, loaded: &mut Loaded) -> Result<Drained, MapError> {
        let old = self.generation;
        // One write flips the generation (the low bit) and the epoch together.
        let epoch = self.epoch.wrapping_add(1);
        let new = epoch & 1;
        loaded.control.set(0, epoch, 0)?;
        self.epoch = epoch;
        self.generation = new;
        self.started_ns[new as usize] = monotonic_ns();
        thread::sleep(FLIP_GRACE);

        let mut drained = Drained::default();
        let bulk = &mut self.bulk;
        let errors = &mut drained.read_errors;
        drained.rows = take_entries(&mut loaded.counts[old as usize], bulk, errors);
        let walked: HashMap<u64, Vec<u64>> =
            take_entries(&mut loaded.ustacks[old as usize], bulk, errors)
                .into_iter()
                .map(|(hash, stack)| {
                    let len = (stack.len as usize).min(stack.frames.len());
                    (hash, stack.frames[..len].to_vec())
                })
                .collect();
        // A stack trace map has no batch command: its entries go key by key.
        let stacks = &mut loaded.stacks[old as usize];
        let ids: Vec<u32> = stacks.stack_ids().filter_map(Result::ok).collect();
        for id in ids {
            match stacks.get(&id, 0) {
                Ok(trace) => {
                    drained
                        .stacks
                        .insert(id, trace.frames().iter().map(|frame| frame.ip).collect());
                }
                Err(_) => drained.read_errors += 1,
            }
            if stacks.remove(&id).is_err() {
                drained.read_errors += 1;
            }
        }
        adopt_walked(&mut drained, walked);
        let bulk = &mut self.bulk;
        let errors = &mut drained.read_errors;
        let interp_stacks = take_entries(&mut loaded.interp_stacks[old as usize], bulk, errors);
        let interp_codes = take_entries(&mut loaded.interp_codes[old as usize], bulk, errors);
        for (hash, stack) in interp_stacks {
            drained
                .interp
                .stacks
                .insert(hash, interp_stack_wire(&stack));
        }
        for (key, code) in interp_codes {
            drained.interp.codes.insert(
                (key.tgid, key.code),
                interp_code_wire(key.tgid, key.code, &code),
            );
        }
        Ok(drained)
    }

    /// Sums the per-CPU loss counters (totals since load).
    pub fn counters(loaded: &Loaded) -> Losses {
        let read = |slot: u32| -> u64 {
            loaded
                .counters
                .get(&slot, 0)
                .map(|values| values.iter().sum())
                .unwrap_or(0)
        };
        // Stop code c (1..=8) is counted in slot UNWIND_STOP_CODE + c - 1.
        let stop = |code: u32| read(counter::UNWIND_STOP_CODE + code - 1);
        Losses {
            samples: read(counter::SAMPLES),
            idle: read(counter::IDLE),
            filtered: read(counter::FILTERED),
            user_stack_lost: read(counter::USER_STACK_LOST),
            kernel_stack_lost: read(counter::KERNEL_STACK_LOST),
            counts_full: read(counter::COUNTS_FULL),
            unwind_stopped: read(counter::UNWIND_STOP),
            unwind_cut: read(counter::UNWIND_CUT),
            unwind_map_full: read(counter::UNWIND_FULL),
            unwind_outermost: stop(1),
            unwind_stop_cfa_register: stop(2),
            unwind_stop_cfa_expression: stop(3),
            unwind_stop_offset_range: stop(4),
            unwind_stop_return_address_rule: stop(5),
            unwind_stop_rbp_rule: stop(6),
            unwind_stop_malformed: stop(7),
            unwind_stop_budget: stop(8),
            unwind_read_failed: read(counter::UNWIND_READ_FAILED),
            unwind_zero_end: read(counter::UNWIND_ZERO_END),
            unwind_fp_no_mapping: read(counter::UNWIND_FP_NO_MAPPING),
            unwind_fp_no_table: read(counter::UNWIND_FP_NO_TABLE),
            unwind_fp_gap: read(counter::UNWIND_FP_GAP),
            unwind_no_process: read(counter::UNWIND_NO_PROCESS),
            interp_walked: read(counter::INTERP_WALKED),
            interp_no_thread: read(counter::INTERP_NO_THREAD),
            interp_read_failed: read(counter::INTERP_READ_FAILED),
            interp_cut: read(counter::INTERP_CUT),
            interp_stacks_full: read(counter::INTERP_STACKS_FULL),
            interp_codes_full: read(counter::INTERP_CODES_FULL),
            interp_bad_code: read(counter::INTERP_BAD_CODE),
            off_cpu_kept: read(counter::OFF_CPU_KEPT),
            off_cpu_sampled_out: read(counter::OFF_CPU_SAMPLED_OUT),
            off_cpu_counts_full: read(counter::OFF_CPU_COUNTS_FULL),
            ..Losses::default()
        }
    }

    /// Samples the program dropped because their process is ignored (total since load).
    pub fn ignored_samples(loaded: &Loaded) -> u64 {
        loaded
            .counters
            .get(&counter::IGNORED, 0)
            .map_or(0, |values| values.iter().sum())
    }
}

/// Bytes of keys and values one batch call takes at most: a few calls drain a full counts map.
const BULK_BYTES: usize = 256 << 10;

/// Every entry of one of the old generation's hash maps, removed from it: in batches while
/// `bulk` holds, else (and for what a refused batch left) key by key, three calls each. A
/// failed lookup or removal is counted in `errors`.
fn take_entries<K: Pod, V: Pod>(
    map: &mut AyaHashMap<MapData, K, V>,
    bulk: &mut bool,
    errors: &mut u64,
) -> Vec<(K, V)> {
    let mut entries = Vec::new();
    if *bulk {
        let chunk = (BULK_BYTES / (size_of::<K>() + size_of::<V>())).max(64);
        let (taken, result) = bulk::take_all::<K, V>(map.map(), chunk);
        entries = taken;
        match result {
            Ok(()) => return entries,
            // A bucket longer than the chunk (never seen): this map goes key by key this time.
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => {}
            Err(err) => {
                *bulk = false;
                tracing::warn!(
                    %err,
                    "the kernel refused to read a map in batches (Linux 5.6 has the command); \
                     reading maps key by key from now on"
                );
            }
        }
    }
    let keys: Vec<K> = map.keys().filter_map(Result::ok).collect();
    for key in keys {
        match map.get(&key, 0) {
            Ok(value) => entries.push((key, value)),
            Err(_) => *errors += 1,
        }
        if map.remove(&key).is_err() {
            *errors += 1;
        }
    }
    entries
}

/// An interpreter stack as the batch carries it: the frames used, as the kernel read them.
fn interp_stack_wire(stack: &InterpStack) -> InterpStackWire {
    let len = (stack.len as usize).min(stack.frames.len());
    InterpStackWire {
        frames: stack.frames[..len]
            .iter()
            .map(|f| InterpFrameWire {
                code: f.code,
                instruction: f.instruction,
                marker: f.marker,
            })
            .collect(),
        end: u8::try_from(stack.end).unwrap_or(u8::MAX),
    }
}

/// A code object as the batch carries it: the bytes the kernel copied, nothing where its read
/// failed (its `copied` bit clear).
fn interp_code_wire(pid: u32, address: u64, code: &InterpCode) -> InterpCodeWire {
    let part = |bit: u32, bytes: &[u8]| {
        if code.copied & bit != 0 {
            bytes.to_vec()
        } else {
            Vec::new()
        }
    };
    InterpCodeWire {
        pid,
        code: address,
        first_line: code.first_line,
        name: part(1, &code.name),
        filename: part(2, &code.filename),
        linetable: part(4, &code.linetable),
    }
}

/// First id given to stacks of the DWARF unwinder: above any stack-map id (at most
/// `--stack-map-size` entries), below i32::MAX, so the rest of the sampler treats them alike.
const WALKED_ID_BASE: u32 = 1 << 30;

/// Gives each stack the DWARF unwinder stored (by hash) an id in `drained.stacks` and points
/// the rows at it; a row whose stack vanished gets ENOENT (missing, counted as lost).
fn adopt_walked(drained: &mut Drained, walked: HashMap<u64, Vec<u64>>) {
    let mut ids: HashMap<u64, u32> = HashMap::with_capacity(walked.len());
    for (hash, frames) in walked {
        let id = WALKED_ID_BASE.saturating_add(u32::try_from(ids.len()).unwrap_or(u32::MAX >> 2));
        ids.insert(hash, id);
        drained.stacks.insert(id, frames);
    }
    for (key, _) in &mut drained.rows {
        if key.user_stack_hash != 0 {
            key.user_stack_id = ids
                .get(&key.user_stack_hash)
                .map_or(-ERRNO_ENOENT, |&id| id as i32);
        }
        // Off-CPU rows keep their kernel stack there too (walked when the thread blocked).
        if key.kernel_stack_hash != 0 {
            key.kernel_stack_id = ids
                .get(&key.kernel_stack_hash)
                .map_or(-ERRNO_ENOENT, |&id| id as i32);
        }
    }
}

/// Splits one drained generation at a reused pid: the rows of the process that had the pid
/// before (`before`, symbolized with its facts) and those of the process that has it now
/// (`after`, symbolized with its facts, which the sampler sends between the two). The program
/// tags the newer process's rows when the older one's leader exited in this very generation;
/// untagged rows of a `reused` pid are the older process's when it exited after this
/// generation began (`exited_here`), else the newer one's. Untags every
/// row. Both halves carry the stacks.
pub fn split_reused(
    mut drained: Drained,
    reused: &HashSet<u32>,
    exited_here: impl Fn(u32) -> bool,
) -> (Drained, Drained) {
    let tagged = drained
        .rows
        .iter()
        .any(|(key, _)| key.tgid & REUSED_TGID_BIT != 0);
    if !tagged && reused.is_empty() {
        return (drained, Drained::default());
    }
    let mut after = Drained {
        stacks: drained.stacks.clone(),
        interp: split::InterpTables {
            stacks: drained.interp.stacks.clone(),
            codes: HashMap::new(),
        },
        ..Drained::default()
    };
    // Code objects copied for the newer process (tagged) go after, untagged; untagged ones
    // stay and go after too, for the newer process's untagged rows.
    let codes = std::mem::take(&mut drained.interp.codes);
    for ((pid, address), mut code) in codes {
        if pid & REUSED_TGID_BIT != 0 {
            code.pid = pid & !REUSED_TGID_BIT;
            after.interp.codes.insert((code.pid, address), code);
        } else {
            after
                .interp
                .codes
                .entry((pid, address))
                .or_insert_with(|| code.clone());
            drained.interp.codes.insert((pid, address), code);
        }
    }
    let rows = std::mem::take(&mut drained.rows);
    for (mut key, count) in rows {
        let newer = key.tgid & REUSED_TGID_BIT != 0
            || (reused.contains(&key.tgid) && !exited_here(key.tgid));
        key.tgid &= !REUSED_TGID_BIT;
        if newer {
            after.rows.push((key, count));
        } else {
            drained.rows.push((key, count));
        }
    }
    (drained, after)
}

/// Splits one drain into batches of at most about `max_bytes` encoded bytes each
/// ([`split::batch_parts`]): every part carries the stacks its rows use, and a row whose stack
/// vanished keeps its count with the stack reported missing (ENOENT).
pub fn build_batches(drained: &Drained, header: &BatchHeader, max_bytes: usize) -> Vec<Batch> {
    let samples = drained.rows.iter().map(|(key, value)| {
        // An off-CPU row (tagged tid) holds nanoseconds blocked, not samples.
        let off_cpu = key.tid & OFF_CPU_TID_BIT != 0;
        SampleIn {
            pid: key.tgid,
            tid: key.tid & !OFF_CPU_TID_BIT,
            comm: &key.comm,
            user_stack: key.user_stack_id,
            kernel_stack: key.kernel_stack_id,
            count: if off_cpu { 0 } else { *value },
            interp_stack: key.interp_stack_hash,
            off_cpu_ns: if off_cpu { *value } else { 0 },
        }
    });
    split::batch_parts(samples, &drained.stacks, &drained.interp, header, max_bytes)
}

/// [`build_batches`] of two halves of one drain, sent in this order with messages between
/// them: numbered as the parts of one interval.
pub fn build_batches_in_two(
    first: &Drained,
    second: &Drained,
    header: &BatchHeader,
    max_bytes: usize,
) -> (Vec<Batch>, Vec<Batch>) {
    let mut a = build_batches(first, header, max_bytes);
    if second.rows.is_empty() {
        return (a, Vec::new());
    }
    let mut b = build_batches(second, header, max_bytes);
    split::number_parts(a.iter_mut().chain(b.iter_mut()));
    (a, b)
}

#[cfg(test)]
mod tests {
    use ember_protocol::{IgnoreStats, StackRef};

    use super::*;

    fn key(tid: u32, user: i32, kernel: i32) -> SampleKey {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"work");
        SampleKey {
            tgid: 1,
            tid,
            user_stack_id: user,
            kernel_stack_id: kernel,
            comm,
            user_stack_hash: 0,
            interp_stack_hash: 0,
            kernel_stack_hash: 0,
        }
    }

    fn header() -> BatchHeader {
        BatchHeader {
            sequence: 7,
            interval_start_unix_ns: 1,
            interval_end_unix_ns: 2,
            frequency_hz: 97,
            losses: Losses::default(),
            ignore: IgnoreStats::default(),
        }
    }

    #[test]
    fn walked_stacks_get_ids_and_vanished_ones_are_missing() {
        // Given two rows with DWARF-walked stacks, one of which was stored
        let mut drained = Drained::default();
        let mut found = key(1, 0, -14);
        found.user_stack_hash = 77;
        let mut vanished = key(2, 0, -14);
        vanished.user_stack_hash = 78;
        drained.rows = vec![(found, 3), (vanished, 1), (key(3, 5, -14), 1)];
        // When adopted
        adopt_walked(&mut drained, HashMap::from([(77, vec![0x10, 0x20])]));
        // Then the stored one has an id above the stack map's, the other is ENOENT, and a
        // frame-pointer row is untouched
        let id = drained.rows[0].0.user_stack_id;
        assert!(id >= WALKED_ID_BASE as i32);
        assert_eq!(drained.stacks[&(id as u32)], vec![0x10, 0x20]);
        assert_eq!(drained.rows[1].0.user_stack_id, -ERRNO_ENOENT);
        assert_eq!(drained.rows[2].0.user_stack_id, 5);
    }

    #[test]
    fn split_keeps_every_sample_and_its_stacks() {
        // Given 200 rows over 50 distinct 100-frame stacks
        let mut drained = Drained::default();
        for id in 0..50u32 {
            drained
                .stacks
                .insert(id, (0..100).map(|f| u64::from(id) * 1000 + f).collect());
        }
        for tid in 0..200u32 {
            drained
                .rows
                .push((key(tid, (tid % 50) as i32, -14), u64::from(tid) + 1));
        }
        // When split into parts of at most 8 KiB
        let parts = build_batches(&drained, &header(), 8 << 10);
        // Then no sample is lost, and each part resolves its rows' stacks itself
        assert!(parts.len() > 1);
        let total: u64 = parts.iter().map(Batch::sample_count).sum();
        assert_eq!(total, (1..=200).sum::<u64>());
        for part in &parts {
            assert_eq!(part.parts, parts.len() as u32);
            for row in &part.rows {
                match row.user_stack {
                    StackRef::Index(i) => {
                        let frames = &part.user_stacks[i as usize];
                        assert_eq!(frames[0] / 1000, u64::from(row.tid % 50));
                    }
                    StackRef::Missing(_) => panic!("stack lost in split"),
                }
                assert_eq!(row.kernel_stack, StackRef::Missing(14));
            }
        }
    }

    #[test]
    fn vanished_stack_is_reported_not_dropped() {
        let drained = Drained {
            rows: vec![(key(1, 5, -17), 3)],
            ..Drained::default()
        };
        let parts = build_batches(&drained, &header(), 1 << 20);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].rows[0].user_stack, StackRef::Missing(libc::ENOENT));
        assert_eq!(parts[0].rows[0].kernel_stack, StackRef::Missing(17));
        assert_eq!(parts[0].rows[0].count, 3);
    }

    fn row(tgid: u32) -> (SampleKey, u64) {
        let key = SampleKey {
            tgid,
            tid: tgid & !REUSED_TGID_BIT,
            user_stack_id: 1,
            kernel_stack_id: -14,
            comm: [0; 16],
            user_stack_hash: 0,
            interp_stack_hash: 0,
            kernel_stack_hash: 0,
        };
        (key, 1)
    }

    fn pids(drained: &Drained) -> Vec<u32> {
        drained.rows.iter().map(|(k, _)| k.tgid).collect()
    }

    #[test]
    fn the_newer_process_of_a_reused_pid_gets_its_own_code_objects_untagged() {
        // Given pid 7's older process and its newer one (tagged) each with a code object at
        // the same address, and one row each using one interpreter stack that names it
        let code = |pid: u32, name: &[u8]| InterpCodeWire {
            pid,
            code: 0x1000,
            name: name.to_vec(),
            ..InterpCodeWire::default()
        };
        let stack = InterpStackWire {
            frames: vec![InterpFrameWire {
                code: 0x1000,
                ..InterpFrameWire::default()
            }],
            end: 0,
        };
        let (mut older, mut newer) = (row(7), row(7 | REUSED_TGID_BIT));
        older.0.interp_stack_hash = 5;
        newer.0.interp_stack_hash = 5;
        let tagged = 7 | REUSED_TGID_BIT;
        let drained = Drained {
            rows: vec![older, newer],
            interp: split::InterpTables {
                stacks: HashMap::from([(5, stack)]),
                codes: HashMap::from([
                    ((7, 0x1000), code(7, b"old")),
                    ((tagged, 0x1000), code(tagged, b"new")),
                ]),
            },
            ..Drained::default()
        };
        // When split and made into batches
        let (before, after) = split_reused(drained, &HashSet::from([7]), |_| true);
        let (a, b) = build_batches_in_two(&before, &after, &header(), 1 << 20);
        // Then each half's row names its own process's code object, under the plain pid
        for (parts, name) in [(a, b"old"), (b, b"new")] {
            let part = &parts[0];
            assert_eq!(part.rows.len(), 1);
            assert_eq!(part.rows[0].interp_stack, Some(0));
            assert_eq!(part.interp_codes.len(), 1);
            assert_eq!(
                (part.interp_codes[0].pid, &part.interp_codes[0].name[..]),
                (7, &name[..])
            );
        }
    }

    #[test]
    fn a_code_copy_keeps_only_the_parts_the_kernel_read() {
        let mut code = InterpCode {
            first_line: 12,
            copied: 1 | 4,
            name: [b'n'; ember_sampler_ebpf::INTERP_NAME_BYTES],
            filename: [b'f'; ember_sampler_ebpf::INTERP_FILE_BYTES],
            linetable: [b'l'; ember_sampler_ebpf::INTERP_LINES_BYTES],
        };
        let wire = interp_code_wire(7, 0x10, &code);
        assert_eq!(
            (wire.name.len(), wire.filename.len(), wire.linetable.len()),
            (192, 0, 256)
        );
        code.copied = 0;
        let wire = interp_code_wire(7, 0x10, &code);
        assert!(wire.name.is_empty() && wire.linetable.is_empty());
        assert_eq!((wire.pid, wire.code, wire.first_line), (7, 0x10, 12));
    }

    #[test]
    fn a_reused_pid_splits_its_rows_between_the_two_processes() {
        let drained = || Drained {
            rows: vec![row(7), row(7 | REUSED_TGID_BIT), row(8)],
            ..Drained::default()
        };
        let reused = HashSet::from([7]);
        // Given the older process of pid 7 exited in this generation: its rows stay before, the
        // tagged ones (the newer process's) go after, untagged
        let (before, after) = split_reused(drained(), &reused, |_| true);
        assert_eq!((pids(&before), pids(&after)), (vec![7, 8], vec![7]));
        // Given it exited in an earlier generation: every row of pid 7 is the newer process's
        let (before, after) = split_reused(drained(), &reused, |_| false);
        assert_eq!((pids(&before), pids(&after)), (vec![8], vec![7, 7]));
        // Given no reuse the sampler knows of: tagged rows still go after, untagged
        let (before, after) = split_reused(drained(), &HashSet::new(), |_| true);
        assert_eq!((pids(&before), pids(&after)), (vec![7, 8], vec![7]));
    }
}
