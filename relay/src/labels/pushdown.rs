//! The process filter, pushed down: the processes the labels stage's
//! `--process-filter` left out are sent to the sampler that described them, as
//! `ignoreProcesses` on its connection, so it stops sampling them (it checks each one; see
//! sampler/src/ignore.rs). Not a label provider: the one place in `labels` that writes a socket.
//!
//! The relay-side filter stays the authority: samples that still arrive for a filtered process
//! are dropped by the stage as before; this only saves their cost. Nothing is sent when no filter
//! is configured (nothing is filtered out). Sends never block the driver's thread: what the
//! socket does not take now stays queued per connection (at most [`MAX_PENDING`] entries; more
//! are dropped and counted) and is retried with the connection's next batch. A changed filter
//! (new labels stage) makes the next message to every connection `forgetAll`.

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, OwnedFd},
    sync::Arc,
};

use ember_protocol::{
    encode_relay_message, transport, IgnoreProcesses, IgnoredProcess, RelayMessage,
    MAX_IGNORE_PER_MESSAGE,
};
use nix::errno::Errno;

use crate::source::ConnectionId;

/// Entries queued per connection at most: the sampler ignores no more than this many processes.
pub(crate) const MAX_PENDING: usize = 16_384;

/// One connection's queue.
struct Outbox {
    control: Arc<OwnedFd>,
    pending: Vec<IgnoredProcess>,
    /// The next message says `forgetAll` (the filter changed).
    forget_all: bool,
}

/// Every connection's queue of processes to ignore, and what became of them.
#[derive(Default)]
pub(crate) struct IgnoreSender {
    outboxes: HashMap<ConnectionId, Outbox>,
    /// Entries handed to a socket, since start.
    pub(crate) sent: u64,
    /// Entries dropped: over [`MAX_PENDING`], or the socket failed.
    pub(crate) dropped: u64,
}

impl IgnoreSender {
    /// A sampler connected; `control` is its sending side.
    pub(crate) fn connected(&mut self, conn: ConnectionId, control: Arc<OwnedFd>) {
        self.outboxes.insert(
            conn,
            Outbox {
                control,
                pending: Vec::new(),
                forget_all: false,
            },
        );
    }

    /// The connection ended (the sampler forgets its entries itself).
    pub(crate) fn closed(&mut self, conn: ConnectionId) {
        self.outboxes.remove(&conn);
    }

    /// The filter changed: every sampler is told to forget what it ignores (the new filter may
    /// keep those processes); entries not sent yet are dropped (they were the old filter's).
    pub(crate) fn forget_all(&mut self) {
        let conns: Vec<ConnectionId> = self.outboxes.keys().copied().collect();
        for conn in conns {
            if let Some(outbox) = self.outboxes.get_mut(&conn) {
                outbox.pending.clear();
                outbox.forget_all = true;
            }
            self.flush(conn);
        }
    }

    /// Queues `processes` for `conn`'s sampler and sends what the socket takes.
    pub(crate) fn send(&mut self, conn: ConnectionId, processes: Vec<IgnoredProcess>) {
        let Some(outbox) = self.outboxes.get_mut(&conn) else {
            return;
        };
        let room = MAX_PENDING.saturating_sub(outbox.pending.len());
        let over = processes.len().saturating_sub(room);
        outbox.pending.extend(processes.into_iter().take(room));
        self.dropped += over as u64;
        self.flush(conn);
    }

