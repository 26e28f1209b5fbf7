//! Reads the program's process events: the first sample of each process arrives on
//! a ring buffer at once, so the drain loop reads the process's facts (and opens its mapped
//! binaries) while it still runs, instead of at the next drain when a short-lived process is
//! long gone. Also measures how long after that first sample the facts were read.
//!
//! The ring buffer is memory-mapped when the program is loaded: reading it needs no system call
//! besides the `ppoll` the drain loop already makes (its descriptor is polled with the relay
//! socket's).

use std::{
    collections::HashSet,
    os::fd::{AsFd as _, BorrowedFd},
};

use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};
use ember_sampler_ebpf::{event_counter, ProcessEvent};

use crate::{clock::monotonic_ns, link::Outgoing};

/// Most events taken per call, so a flood cannot starve the rest of the loop (the rest stays in
/// the ring buffer for the next call).
const MAX_EVENTS_PER_CALL: usize = 1024;
/// Latencies kept between two status lines (the oldest are overwritten beyond).
const MAX_LATENCIES: usize = 4096;

pub struct ProcessEvents {
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    /// Group leaders' exits, by pid: `ktime * 2 + generation` then.
    exited_at: HashMap<MapData, u32, u64>,
    /// Nanoseconds from a process's first sample to its facts being read, since the last
    /// [`ProcessEvents::take_latencies`].
    latencies: Vec<u64>,
    next_slot: usize,
    /// Events with a size other than a [`ProcessEvent`]'s (never, with our program).
    pub malformed: u64,
}

/// Facts-read latency percentiles of one window.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Latencies {
    pub count: usize,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

impl ProcessEvents {
    pub fn new(
        ring: RingBuf<MapData>,
        counters: PerCpuArray<MapData, u64>,
        exited_at: HashMap<MapData, u32, u64>,
    ) -> Self {
        Self {
            ring,
            counters,
            exited_at,
            latencies: Vec::new(),
            next_slot: 0,
            malformed: 0,
        }
    }

    /// The ring buffer's descriptor: readable when events wait.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }

    /// The events waiting, oldest first (at most [`MAX_EVENTS_PER_CALL`]).
    pub fn take(&mut self) -> Vec<ProcessEvent> {
        let mut out = Vec::new();
        while out.len() < MAX_EVENTS_PER_CALL {
            let Some(item) = self.ring.next() else {
                break;
            };
            match parse(&item) {
                Some(event) => out.push(event),
                None => self.malformed += 1,
            }
        }
        out
    }

    /// Records that the facts of a process first sampled at `first_sample_ktime_ns`
    /// (CLOCK_MONOTONIC) were read now.
    pub fn facts_read(&mut self, first_sample_ktime_ns: u64) {
        let latency = monotonic_ns().saturating_sub(first_sample_ktime_ns);
        if self.latencies.len() < MAX_LATENCIES {
            self.latencies.push(latency);
        } else {
            self.latencies[self.next_slot] = latency;
            self.next_slot = (self.next_slot + 1) % MAX_LATENCIES;
        }
    }

    /// Percentiles of the latencies recorded since the last call, then starts a new window.
    pub fn take_latencies(&mut self) -> Latencies {
        let mut window = std::mem::take(&mut self.latencies);
        self.next_slot = 0;
        percentiles(&mut window)
    }

    /// (events sent, events dropped on a full ring buffer, execs seen), totals since load.
    pub fn counters(&self) -> (u64, u64, u64) {
        let read = |slot: u32| -> u64 {
            self.counters
                .get(&slot, 0)
                .map_or(0, |values| values.iter().sum())
        };
        (
            read(event_counter::SENT),
            read(event_counter::DROPPED),
            read(event_counter::EXECS),
        )
    }
}

impl ProcessEvents {
    /// Whether the group leader of a process with `pid` exited at or after `since_ns`
    /// (CLOCK_MONOTONIC): then it may have rows in the generation that began then.
    pub fn exited_since(&self, pid: u32, since_ns: u64) -> bool {
        self.exited_at
            .get(&pid, 0)
            .is_ok_and(|at| at / 2 >= since_ns)
    }
}

/// The pids whose facts now describe another process than at the last drain (pid reuse), and
/// the messages with those facts, held until the older process's rows are queued: the relay
/// symbolizes a row with the facts it holds for the pid when the row arrives.
#[derive(Default)]
pub struct Deferral {
    reused: HashSet<u32>,
    held: Vec<Outgoing>,
}

impl Deferral {
    /// The messages describing `pid` at its first sample that may go now: all of them, or none
    /// when they are held, because they replace another process's facts (`reused`) or the
    /// pid's facts were already held this interval.
    pub fn route(&mut self, pid: u32, reused: bool, messages: Vec<Outgoing>) -> Vec<Outgoing> {
        if reused || self.reused.contains(&pid) {
            self.reused.insert(pid);
            self.held.extend(messages);
            return Vec::new();
        }
        messages
    }

    /// Pids whose rows [`split_reused`] divides this interval.
    pub fn reused(&self) -> &HashSet<u32> {
        &self.reused
    }

