//! The SOCK_SEQPACKET Unix socket under the protocol: one datagram = one encoded message plus up
//! to [`MAX_FDS_PER_MESSAGE`] file descriptors (SCM_RIGHTS). Datagram boundaries are kept by the
//! kernel, so no framing is needed, and a datagram larger than the reader's buffer is detected
//! (MSG_TRUNC) rather than misread.

use std::{
    io::IoSlice,
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use nix::{
    errno::Errno,
    sys::socket::{
        self, AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
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
    /// A whole datagram of `len` bytes is in the buffer. `fds_truncated` (MSG_CTRUNC): the
    /// kernel could not hand over every descriptor that came with it (typically our
    /// RLIMIT_NOFILE is reached); the ones that fit are in `fds`, the rest are lost.
    Message {
        len: usize,
        fds: Vec<OwnedFd>,
        fds_truncated: bool,
    },
    /// The datagram was `len` bytes, more than the buffer holds; its content is discarded.
    Truncated { len: usize, fds: Vec<OwnedFd> },
    /// The peer closed the connection (or shut down its sending side).
    Closed,
}

/// Most descriptors one datagram can carry (the kernel's SCM_MAX_FD).
const SCM_MAX_FD: usize = 253;

/// Receives one datagram into `buf` (blocking). Received descriptors are owned at once, so
/// none leaks whatever the caller decides about the message, also when the kernel could install
/// only some of them (MSG_CTRUNC, reported as `fds_truncated`).
///
/// Written on libc's `recvmsg` rather than nix's: nix refuses to iterate the control messages of
/// a datagram flagged MSG_CTRUNC, and the descriptors the kernel did install would leak, keeping
/// the table full for good.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Received, Errno> {
    let fd_bytes = u32::try_from(SCM_MAX_FD * std::mem::size_of::<libc::c_int>()).unwrap_or(0);
    // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    // u64 elements: the control buffer must be aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid (no name, no iovecs, no control); filled below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `iov` (covering `buf`) and `control`, all alive and writable for
    // the whole call and sized as stated in `msg`.
    let received = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_TRUNC | libc::MSG_CMSG_CLOEXEC,
        )
    };
    let len = usize::try_from(received).map_err(|_| Errno::last())?;
    let fds_truncated = msg.msg_flags & libc::MSG_CTRUNC != 0;
    let truncated = msg.msg_flags & libc::MSG_TRUNC != 0;
    let fds = owned_rights(&msg);
    if len == 0 && fds.is_empty() && !fds_truncated {
        return Ok(Received::Closed);
    }
    if truncated || len > buf.len() {
        return Ok(Received::Truncated { len, fds });
    }
    Ok(Received::Message {
        len,
        fds,
        fds_truncated,
    })
}

/// Takes ownership of every descriptor in the SCM_RIGHTS messages of a received `msg`, never
/// reading past the control bytes the kernel reported (`msg_controllen`).
fn owned_rights(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    #[allow(
        clippy::unnecessary_cast,
        reason = "msg_controllen is usize with glibc, u32 with musl"
    )]
    let control_len = msg.msg_controllen as usize;
    let control_end = (msg.msg_control as usize).saturating_add(control_len);
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR/NXTHDR only return headers that lie
    // within msg_control..msg_control+msg_controllen (or null).
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: non-null headers from CMSG_FIRSTHDR/NXTHDR are inside the control buffer,
        // which is aligned for cmsghdr.
        let header = unsafe { &*cmsg };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_DATA is pointer arithmetic within the header's message.
            let data = unsafe { libc::CMSG_DATA(cmsg) };
            let data_len = (header.cmsg_len as usize)
                .saturating_sub(data as usize - cmsg as usize)
                .min(control_end.saturating_sub(data as usize));
            for i in 0..data_len / std::mem::size_of::<libc::c_int>() {
                // SAFETY: index i lies within data_len bytes of the control buffer; the data
                // need not be aligned for c_int, hence read_unaligned.
                let fd = unsafe { std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i)) };
                if fd >= 0 {
                    // SAFETY: the kernel just installed this descriptor in our table for us;
                    // nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR; returns null past the last header.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    fds
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    const CHILD: &str = "EMBER_TEST_CTRUNC_CHILD";

    #[test]
    fn recv_reports_descriptors_the_kernel_could_not_install() {
        // Runs `ctrunc_child` in a fresh process: it lowers its own RLIMIT_NOFILE, which must
        // not disturb the other tests of this binary.
        let exe = std::env::current_exe().expect("own test binary");
        let out = std::process::Command::new(exe)
            .args(["--exact", "transport::tests::ctrunc_child", "--nocapture"])
            .args(["--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .expect("run the child test");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("CTRUNC-CHECKED"),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn ctrunc_child() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        // Given a datagram carrying three descriptors and room for just one more in our table
        let (a, b) = pair().expect("socketpair");
        let files: Vec<OwnedFd> = (0..3)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").expect("open /dev/null")))
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(AsFd::as_fd).collect();
        send(a.as_fd(), b"hello", &borrowed, false).expect("send");
        drop(files);
        let probe = nix::unistd::dup(b.as_fd()).expect("dup");
        let lowest_free = u64::try_from(probe.as_raw_fd()).expect("fd >= 0");
        drop(probe);
        let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .expect("getrlimit");
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NOFILE,
            lowest_free + 1,
            hard,
        )
        .expect("setrlimit");
        // When it is received
        let mut buf = [0u8; 64];
        let received = recv(b.as_fd(), &mut buf).expect("recv");
        // Then the message is whole, one descriptor arrived and the loss is reported
        let Received::Message {
            len,
            fds,
            fds_truncated,
        } = received
        else {
            panic!("expected a message, got {received:?}");
        };
        assert_eq!(&buf[..len], b"hello");
        assert_eq!(fds.len(), 1);
        assert!(fds_truncated);
        println!("CTRUNC-CHECKED");
    }
}
