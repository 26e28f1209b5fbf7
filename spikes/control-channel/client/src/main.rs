//! The relay side of the spike: drives the server with the workloads measure.sh times and prints
//! figures. Its capnp-rpc half went with the capnp-rpc server (plain messages were chosen, see SECURITY.md; both are in
//! the commit that added this spike). Usage: spike-client msg PATH latency|load100|flood N|hostile
use std::{
    ffi::CString,
    io,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use capnp::{message::ReaderOptions, serialize};
use spike_common::{
    control_capnp::{reply, request},
    tables::{sample_table, vm_hwm_kib, CHUNK_ROWS, ROW_BYTES},
};

const MIB_ROWS: usize = 1024 * 1024 / ROW_BYTES;

/// One chunked table load: (file id, chunk, chunks, rows).
fn chunks(file_id: u64, table: &[u8]) -> Vec<(u64, u32, u32, &[u8])> {
    let parts: Vec<&[u8]> = table.chunks(CHUNK_ROWS * ROW_BYTES).collect();
    let n = parts.len() as u32;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| (file_id, i as u32, n, p))
        .collect()
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (kind, path, mode) = match &args[..] {
        [_, k, p, m, ..] => (k.as_str(), p.as_str(), m.as_str()),
        _ => bail!("usage: spike-client rpc|msg PATH latency|load100|flood N|hostile"),
    };
    let n: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(2000);
    match kind {
        "msg" => msg_main(path, mode, n),
        _ => bail!("kind must be msg (the rpc client was removed with its server)"),
    }
}

fn median_ms(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "median {:.2} ms (min {:.2}, max {:.2}, n {})",
        ms(v[v.len() / 2]),
        ms(v[0]),
        ms(v[v.len() - 1]),
        v.len()
    )
}

// ---------------------------------------------------------------- (b) plain messages

struct Msg {
    fd: i32,
    replies: mpsc::Receiver<Result<Vec<u8>, ()>>,
    next_id: u64,
}

impl Msg {
    fn connect(path: &str) -> anyhow::Result<Self> {
        // SAFETY: socket/connect on a sockaddr_un we fill in; errors checked.
        let fd = unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as _;
            for (d, s) in addr.sun_path.iter_mut().zip(CString::new(path)?.as_bytes()) {
                *d = *s as _;
            }
            let len = std::mem::size_of::<libc::sockaddr_un>() as u32;
            if fd < 0 || libc::connect(fd, (&raw const addr).cast(), len) < 0 {
                return Err(io::Error::last_os_error()).context("connect");
            }
            fd
        };
        let (tx, rx) = mpsc::channel();
        // Replies are read on their own thread so a flood of requests never deadlocks on them.
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                // SAFETY: recv into our buffer.
                let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
                if r <= 0 {
                    let _ = tx.send(Err(()));
                    return;
                }
                if tx.send(Ok(buf[..r as usize].to_vec())).is_err() {
                    return;
                }
            }
        });
        Ok(Self {
            fd,
            replies: rx,
            next_id: 1,
        })
    }

    fn close(&self) {
        // SAFETY: shutting down our own socket; the reply thread then sees the end and exits.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
    }

    fn send_raw(&self, bytes: &[u8]) -> anyhow::Result<()> {
        // SAFETY: send our buffer; blocks while the server's socket buffer is full (backpressure).
        if unsafe {
            libc::send(
                self.fd,
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        } < 0
        {
            return Err(io::Error::last_os_error()).context("send");
        }
        Ok(())
    }

    fn send(&mut self, build: impl FnOnce(request::Builder)) -> anyhow::Result<()> {
        let mut m = capnp::message::Builder::new_default();
        let mut r = m.init_root::<request::Builder>();
        r.set_id(self.next_id);
        self.next_id += 1;
        build(r);
        self.send_raw(&serialize::write_message_to_words(&m))
    }

    fn load(&mut self, c: (u64, u32, u32, &[u8])) -> anyhow::Result<()> {
        self.send(|r| {
            let mut t = r.init_load_table();
            t.set_file_id(c.0);
            t.set_chunk(c.1);
            t.set_chunks(c.2);
            t.set_rows(c.3);
        })
    }

    /// Waits for `n` replies; returns how many were refusals.
    fn wait(&self, n: usize) -> anyhow::Result<usize> {
        let mut refused = 0;
        for _ in 0..n {
            let bytes = self
                .replies
                .recv()?
                .map_err(|()| anyhow::anyhow!("server closed"))?;
            let m = serialize::read_message_from_flat_slice(&mut &bytes[..], ReaderOptions::new())?;
            if let reply::Refused(_) = m.get_root::<reply::Reader>()?.which()? {
                refused += 1;
            }
        }
        Ok(refused)
    }

    fn status(&mut self) -> anyhow::Result<String> {
        self.send(|mut r| r.set_status(()))?;
        let bytes = self
            .replies
            .recv()?
            .map_err(|()| anyhow::anyhow!("server closed"))?;
        let m = serialize::read_message_from_flat_slice(&mut &bytes[..], ReaderOptions::new())?;
        match m.get_root::<reply::Reader>()?.which()? {
            reply::Status(s) => Ok(show_status(s?)),
            _ => bail!("not a status reply"),
        }
    }
}

