//! (b) Plain Cap'n Proto messages on a SOCK_SEQPACKET socket, sampler side: one `Request` per
//! datagram, one `Reply` per request, handled in order on the one thread the sampler has. A
//! datagram is read into a fixed 64 KiB buffer (a larger one is truncated by the kernel, seen as
//! MSG_TRUNC and refused); the kernel's socket buffer is the only queue, so a relay that sends
//! faster than this loop loads blocks in its own sendmsg. Usage: spike-msg-server PATH [DELAY_US]
use std::{ffi::CString, io};

use capnp::{message::ReaderOptions, serialize};
use spike_common::{
    control_capnp::{reply, request},
    tables::{vm_hwm_kib, Tables},
};

const MAX_DATAGRAM: usize = 64 * 1024;

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/tmp/spike-msg.sock".into());
    let mut tables = Tables::new(args.next().and_then(|d| d.parse().ok()).unwrap_or(0));
    let listener = listen(&path)?;
    eprintln!("msg-server: listening on {path}");
    loop {
        // SAFETY: accept4 on our listening socket; the returned fd is owned below.
        let conn = unsafe {
            libc::accept4(
                listener,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if conn < 0 {
            return Err(io::Error::last_os_error());
        }
        serve(conn, &mut tables);
        tables.disconnected();
        // SAFETY: conn is ours and no longer used.
        unsafe { libc::close(conn) };
    }
}

/// Serves one connection until it closes; every bad request is refused, counted and answered.
fn serve(conn: i32, tables: &mut Tables) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        // SAFETY: recv into our buffer of MAX_DATAGRAM bytes.
        let n = unsafe { libc::recv(conn, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_TRUNC) };
        if n <= 0 {
            return; // closed (or an error): the relay is gone, mid-table or not.
        }
        let reply = if n as usize > buf.len() {
            tables.refused += 1;
            build_reply(
                0,
                Err(format!("datagram of {n} bytes over {MAX_DATAGRAM}")),
                tables,
            )
        } else {
            handle(&buf[..n as usize], tables)
        };
        // SAFETY: send our encoded reply; a relay that does not read them blocks us, not the kernel.
        if unsafe { libc::send(conn, reply.as_ptr().cast(), reply.len(), libc::MSG_NOSIGNAL) } < 0 {
            return;
        }
    }
}

fn handle(datagram: &[u8], tables: &mut Tables) -> Vec<u8> {
    let options = *ReaderOptions::new()
        .traversal_limit_in_words(Some(MAX_DATAGRAM / 8))
        .nesting_limit(8);
    let decoded = (|| -> capnp::Result<(u64, Result<bool, String>)> {
        let message = serialize::read_message_from_flat_slice(&mut &datagram[..], options)?;
        let req = message.get_root::<request::Reader>()?;
        let outcome = match req.which()? {
            request::LoadTable(t) => {
                let t = t?;
                let rows = t.get_rows()?;
                tables
                    .load_chunk(t.get_file_id(), t.get_chunk(), t.get_chunks(), rows)
                    .map(|()| false)
            }
            request::DropTable(id) => {
                tables.drop_table(id);
                Ok(false)
            }
            request::Status(()) => Ok(true),
        };
        Ok((req.get_id(), outcome))
    })();
    match decoded {
        Ok((id, outcome)) => build_reply(id, outcome, tables),
        Err(e) => {
            tables.refused += 1;
            build_reply(0, Err(format!("malformed: {e}")), tables)
        }
    }
}

/// `Ok(true)` = a status reply, `Ok(false)` = ok, `Err` = refused with the reason.
fn build_reply(id: u64, outcome: Result<bool, String>, tables: &Tables) -> Vec<u8> {
    let mut message = capnp::message::Builder::new_default();
    let mut r = message.init_root::<reply::Builder>();
    r.set_id(id);
    match outcome {
        Ok(false) => r.set_ok(()),
        Err(why) => r.set_refused(why.as_str()),
        Ok(true) => {
            let mut s = r.init_status();
            s.set_tables_loaded(tables.tables_loaded);
            s.set_rows_loaded(tables.rows_loaded);
            s.set_refused(tables.refused);
            s.set_pending_bytes(tables.pending_bytes());
            s.set_vm_hwm_kib(vm_hwm_kib());
        }
    }
    serialize::write_message_to_words(&message)
}

fn listen(path: &str) -> io::Result<i32> {
    let _ = std::fs::remove_file(path);
    // SAFETY: plain socket/bind/listen on a sockaddr_un we fill in; errors checked.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as _;
        let c = CString::new(path).map_err(io::Error::other)?;
        for (d, s) in addr.sun_path.iter_mut().zip(c.as_bytes()) {
            *d = *s as _;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as u32;
        if fd < 0 || libc::bind(fd, (&raw const addr).cast(), len) < 0 || libc::listen(fd, 1) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}
