//! The relay's account of one sampler's unwind-row budget: which tables it sent, who each is
//! charged to, and a fair share per owner, so that one user's binaries cannot evict everyone's
//! tables.
//!
//! The sampler announces its row array and table map sizes in its hello
//! (`--unwind-memory-bytes`); the relay never sends more than they hold, so the sampler has no
//! reason to evict on its own. Before a table is sent, [`Budget::admit`] decides:
//! - A table over [`FILE_SHARE`] of the rows is refused for good (counted): its binary unwinds
//!   by frame pointers.
//! - A table is charged to the owner of its file, as the kernel reports it for the descriptor the
//!   sampler passed (`fstat`): root-owned system files share root's part, each other user has her
//!   own. With `n` owners holding tables (the new one included) each may hold `1/n` of the rows
//!   and of the table entries. While there is room anyone may use more; when there is not, a
//!   table within its owner's share displaces the least recently sampled tables of owners over
//!   theirs, and a table over it displaces only its owner's own (least recently sampled first,
//!   the largest first among those sampled in the same batch).
//!   An owner within her share is never displaced by another. A table that even all of its
//!   owner's own tables cannot make room for is refused (counted) and offered again later.
//! - Tables displaced this way are dropped in the sampler (`dropUnwindTable`) before the new one
//!   is sent, and offered again when their binary is sampled again, at most once per
//!   [`REOFFER_EVERY`] per file.
//! - A file the compile queue had no room for is offered again at the next batch.
//!
//! If the sampler evicts on its own all the same (its free rows are fragmented, or it predates
//! the hello's sizes), its eviction counter grows: every table is then taken as unsure and sent
//! again when its binary is next sampled (rate-limited the same way).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// A table may take at most this fraction (1/`FILE_SHARE`) of the sampler's rows: half, the
/// share of each owner as soon as two hold tables, so that one table never outgrows it.
pub(crate) const FILE_SHARE: u64 = 2;
/// A file whose table is absent from the sampler is offered again at most this often.
pub(crate) const REOFFER_EVERY: Duration = Duration::from_secs(2);

/// The budget's counters, summed over all connections (relay metrics).
#[derive(Debug, Default)]
pub(crate) struct BudgetCounters {
    /// Tables refused for good: larger than 1/[`FILE_SHARE`] of the rows.
    pub too_large: AtomicU64,
    /// Tables refused for now: their owner's share could not make room.
    pub over_share: AtomicU64,
    /// Tables the relay told the sampler to drop to make room within the fair shares.
    pub withdrawn: AtomicU64,
    /// Tables offered again (evicted, refused for now, skipped by a full compile queue, unsure).
    pub reoffered: AtomicU64,
    /// Files whose compressed CFI was refused (over the size limit, or not inflating to the size
    /// it claims: a broken or hostile file). Counted here, where the compile worker and the
    /// relay's metrics already share counters.
    pub cfi_refused: AtomicU64,
}

impl BudgetCounters {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where a file's table stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Handed to the compile queue; not decided yet.
    Queued,
    /// Sent to the sampler; `unsure` once the sampler evicted tables on its own.
    Held {
        owner: u32,
        rows: u64,
        used: Instant,
        unsure: bool,
    },
    /// Not in the sampler: offered again from `after` on, only once sampled if `needs_sample`.
    Absent { after: Instant, needs_sample: bool },
    /// Never offered again: no table could be built, or it is too large.
    Never,
}

/// What to do with a compiled table.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Send it after telling the sampler to drop these tables, in order.
    Send { drop: Vec<u64> },
    /// Larger than 1/[`FILE_SHARE`] of the rows: never sent.
    TooLarge { rows: u64, limit: u64 },
    /// Its owner's share cannot make room now: offered again later.
    OverShare { owner: u32, rows: u64, share: u64 },
}