fn show_status(s: spike_common::control_capnp::status::Reader) -> String {
    format!(
        "tables_loaded={} rows_loaded={} refused={} pending_bytes={} server_vmhwm_kib={}",
        s.get_tables_loaded(),
        s.get_rows_loaded(),
        s.get_refused(),
        s.get_pending_bytes(),
        s.get_vm_hwm_kib()
    )
}

fn msg_main(path: &str, mode: &str, n: usize) -> anyhow::Result<()> {
    let table = sample_table(MIB_ROWS);
    let mut c = Msg::connect(path)?;
    match mode {
        "latency" => {
            let mut times = Vec::new();
            for i in 0..21u64 {
                let start = Instant::now();
                let parts = chunks(1000 + i, &table);
                let count = parts.len();
                for p in parts {
                    c.load(p)?;
                }
                if c.wait(count)? != 0 {
                    bail!("a valid table was refused");
                }
                if i > 0 {
                    times.push(start.elapsed()); // the first load warms up
                }
            }
            println!("latency 1 MiB: {}", median_ms(times));
        }
        "load100" => {
            for id in 1..=100 {
                let parts = chunks(id, &table);
                let count = parts.len();
                for p in parts {
                    c.load(p)?;
                }
                c.wait(count)?;
            }
        }
        "flood" => flood_msg(&mut c, &table, n)?,
        "hostile" => hostile_msg(path, &mut c, &table)?,
        _ => bail!("unknown mode {mode}"),
    }
    println!("status: {} client_vmhwm_kib={}", c.status()?, vm_hwm_kib());
    Ok(())
}

/// Sends `n` chunks without waiting for any reply (a table cycled under new ids).
fn flood_msg(c: &mut Msg, table: &[u8], n: usize) -> anyhow::Result<()> {
    let parts = chunks(0, table);
    let start = Instant::now();
    for i in 0..n {
        let (_, chunk, count, rows) = parts[i % parts.len()];
        c.load(((i / parts.len()) as u64 + 1, chunk, count, rows))?;
    }
    let sent = start.elapsed();
    let refused = c.wait(n)?;
    println!(
        "flood: {n} chunks ({} MiB) sent in {:.0} ms, all acked after {:.0} ms, refused {refused}",
        (n * CHUNK_ROWS * ROW_BYTES) >> 20,
        sent.as_secs_f64() * 1e3,
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// Malformed bytes, an oversized datagram, an unsorted table, a chunk out of order, a
/// disconnect mid-table; then a valid table must still load.
fn hostile_msg(path: &str, c: &mut Msg, table: &[u8]) -> anyhow::Result<()> {
    c.send_raw(&[0xff; 64])?;
    c.send_raw(&vec![0u8; 200 * 1024])?;
    let mut unsorted = table[..CHUNK_ROWS * ROW_BYTES].to_vec();
    unsorted.swap(0, 12);
    c.load((7, 0, 1, &unsorted))?;
    c.load((8, 1, 2, &table[..ROW_BYTES * 10]))?;
    let refused = c.wait(4)?;
    println!("hostile: {refused} of 4 refused");
    if refused != 4 {
        bail!("the server accepted a bad request");
    }
    c.close();
    {
        let mut gone = Msg::connect(path)?;
        gone.load((9, 0, 5, &table[..CHUNK_ROWS * ROW_BYTES]))?;
        gone.wait(1)?;
        gone.close(); // mid-table: the disconnect case
    }
    std::thread::sleep(Duration::from_millis(50));
    *c = Msg::connect(path)?;
    let parts = chunks(10, table);
    let count = parts.len();
    for p in parts {
        c.load(p)?;
    }
    let refused = c.wait(count)?;
    println!("hostile: valid table after them refused: {refused}");
    if refused != 0 {
        bail!("a valid table was refused after the hostile requests");
    }
    Ok(())
}
