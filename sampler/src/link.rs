//! The sampler's side of the socket: connects (or uses the inherited connection), sends queued
//! messages in order without blocking the drain loop, and keeps a bounded backlog of batches while
//! no relay is there. Per-connection state (hello, files, processes) is rebuilt on every connect,
//! so only batches need keeping.
//!
//! A datagram the kernel refuses as such (EMSGSIZE: larger than the socket can ever take;
//! ENOBUFS) is dropped and counted, never retried: retrying it by reconnecting would resend the
//! same snapshot forever and stop all profiling (attack 1 in SECURITY.md). An inherited connection is
//! never reconnected: when it ends, the sampler ends.
//!
//! Facts (a process's, an exit) are held up to [`STATE_HOLD`] and then sent together: each
//! datagram sent to a relay waiting in `recv` wakes it, and one wake-up per short-lived process
//! cost both sides more than reading its facts. A batch part, a message carrying descriptors (new
//! files: the relay opens and reads them, and compiles their unwind tables, as early as it can)
//! and a connection's snapshot go at once, with everything queued before them: the order of the
//! queue is never changed.

use std::{
    collections::VecDeque,
    os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd},
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant},
};

use crate::waitset::WaitSet;
use ember_protocol::transport;
use nix::{
    errno::Errno,
    poll::{poll, PollFd, PollFlags, PollTimeout},
};

/// One encoded datagram waiting to be sent.
#[derive(Clone)]
pub struct Outgoing {
    pub bytes: Vec<u8>,
    pub fds: Vec<Rc<OwnedFd>>,
    /// Set when it is a batch part; `None` for per-connection state.
    pub batch: Option<BatchMark>,
}

/// Which interval a queued batch part belongs to and how many samples it holds.
#[derive(Clone, Copy, Debug)]
pub struct BatchMark {
    pub sequence: u64,
    pub samples: u64,
}

/// Where the relay is.
pub enum Target {
    Path(PathBuf),
    /// Inherited from `ember-relay record`: never reconnected; its end ends the sampler.
    Inherited,
}

/// What the socket said since the last look.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Nothing,
    Connected,
    /// The relay closed the connection (or asked us to stop by shutting down its side).
    Closed,
}

pub struct Link {
    target: Target,
    conn: Option<OwnedFd>,
    queue: VecDeque<Outgoing>,
    backlog_bytes: usize,
    backlog_max_bytes: usize,
    next_attempt: Instant,
    backoff: Duration,
    pub dropped_batches: u64,
    pub dropped_samples: u64,
    /// Per-connection state datagrams the socket refused (`factsDropped`).
    pub dropped_facts: u64,
    last_drop_warning: Option<Instant>,
    last_connect_error: Option<Errno>,
    /// Required SO_PEERCRED uid of the relay, when set.
    relay_uid: Option<u32>,
    /// Datagrams from the relay not yet handled (control messages), at most [`MAX_INBOX`].
    inbox: Vec<Vec<u8>>,
    /// Datagrams from the relay over [`INBOX_DATAGRAM_BYTES`]: refused unread.
    pub inbox_refused: u64,
    /// When the facts held in the queue must be sent at the latest ([`STATE_HOLD`]); `None`
    /// while nothing is held.
    send_by: Option<Instant>,
    /// Datagrams handed to the socket, since start (the bench counts them per process).
    pub datagrams_sent: u64,
    /// What a wait waits for: the connection and the ring buffer of first-sample events.
    wait_set: WaitSet,
}

/// Longest time facts wait in the queue for others to go with them: the relay needs a
/// process's facts only before the batch that holds its samples (which goes at once and takes
/// them along), so holding them costs nothing in what it can name; at 100 process starts a
/// second, 5 sends a second instead of 100 wake the relay.
pub const STATE_HOLD: Duration = Duration::from_millis(200);

/// Most relay datagrams held: the drain loop takes the inbox after every wait; while it is full
/// nothing more is read, so a relay that floods fills its own socket buffer and blocks.
const MAX_INBOX: usize = 16;
/// Largest relay datagram read: a table chunk (48 KiB of data) plus its capnp framing.
const INBOX_DATAGRAM_BYTES: usize = 56 << 10;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Least time between two warnings about refused datagrams.
const DROP_WARNING_GAP: Duration = Duration::from_secs(10);
/// Socket send buffer; batches are split well below it (see `drain::build_batches`).
pub const SEND_BUFFER_BYTES: usize = 1 << 20;