    /// Sends `conn`'s queue in messages of at most [`MAX_IGNORE_PER_MESSAGE`], oldest first,
    /// without waiting: on EAGAIN the rest stays queued.
    fn flush(&mut self, conn: ConnectionId) {
        let Some(outbox) = self.outboxes.get_mut(&conn) else {
            return;
        };
        while outbox.forget_all || !outbox.pending.is_empty() {
            let take = outbox.pending.len().min(MAX_IGNORE_PER_MESSAGE);
            let message = RelayMessage::IgnoreProcesses(IgnoreProcesses {
                forget_all: outbox.forget_all,
                processes: outbox.pending[..take].to_vec(),
                excess: 0,
            });
            let bytes = encode_relay_message(&message);
            match transport::send(outbox.control.as_fd(), &bytes, &[], true) {
                Ok(()) => {
                    outbox.pending.drain(..take);
                    outbox.forget_all = false;
                    self.sent += take as u64;
                    tracing::debug!(
                        connection = conn,
                        processes = take,
                        "asked the sampler to ignore processes the filter left out"
                    );
                }
                Err(Errno::EAGAIN) => return,
                Err(err) => {
                    // The connection is ending; the source will report it.
                    self.dropped += outbox.pending.len() as u64;
                    outbox.pending.clear();
                    outbox.forget_all = false;
                    tracing::debug!(connection = conn, %err, "could not send ignoreProcesses");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ember_protocol::{decode_relay_message, Limits};

    use super::*;

    /// Every `ignoreProcesses` waiting on `sock`, decoded.
    fn received(sock: &OwnedFd) -> Vec<IgnoreProcesses> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let mut ready = [nix::poll::PollFd::new(
            sock.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        while nix::poll::poll(&mut ready, nix::poll::PollTimeout::ZERO).is_ok_and(|n| n > 0) {
            let Ok(transport::Received::Message { len, .. }) =
                transport::recv(sock.as_fd(), &mut buf)
            else {
                break;
            };
            match decode_relay_message(&buf[..len], &Limits::default()) {
                Ok(RelayMessage::IgnoreProcesses(m)) => out.push(m),
                other => panic!("unexpected: {other:?}"),
            }
        }
        out
    }

    fn processes(n: u32) -> Vec<IgnoredProcess> {
        (1..=n)
            .map(|pid| IgnoredProcess {
                pid,
                start_time_unix_ns: u64::from(pid) * 10,
            })
            .collect()
    }

    #[test]
    fn entries_go_to_their_connection_in_bounded_messages_and_a_reload_forgets_all() {
        // Given two connections
        let (ours1, theirs1) = transport::pair().expect("socketpair");
        let (ours2, theirs2) = transport::pair().expect("socketpair");
        let mut sender = IgnoreSender::default();
        sender.connected(1, Arc::new(ours1));
        sender.connected(2, Arc::new(ours2));
        // When 2,500 processes are queued for the first
        sender.send(1, processes(2_500));
        // Then its sampler gets them in three messages of at most 1,024, the other nothing
        let got = received(&theirs1);
        let sizes: Vec<usize> = got.iter().map(|m| m.processes.len()).collect();
        assert_eq!(sizes, [1024, 1024, 452]);
        assert!(got.iter().all(|m| !m.forget_all));
        assert_eq!(got.concat_processes(), processes(2_500));
        assert!(received(&theirs2).is_empty());
        assert_eq!((sender.sent, sender.dropped), (2_500, 0));
        // When the filter changes, Then each connection is told to forget all, once
        sender.forget_all();
        for theirs in [&theirs1, &theirs2] {
            let got = received(theirs);
            assert_eq!(got.len(), 1);
            assert!(got[0].forget_all && got[0].processes.is_empty());
        }
        // And a closed connection is sent nothing
        sender.closed(2);
        sender.send(2, processes(3));
        assert!(received(&theirs2).is_empty());
    }

    #[test]
    fn a_full_socket_keeps_a_bounded_queue_for_later() {
        // Given a connection whose peer does not read
        let (ours, theirs) = transport::pair().expect("socketpair");
        let mut sender = IgnoreSender::default();
        sender.connected(1, Arc::new(ours));
        // When twice the cap is queued (far more than the socket buffers take)
        let total = 2 * MAX_PENDING as u64;
        sender.send(1, processes(MAX_PENDING as u32));
        sender.send(1, processes(MAX_PENDING as u32));
        // Then the sends did not block, the queue stayed bounded and the excess was counted
        let queued = sender.outboxes[&1].pending.len();
        assert!(queued <= MAX_PENDING, "{queued}");
        assert!(sender.sent < total && sender.dropped > 0);
        assert_eq!(sender.sent + queued as u64 + sender.dropped, total);
        // And once the peer reads, the next batch's flush sends more
        assert!(!received(&theirs).is_empty());
        let before = sender.sent;
        sender.send(1, Vec::new());
        assert!(sender.sent > before);
    }

    trait Concat {
        fn concat_processes(&self) -> Vec<IgnoredProcess>;
    }

    impl Concat for Vec<IgnoreProcesses> {
        fn concat_processes(&self) -> Vec<IgnoredProcess> {
            self.iter().flat_map(|m| m.processes.clone()).collect()
        }
    }
}