/// One sampler connection's account of its unwind budget.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Rows and table entries the sampler holds; `None` when it did not say (all is sent).
    capacity: Option<(u64, u64)>,
    files: HashMap<u64, State>,
    /// The sampler's eviction counter when last seen.
    sampler_evicted: u64,
    /// The interval (batch sequence) last seen and when its first part came: every part of
    /// one interval stamps its files with that one time ([`Budget::interval_time`]).
    interval: Option<(u64, Instant)>,
    /// When the connection began: the stamp of tables sent before its first batch.
    created: Instant,
    counters: Arc<BudgetCounters>,
}

impl Budget {
    /// A budget for a sampler with `rows` rows and `tables` table entries (0: not said).
    pub(crate) fn new(rows: u32, tables: u32, counters: Arc<BudgetCounters>) -> Self {
        let capacity = (rows > 0 && tables > 0).then_some((u64::from(rows), u64::from(tables)));
        Self {
            capacity,
            files: HashMap::new(),
            sampler_evicted: 0,
            interval: None,
            created: Instant::now(),
            counters,
        }
    }

    /// The time to stamp the files sampled in a part of interval `sequence` with: when its
    /// first part came. A large interval comes in several parts, each holding other processes'
    /// rows; stamped part by part, a hot table whose rows were in the first part looked less
    /// recently sampled than every table of the later parts, and a new table displaced it first
    /// (a 55-row executable sampled in every interval was withdrawn again and again beside a
    /// build's compilers). Within one interval, the largest tables go first.
    pub(crate) fn interval_time(&mut self, sequence: u64, now: Instant) -> Instant {
        match self.interval {
            Some((seen, at)) if seen == sequence => at,
            _ => {
                self.interval = Some((sequence, now));
                now
            }
        }
    }

    /// The file was handed to the compile queue.
    pub(crate) fn queued(&mut self, file_id: u64) {
        self.files.insert(file_id, State::Queued);
    }

    /// The compile queue was full: the file is offered again at the next batch.
    pub(crate) fn skipped(&mut self, file_id: u64, now: Instant) {
        self.files.insert(
            file_id,
            State::Absent {
                after: now,
                needs_sample: false,
            },
        );
    }

    /// No table could be built for the file: it is not offered again.
    pub(crate) fn no_table(&mut self, file_id: u64) {
        self.files.insert(file_id, State::Never);
    }

    /// The file's compressed CFI was refused: no table, not offered again, counted.
    pub(crate) fn cfi_refused(&mut self, file_id: u64) {
        BudgetCounters::add(&self.counters.cfi_refused);
        self.no_table(file_id);
    }

    /// Forgets the files `known` no longer holds (closed by the sampler).
    pub(crate) fn retain(&mut self, known: impl Fn(u64) -> bool) {
        self.files.retain(|&id, _| known(id));
    }

    /// Decides whether the table of `file_id` (`rows` rows, its file owned by `owner`) is sent,
    /// and which tables must be dropped first (see the module header).
    pub(crate) fn admit(&mut self, file_id: u64, owner: u32, rows: u64, now: Instant) -> Admission {
        // Stamped as sampled in the current interval (before the first batch: when the
        // connection began), not later: a table just sent is no more recent than one sampled in
        // that interval (otherwise every new table outranked the hot ones, and the small hot
        // tables, sent first, were displaced first: among equals the largest go first).
        let stamp = self.interval.map_or(self.created, |(_, at)| at).min(now);
        let held = State::Held {
            owner,
            rows,
            used: stamp,
            unsure: false,
        };
        let Some(capacity) = self.capacity else {
            self.files.insert(file_id, held);
            return Admission::Send { drop: Vec::new() };
        };
        let limit = capacity.0 / FILE_SHARE;
        if rows > limit {
            self.files.insert(file_id, State::Never);
            BudgetCounters::add(&self.counters.too_large);
            return Admission::TooLarge { rows, limit };
        }
        // The file's own earlier table is replaced (the sampler drops it first).
        self.files.remove(&file_id);
        let occupancy = Occupancy::of(&self.files, owner);
        let share = occupancy.share(capacity);
        let Some(drop) = occupancy.make_room(owner, rows, capacity, share) else {
            self.absent_until_sampled(file_id, now);
            BudgetCounters::add(&self.counters.over_share);
            return Admission::OverShare {
                owner,
                rows,
                share: share.0,
            };
        };
        for &id in &drop {
            self.absent_until_sampled(id, now);
            BudgetCounters::add(&self.counters.withdrawn);
        }
        self.files.insert(file_id, held);
        Admission::Send { drop }
    }

