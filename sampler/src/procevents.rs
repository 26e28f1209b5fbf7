//! Reads the program's process events: the first sample of each process arrives on
//! a ring buffer at once, so the drain loop reads the process's facts (and opens its mapped
//! binaries) while it still runs, instead of at the next drain when a short-lived process is
//! long gone. Also measures how long after that first sample the facts were read.
//!
//! The ring buffer is memory-mapped when the program is loaded: reading it needs no system call
//! besides the `ppoll` the drain loop already makes (its descriptor is polled with the relay
//! socket's).

use std::os::fd::{AsFd as _, BorrowedFd};

use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};
use ember_sampler_ebpf::{event_counter, ProcessEvent};

use crate::clock::monotonic_ns;

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
        assert_eq!(
            parse(&bytes),
            Some(ProcessEvent {
                tgid: 42,
                kind: 1,
                ktime_ns: 7_000
            })
        );
        assert_eq!(parse(&bytes[..12]), None);
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
}
