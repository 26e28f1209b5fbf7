//! The drain loop's one wait: an epoll set holding the relay connection and the first-sample
//! ring buffer, registered once instead of on every wait. Under process churn the sampler wakes
//! once per process start (its facts are read at once), and `poll` of two descriptors looked up,
//! polled and hooked onto the wait queues of both on every one of those wake-ups and unhooked
//! them after.
//!
//! Made at start-up, before the seccomp filter: the filter allows `epoll_wait` and `epoll_ctl`
//! but not `epoll_create1`, so this set is the only one the confined sampler can ever use.
//! Level-triggered, like `poll`: what is not read stays ready.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd},
};

/// What a wait found ready.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// The connection's `EPOLL*` bits (0 when it was not ready or is not registered).
    pub conn: u32,
    /// The ring buffer holds events.
    pub ring: bool,
}

/// Token of the connection in the set (the ring buffer's is [`RING`]).
const CONN: u64 = 0;
const RING: u64 = 1;

pub struct WaitSet {
    epoll: OwnedFd,
    /// The connection's descriptor and the events it is registered for.
    conn: Option<(RawFd, u32)>,
    /// The ring buffer's descriptor, and whether it is watched now.
    ring: Option<(RawFd, bool)>,
}

impl WaitSet {
    /// A new, empty set (call before the seccomp filter is installed).
    pub fn new() -> io::Result<Self> {
        // SAFETY: no pointer arguments.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: a new descriptor this process owns, once.
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
            conn: None,
            ring: None,
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut event = libc::epoll_event { events, u64: token };
        // SAFETY: `event` is a valid epoll_event for the call's duration; `fd` is open (the
        // caller holds it).
        let rc = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut event) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Adds the ring buffer (readable when events wait); it stays for the sampler's life.
    pub fn add_ring(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let fd = fd.as_raw_fd();
        self.ctl(libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32, RING)?;
        self.ring = Some((fd, true));
        Ok(())
    }

    /// Watches the ring buffer or stops: a wait that does not read it (the last sends at exit)
    /// must not return at once on events that stay ready.
    fn watch_ring(&mut self, on: bool) {
        let Some((fd, watched)) = self.ring else {
            return;
        };
        if watched == on {
            return;
        }
        let events = if on { libc::EPOLLIN as u32 } else { 0 };
        match self.ctl(libc::EPOLL_CTL_MOD, fd, events, RING) {
            Ok(()) => self.ring = Some((fd, on)),
            Err(err) => tracing::warn!(%err, "epoll_ctl on the ring buffer failed"),
        }
    }

    /// Watches `conn` for `events` (`EPOLLIN`, `EPOLLOUT`; hang-ups and errors always), or no
    /// connection. A registration changes only when the descriptor or the events do; a closed
    /// descriptor left the set by itself when it was closed.
    pub fn watch_conn(&mut self, conn: Option<BorrowedFd<'_>>, events: u32) {
        let Some(conn) = conn else {
            self.conn = None;
            return;
        };
        let fd = conn.as_raw_fd();
        let result = match self.conn {
            Some((old, old_events)) if old == fd && old_events == events => return,
            Some((old, _)) if old == fd => self.ctl(libc::EPOLL_CTL_MOD, fd, events, CONN),
            _ => self
                .ctl(libc::EPOLL_CTL_ADD, fd, events, CONN)
                // A new connection may reuse the old one's number before the set noticed.
                .or_else(|_| self.ctl(libc::EPOLL_CTL_MOD, fd, events, CONN)),
        };
        match result {
            Ok(()) => self.conn = Some((fd, events)),
            Err(err) => {
                self.conn = None;
                tracing::warn!(%err, "epoll_ctl on the relay connection failed");
            }
        }
    }

    /// Forgets the connection (it is being closed).
    pub fn forget_conn(&mut self) {
        if let Some((fd, _)) = self.conn.take() {
            let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0, CONN);
        }
    }

    /// Waits at most `millis` for the connection or (when `ring`) the ring buffer.
    pub fn wait(&mut self, millis: u16, ring: bool) -> io::Result<Ready> {
        self.watch_ring(ring);
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: `events` is writable for the 2 entries passed.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                2,
                libc::c_int::from(millis),
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return Err(io::Error::last_os_error());
        };
        let mut ready = Ready::default();
        for event in events.iter().take(n) {
            match event.u64 {
                CONN => ready.conn = event.events,
                _ => ready.ring = true,
            }
        }
        Ok(ready)
    }
}

#[cfg(test)]
mod tests {
    use std::os::{fd::AsFd as _, unix::net::UnixDatagram};

    use super::*;

    #[test]
    fn a_wait_returns_what_is_ready_and_a_ring_not_watched_is_left_out() {
        let (ours, theirs) = UnixDatagram::pair().expect("pair");
        let (ring_w, ring_r) = UnixDatagram::pair().expect("pair");
        let mut set = WaitSet::new().expect("epoll");
        set.add_ring(ring_r.as_fd()).expect("ring added");
        set.watch_conn(Some(ours.as_fd()), libc::EPOLLIN as u32);
        // Nothing ready: the wait times out.
        assert_eq!(set.wait(10, true).expect("wait"), Ready::default());
        // The "ring" readable: found, and again while unread (level-triggered).
        ring_w.send(b"event").expect("send");
        for _ in 0..2 {
            assert_eq!(
                set.wait(1000, true).expect("wait"),
                Ready {
                    conn: 0,
                    ring: true
                }
            );
        }
        // Not watched: a wait passes it by.
        assert_eq!(set.wait(10, false).expect("wait"), Ready::default());
        // The connection readable, and writable once asked for.
        theirs.send(b"hi").expect("send");
        let ready = set.wait(1000, false).expect("wait");
        assert_eq!(ready.conn, libc::EPOLLIN as u32);
        set.watch_conn(Some(ours.as_fd()), (libc::EPOLLIN | libc::EPOLLOUT) as u32);
        let ready = set.wait(1000, false).expect("wait");
        assert_eq!(ready.conn, (libc::EPOLLIN | libc::EPOLLOUT) as u32);
        // A closed connection leaves the set; a new one is added.
        set.forget_conn();
        drop(ours);
        let (again, theirs) = UnixDatagram::pair().expect("pair");
        set.watch_conn(Some(again.as_fd()), libc::EPOLLIN as u32);
        theirs.send(b"hi").expect("send");
        assert_eq!(
            set.wait(1000, false).expect("wait").conn,
            libc::EPOLLIN as u32
        );
    }
}