    /// The file's table is not in the sampler: offered again once its binary is sampled, not
    /// before [`REOFFER_EVERY`] from `now`.
    fn absent_until_sampled(&mut self, file_id: u64, now: Instant) {
        self.files.insert(
            file_id,
            State::Absent {
                after: now + REOFFER_EVERY,
                needs_sample: true,
            },
        );
    }

    /// After a batch: `sampled` are the files its stacks touched, `sampler_evicted` the
    /// sampler's eviction counter. Returns the files to offer again (each taken as queued):
    /// those the compile queue skipped, and sampled ones whose table is absent or unsure, at
    /// most once per [`REOFFER_EVERY`] each.
    pub(crate) fn after_batch(
        &mut self,
        sampled: &[u64],
        sampler_evicted: u64,
        now: Instant,
    ) -> Vec<u64> {
        if sampler_evicted > self.sampler_evicted {
            self.sampler_evicted = sampler_evicted;
            for state in self.files.values_mut() {
                if let State::Held { unsure, .. } = state {
                    *unsure = true;
                }
            }
        }
        let mut again = Vec::new();
        for &id in sampled {
            match self.files.get_mut(&id) {
                Some(State::Held { used, unsure, .. }) => {
                    *used = now;
                    if std::mem::take(unsure) {
                        again.push(id);
                    }
                }
                Some(State::Absent { after, .. }) if *after <= now => again.push(id),
                _ => {}
            }
        }
        for (&id, state) in &self.files {
            if let State::Absent {
                after,
                needs_sample: false,
            } = *state
            {
                if after <= now && !again.contains(&id) {
                    again.push(id);
                }
            }
        }
        for &id in &again {
            // A held (unsure) table stays charged until the new copy is admitted.
            if !matches!(self.files.get(&id), Some(State::Held { .. })) {
                self.files.insert(id, State::Queued);
            }
            BudgetCounters::add(&self.counters.reoffered);
        }
        again
    }

    /// Rows charged to `owner` now.
    #[cfg(test)]
    fn rows_of(&self, owner: u32) -> u64 {
        self.files
            .values()
            .map(|s| match *s {
                State::Held { owner: o, rows, .. } if o == owner => rows,
                _ => 0,
            })
            .sum()
    }
}

/// A table the sampler holds, as [`Budget::admit`] weighs it.
#[derive(Clone, Copy)]
struct HeldTable {
    owner: u32,
    rows: u64,
    used: Instant,
    file_id: u64,
}

/// The tables the sampler holds when a new one is admitted, and what each owner holds of them:
/// the working state of [`Budget::admit`] while it picks the tables to displace.
struct Occupancy {
    tables: Vec<HeldTable>,
    /// (rows, tables) per owner, the new table's owner included even when she holds none.
    usage: HashMap<u32, (u64, u64)>,
    /// Rows and tables held in all.
    used_rows: u64,
    used_tables: u64,
}

impl Occupancy {
    /// The held tables of `files`, with `owner` (the new table's) counted among the owners.
    fn of(files: &HashMap<u64, State>, owner: u32) -> Self {
        let tables: Vec<HeldTable> = files
            .iter()
            .filter_map(|(&file_id, state)| match *state {
                State::Held {
                    owner, rows, used, ..
                } => Some(HeldTable {
                    owner,
                    rows,
                    used,
                    file_id,
                }),
                _ => None,
            })
            .collect();
        let mut usage: HashMap<u32, (u64, u64)> = HashMap::new();
        usage.entry(owner).or_default();
        for table in &tables {
            let entry = usage.entry(table.owner).or_default();
            entry.0 += table.rows;
            entry.1 += 1;
        }
        Self {
            used_rows: tables.iter().map(|t| t.rows).sum(),
            used_tables: tables.len() as u64,
            tables,
            usage,
        }
    }