impl Link {
    pub fn new(
        target: Target,
        inherited: Option<OwnedFd>,
        backlog_max_bytes: usize,
        relay_uid: Option<u32>,
        wait_set: WaitSet,
    ) -> Self {
        Self {
            target,
            conn: inherited,
            queue: VecDeque::new(),
            backlog_bytes: 0,
            backlog_max_bytes,
            next_attempt: Instant::now(),
            backoff: BACKOFF_MIN,
            dropped_batches: 0,
            dropped_samples: 0,
            dropped_facts: 0,
            last_drop_warning: None,
            last_connect_error: None,
            relay_uid,
            inbox: Vec::new(),
            inbox_refused: 0,
            send_by: None,
            datagrams_sent: 0,
            wait_set,
        }
    }

    /// Adopts an inherited connected socket given by number.
    ///
    /// # Safety
    /// `fd` must be an open descriptor this process owns and nothing else uses.
    pub unsafe fn inherit(fd: i32) -> OwnedFd {
        // SAFETY: upheld by the caller.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    pub fn backlog_bytes(&self) -> usize {
        self.backlog_bytes
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The sequence of the oldest batch part not yet handed to the relay.
    pub fn oldest_queued_sequence(&self) -> Option<u64> {
        self.queue
            .iter()
            .filter_map(|m| m.batch)
            .map(|b| b.sequence)
            .min()
    }

    /// Whether an inherited connection ended (it is never reconnected).
    pub fn ended(&self) -> bool {
        matches!(self.target, Target::Inherited) && self.conn.is_none()
    }

    /// Queues a message. Batches over the backlog bound push out the oldest batches, counted.
    pub fn enqueue(&mut self, message: Outgoing) {
        if message.batch.is_some() {
            self.backlog_bytes += message.bytes.len();
        } else if self.send_by.is_none() {
            self.send_by = Some(Instant::now() + STATE_HOLD);
        }
        self.queue.push_back(message);
        while self.backlog_bytes > self.backlog_max_bytes {
            let Some(pos) = self.queue.iter().position(|m| m.batch.is_some()) else {
                break;
            };
            if let Some(old) = self.queue.remove(pos) {
                self.backlog_bytes -= old.bytes.len();
                self.dropped_batches += 1;
                self.dropped_samples += old.batch.map_or(0, |b| b.samples);
                tracing::warn!(
                    dropped_batches = self.dropped_batches,
                    dropped_samples = self.dropped_samples,
                    backlog_max_bytes = self.backlog_max_bytes,
                    "backlog full: dropped the oldest batch; is ember-relay running? \
                     (raise --backlog-max-bytes to keep more)"
                );
            }
        }
    }

    /// Tries to connect when due (path targets only). On success the caller must queue the
    /// per-connection state with [`Link::prepend`].
    pub fn maybe_connect(&mut self) -> Event {
        let Target::Path(path) = &self.target else {
            return Event::Nothing;
        };
        if self.conn.is_some() || Instant::now() < self.next_attempt {
            return Event::Nothing;
        }
        match transport::connect(path).and_then(|fd| self.check_peer(fd)) {
            Ok(fd) => {
                if let Err(err) = transport::set_send_buffer(fd.as_fd(), SEND_BUFFER_BYTES) {
                    tracing::debug!(%err, "could not raise the socket send buffer");
                }
                tracing::info!(socket = %path.display(), "connected to ember-relay");
                self.conn = Some(fd);
                // The backoff is reset only once a batch went through (see `flush`): a listener
                // that accepts and at once closes (e.g. a relay refusing our uid) must not make
                // the sampler reconnect in a busy loop.
                self.last_connect_error = None;
                Event::Connected
            }
            Err(err) => {
                if self.last_connect_error != Some(err) {
                    let hint = match err {
                        Errno::EACCES if self.relay_uid.is_some() => "; the socket is not writable by the relay's group (mode 0660 expected)",
                        Errno::EACCES => "; the socket is not writable by the sampler: pass --relay-uid <relay user> so the sampler joins the relay's group",
                        Errno::EPERM => "; the listener is not the relay user given by --relay-uid",
                        _ => "; start ember-relay or check --socket",
                    };
                    tracing::warn!(
                        socket = %path.display(),
                        %err,
                        "cannot reach ember-relay; sampling goes on and batches are kept in the backlog{hint}"
                    );
                    self.last_connect_error = Some(err);
                }
                self.next_attempt = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                Event::Nothing
            }
        }
    }

    /// Refuses a listener whose uid is not the configured relay uid.
    fn check_peer(&self, fd: OwnedFd) -> Result<OwnedFd, Errno> {
        let Some(expected) = self.relay_uid else {
            return Ok(fd);
        };
        let (uid, _, pid) = transport::peer_credentials(fd.as_fd())?;
        if uid != expected {
            tracing::error!(
                peer_uid = uid,
                peer_pid = pid,
                relay_uid = expected,
                "refusing the process listening on the socket: its uid is not --relay-uid"
            );
            return Err(Errno::EPERM);
        }
        Ok(fd)
    }

    /// Puts per-connection state before everything queued (after a connect), dropping the state
    /// queued for the previous connection.
    pub fn prepend(&mut self, state: Vec<Outgoing>) {
        self.queue.retain(|m| m.batch.is_some());
        for message in state.into_iter().rev() {
            self.queue.push_front(message);
        }
        // A new relay gets its snapshot at once.
        self.send_by = Some(Instant::now());
    }

    /// Whether what is queued should go now: a batch part or a message with descriptors is
    /// queued, or held facts reached their [`STATE_HOLD`].
    fn due(&self) -> bool {
        self.send_by.is_some_and(|by| Instant::now() >= by)
            || self
                .queue
                .iter()
                .any(|m| m.batch.is_some() || !m.fds.is_empty())
    }

    /// How long the held facts may still wait (zero when due; `None` when nothing is queued).
    fn hold_left(&self) -> Option<Duration> {
        if self.queue.is_empty() {
            return None;
        }
        if self.due() {
            return Some(Duration::ZERO);
        }
        self.send_by
            .map(|by| by.saturating_duration_since(Instant::now()))
    }

    /// Sends as much of the queue as the socket takes now, when it is due (see [`STATE_HOLD`]).
    /// Returns `Closed` if the connection broke.
    pub fn flush(&mut self) -> Event {
        if !self.due() {
            return Event::Nothing;
        }
        self.send_queued()
    }

    /// Sends as much of the queue as the socket takes now, held facts included.
    fn send_queued(&mut self) -> Event {
        while let Some(front) = self.queue.front() {
            let Some(conn) = self.conn.as_ref() else {
                return Event::Nothing;
            };
            let fds: Vec<BorrowedFd<'_>> = front.fds.iter().map(|fd| fd.as_fd()).collect();
            match transport::send(conn.as_fd(), &front.bytes, &fds, true) {
                Ok(()) => {
                    self.datagrams_sent += 1;
                    if self.pop_front().is_some_and(|m| m.batch.is_some()) {
                        self.backoff = BACKOFF_MIN;
                    }
                }
                Err(Errno::EAGAIN) => return Event::Nothing,
                Err(err @ (Errno::EMSGSIZE | Errno::ENOBUFS)) => self.drop_refused(err),
                Err(err) => {
                    tracing::warn!(%err, bytes = front.bytes.len(), "sending to ember-relay failed; reconnecting");
                    return self.disconnect();
                }
            }
        }
        self.send_by = None;
        Event::Nothing
    }

    /// Removes the front message (sent or dropped), keeping the backlog size right.
    fn pop_front(&mut self) -> Option<Outgoing> {
        let message = self.queue.pop_front()?;
        if message.batch.is_some() {
            self.backlog_bytes -= message.bytes.len();
        }
        Some(message)
    }

    /// Drops the front message, which the socket refused as such, and counts it; the
    /// connection stays up.
    fn drop_refused(&mut self, err: Errno) {
        let Some(message) = self.pop_front() else {
            return;
        };
        match message.batch {
            Some(batch) => {
                self.dropped_batches += 1;
                self.dropped_samples += batch.samples;
            }
            None => self.dropped_facts += 1,
        }
        if self
            .last_drop_warning
            .is_none_or(|at| at.elapsed() >= DROP_WARNING_GAP)
        {
            self.last_drop_warning = Some(Instant::now());
            tracing::warn!(
                %err,
                bytes = message.bytes.len(),
                fds = message.fds.len(),
                facts_dropped = self.dropped_facts,
                dropped_batches = self.dropped_batches,
                "the socket refused a message; dropped it (counted) and carrying on"
            );
        }
    }

    /// Waits at most `timeout` for the connection (see [`Link::wait_also`]), not for the ring
    /// buffer of first-sample events.
    pub fn wait(&mut self, timeout: Duration) -> Event {
        self.wait_for(timeout, false)
    }

    /// Waits at most `timeout` (shorter while facts are held) for the connection to be readable,
    /// writable when something is due, closed, or for the ring buffer of first-sample events
    /// ([`Link::watch_ring`]) to hold events; reads what the relay sent into the inbox.
    pub fn wait_also(&mut self, timeout: Duration) -> Event {
        self.wait_for(timeout, true)
    }

    /// Adds the ring buffer of first-sample events to what [`Link::wait_also`] waits for.
    pub fn watch_ring(&mut self, ring: BorrowedFd<'_>) -> std::io::Result<()> {
        self.wait_set.add_ring(ring)
    }

    fn wait_for(&mut self, timeout: Duration, ring: bool) -> Event {
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let Some(conn) = self.conn.as_ref() else {
            self.wait_set.watch_conn(None, 0);
            if let Err(err) = self.wait_set.wait(millis, ring) {
                if err.kind() != std::io::ErrorKind::Interrupted {
                    tracing::warn!(%err, "epoll_wait failed");
                    std::thread::sleep(timeout);
                }
            }
            return Event::Nothing;
        };
        // A full inbox is left on the socket until the drain loop takes it: backpressure.
        let mut events = 0;
        if self.inbox.len() < MAX_INBOX {
            events |= libc::EPOLLIN as u32;
        }
        // Held facts: wake when they are due, not when the socket has room.
        let millis = match self.hold_left() {
            Some(Duration::ZERO) => {
                events |= libc::EPOLLOUT as u32;
                millis
            }
            Some(left) => millis.min(u16::try_from(left.as_millis() + 1).unwrap_or(u16::MAX)),
            None => millis,
        };
        self.wait_set.watch_conn(Some(conn.as_fd()), events);
        match self.wait_set.wait(millis, ring) {
            Ok(ready) => {
                let revents = ready.conn;
                if revents & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                    return self.disconnect();
                }
                if revents & libc::EPOLLIN as u32 != 0 {
                    if let Some(event) = self.read_inbox() {
                        return event;
                    }
                }
                if revents & libc::EPOLLOUT as u32 != 0 {
                    return self.flush();
                }
                Event::Nothing
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => Event::Nothing,
            Err(err) => {
                tracing::warn!(%err, "epoll_wait on the relay socket failed");
                Event::Nothing
            }
        }
    }

    /// Reads the datagrams waiting on the socket into the inbox, until it holds [`MAX_INBOX`].
    /// A readable socket with no data is an orderly shutdown of the relay's side: `Closed` for
    /// an inherited connection (it stays open for sending the last batch), a disconnect
    /// otherwise. Descriptors a relay might attach are closed at once (never used).
    fn read_inbox(&mut self) -> Option<Event> {
        let mut buf = vec![0u8; INBOX_DATAGRAM_BYTES];
        while self.inbox.len() < MAX_INBOX {
            let conn = self.conn.as_ref()?;
            match transport::recv(conn.as_fd(), &mut buf) {
                Ok(transport::Received::Closed) if matches!(self.target, Target::Inherited) => {
                    return Some(Event::Closed);
                }
                Ok(transport::Received::Closed) | Err(_) => return Some(self.disconnect()),
                Ok(transport::Received::Message { len, .. }) => {
                    self.inbox.push(buf[..len].to_vec());
                }
                Ok(transport::Received::Truncated { .. }) => self.inbox_refused += 1,
            }
            let mut more = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
            if !matches!(poll(&mut more, PollTimeout::ZERO), Ok(n) if n > 0) {
                break;
            }
        }
        None
    }

    /// The datagrams the relay sent since the last call, oldest first.
    pub fn take_inbox(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.inbox)
    }

