//! The unwind worker's queue of files to compile: bounded, and hottest first.
//!
//! One worker compiles tables one after another, and a large binary takes long (a Rust
//! compiler's `librustc_driver` holds 6 MB of `.eh_frame`). First come, first served made a
//! process sampled now wait behind every binary described before it; on a host running a build,
//! the compilers' binaries came first and a hot Python process waited for seconds. Each queued
//! file carries its *heat*: the samples of the connection's latest batch whose user stacks fell in
//! it, per MiB of the file (a table serves those samples; compiling it costs about its size), so
//! the worker takes the file whose table recovers the most stacks per second of work first. Files
//! not sampled yet (heat 0: the rest of a new process's files) follow smallest first (shortest
//! job first: most files get their tables soonest, and a build's huge compiler libraries come
//! last), then in the order they came.
//! The driver raises the heat of queued files after every batch ([`JobQueue::reheat`]).
//!
//! At most [`QUEUE`] files wait; a file that finds the queue full displaces the coldest one if
//! it is hotter, and the one left out (either) is returned to be offered again later (the
//! caller's budget keeps it), never queued without bound.

use std::{
    collections::HashMap,
    sync::{Condvar, Mutex, PoisonError},
};

/// Files waiting for the worker; more are left out (offered again later).
pub(crate) const QUEUE: usize = 256;

/// The heat of `samples` samples in a file of `size` bytes: samples per MiB (a file under
/// 64 KiB counts as 64 KiB).
pub(crate) fn heat(samples: u64, size: u64) -> u64 {
    samples.saturating_mul(1 << 20) / size.max(64 << 10)
}

/// A job and its place in the queue.
struct Queued<J> {
    job: J,
    heat: u64,
    /// What compiling it costs (the file's size): ties of heat go cheapest first.
    cost: u64,
    /// Arrival order: ties of heat and cost go first come, first served.
    seq: u64,
}

impl<J> Queued<J> {
    /// Greater goes first: hotter, then cheaper, then earlier.
    fn rank(&self) -> (u64, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>) {
        (
            self.heat,
            std::cmp::Reverse(self.cost),
            std::cmp::Reverse(self.seq),
        )
    }
}

struct State<J> {
    jobs: Vec<Queued<J>>,
    next_seq: u64,
    closed: bool,
}

/// A bounded queue of jobs, taken hottest first. `J` names its queue entry by a key
/// ([`Keyed`]): a key queued twice is one entry.
pub(crate) struct JobQueue<J> {
    state: Mutex<State<J>>,
    ready: Condvar,
    capacity: usize,
}

/// What identifies a job in the queue (connection and file).
pub(crate) trait Keyed {
    type Key: Eq + std::hash::Hash + Copy;
    fn key(&self) -> Self::Key;
}