    /// Each owner's share of the `capacity` (rows, tables): an equal part per owner.
    fn share(&self, capacity: (u64, u64)) -> (u64, u64) {
        let owners = self.usage.len() as u64;
        (capacity.0 / owners, capacity.1 / owners)
    }

    /// The tables to drop, in order, so that a table of `rows` rows of `owner` fits in
    /// `capacity`; `None` when the fairness rule lets no more be displaced.
    fn make_room(
        mut self,
        owner: u32,
        rows: u64,
        capacity: (u64, u64),
        share: (u64, u64),
    ) -> Option<Vec<u64>> {
        let mut drop = Vec::new();
        while self.used_rows + rows > capacity.0 || self.used_tables + 1 > capacity.1 {
            let from = self.displaced_owner(owner, rows, capacity, share);
            let index = from.and_then(|o| self.victim_of(o))?;
            drop.push(self.remove(index));
        }
        Some(drop)
    }

    /// Whose table makes room: the new table's owner when it would put her over her share,
    /// else the other owner furthest over hers in what is short (rows first, then tables).
    fn displaced_owner(
        &self,
        owner: u32,
        rows: u64,
        capacity: (u64, u64),
        share: (u64, u64),
    ) -> Option<u32> {
        let (share_rows, share_tables) = share;
        let own = self.usage.get(&owner).copied().unwrap_or_default();
        if own.0 + rows > share_rows || own.1 + 1 > share_tables {
            Some(owner)
        } else if self.used_rows + rows > capacity.0 {
            // The other owner furthest over its share of rows.
            self.usage
                .iter()
                .filter(|(&o, u)| o != owner && u.0 > share_rows)
                .max_by_key(|(&o, u)| (u.0 - share_rows, std::cmp::Reverse(o)))
                .map(|(&o, _)| o)
        } else {
            self.usage
                .iter()
                .filter(|(&o, u)| o != owner && u.1 > share_tables)
                .max_by_key(|(&o, u)| (u.1 - share_tables, std::cmp::Reverse(o)))
                .map(|(&o, _)| o)
        }
    }

