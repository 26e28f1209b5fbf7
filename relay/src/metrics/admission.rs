//! Who may hold a connection of the metrics server, and who is closed to make room: the table of
//! open connections, the bounds on it, the counters of what the bounds closed and the
//! (rate-limited) log of it. No I/O: the server asks, this decides.
//!
//! Anyone who can reach the address can connect, and a slow client costs the server nothing but
//! a table entry, so the bounds close the slow rather than refuse the new: a probe's connection
//! lives for a millisecond, an attacker's as long as it can make it last, so "close the oldest"
//! always lands on the attacker.
//! - One peer (IP address) holds at most [`Limits::max_per_peer`] connections: at the bound, its
//!   own oldest connection is closed for the new one. A peer can only push out its own
//!   connections, never another peer's (the kubelet's probes come from the node's address).
//! - All peers together hold at most [`Limits::max_connections`]: at the bound, the oldest
//!   connection still waiting for its request head is closed for the new one (else the oldest
//!   of all, which is being answered that slowly). A new connection is never refused and never
//!   queued.
//! - The server closes a connection whose request head is not complete within
//!   [`Limits::head_timeout`] of its accept, and any connection after
//!   [`Limits::connection_timeout`].
//!
//! Invariants: the table never holds more than `max_connections` entries nor more than
//! `max_per_peer` of one peer; every connection closed by a bound is counted once, by reason
//! ([`Closed`]); the log says so at most once per [`LOG_EVERY`] (with the latest peer and the
//! counts since the previous line), so a flood of connections cannot flood the log.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

/// The metrics server's bounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Connections open at once, all peers together.
    pub max_connections: usize,
    /// Connections open at once from one IP address.
    pub max_per_peer: usize,
    /// Request line and headers; hyper's own floor is 8 KiB.
    pub max_head_bytes: usize,
    /// From accept to a complete request head.
    pub head_timeout: Duration,
    /// From accept to the end of the exchange (the answer written).
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_per_peer: 8,
            max_head_bytes: 8 << 10,
            head_timeout: Duration::from_secs(2),
            connection_timeout: Duration::from_secs(10),
        }
    }
}

/// At most one log line about closed connections per this long.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// Why the server closed a connection before its exchange ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// Its request head was not complete within [`Limits::head_timeout`].
    HeadTimeout,
    /// Its peer opened more than [`Limits::max_per_peer`] connections; it was that peer's
    /// oldest.
    PeerLimit,
    /// [`Limits::max_connections`] were open; it was the oldest (slowest) one.
    ServerFull,
    /// The exchange took longer than [`Limits::connection_timeout`].
    ExchangeTimeout,
}

impl Closed {
    pub(crate) const ALL: [Self; 4] = [
        Self::HeadTimeout,
        Self::PeerLimit,
        Self::ServerFull,
        Self::ExchangeTimeout,
    ];

    /// The reason's label in `ember_relay_metrics_connections_closed_total`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::HeadTimeout => "head_timeout",
            Self::PeerLimit => "peer_limit",
            Self::ServerFull => "server_full",
            Self::ExchangeTimeout => "exchange_timeout",
        }
    }
}

/// The server's connection counters, read at scrape time.
#[derive(Debug, Default)]
pub(crate) struct ConnectionStats {
    accepted: AtomicU64,
    open: AtomicU64,
    closed: [AtomicU64; Closed::ALL.len()],
}

impl ConnectionStats {
    /// Connections accepted since start.
    pub(crate) fn accepted(&self) -> u64 {
        self.accepted.load(Relaxed)
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> u64 {
        self.open.load(Relaxed)
    }

    /// Connections closed for `reason` since start.
    pub(crate) fn closed(&self, reason: Closed) -> u64 {
        self.closed[reason as usize].load(Relaxed)
    }
}

/// One open connection.
#[derive(Debug)]
struct Entry {
    peer: IpAddr,
    /// Set by the server once the request head is parsed.
    head_read: Arc<AtomicBool>,
    /// Dropped or fired to close the connection.
    close: oneshot::Sender<Closed>,
}

/// The open connections, oldest first (ids only grow), and the close log.
#[derive(Debug)]
struct Table {
    limits: Limits,
    next_id: u64,
    open: BTreeMap<u64, Entry>,
    log: CloseLog,
}

/// The table, shared by the accept loop and the connections' tasks (never locked across an
/// `await`).
#[derive(Clone, Debug)]
pub(crate) struct Admission {
    table: Arc<Mutex<Table>>,
    stats: Arc<ConnectionStats>,
}

/// A connection's place in the table; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct Ticket {
    id: u64,
    peer: IpAddr,
    admission: Admission,
    /// Set it once the request head is parsed.
    pub head_read: Arc<AtomicBool>,
    /// Resolves when the table closed this connection to make room (already counted).
    pub closed: oneshot::Receiver<Closed>,
}