impl<J: Keyed> JobQueue<J> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(State {
                jobs: Vec::new(),
                next_seq: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job` with `heat` and `cost`; an entry of the same key keeps its place and takes
    /// the higher heat. Returns the job left out when the queue was full: the new one, or the
    /// last in rank it displaced.
    pub(crate) fn push(&self, job: J, heat: u64, cost: u64) -> Option<J> {
        let mut state = self.lock();
        let key = job.key();
        if let Some(queued) = state.jobs.iter_mut().find(|q| q.job.key() == key) {
            queued.heat = queued.heat.max(heat);
            return None;
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let entry = Queued {
            job,
            heat,
            cost,
            seq,
        };
        let left_out = if state.jobs.len() >= self.capacity {
            let coldest = (0..state.jobs.len()).min_by_key(|&i| state.jobs[i].rank())?;
            if state.jobs[coldest].rank() >= entry.rank() {
                return Some(entry.job);
            }
            Some(std::mem::replace(&mut state.jobs[coldest], entry).job)
        } else {
            state.jobs.push(entry);
            None
        };
        drop(state);
        self.ready.notify_one();
        left_out
    }

    /// Raises the heat of queued jobs: `heat` by key.
    pub(crate) fn reheat(&self, heat: &HashMap<J::Key, u64>) {
        if heat.is_empty() {
            return;
        }
        let mut state = self.lock();
        for queued in &mut state.jobs {
            if let Some(&h) = heat.get(&queued.job.key()) {
                queued.heat = queued.heat.max(h);
            }
        }
    }

    /// The hottest job, without waiting; `None` when there is none.
    pub(crate) fn try_pop(&self) -> Option<J> {
        Self::take_hottest(&mut self.lock())
    }

    /// Waits until a job is queued (true) or the queue is closed and empty (false).
    pub(crate) fn wait(&self) -> bool {
        let mut state = self.lock();
        loop {
            if !state.jobs.is_empty() {
                return true;
            }
            if state.closed {
                return false;
            }
            state = self
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// No more jobs will come: the worker ends once the queue is empty.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Jobs waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().jobs.len()
    }

    fn take_hottest(state: &mut State<J>) -> Option<J> {
        let hottest = (0..state.jobs.len()).max_by_key(|&i| state.jobs[i].rank())?;
        Some(state.jobs.swap_remove(hottest).job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Keyed for u64 {
        type Key = u64;
        fn key(&self) -> u64 {
            *self
        }
    }

    fn drain(queue: &JobQueue<u64>) -> Vec<u64> {
        std::iter::from_fn(|| queue.try_pop()).collect()
    }

    #[test]
    fn the_hottest_file_goes_first_and_cold_ones_in_the_order_they_came() {
        // Given five files queued cold, then a batch that sampled 3 and 5 (5 hotter).
        let queue = JobQueue::new(10);
        for id in 1..=5u64 {
            assert_eq!(queue.push(id, 0, 0), None);
        }
        queue.reheat(&HashMap::from([(3, 10), (5, 40), (9, 99)]));
        // When the worker takes them, Then 5, 3, then the cold ones first come first.
        assert_eq!(drain(&queue), [5, 3, 1, 2, 4]);
    }

    #[test]
    fn files_not_sampled_go_smallest_first_then_in_the_order_they_came() {
        let queue = JobQueue::new(10);
        queue.push(1, 0, 150 << 20);
        queue.push(2, 0, 2 << 20);
        queue.push(3, 0, 64 << 10);
        queue.push(4, 0, 2 << 20);
        queue.push(5, 1, 200 << 20);
        assert_eq!(drain(&queue), [5, 3, 2, 4, 1]);
    }

    #[test]
    fn a_file_queued_again_keeps_one_entry_with_the_higher_heat() {
        let queue = JobQueue::new(10);
        queue.push(1, 5, 0);
        queue.push(2, 7, 0);
        queue.push(1, 9, 0);
        queue.push(2, 1, 0);
        assert_eq!(queue.len(), 2);
        assert_eq!(drain(&queue), [1, 2]);
    }

    #[test]
    fn a_full_queue_leaves_out_the_coldest_job() {
        // Given a queue of two, full with heats 5 and 1.
        let queue = JobQueue::new(2);
        queue.push(1, 5, 0);
        queue.push(2, 1, 0);
        // When a colder job comes, Then it is left out; a hotter one displaces the coldest.
        assert_eq!(queue.push(3, 0, 0), Some(3));
        assert_eq!(queue.push(4, 9, 0), Some(2));
        assert_eq!(drain(&queue), [4, 1]);
    }

    #[test]
    fn heat_is_samples_per_mib_with_small_files_counted_as_64_kib() {
        assert_eq!(heat(100, 1 << 20), 100);
        assert_eq!(heat(100, 100 << 20), 1);
        assert_eq!(heat(100, 4096), 1600);
        assert_eq!(heat(0, 1 << 20), 0);
    }

    #[test]
    fn a_closed_queue_still_hands_out_what_it_holds_then_ends() {
        let queue = JobQueue::new(4);
        queue.push(1, 0, 0);
        queue.close();
        assert!(queue.wait());
        assert_eq!(queue.try_pop(), Some(1));
        assert!(!queue.wait());
    }
}
