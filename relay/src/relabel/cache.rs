//! The per-process relabel cache: rules run once per process, not per sample.
//!
//! Keyed by pid and start time: a reused pid (same pid, new start time) never gets the old
//! process's labels. One entry per pid, so the cache is bounded by the number of live pids and
//! by `max_entries` on top (a full cache evicts an arbitrary entry: it is recomputed on its next
//! sample, never wrong). The labels stage calls [`RelabelCache::forget`] when the sampler says a
//! process exited or sends new facts for it (exec keeps pid and start time), and
//! [`RelabelCache::clear`] when the rules are reloaded.

use std::{collections::HashMap, sync::Arc};

use crate::labels::Labels;

/// What the rules made of a process: its labels, or `None` when a rule dropped it.
pub type Outcome = Option<Arc<Labels>>;

/// Counters, for the relay's stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Entries replaced because their pid came back with a new start time.
    pub reused_pids: u64,
    /// Entries evicted because the cache was full.
    pub evictions: u64,
}

#[derive(Debug)]
struct Entry {
    start_time_unix_ns: u64,
    outcome: Outcome,
}

/// pid -> (start time, outcome).
#[derive(Debug)]
pub struct RelabelCache {
    entries: HashMap<u32, Entry>,
    max_entries: usize,
    stats: CacheStats,
}

impl RelabelCache {
    /// A cache of at most `max_entries` processes (at least one).
    pub fn new(max_entries: usize) -> Self {
        Self {
            entries: HashMap::new(),
            max_entries: max_entries.max(1),
            stats: CacheStats::default(),
        }
    }

    /// The outcome for the process `(pid, start_time_unix_ns)`, computed by `relabel` on a miss.
    /// Whether the process `(pid, start time)` is cached as left out (`None`), without
    /// counting a lookup.
    pub fn is_left_out(&self, pid: u32, start_time_unix_ns: u64) -> bool {
        self.entries.get(&pid).is_some_and(|entry| {
            entry.start_time_unix_ns == start_time_unix_ns && entry.outcome.is_none()
        })
    }

    pub fn get_or_insert_with(
        &mut self,
        pid: u32,
        start_time_unix_ns: u64,
        relabel: impl FnOnce() -> Option<Labels>,
    ) -> Outcome {
        match self.entries.get(&pid) {
            Some(entry) if entry.start_time_unix_ns == start_time_unix_ns => {
                self.stats.hits += 1;
                return entry.outcome.clone();
            }
            Some(_) => self.stats.reused_pids += 1,
            None => {
                if self.entries.len() >= self.max_entries {
                    let victim = self.entries.keys().next().copied();
                    if let Some(victim) = victim {
                        self.entries.remove(&victim);
                        self.stats.evictions += 1;
                    }
                }
            }
        }
        self.stats.misses += 1;
        let outcome = relabel().map(Arc::new);
        self.entries.insert(
            pid,
            Entry {
                start_time_unix_ns,
                outcome: outcome.clone(),
            },
        );
        outcome
    }

    /// Forgets a process (it exited, or exec'd and has new facts).
    pub fn forget(&mut self, pid: u32) {
        self.entries.remove(&pid);
    }

    /// Forgets everything (the rules changed).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    #[cfg(test)]
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn named(name: &str) -> Labels {
        [("service.name", name)].into_iter().collect()
    }

    #[test]
    fn once_per_process_and_pid_reuse_recomputes() {
        let mut cache = RelabelCache::new(16);
        let runs = Cell::new(0);
        let lookup = |cache: &mut RelabelCache, pid, start, name: &str| {
            cache.get_or_insert_with(pid, start, || {
                runs.set(runs.get() + 1);
                Some(named(name))
            })
        };
        // Given a process seen for many samples, Then the rules ran once.
        for _ in 0..5 {
            let outcome = lookup(&mut cache, 10, 100, "first");
            assert_eq!(outcome.as_deref(), Some(&named("first")));
        }
        assert_eq!(runs.get(), 1);
        // When its pid is reused by a new process (new start time), Then it is recomputed, and
        // the old labels are gone.
        let outcome = lookup(&mut cache, 10, 200, "second");
        assert_eq!(outcome.as_deref(), Some(&named("second")));
        assert_eq!(runs.get(), 2);
        assert_eq!(cache.len(), 1);
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.reused_pids), (4, 2, 1));
        // forget (exec, exit) and clear (reload) force a new run.
        cache.forget(10);
        lookup(&mut cache, 10, 200, "after-exec");
        cache.clear();
        assert!(cache.is_empty());
        lookup(&mut cache, 10, 200, "after-reload");
        assert_eq!(runs.get(), 4);
    }

    #[test]
    fn dropped_processes_are_cached_too_and_size_is_bounded() {
        let mut cache = RelabelCache::new(3);
        let dropped = cache.get_or_insert_with(1, 1, || None);
        assert_eq!(dropped, None);
        let again = cache.get_or_insert_with(1, 1, || Some(named("not run")));
        assert_eq!(again, None, "the drop is the cached outcome");
        for pid in 2..10 {
            cache.get_or_insert_with(pid, 1, || Some(named("x")));
            assert!(cache.len() <= 3);
        }
        assert_eq!(cache.stats().evictions, 6);
    }
}
