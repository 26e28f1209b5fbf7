//! The SOCK_SEQPACKET Unix socket under the protocol: one datagram = one encoded message plus up
//! to [`MAX_FDS_PER_MESSAGE`] file descriptors (SCM_RIGHTS). Datagram boundaries are kept by the
//! kernel, so no framing is needed, and a datagram larger than the reader's buffer is detected
//! (MSG_TRUNC) rather than misread.

use std::{
    io::{IoSlice, IoSliceMut},
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use nix::{
    errno::Errno,
    sys::socket::{
        self, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
        SockType, UnixAddr,
    },
};

/// Most descriptors sent in one datagram (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS_PER_MESSAGE: usize = 250;

fn seqpacket_socket() -> Result<OwnedFd, Errno> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
}

/// Creates, binds and listens on a SOCK_SEQPACKET socket at `path`, replacing a stale socket file.
pub fn listen(path: &Path) -> Result<OwnedFd, Errno> {
    let fd = seqpacket_socket()?;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt as _;
        if meta.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
    let addr = UnixAddr::new(path.as_os_str().as_bytes())?;
    socket::bind(fd.as_raw_fd(), &addr)?;
    socket::listen(&fd, Backlog::new(16).unwrap_or(Backlog::MAXCONN))?;
    Ok(fd)
}

/// Accepts one connection (blocking).
pub fn accept(listener: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    socket::accept4(listener, SockFlag::SOCK_CLOEXEC)
}

/// Connects to a listening SOCK_SEQPACKET socket at `path`.
pub fn connect(path: &Path) -> Result<OwnedFd, Errno> {
    let fd = seqpacket_socket()?;
    let addr = UnixAddr::new(path.as_os_str().as_bytes())?;
    socket::connect(fd.as_raw_fd(), &addr)?;
    Ok(fd)
}

/// A connected pair, as used by `ember-relay record` to talk to its sampler child.
pub fn pair() -> Result<(OwnedFd, OwnedFd), Errno> {
    socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
}

/// Sends one datagram. `nonblocking` returns `Err(EAGAIN)` instead of waiting for buffer space.
pub fn send(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
    nonblocking: bool,
) -> Result<(), Errno> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage<'_>> = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    let mut flags = MsgFlags::MSG_NOSIGNAL;
    if nonblocking {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    let sent = socket::sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        flags,
        None,
    )?;
    if sent != bytes.len() {
        // Cannot happen for SOCK_SEQPACKET (all or nothing), but never report a partial send as ok.
        return Err(Errno::EMSGSIZE);
    }
    Ok(())
}

/// What one `recv` produced.
#[derive(Debug)]
pub enum Received {
    /// A whole datagram of `len` bytes is in the buffer.
    Message { len: usize, fds: Vec<OwnedFd> },
    /// The datagram was `len` bytes, more than the buffer holds; its content is discarded.
    Truncated { len: usize, fds: Vec<OwnedFd> },
    /// The peer closed the connection (or shut down its sending side).
    Closed,
}

/// Receives one datagram into `buf` (blocking). Received descriptors are owned at once, so
/// none leaks whatever the caller decides about the message.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Received, Errno> {
    let mut cmsg_buf = nix::cmsg_space!([RawFd; 253]);
    let (len, truncated, fds) = {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = socket::recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_buf),
            MsgFlags::MSG_TRUNC | MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = cmsg {
                    for fd in raw {
                        // SAFETY: the kernel just installed this descriptor in our table for us;
                        // nothing else owns it.
                        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
        }
        let truncated = msg.flags.contains(MsgFlags::MSG_TRUNC);
        (msg.bytes, truncated, fds)
    };
    if len == 0 && fds.is_empty() {
        return Ok(Received::Closed);
    }
    if truncated || len > buf.len() {
        return Ok(Received::Truncated { len, fds });
    }
    Ok(Received::Message { len, fds })
}

/// Credentials of the process at the other end of a connected Unix socket.
pub fn peer_credentials(sock: BorrowedFd<'_>) -> Result<(u32, u32, i32), Errno> {
    let cred = socket::getsockopt(&sock, socket::sockopt::PeerCredentials)?;
    Ok((cred.uid(), cred.gid(), cred.pid()))
}

/// Stops sending on `sock`; the peer reads end-of-stream but may still send to us.
pub fn shutdown_write(sock: BorrowedFd<'_>) -> Result<(), Errno> {
    socket::shutdown(sock.as_raw_fd(), socket::Shutdown::Write)
}

/// Asks for a send buffer able to hold one datagram of `bytes`.
pub fn set_send_buffer(sock: BorrowedFd<'_>, bytes: usize) -> Result<(), Errno> {
    socket::setsockopt(&sock, socket::sockopt::SndBuf, &bytes)
}

/// Borrows every fd of a slice of owned fds.
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(|fd| fd.as_fd()).collect()
}
