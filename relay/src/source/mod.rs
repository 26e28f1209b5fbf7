//! The relay's socket side: accepts sampler connections, reads datagrams with their file
//! descriptors, enforces the protocol's limits and handshake, and hands decoded messages to the
//! pipeline. Anything malformed closes that one connection with a logged reason; the relay keeps
//! serving everyone else.
//!
//! Descriptors the kernel could not install (MSG_CTRUNC: the relay's RLIMIT_NOFILE is reached)
//! are not a protocol error: the message is taken with those files absent, a WARN naming the fix
//! is logged once per connection and the losses are counted (logged every minute while they
//! grow, and when the connection ends).

use std::{
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc::SyncSender,
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use ember_protocol::{
    decode_sampler_message, transport, DecodeError, Limits, SamplerMessage, PROTOCOL_VERSION,
};

/// Identifies one sampler connection for the lifetime of the relay.
pub type ConnectionId = u64;

/// What the source tells the pipeline.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "a message is moved once, from the socket thread to the pipeline; boxing it would \
              allocate per datagram for nothing"
)]
pub enum SourceEvent {
    Connected {
        conn: ConnectionId,
        peer_uid: u32,
        peer_pid: i32,
        /// A duplicate of the connection for sending to the sampler (unwind tables); `None`
        /// when it could not be duplicated. Dropped by the pipeline when the connection closes.
        control: Option<Arc<OwnedFd>>,
    },
    Message {
        conn: ConnectionId,
        message: SamplerMessage,
        fds: Vec<OwnedFd>,
    },
    Closed {
        conn: ConnectionId,
        /// Why the relay closed it; `None` when the sampler closed it.
        error: Option<String>,
    },
}

/// Why a connection was closed by the relay.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("reading the socket failed: {0}")]
    Recv(nix::errno::Errno),
    #[error("datagram of {len} bytes exceeds --max-message-bytes {limit}")]
    Oversized { len: usize, limit: usize },
    #[error("malformed message: {0}")]
    Decode(#[from] DecodeError),
    #[error("first message was `{0}`, expected `hello`")]
    NoHello(&'static str),
    #[error(
        "protocol version mismatch: sampler speaks v{got}, this relay speaks v{PROTOCOL_VERSION}; \
         run ember-sampler and ember-relay of the same release ({})",
        if *got < PROTOCOL_VERSION { "upgrade ember-sampler" } else { "upgrade ember-relay" }
    )]
    Version { got: u32 },
    #[error("a second `hello` on one connection")]
    DuplicateHello,
    #[error("message refers to fd index {index} but carried {count} descriptors")]
    FdIndex { index: i32, count: usize },
    /// A sampler passes only the descriptors its message names: others would only cost the
    /// relay descriptors (a flood of them could exhaust its RLIMIT_NOFILE).
    #[error(
        "datagram carried {count} descriptors but its message names only {named} of them; \
         ember-sampler never sends others"
    )]
    UnreferencedFds { count: usize, named: usize },
}

impl ConnectionError {
    /// The reason's name in the metrics (`ember_relay_sampler_connections_refused_total`).
    fn reason(&self) -> Refusal {
        match self {
            Self::Recv(_) => Refusal::Recv,
            Self::Oversized { .. } => Refusal::Oversized,
            Self::Decode(_) => Refusal::Malformed,
            Self::NoHello(_) | Self::DuplicateHello => Refusal::Handshake,
            Self::Version { .. } => Refusal::Version,
            Self::FdIndex { .. } | Self::UnreferencedFds { .. } => Refusal::FdIndex,
        }
    }
}

/// Why the relay refused a connection or closed it on an error: counted in [`Refusals`] for the
/// metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The peer's uid is not one of `--sampler-uid`.
    PeerUid,
    /// Its credentials could not be read.
    Credentials,
    /// [`MAX_CONNECTIONS`] samplers were connected already.
    TooMany,
    Recv,
    Oversized,
    Malformed,
    /// No hello first, or a second one.
    Handshake,
    /// The protocol versions differ.
    Version,
    FdIndex,
}