impl Admission {
    pub(crate) fn new(limits: Limits, stats: Arc<ConnectionStats>) -> Self {
        Self {
            table: Arc::new(Mutex::new(Table {
                limits,
                next_id: 0,
                open: BTreeMap::new(),
                log: CloseLog::default(),
            })),
            stats,
        }
    }

    /// Takes a place for a connection just accepted from `peer`, closing others to make room
    /// (counted and logged here).
    pub(crate) fn admit(&self, peer: IpAddr) -> Ticket {
        self.admit_at(peer.to_canonical(), Instant::now())
    }

    fn admit_at(&self, peer: IpAddr, now: Instant) -> Ticket {
        let mut table = self.lock();
        let limits = table.limits;
        if table.of_peer(peer) >= limits.max_per_peer.max(1) {
            if let Some(id) = table.victim(Some(peer)) {
                self.close_entry(&mut table, id, Closed::PeerLimit, now);
            }
        }
        if table.open.len() >= limits.max_connections.max(1) {
            if let Some(id) = table.victim(None) {
                self.close_entry(&mut table, id, Closed::ServerFull, now);
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        let head_read = Arc::new(AtomicBool::new(false));
        let (close, closed) = oneshot::channel();
        table.open.insert(
            id,
            Entry {
                peer,
                head_read: Arc::clone(&head_read),
                close,
            },
        );
        self.stats.accepted.fetch_add(1, Relaxed);
        self.stats.open.store(table.open.len() as u64, Relaxed);
        Ticket {
            id,
            peer,
            admission: self.clone(),
            head_read,
            closed,
        }
    }

    /// Removes `id` from the table, tells its task why, counts and logs it.
    fn close_entry(&self, table: &mut Table, id: u64, reason: Closed, now: Instant) {
        if let Some(entry) = table.open.remove(&id) {
            // The task may have ended already: nobody to tell, nothing lost.
            let _ = entry.close.send(reason);
            self.count(table, entry.peer, reason, now);
        }
    }

    fn count(&self, table: &mut Table, peer: IpAddr, reason: Closed, now: Instant) {
        self.stats.closed[reason as usize].fetch_add(1, Relaxed);
        self.stats.open.store(table.open.len() as u64, Relaxed);
        table.log.note(peer, reason, now, &table.limits);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Table {
    fn of_peer(&self, peer: IpAddr) -> usize {
        self.open.values().filter(|e| e.peer == peer).count()
    }

    /// The connection to close for a new one: among `peer`'s (or everyone's), the oldest still
    /// waiting for its request head, else the oldest.
    fn victim(&self, peer: Option<IpAddr>) -> Option<u64> {
        let mut candidates = self
            .open
            .iter()
            .filter(|(_, e)| peer.is_none_or(|p| e.peer == p));
        let oldest = candidates.clone().next().map(|(id, _)| *id);
        candidates
            .find(|(_, e)| !e.head_read.load(Relaxed))
            .map(|(id, _)| *id)
            .or(oldest)
    }
}

impl Ticket {
    /// The server closes this connection for `reason` (a timeout): counted and logged.
    pub(crate) fn close(self, reason: Closed) {
        let admission = self.admission.clone();
        let mut table = admission.lock();
        if table.open.remove(&self.id).is_some() {
            admission.count(&mut table, self.peer, reason, Instant::now());
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut table = self.admission.lock();
        if table.open.remove(&self.id).is_some() {
            self.admission
                .stats
                .open
                .store(table.open.len() as u64, Relaxed);
        }
    }
}

/// The rate-limited log of closed connections: the first at once, then at most one line per
/// [`LOG_EVERY`] with what was closed since the previous line.
#[derive(Debug, Default)]
struct CloseLog {
    last_line: Option<Instant>,
    since: [u64; Closed::ALL.len()],
}

impl CloseLog {
    /// Counts a close; returns whether a line was written.
    fn note(&mut self, peer: IpAddr, reason: Closed, now: Instant, limits: &Limits) -> bool {
        self.since[reason as usize] += 1;
        if self
            .last_line
            .is_some_and(|at| now.saturating_duration_since(at) < LOG_EVERY)
        {
            return false;
        }
        let [head_timeout, peer_limit, server_full, exchange_timeout] = self.since;
        tracing::warn!(
            %peer,
            reason = reason.as_str(),
            head_timeout,
            peer_limit,
            server_full,
            exchange_timeout,
            max_connections = limits.max_connections,
            max_per_peer = limits.max_per_peer,
            head_timeout_seconds = limits.head_timeout.as_secs_f64(),
            "metrics server: closed connections that were too slow or too many (counts since \
             the previous such line, at most one per 10 s; totals in \
             ember_relay_metrics_connections_closed_total). A scraper or probe should send its \
             whole request at once and keep one connection; otherwise something is holding \
             connections open on purpose: restrict who may reach --metrics-address (a \
             NetworkPolicy, a firewall, or 127.0.0.1)"
        );
        self.last_line = Some(now);
        self.since = [0; Closed::ALL.len()];
        true
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn limits(max_connections: usize, max_per_peer: usize) -> Limits {
        Limits {
            max_connections,
            max_per_peer,
            ..Limits::default()
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn admission(limits: Limits) -> (Admission, Arc<ConnectionStats>) {
        let stats = Arc::new(ConnectionStats::default());
        (Admission::new(limits, Arc::clone(&stats)), stats)
    }

    /// Whether the table closed this ticket's connection, and why.
    fn closed(ticket: &mut Ticket) -> Option<Closed> {
        ticket.closed.try_recv().ok()
    }

    #[test]
    fn a_peer_at_its_bound_loses_its_own_oldest_connection() {
        // Given a peer holding its 3 connections and another peer holding one
        let (admission, stats) = admission(limits(100, 3));
        let now = Instant::now();
        let mut mine: Vec<Ticket> = (0..3).map(|_| admission.admit_at(ip(1), now)).collect();
        let mut theirs = admission.admit_at(ip(2), now);
        // When the first peer opens a fourth
        let mut newest = admission.admit_at(ip(1), now);
        // Then its oldest is closed for it, nobody else's
        assert_eq!(closed(&mut mine[0]), Some(Closed::PeerLimit));
        assert_eq!(closed(&mut mine[1]), None);
        assert_eq!(closed(&mut theirs), None);
        assert_eq!(closed(&mut newest), None);
        assert_eq!(stats.closed(Closed::PeerLimit), 1);
        assert_eq!((stats.accepted(), stats.open()), (5, 4));
    }

    #[test]
    fn a_full_server_closes_the_oldest_connection_still_waiting_for_its_head() {
        // Given a full server: the oldest connection is being answered, the next two wait for
        // their heads
        let (admission, stats) = admission(limits(3, 3));
        let now = Instant::now();
        let mut open: Vec<Ticket> = (1..=3).map(|n| admission.admit_at(ip(n), now)).collect();
        open[0].head_read.store(true, Relaxed);
        // When another peer connects
        let mut newest = admission.admit_at(ip(9), now);
        // Then the oldest of those waiting is closed, and the new one is in
        assert_eq!(closed(&mut open[0]), None);
        assert_eq!(closed(&mut open[1]), Some(Closed::ServerFull));
        assert_eq!(closed(&mut newest), None);
        // And when every open connection has its head, the oldest of all goes
        open[2].head_read.store(true, Relaxed);
        newest.head_read.store(true, Relaxed);
        let _last = admission.admit_at(ip(10), now);
        assert_eq!(closed(&mut open[0]), Some(Closed::ServerFull));
        assert_eq!(stats.closed(Closed::ServerFull), 2);
        assert_eq!(stats.open(), 3);
    }

    #[test]
    fn a_connection_leaving_frees_its_place_and_a_timeout_is_counted_once() {
        let (admission, stats) = admission(limits(2, 2));
        let now = Instant::now();
        let first = admission.admit_at(ip(1), now);
        let second = admission.admit_at(ip(1), now);
        drop(first);
        assert_eq!(stats.open(), 1);
        let mut third = admission.admit_at(ip(1), now);
        assert_eq!(closed(&mut third), None);
        assert_eq!(stats.closed(Closed::PeerLimit), 0, "a place was free");
        second.close(Closed::HeadTimeout);
        assert_eq!(stats.closed(Closed::HeadTimeout), 1);
        assert_eq!(stats.open(), 1);
    }

    #[test]
    fn ipv4_mapped_addresses_are_the_same_peer() {
        let (admission, stats) = admission(limits(10, 1));
        let v4 = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().expect("an address");
        let mut first = admission.admit(v4);
        let _second = admission.admit(mapped);
        assert_eq!(closed(&mut first), Some(Closed::PeerLimit));
        assert_eq!(stats.open(), 1);
    }

    #[test]
    fn the_log_says_it_once_then_once_per_period() {
        let mut log = CloseLog::default();
        let limits = Limits::default();
        let start = Instant::now();
        assert!(log.note(ip(1), Closed::HeadTimeout, start, &limits));
        let quiet = (1..1000).filter(|n| {
            let at = start + Duration::from_millis(*n);
            log.note(ip(1), Closed::PeerLimit, at, &limits)
        });
        assert_eq!(quiet.count(), 0, "nothing more within the period");
        assert_eq!(log.since[Closed::PeerLimit as usize], 999);
        assert!(log.note(ip(2), Closed::ServerFull, start + LOG_EVERY, &limits));
        assert_eq!(log.since, [0; Closed::ALL.len()]);
    }
}