    /// One interval's batch parts and the held facts in sending order: the older processes'
    /// parts (`older`), the held facts, then the newer processes' parts. Starts the next
    /// interval with nothing reused.
    pub fn interval(&mut self, older: Vec<Outgoing>, newer: Vec<Outgoing>) -> Vec<Outgoing> {
        self.reused.clear();
        let held = std::mem::take(&mut self.held);
        older.into_iter().chain(held).chain(newer).collect()
    }
}

fn parse(bytes: &[u8]) -> Option<ProcessEvent> {
    if bytes.len() != size_of::<ProcessEvent>() {
        return None;
    }
    let word = |at: usize, len: usize| -> Option<u64> {
        let mut buf = [0u8; 8];
        buf[..len].copy_from_slice(bytes.get(at..at + len)?);
        Some(u64::from_ne_bytes(buf))
    };
    Some(ProcessEvent {
        tgid: u32::try_from(word(0, 4)?).ok()?,
        kind: u32::try_from(word(4, 4)?).ok()?,
        ktime_ns: word(8, 8)?,
        uid: u32::try_from(word(16, 4)?).ok()?,
        _pad: 0,
        cgroup_id: word(24, 8)?,
        start_boottime_ns: word(32, 8)?,
    })
}

/// Nearest-rank percentiles.
fn percentiles(values: &mut [u64]) -> Latencies {
    if values.is_empty() {
        return Latencies::default();
    }
    values.sort_unstable();
    let rank = |p: usize| values[(values.len() * p).div_ceil(100).clamp(1, values.len()) - 1];
    Latencies {
        count: values.len(),
        p50_ns: rank(50),
        p99_ns: rank(99),
        max_ns: values[values.len() - 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_parsed_from_its_bytes_and_other_sizes_are_refused() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&42u32.to_ne_bytes());
        bytes.extend_from_slice(&1u32.to_ne_bytes());
        bytes.extend_from_slice(&7_000u64.to_ne_bytes());
        bytes.extend_from_slice(&1_000u32.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(&0x1234u64.to_ne_bytes());
        bytes.extend_from_slice(&5_000_000_123u64.to_ne_bytes());
        assert_eq!(
            parse(&bytes),
            Some(ProcessEvent {
                tgid: 42,
                kind: 1,
                ktime_ns: 7_000,
                uid: 1_000,
                _pad: 0,
                cgroup_id: 0x1234,
                start_boottime_ns: 5_000_000_123,
            })
        );
        assert_eq!(parse(&bytes[..32]), None);
        assert_eq!(parse(&bytes[..12]), None);
        assert_eq!(parse(&bytes[..16]), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut values: Vec<u64> = (1..=200).rev().collect();
        let l = percentiles(&mut values);
        assert_eq!(
            (l.count, l.p50_ns, l.p99_ns, l.max_ns),
            (200, 100, 198, 200)
        );
        assert_eq!(percentiles(&mut []), Latencies::default());
    }

    fn message(text: &str) -> Outgoing {
        Outgoing {
            bytes: text.as_bytes().to_vec(),
            fds: Vec::new(),
            batch: None,
        }
    }

    fn texts(messages: &[Outgoing]) -> Vec<&str> {
        messages
            .iter()
            .map(|m| std::str::from_utf8(&m.bytes).expect("text"))
            .collect()
    }

    #[test]
    fn a_reused_pids_facts_wait_for_the_older_processs_rows() {
        // Given pid 7's first process described when first sampled, then pid 7 taken by a new
        // process (its facts read twice this interval), and pid 8 new
        let mut deferral = Deferral::default();
        let now = deferral.route(7, false, vec![message("facts 7 old")]);
        assert_eq!(texts(&now), ["facts 7 old"]);
        let interval = deferral.interval(vec![message("rows 7 old")], Vec::new());
        assert_eq!(texts(&interval), ["rows 7 old"]);
        // When the new process's facts and pid 8's arrive before the drain
        let reused = deferral.route(7, true, vec![message("facts 7 new")]);
        let again = deferral.route(7, false, vec![message("facts 7 newer")]);
        let other = deferral.route(8, false, vec![message("facts 8")]);
        // Then only pid 8's go now; pid 7's are held, and its rows are split
        assert!(reused.is_empty(), "{:?}", texts(&reused));
        assert!(again.is_empty(), "{:?}", texts(&again));
        assert_eq!(texts(&other), ["facts 8"]);
        assert_eq!(deferral.reused(), &HashSet::from([7]));
        // When the interval's parts are queued
        let interval = deferral.interval(
            vec![message("rows 7 old, rows 8")],
            vec![message("rows 7 new")],
        );
        // Then the older process's rows go first, then the new process's facts, then its rows
        assert_eq!(
            texts(&interval),
            [
                "rows 7 old, rows 8",
                "facts 7 new",
                "facts 7 newer",
                "rows 7 new"
            ]
        );
        // And the next interval starts with nothing reused or held
        assert!(deferral.reused().is_empty());
        let next = deferral.route(7, false, vec![message("facts 7 later")]);
        assert_eq!(texts(&next), ["facts 7 later"]);
        assert_eq!(
            texts(&deferral.interval(vec![message("rows")], Vec::new())),
            ["rows"]
        );
    }
}