    /// The least recently sampled table of `owner`; of those sampled in the same batch the
    /// largest (it frees the most room), then the lower file id.
    fn victim_of(&self, owner: u32) -> Option<usize> {
        self.tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.owner == owner)
            .min_by_key(|(_, t)| (t.used, std::cmp::Reverse(t.rows), t.file_id))
            .map(|(i, _)| i)
    }

    /// Takes the table at `index` out of the account; returns its file id.
    fn remove(&mut self, index: usize) -> u64 {
        let table = self.tables.swap_remove(index);
        if let Some(u) = self.usage.get_mut(&table.owner) {
            u.0 -= table.rows;
            u.1 -= 1;
        }
        self.used_rows -= table.rows;
        self.used_tables -= 1;
        table.file_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: u32 = 0;
    const ATTACKER: u32 = 45_000;

    fn budget(rows: u32, tables: u32) -> Budget {
        Budget::new(rows, tables, Arc::default())
    }

    #[test]
    fn one_users_tables_cannot_displace_anothers_within_its_share() {
        // Given 1000 rows, root holding 3 tables of 100 rows.
        let t0 = Instant::now();
        let mut b = budget(1000, 100);
        for id in 1..=3 {
            assert_eq!(b.admit(id, ROOT, 100, t0), Admission::Send { drop: vec![] });
        }
        // When an attacker sends tables of 250 rows, one after another.
        let mut sent = 0;
        for id in 10..20 {
            let now = t0 + Duration::from_millis(id);
            match b.admit(id, ATTACKER, 250, now) {
                Admission::Send { drop } => {
                    sent += 1;
                    assert!(
                        drop.iter().all(|d| *d >= 10),
                        "root's table displaced: {drop:?}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        // Then root keeps all three, the attacker at most its half, its own oldest going first.
        assert_eq!(b.rows_of(ROOT), 300);
        assert!(b.rows_of(ATTACKER) <= 500, "{}", b.rows_of(ATTACKER));
        assert_eq!(sent, 10);
        assert_eq!(b.counters.withdrawn.load(Ordering::Relaxed), 8);
        // And a table over half of the rows is refused for good.
        assert_eq!(
            b.admit(30, ATTACKER, 501, t0),
            Admission::TooLarge {
                rows: 501,
                limit: 500
            }
        );
        assert_eq!(b.counters.too_large.load(Ordering::Relaxed), 1);
        assert!(b
            .after_batch(&[30], 0, t0 + Duration::from_secs(60))
            .is_empty());
    }

    #[test]
    fn a_user_under_its_share_displaces_the_one_over_it() {
        // Given an attacker alone holding all 1000 rows (it may while nobody else needs them).
        let t0 = Instant::now();
        let mut b = budget(1000, 100);
        for id in 10..14 {
            b.admit(id, ATTACKER, 250, t0 + Duration::from_millis(id));
        }
        assert_eq!(b.rows_of(ATTACKER), 1000);
        // When root's table arrives, Then the attacker's least recently sampled table goes.
        b.after_batch(&[10, 12, 13], 0, t0 + Duration::from_secs(1));
        let admitted = b.admit(1, ROOT, 200, t0 + Duration::from_secs(1));
        assert_eq!(admitted, Admission::Send { drop: vec![11] });
        assert_eq!((b.rows_of(ROOT), b.rows_of(ATTACKER)), (200, 750));
    }

    #[test]
    fn a_table_over_its_owners_share_with_nothing_to_give_back_is_refused_and_offered_later() {
        // Given 5 owners each holding 200 of 1000 rows.
        let t0 = Instant::now();
        let mut b = budget(1000, 100);
        for owner in 1..=5u32 {
            b.admit(u64::from(owner), owner, 200, t0);
        }
        // When a sixth owner's table of 200 rows arrives (its share is 166).
        let refused = b.admit(9, 6, 200, t0);
        // Then it is refused, counted, nobody's table dropped.
        assert_eq!(
            refused,
            Admission::OverShare {
                owner: 6,
                rows: 200,
                share: 166
            }
        );
        assert_eq!(b.counters.over_share.load(Ordering::Relaxed), 1);
        // And offered again when sampled, not before REOFFER_EVERY, then once per period.
        assert!(b
            .after_batch(&[9], 0, t0 + Duration::from_millis(100))
            .is_empty());
        let later = t0 + REOFFER_EVERY;
        assert_eq!(b.after_batch(&[9], 0, later), vec![9]);
        assert!(b.after_batch(&[9], 0, later).is_empty(), "queued already");
    }

    #[test]
    fn a_displaced_table_comes_back_when_sampled_and_a_skipped_file_at_the_next_batch() {
        let t0 = Instant::now();
        let mut b = budget(1000, 100);
        b.admit(1, ATTACKER, 250, t0);
        b.admit(2, ATTACKER, 250, t0 + Duration::from_millis(1));
        b.admit(3, ATTACKER, 250, t0 + Duration::from_millis(2));
        b.admit(4, ATTACKER, 250, t0 + Duration::from_millis(3));
        // Root needs room: 1 (least recent) is dropped.
        assert_eq!(
            b.admit(5, ROOT, 250, t0 + Duration::from_millis(4)),
            Admission::Send { drop: vec![1] }
        );
        b.skipped(6, t0);
        // Not sampled: only the skipped file comes back; sampled after the period: 1 too.
        assert_eq!(
            b.after_batch(&[], 0, t0 + Duration::from_millis(5)),
            vec![6]
        );
        let later = t0 + REOFFER_EVERY + Duration::from_millis(5);
        assert_eq!(b.after_batch(&[1], 0, later), vec![1]);
        assert_eq!(b.counters.reoffered.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_sampler_eviction_makes_every_sampled_table_go_again_once() {
        let t0 = Instant::now();
        let mut b = budget(1000, 100);
        b.admit(1, ROOT, 100, t0);
        b.admit(2, ROOT, 100, t0);
        assert!(b.after_batch(&[1, 2], 0, t0).is_empty());
        assert_eq!(b.after_batch(&[1], 3, t0), vec![1]);
        assert!(b.after_batch(&[1], 3, t0).is_empty());
        assert_eq!(b.after_batch(&[2], 3, t0), vec![2]);
        assert_eq!(b.rows_of(ROOT), 200, "still charged while resent");
    }

    #[test]
    fn of_tables_sampled_in_the_same_batch_the_largest_goes_first() {
        // Given root's small table (low id) and a big one, both sampled in the last batch.
        let t0 = Instant::now();
        let mut b = budget(1000, 100);
        b.admit(1, ROOT, 10, t0);
        b.admit(2, ROOT, 250, t0);
        b.admit(3, ROOT, 250, t0);
        b.admit(4, ROOT, 250, t0);
        let now = t0 + Duration::from_secs(1);
        b.after_batch(&[1, 2, 3, 4], 0, now);
        // When root needs room, Then a big one goes, not the small one with the lowest id.
        assert_eq!(
            b.admit(5, ROOT, 250, now),
            Admission::Send { drop: vec![2] }
        );
    }

    #[test]
    fn the_table_map_is_shared_fairly_too_and_an_unsized_sampler_gets_everything() {
        let t0 = Instant::now();
        let mut b = budget(1000, 4);
        b.admit(1, ROOT, 1, t0);
        b.admit(2, ROOT, 1, t0);
        b.admit(3, ATTACKER, 1, t0);
        b.admit(4, ATTACKER, 1, t0);
        assert_eq!(
            b.admit(5, ATTACKER, 1, t0),
            Admission::Send { drop: vec![3] }
        );
        let mut open = budget(0, 0);
        assert_eq!(
            open.admit(1, ATTACKER, u64::from(u32::MAX), t0),
            Admission::Send { drop: vec![] }
        );
        // Forgotten once closed.
        b.retain(|id| id != 1);
        assert_eq!(b.rows_of(ROOT), 1);
    }

    #[test]
    fn the_parts_of_one_interval_stamp_their_files_with_one_time() {
        // Given a sampler holding room for 100 rows: a hot 10-row table (file 1) and a 50-row
        // table (file 2), both sampled in interval 7, file 1 in its first part and file 2 in
        // its second, which came later.
        let t0 = Instant::now();
        let mut b = Budget::new(100, 10, Arc::default());
        assert_eq!(b.admit(1, 0, 10, t0), Admission::Send { drop: vec![] });
        assert_eq!(b.admit(2, 0, 50, t0), Admission::Send { drop: vec![] });
        let first = b.interval_time(7, t0 + Duration::from_secs(5));
        b.after_batch(&[1], 0, first);
        let second = b.interval_time(7, t0 + Duration::from_secs(6));
        assert_eq!(first, second, "one interval, one time");
        b.after_batch(&[2], 0, second);
        // When a 45-row table comes
        let admitted = b.admit(3, 0, 45, t0 + Duration::from_secs(7));
        // Then the largest of the interval's tables makes room, not the small hot one
        assert_eq!(admitted, Admission::Send { drop: vec![2] });
        // And the next interval takes a new time
        assert!(b.interval_time(8, t0 + Duration::from_secs(10)) > first);
    }

    #[test]
    fn a_table_just_sent_is_no_more_recent_than_the_tables_of_its_interval() {
        // Given room for 100 rows and, before any batch, a small table sent first (file 1, as
        // the queue sends the small ones first) and then a 50-row one (file 2).
        let mut b = Budget::new(100, 10, Arc::default());
        let t0 = Instant::now();
        assert_eq!(b.admit(1, 0, 10, t0), Admission::Send { drop: vec![] });
        let later = t0 + Duration::from_secs(1);
        assert_eq!(b.admit(2, 0, 50, later), Admission::Send { drop: vec![] });
        // When a 45-row table comes, Then the largest makes room, not the one sent first
        let admitted = b.admit(3, 0, 45, later + Duration::from_secs(1));
        assert_eq!(admitted, Admission::Send { drop: vec![2] });
    }
}
