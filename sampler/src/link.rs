//! The sampler's side of the socket: connects (or uses the inherited connection), sends queued
//! messages in order without blocking the drain loop, and keeps a bounded backlog of batches while
//! no relay is there. Per-connection state (hello, files, processes) is rebuilt on every connect,
//! so only batches need keeping.

use std::{
    collections::VecDeque,
    os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd},
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant},
};

use ember_protocol::transport;
use nix::{
    errno::Errno,
    poll::{poll, PollFd, PollFlags, PollTimeout},
};

/// One encoded datagram waiting to be sent.
pub struct Outgoing {
    pub bytes: Vec<u8>,
    pub fds: Vec<Rc<OwnedFd>>,
    /// Samples in it when it is a batch; `None` for per-connection state.
    pub batch_samples: Option<u64>,
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
    last_connect_error: Option<Errno>,
    /// Required SO_PEERCRED uid of the relay, when set.
    relay_uid: Option<u32>,
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Socket send buffer; batches are split well below it (see `drain::build_batches`).
pub const SEND_BUFFER_BYTES: usize = 1 << 20;

impl Link {
    pub fn new(
        target: Target,
        inherited: Option<OwnedFd>,
        backlog_max_bytes: usize,
        relay_uid: Option<u32>,
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
            last_connect_error: None,
            relay_uid,
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

    /// Whether every batch has been handed to the relay.
    pub fn backlog_empty(&self) -> bool {
        self.queue.iter().all(|m| m.batch_samples.is_none())
    }

    /// Queues a message. Batches over the backlog bound push out the oldest batches, counted.
    pub fn enqueue(&mut self, message: Outgoing) {
        if message.batch_samples.is_some() {
            self.backlog_bytes += message.bytes.len();
        }
        self.queue.push_back(message);
        while self.backlog_bytes > self.backlog_max_bytes {
            let Some(pos) = self.queue.iter().position(|m| m.batch_samples.is_some()) else {
                break;
            };
            if let Some(old) = self.queue.remove(pos) {
                self.backlog_bytes -= old.bytes.len();
                self.dropped_batches += 1;
                self.dropped_samples += old.batch_samples.unwrap_or(0);
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
                self.backoff = BACKOFF_MIN;
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
        self.queue.retain(|m| m.batch_samples.is_some());
        for message in state.into_iter().rev() {
            self.queue.push_front(message);
        }
    }

    /// Sends as much of the queue as the socket takes now. Returns `Closed` if the connection
    /// broke.
    pub fn flush(&mut self) -> Event {
        while let Some(front) = self.queue.front() {
            let Some(conn) = self.conn.as_ref() else {
                return Event::Nothing;
            };
            let fds: Vec<BorrowedFd<'_>> = front.fds.iter().map(|fd| fd.as_fd()).collect();
            match transport::send(conn.as_fd(), &front.bytes, &fds, true) {
                Ok(()) => {
                    if let Some(message) = self.queue.pop_front() {
                        if message.batch_samples.is_some() {
                            self.backlog_bytes -= message.bytes.len();
                        }
                    }
                }
                Err(Errno::EAGAIN) => return Event::Nothing,
                Err(err) => {
                    tracing::warn!(%err, bytes = front.bytes.len(), "sending to ember-relay failed; reconnecting");
                    return self.disconnect();
                }
            }
        }
        Event::Nothing
    }

    /// Waits up to `timeout` for the connection to close or become writable; reports a close.
    pub fn wait(&mut self, timeout: Duration) -> Event {
        let Some(conn) = self.conn.as_ref() else {
            std::thread::sleep(timeout);
            return Event::Nothing;
        };
        let mut flags = PollFlags::POLLIN;
        if !self.queue.is_empty() {
            flags |= PollFlags::POLLOUT;
        }
        let mut fds = [PollFd::new(conn.as_fd(), flags)];
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(0) | Err(Errno::EINTR) => Event::Nothing,
            Ok(_) => {
                let revents = fds[0].revents().unwrap_or(PollFlags::empty());
                if revents.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
                    return self.disconnect();
                }
                if revents.contains(PollFlags::POLLIN) {
                    // The relay sends nothing the sampler acts on yet; a readable socket with
                    // no data is an orderly shutdown of the relay's side.
                    let mut buf = [0u8; 64];
                    match transport::recv(conn.as_fd(), &mut buf) {
                        // An inherited connection stays open for sending: the relay shut its
                        // side down to ask for the last batch.
                        Ok(transport::Received::Closed)
                            if matches!(self.target, Target::Inherited) =>
                        {
                            return Event::Closed;
                        }
                        Ok(transport::Received::Closed) | Err(_) => return self.disconnect(),
                        Ok(_) => {}
                    }
                }
                if revents.contains(PollFlags::POLLOUT) {
                    return self.flush();
                }
                Event::Nothing
            }
            Err(err) => {
                tracing::warn!(%err, "poll on the relay socket failed");
                Event::Nothing
            }
        }
    }

    fn disconnect(&mut self) -> Event {
        if self.conn.take().is_some() {
            tracing::warn!(
                queued_batches = self
                    .queue
                    .iter()
                    .filter(|m| m.batch_samples.is_some())
                    .count(),
                "ember-relay went away; keeping batches in the backlog until it is back"
            );
        }
        self.queue.retain(|m| m.batch_samples.is_some());
        self.next_attempt = Instant::now();
        Event::Closed
    }

    /// Blocks until everything queued is sent or `timeout` passes (used on exit).
    pub fn drain_queue(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.queue.is_empty() && self.conn.is_some() && Instant::now() < deadline {
            self.flush();
            if !self.queue.is_empty() {
                self.wait(Duration::from_millis(20));
            }
        }
        self.queue.is_empty()
    }
}