    fn disconnect(&mut self) -> Event {
        self.wait_set.forget_conn();
        if self.conn.take().is_some() {
            let queued_batches = self.queue.iter().filter(|m| m.batch.is_some()).count();
            if matches!(self.target, Target::Inherited) {
                tracing::warn!(
                    queued_batches,
                    "the inherited connection to ember-relay ended; stopping"
                );
            } else {
                tracing::warn!(
                    queued_batches,
                    "ember-relay went away; keeping batches in the backlog until it is back"
                );
            }
        }
        self.queue.retain(|m| m.batch.is_some());
        self.send_by = None;
        self.next_attempt = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        Event::Closed
    }

    /// Blocks until everything queued is sent or `timeout` passes (used on exit).
    pub fn drain_queue(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.queue.is_empty() && self.conn.is_some() && Instant::now() < deadline {
            self.send_queued();
            if !self.queue.is_empty() {
                self.wait(Duration::from_millis(20));
            }
        }
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link to `target` over `conn` (if connected) holding at most `limit` bytes of backlog,
    /// with a wait set of its own.
    fn test_link(target: Target, conn: Option<OwnedFd>, limit: usize) -> Link {
        Link::new(target, conn, limit, None, WaitSet::new().expect("epoll"))
    }

    fn message(len: usize, batch: Option<BatchMark>) -> Outgoing {
        Outgoing {
            bytes: vec![0u8; len],
            fds: Vec::new(),
            batch,
        }
    }

    fn batch(len: usize, sequence: u64, samples: u64) -> Outgoing {
        message(len, Some(BatchMark { sequence, samples }))
    }

    /// Sequences of the queued batch parts, front first.
    fn queued_sequences(link: &Link) -> Vec<u64> {
        link.queue
            .iter()
            .filter_map(|m| m.batch.map(|b| b.sequence))
            .collect()
    }

    /// A directory of its own under the system temp dir, removed on drop (also when a test
    /// fails).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("ember-link-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).expect("create the test's temp dir");
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Waits (bounded) until the link reports the connection closed.
    fn wait_closed(link: &mut Link) {
        for _ in 0..50 {
            if link.wait(Duration::from_millis(100)) == Event::Closed {
                return;
            }
        }
        panic!("the link never saw the relay close the connection");
    }

    #[test]
    fn a_full_backlog_drops_the_oldest_batches_counted_and_keeps_state_messages() {
        // Given a link with no relay and room for three 100-byte batches
        let mut link = test_link(Target::Path("/nonexistent/ember.sock".into()), None, 300);
        // When a state message and five batches (sequence s carries s + 1 samples) are queued
        link.enqueue(message(1000, None));
        for sequence in 0..5 {
            link.enqueue(batch(100, sequence, sequence + 1));
            // Then the backlog never exceeds its bound (state messages do not count)
            assert!(
                link.backlog_bytes() <= 300,
                "{} bytes",
                link.backlog_bytes()
            );
        }
        // ...the two oldest batches were dropped and counted with their samples (1 + 2)...
        assert_eq!(queued_sequences(&link), vec![2, 3, 4]);
        assert_eq!(link.oldest_queued_sequence(), Some(2));
        assert_eq!((link.dropped_batches, link.dropped_samples), (2, 3));
        assert_eq!(link.backlog_bytes(), 300);
        // ...and the state message, larger than the bound, was neither dropped nor counted.
        assert_eq!(link.queued(), 4);
        assert!(link.queue[0].batch.is_none());
        assert_eq!(link.dropped_facts, 0);
        // When one batch larger than the whole bound comes, everything older goes, and so
        // does the new batch itself: the backlog stays bounded.
        link.enqueue(batch(301, 5, 10));
        assert_eq!(queued_sequences(&link), Vec::<u64>::new());
        assert_eq!(
            (link.dropped_batches, link.dropped_samples),
            (6, 3 + 3 + 4 + 5 + 10)
        );
        assert_eq!(link.backlog_bytes(), 0);
    }

    #[test]
    fn prepend_replaces_the_state_of_the_previous_connection_and_keeps_batches() {
        // Given the state of an old connection queued between batches
        let mut link = test_link(Target::Path("/nonexistent/ember.sock".into()), None, 1000);
        link.enqueue(message(11, None));
        link.enqueue(batch(100, 7, 1));
        link.enqueue(message(12, None));
        link.enqueue(batch(100, 8, 1));
        // When the state of a new connection is prepended
        link.prepend(vec![message(21, None), message(22, None)]);
        // Then the new state comes first, in its order, the old state is gone, and the batches
        // follow in their order with the backlog size unchanged
        let layout: Vec<(usize, Option<u64>)> = link
            .queue
            .iter()
            .map(|m| (m.bytes.len(), m.batch.map(|b| b.sequence)))
            .collect();
        assert_eq!(
            layout,
            vec![(21, None), (22, None), (100, Some(7)), (100, Some(8))]
        );
        assert_eq!(link.backlog_bytes(), 200);
        assert_eq!((link.dropped_batches, link.dropped_facts), (0, 0));
    }

    #[test]
    fn a_missing_relay_is_retried_after_a_doubling_backoff() {
        // Given a socket path nobody listens on
        let dir = TempDir::new("missing");
        let mut link = test_link(Target::Path(dir.0.join("relay.sock")), None, 1000);
        let mut expected = BACKOFF_MIN;
        for _ in 0..8 {
            // When an attempt is due and fails
            link.next_attempt = Instant::now();
            let before = Instant::now();
            assert_eq!(link.maybe_connect(), Event::Nothing);
            // Then the next one waits at least the current backoff, which doubles up to 5 s
            assert!(!link.is_connected());
            assert!(link.next_attempt >= before + expected);
            expected = (expected * 2).min(BACKOFF_MAX);
            assert_eq!(link.backoff, expected);
        }
        assert_eq!(link.backoff, BACKOFF_MAX);
        // And an attempt that is not due yet does not even try
        link.next_attempt = Instant::now() + Duration::from_secs(3600);
        let _listener = transport::listen(&dir.0.join("relay.sock")).expect("listen");
        assert_eq!(link.maybe_connect(), Event::Nothing);
        assert!(!link.is_connected());
    }

    #[test]
    fn a_relay_closing_before_any_batch_went_through_backs_off_until_a_batch_is_sent() {
        // Given a listener that accepts and closes at once (a relay refusing the sampler)
        let dir = TempDir::new("refusing");
        let path = dir.0.join("relay.sock");
        let listener = transport::listen(&path).expect("listen");
        let mut link = test_link(Target::Path(path), None, 1 << 20);
        let mut expected = BACKOFF_MIN;
        for round in 0..8 {
            // When the link connects (made due: no waiting in tests)...
            link.next_attempt = Instant::now();
            assert_eq!(link.maybe_connect(), Event::Connected, "round {round}");
            // ...sends its per-connection state (not a batch)...
            link.prepend(vec![message(16, None)]);
            assert_eq!(link.flush(), Event::Nothing);
            assert_eq!(link.queued(), 0);
            // ...and the relay closes the connection
            drop(transport::accept(listener.as_fd()).expect("accept"));
            let before = Instant::now();
            wait_closed(&mut link);
            // Then connecting did not reset the backoff: the next attempt waits at least the
            // current backoff, which doubles up to 5 s
            assert!(!link.is_connected());
            assert!(link.next_attempt >= before + expected, "round {round}");
            expected = (expected * 2).min(BACKOFF_MAX);
            assert_eq!(link.backoff, expected, "round {round}");
        }
        assert_eq!(link.backoff, BACKOFF_MAX);
        // When a relay stays and a batch goes through
        link.next_attempt = Instant::now();
        assert_eq!(link.maybe_connect(), Event::Connected);
        let relay = transport::accept(listener.as_fd()).expect("accept");
        link.prepend(vec![message(16, None)]);
        link.flush();
        assert_eq!(
            link.backoff, BACKOFF_MAX,
            "state messages do not reset the backoff"
        );
        link.enqueue(batch(64, 1, 3));
        link.flush();
        // Then the backoff is back to 100 ms
        assert_eq!(link.queued(), 0);
        assert_eq!(link.backoff, BACKOFF_MIN);
        // And the next loss waits that again
        drop(relay);
        let before = Instant::now();
        wait_closed(&mut link);
        assert!(link.next_attempt >= before + BACKOFF_MIN);
        assert_eq!(link.backoff, BACKOFF_MIN * 2);
    }

    #[test]
    fn a_datagram_the_socket_refuses_is_dropped_and_counted_and_the_link_stays_up() {
        // Given a connection whose send buffer can never take 64 KiB
        let (ours, theirs) = transport::pair().expect("socketpair");
        transport::set_send_buffer(ours.as_fd(), 4096).expect("SO_SNDBUF");
        let mut link = test_link(Target::Inherited, Some(ours), 1 << 20);
        // When a large fact, a large batch and a small fact are queued
        link.enqueue(message(64 << 10, None));
        link.enqueue(message(
            64 << 10,
            Some(BatchMark {
                sequence: 0,
                samples: 5,
            }),
        ));
        link.enqueue(message(64, None));
        link.flush();
        // Then the large ones are dropped and counted, the small one is delivered
        assert_eq!(link.dropped_facts, 1);
        assert_eq!((link.dropped_batches, link.dropped_samples), (1, 5));
        assert!(link.is_connected());
        assert_eq!(link.queued(), 0);
        assert_eq!(link.backlog_bytes(), 0);
        let mut buf = [0u8; 256];
        assert!(matches!(
            transport::recv(theirs.as_fd(), &mut buf),
            Ok(transport::Received::Message { .. })
        ));
    }

    /// The first bytes of every datagram waiting on `theirs`.
    fn received(theirs: &OwnedFd) -> Vec<usize> {
        let mut lens = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(transport::Received::Message { len, .. }) =
            transport::recv(theirs.as_fd(), &mut buf)
        {
            lens.push(len);
        }
        lens
    }

    #[test]
    fn facts_are_held_then_sent_together_and_in_order() {
        // Given a connection (non-blocking reads on the relay's end)
        let (ours, theirs) = transport::pair().expect("socketpair");
        nix::fcntl::fcntl(
            &theirs,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .expect("O_NONBLOCK");
        let mut link = test_link(Target::Inherited, Some(ours), 1 << 20);
        // When two facts are queued and flushed at once
        link.enqueue(message(11, None));
        link.enqueue(message(12, None));
        link.flush();
        // Then they are held: nothing reached the relay
        assert_eq!(received(&theirs), Vec::<usize>::new());
        assert_eq!((link.queued(), link.datagrams_sent), (2, 0));
        // When a message carrying a descriptor (a new file) is queued, Then it goes at once and
        // takes what was held with it, in order
        let null = std::fs::File::open("/dev/null").expect("open /dev/null");
        link.enqueue(Outgoing {
            bytes: vec![0u8; 13],
            fds: vec![Rc::new(OwnedFd::from(null))],
            batch: None,
        });
        link.flush();
        assert_eq!(received(&theirs), vec![11, 12, 13]);
        // When a fact is held and a batch part follows, Then both go, in order
        link.enqueue(message(14, None));
        link.flush();
        assert_eq!(link.queued(), 1);
        link.enqueue(batch(15, 0, 1));
        link.flush();
        assert_eq!(received(&theirs), vec![14, 15]);
        // When a fact is held alone, Then waiting sends it once the hold is over
        link.enqueue(message(16, None));
        let started = Instant::now();
        while link.queued() > 0 && started.elapsed() < STATE_HOLD * 20 {
            link.wait(STATE_HOLD);
            link.flush();
        }
        assert_eq!(received(&theirs), vec![16]);
        assert_eq!(link.datagrams_sent, 6);
    }

    #[test]
    fn an_inherited_connection_that_closes_ends_the_link() {
        // Given an inherited connection
        let (ours, theirs) = transport::pair().expect("socketpair");
        let mut link = test_link(Target::Inherited, Some(ours), 1 << 20);
        assert!(!link.ended());
        // When the relay closes it
        drop(theirs);
        link.wait(Duration::from_millis(100));
        // Then the link says it ended (the sampler stops) and never reconnects
        assert!(link.ended());
        assert_eq!(link.maybe_connect(), Event::Nothing);
    }
}