impl Refusal {
    pub(crate) const ALL: [Self; 9] = [
        Self::PeerUid,
        Self::Credentials,
        Self::TooMany,
        Self::Recv,
        Self::Oversized,
        Self::Malformed,
        Self::Handshake,
        Self::Version,
        Self::FdIndex,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::PeerUid => "peer_uid",
            Self::Credentials => "credentials",
            Self::TooMany => "too_many",
            Self::Recv => "recv_error",
            Self::Oversized => "oversized",
            Self::Malformed => "malformed",
            Self::Handshake => "handshake",
            Self::Version => "version",
            Self::FdIndex => "fd_index",
        }
    }
}

/// Connections the source refused, or closed on an error, by [`Refusal`], since start. Owned by
/// the source: its accept and connection threads count here without waiting on anyone (the
/// intake to the driver could block them); the command hands the same counters to the metrics
/// when it assembles them, which read them at scrape time.
#[derive(Debug, Default)]
pub(crate) struct Refusals([AtomicU64; Refusal::ALL.len()]);

impl Refusals {
    pub(crate) fn count(&self, reason: Refusal) {
        self.0[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections refused or closed for `reason` since start.
    pub(crate) fn total(&self, reason: Refusal) -> u64 {
        self.0[reason as usize].load(Ordering::Relaxed)
    }

    /// Connections refused or closed for any reason since start.
    pub(crate) fn sum(&self) -> u64 {
        Refusal::ALL
            .iter()
            .fold(0u64, |sum, reason| sum.saturating_add(self.total(*reason)))
    }
}

pub use ember_common::raise_nofile_limit;

/// Descriptors of one connection lost to MSG_CTRUNC.
#[derive(Debug, Default)]
struct LostDescriptors {
    /// Datagrams flagged MSG_CTRUNC.
    datagrams: u64,
    /// File references in them whose descriptor did not arrive.
    files: u64,
    /// `files` when last logged, and when.
    reported: u64,
    last_report: Option<Instant>,
}

/// How often growing descriptor losses are logged again.
const LOST_FDS_REPORT_EVERY: Duration = Duration::from_secs(60);

impl LostDescriptors {
    fn record(&mut self, conn: ConnectionId, missing: u64) {
        self.datagrams += 1;
        self.files += missing;
        let due = self
            .last_report
            .is_none_or(|at| at.elapsed() >= LOST_FDS_REPORT_EVERY);
        if !due || (self.last_report.is_some() && self.files == self.reported) {
            return;
        }
        if self.last_report.is_none() {
            tracing::warn!(
                connection = conn,
                missing_now = missing,
                "the kernel could not hand the relay every descriptor the sampler sent \
                 (MSG_CTRUNC: the relay's open-file limit is reached); those files stay \
                 unnamed. Fix: raise the relay's limit (LimitNOFILE= in its unit, `ulimit -n`, \
                 the container's nofile ulimit) or lower --max-open-files"
            );
        } else {
            tracing::warn!(
                connection = conn,
                lost_descriptors = self.files,
                datagrams = self.datagrams,
                "descriptors lost to MSG_CTRUNC on this connection so far"
            );
        }
        self.reported = self.files;
        self.last_report = Some(Instant::now());
    }
}

/// Events queued between the connection threads and the pipeline (`sync_channel`). When the
/// pipeline falls behind, connection threads block on send, stop reading their sockets, and the
/// samplers see full socket buffers: backpressure instead of unbounded memory in the relay.
pub const INTAKE_CAPACITY: usize = 64;

/// Largest number of samplers served at once; more are refused with a logged reason.
pub const MAX_CONNECTIONS: usize = 64;

/// Reads one connection until it ends; runs on its own thread. An error that closes it is
/// counted in `refusals`.
pub(crate) fn serve_connection(
    conn: ConnectionId,
    fd: OwnedFd,
    limits: Limits,
    events: SyncSender<SourceEvent>,
    refusals: &Refusals,
) {
    let (peer_uid, _, peer_pid) =
        transport::peer_credentials(fd.as_fd()).unwrap_or((u32::MAX, 0, -1));
    let control = fd.try_clone().ok().map(Arc::new);
    if events
        .send(SourceEvent::Connected {
            conn,
            peer_uid,
            peer_pid,
            control,
        })
        .is_err()
    {
        return;
    }
    let mut lost = LostDescriptors::default();
    let result = read_loop(conn, &fd, &limits, &events, &mut lost);
    if lost.datagrams > 0 {
        tracing::warn!(
            connection = conn,
            lost_descriptors = lost.files,
            datagrams = lost.datagrams,
            "descriptors lost to MSG_CTRUNC on this connection"
        );
    }
    let error = match result {
        Ok(()) => None,
        Err(err) => {
            refusals.count(err.reason());
            tracing::error!(
                connection = conn,
                peer_pid,
                error = %err,
                "closing connection: {err}"
            );
            Some(err.to_string())
        }
    };
    drop(fd);
    let _ = events.send(SourceEvent::Closed { conn, error });
}

fn read_loop(
    conn: ConnectionId,
    fd: &OwnedFd,
    limits: &Limits,
    events: &SyncSender<SourceEvent>,
    lost: &mut LostDescriptors,
) -> Result<(), ConnectionError> {
    // One byte more than the limit, so an oversized datagram is seen as truncated.
    let mut buf = vec![0u8; limits.max_message_bytes + 1];
    let mut greeted = false;
    let mut reset = false;
    loop {
        let (len, fds, fds_truncated) = match transport::recv(fd.as_fd(), &mut buf) {
            Ok(transport::Received::Message {
                len,
                fds,
                fds_truncated,
            }) => (len, fds, fds_truncated),
            Ok(transport::Received::Truncated { len, .. }) => {
                return Err(ConnectionError::Oversized {
                    len,
                    limit: limits.max_message_bytes,
                })
            }
            Ok(transport::Received::Closed) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            // A peer that closes while datagrams of ours wait unread in its queue (unwind
            // tables a stopping sampler no longer reads) makes the kernel report ECONNRESET once,
            // ahead of the datagrams the peer sent before closing: a sampler's last batch. They
            // are still queued; read on to the end.
            Err(nix::errno::Errno::ECONNRESET) if !reset => {
                reset = true;
                tracing::debug!(
                    connection = conn,
                    "the sampler closed with relay messages unread; reading what it sent before"
                );
                continue;
            }
            Err(err) => return Err(ConnectionError::Recv(err)),
        };
        let message = decode_sampler_message(&buf[..len], limits)?;
        match (&message, greeted) {
            (SamplerMessage::Hello(hello), false) => {
                if hello.protocol_version != PROTOCOL_VERSION {
                    return Err(ConnectionError::Version {
                        got: hello.protocol_version,
                    });
                }
                greeted = true;
            }
            (SamplerMessage::Hello(_), true) => return Err(ConnectionError::DuplicateHello),
            (other, false) => return Err(ConnectionError::NoHello(other.kind())),
            (_, true) => {}
        }
        let missing = check_fd_indices(&message, fds.len(), fds_truncated)?;
        if fds_truncated {
            lost.record(conn, missing);
        }
        if events
            .send(SourceEvent::Message { conn, message, fds })
            .is_err()
        {
            return Ok(());
        }
    }
}

/// Every fd index a message names must be one of the descriptors that came with it, except
/// when the kernel reported that some could not be installed (`fds_truncated`): then indices
/// past the received ones stand for absent files. Returns how many references are absent so.
fn check_fd_indices(
    message: &SamplerMessage,
    count: usize,
    fds_truncated: bool,
) -> Result<u64, ConnectionError> {
    let mut missing = 0u64;
    let mut named = vec![false; count];
    let mut check = |index: i32| {
        let beyond = usize::try_from(index).is_ok_and(|i| i >= count);
        if index < -1 || (beyond && !fds_truncated) {
            return Err(ConnectionError::FdIndex { index, count });
        }
        if let Some(slot) = usize::try_from(index).ok().and_then(|i| named.get_mut(i)) {
            *slot = true;
        }
        missing += u64::from(beyond);
        Ok(())
    };
    match message {
        SamplerMessage::Hello(hello) => check(hello.kallsyms_fd)?,
        SamplerMessage::Files(files) => files.iter().try_for_each(|f| check(f.fd))?,
        SamplerMessage::Process(info) => check(info.perf_map_fd.unwrap_or(ember_protocol::NO_FD))?,
        _ => {}
    }
    let named = named.iter().filter(|n| **n).count();
    if named < count {
        return Err(ConnectionError::UnreferencedFds { count, named });
    }
    Ok(missing)
}

/// Creates the socket's directory (mode 0750) if missing, listens on `path` and makes the socket
/// mode 0660: only the relay's user and group (which the sampler joins) may connect.
fn listen_private(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)?;
    }
    let listener = transport::listen(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// Accepts connections on `path` forever, one reading thread per sampler. Connections from any
/// uid but those of `sampler_uids` are closed with a logged reason; every refusal is counted in
/// `refusals`.
pub(crate) fn spawn_listener(
    path: &Path,
    limits: Limits,
    sampler_uids: Vec<u32>,
    events: SyncSender<SourceEvent>,
    refusals: Arc<Refusals>,
) -> std::io::Result<thread::JoinHandle<()>> {
    let listener = listen_private(path)?;
    let path: PathBuf = path.to_owned();
    let active = Arc::new(AtomicUsize::new(0));
    let handle = thread::Builder::new()
        .name("accept".into())
        .spawn(move || {
            let mut next_id: ConnectionId = 0;
            loop {
                let fd = match transport::accept(listener.as_fd()) {
                    Ok(fd) => fd,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(err) => {
                        tracing::error!(socket = %path.display(), %err, "accept failed");
                        thread::sleep(std::time::Duration::from_millis(100));
                        continue;
                    }
                };
                match transport::peer_credentials(fd.as_fd()) {
                    Ok((uid, _, pid)) if !sampler_uids.contains(&uid) => {
                        refusals.count(Refusal::PeerUid);
                        tracing::error!(
                            peer_uid = uid,
                            peer_pid = pid,
                            sampler_uids = ?sampler_uids,
                            "closing connection: peer uid {uid} is not the sampler's (--sampler-uid {sampler_uids:?})"
                        );
                        continue;
                    }
                    Ok(_) => {}
                    Err(err) => {
                        refusals.count(Refusal::Credentials);
                        tracing::error!(%err, "closing connection: cannot read its credentials");
                        continue;
                    }
                }
                if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    refusals.count(Refusal::TooMany);
                    tracing::error!(
                        max = MAX_CONNECTIONS,
                        "closing connection: too many samplers connected at once"
                    );
                    continue;
                }
                next_id += 1;
                let conn = next_id;
                let events = events.clone();
                let active_after_error = Arc::clone(&active);
                let active = Arc::clone(&active);
                let refusals = Arc::clone(&refusals);
                active.fetch_add(1, Ordering::SeqCst);
                let spawned =
                    thread::Builder::new()
                        .name(format!("conn-{conn}"))
                        .spawn(move || {
                            serve_connection(conn, fd, limits, events, &refusals);
                            active.fetch_sub(1, Ordering::SeqCst);
                        });
                if let Err(err) = spawned {
                    tracing::error!(%err, "cannot start a connection thread");
                    active_after_error.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })
        ?;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use ember_protocol::FileInfo;

    use super::*;

    fn files(fds: &[i32]) -> SamplerMessage {
        SamplerMessage::Files(
            fds.iter()
                .map(|&fd| FileInfo {
                    fd,
                    ..FileInfo::default()
                })
                .collect(),
        )
    }

    #[test]
    fn a_sampler_closing_with_relay_messages_unread_still_delivers_what_it_sent() {
        // Given a connection where the relay sent a message the sampler never read
        let (relay, sampler) = transport::pair().expect("socketpair");
        transport::send(relay.as_fd(), b"unwind table", &[], false).expect("relay sends");
        // And a sampler that sent its hello and a last message, then closed
        let hello = SamplerMessage::Hello(ember_protocol::Hello {
            protocol_version: PROTOCOL_VERSION,
            kallsyms_fd: ember_protocol::NO_FD,
            ..Default::default()
        });
        for message in [hello, SamplerMessage::FilesClosed(vec![7])] {
            let bytes = ember_protocol::encode_sampler_message(&message);
            transport::send(sampler.as_fd(), &bytes, &[], false).expect("sampler sends");
        }
        drop(sampler);
        // When the relay reads the connection (the kernel reports ECONNRESET first)
        let (events, received) = std::sync::mpsc::sync_channel(8);
        let result = read_loop(
            1,
            &relay,
            &Limits::default(),
            &events,
            &mut LostDescriptors::default(),
        );
        // Then both messages arrive and the connection ends as a plain close
        assert!(result.is_ok(), "{result:?}");
        drop(events);
        let kinds: Vec<&str> = received
            .iter()
            .map(|event| match event {
                SourceEvent::Message { message, .. } => message.kind(),
                _ => "other event",
            })
            .collect();
        assert_eq!(kinds, ["hello", "files closed"]);
    }

    #[test]
    fn a_connection_closed_on_an_error_is_counted_in_the_refusals_it_was_given() {
        // Given a sampler whose first message is not its hello
        let (relay, sampler) = transport::pair().expect("socketpair");
        let bytes = ember_protocol::encode_sampler_message(&SamplerMessage::FilesClosed(vec![7]));
        transport::send(sampler.as_fd(), &bytes, &[], false).expect("sampler sends");
        // When the relay serves the connection with counters of its own
        let refusals = Refusals::default();
        let (events, received) = std::sync::mpsc::sync_channel(8);
        serve_connection(1, relay, Limits::default(), events, &refusals);
        // Then the connection was closed with the reason, and counted under it alone
        let closed = received.iter().find_map(|event| match event {
            SourceEvent::Closed { error, .. } => Some(error),
            _ => None,
        });
        assert!(
            closed
                .flatten()
                .is_some_and(|e| e.contains("expected `hello`")),
            "closed with an error"
        );
        let counted: Vec<(&str, u64)> = Refusal::ALL
            .into_iter()
            .map(|reason| (reason.as_str(), refusals.total(reason)))
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(counted, [("handshake", 1)]);
        assert_eq!(refusals.sum(), 1);
    }

    #[test]
    fn a_version_2_sampler_is_refused_naming_the_fix() {
        let text = ConnectionError::Version { got: 2 }.to_string();
        assert!(
            text.starts_with("protocol version mismatch: sampler speaks v2, this relay speaks v3;")
                && text.contains("run ember-sampler and ember-relay of the same release")
                && text.ends_with("(upgrade ember-sampler)"),
            "{text}"
        );
        let newer = ConnectionError::Version { got: 4 }.to_string();
        assert!(newer.ends_with("(upgrade ember-relay)"), "{newer}");
    }

    #[test]
    fn a_bad_fd_index_closes_the_connection_unless_the_kernel_truncated_the_descriptors() {
        // Given a message naming descriptors 0..3 of which only two arrived
        let message = files(&[0, 1, 2, 3, -1]);
        // Then without MSG_CTRUNC it is a protocol error
        assert!(matches!(
            check_fd_indices(&message, 2, false),
            Err(ConnectionError::FdIndex { index: 2, count: 2 })
        ));
        // And with MSG_CTRUNC the two missing ones are absent files, counted
        assert_eq!(check_fd_indices(&message, 2, true).ok(), Some(2));
        // And an index below -1 is an error either way
        assert!(check_fd_indices(&files(&[-2]), 2, true).is_err());
        assert_eq!(check_fd_indices(&files(&[0, 1]), 2, false).ok(), Some(0));
    }

    #[test]
    fn descriptors_the_message_does_not_name_close_the_connection() {
        // Given datagrams carrying more descriptors than their message names
        let none = SamplerMessage::FilesClosed(Vec::new());
        assert!(matches!(
            check_fd_indices(&none, 250, false),
            Err(ConnectionError::UnreferencedFds {
                count: 250,
                named: 0
            })
        ));
        assert!(matches!(
            check_fd_indices(&files(&[0, 0, 2]), 3, false),
            Err(ConnectionError::UnreferencedFds { count: 3, named: 2 })
        ));
        // Then one naming each of them is fine, and so is none with no descriptors
        assert_eq!(
            check_fd_indices(&files(&[1, 0, -1]), 2, false).ok(),
            Some(0)
        );
        assert_eq!(check_fd_indices(&none, 0, false).ok(), Some(0));
    }
}
