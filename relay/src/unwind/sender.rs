//! Sends unwind tables to the sampler (issue 10, step 2): with `--unwind dwarf`, every
//! executable file a sampler passes is compiled ([`super::compile`]) on one worker thread and
//! its encoded table sent back on that sampler's connection as `unwindTableChunk` messages of at
//! most [`MAX_UNWIND_CHUNK_BYTES`], in order, one table after another.
//!
//! The worker runs off the driver's thread (compiling libc takes tens of milliseconds) and takes
//! jobs from a bounded queue: when it falls behind, further files are skipped (counted), never
//! queued without bound. It sends blocking: a sampler that reads slowly slows only this thread.
//! Each job holds its own duplicate of the connection and of the file, dropped when sent.

use std::{
    fs::File,
    os::fd::{AsFd, OwnedFd},
    sync::{
        mpsc::{self, Receiver, SyncSender, TrySendError},
        Arc,
    },
    thread,
};

use ember_protocol::{
    encode_relay_message, transport, RelayMessage, UnwindTableChunk, MAX_UNWIND_CHUNK_BYTES,
};

use super::{compile, Limits};

/// How user stacks are walked; `dwarf` makes the relay compile and send unwind tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum UnwindMode {
    /// Frame pointers only: no tables are compiled or sent.
    #[default]
    Fp,
    /// Compile each passed binary's .eh_frame into a table and send it to the sampler.
    Dwarf,
}

impl UnwindMode {
    /// The value of the sampler's `--unwind` flag.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Fp => "fp",
            Self::Dwarf => "dwarf",
        }
    }
}

/// Files waiting for the worker; more are skipped (counted).
const QUEUE: usize = 256;

/// One file to compile and send.
pub(crate) struct Job {
    /// The sampler's connection (a duplicate of the source's descriptor).
    pub control: Arc<OwnedFd>,
    pub file_id: u64,
    pub file: File,
}

/// The driver's handle on the worker.
pub(crate) struct TableSender {
    jobs: SyncSender<Job>,
    /// Files not compiled because the worker was behind.
    pub skipped: u64,
}

impl TableSender {
    /// Starts the worker thread.
    pub(crate) fn spawn() -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::sync_channel(QUEUE);
        thread::Builder::new()
            .name("unwind".into())
            .spawn(move || worker(&queue))?;
        Ok(Self { jobs, skipped: 0 })
    }

    /// Queues a file unless the worker is behind.
    pub(crate) fn offer(&mut self, job: Job) {
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.skipped += 1;
                tracing::debug!(skipped = self.skipped, "unwind worker behind: file skipped");
            }
        }
    }
}

fn worker(queue: &Receiver<Job>) {
    let limits = Limits::default();
    while let Ok(job) = queue.recv() {
        let compiled = match compile(&job.file, &limits) {
            Ok(compiled) => compiled,
            Err(err) => {
                tracing::debug!(file_id = job.file_id, %err, "no unwind table");
                continue;
            }
        };
        let bytes = compiled.table.encode();
        let messages = chunks(job.file_id, &bytes, compiled.vaddr_minus_offset);
        let parts = messages.len();
        for message in messages {
            let datagram = encode_relay_message(&message);
            if let Err(err) = transport::send(job.control.as_fd(), &datagram, &[], false) {
                tracing::debug!(file_id = job.file_id, %err, "sending an unwind table failed");
                break;
            }
        }
        tracing::debug!(
            file_id = job.file_id,
            rows = compiled.table.rows().len(),
            bytes = bytes.len(),
            chunks = parts,
            elapsed = ?compiled.stats.elapsed,
            "unwind table sent"
        );
    }
}

/// An encoded table cut into chunk messages, in order.
pub(crate) fn chunks(file_id: u64, bytes: &[u8], vaddr_minus_offset: i64) -> Vec<RelayMessage> {
    let parts: Vec<&[u8]> = bytes.chunks(MAX_UNWIND_CHUNK_BYTES).collect();
    // A table is at most a few tens of MiB: far fewer than u32::MAX chunks.
    let count = u32::try_from(parts.len()).unwrap_or(u32::MAX);
    parts
        .into_iter()
        .zip(0u32..)
        .map(|(data, chunk)| {
            RelayMessage::UnwindTableChunk(UnwindTableChunk {
                file_id,
                chunk,
                chunks: count,
                data: data.to_vec(),
                vaddr_minus_offset,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_cut_into_ordered_chunks_that_concatenate_to_it() {
        // Given a table of 2.5 chunks, When cut, Then 3 chunks in order, each within the bound.
        let bytes: Vec<u8> = (0..MAX_UNWIND_CHUNK_BYTES * 5 / 2)
            .map(|i| i as u8)
            .collect();
        let messages = chunks(42, &bytes, 0x400000);
        assert_eq!(messages.len(), 3);
        let mut joined = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            let RelayMessage::UnwindTableChunk(chunk) = message else {
                panic!("not a chunk: {message:?}");
            };
            assert_eq!(
                (chunk.file_id, chunk.chunk, chunk.chunks),
                (42, i as u32, 3)
            );
            assert_eq!(chunk.vaddr_minus_offset, 0x400000);
            assert!(chunk.data.len() <= MAX_UNWIND_CHUNK_BYTES);
            joined.extend_from_slice(&chunk.data);
        }
        assert_eq!(joined, bytes);
    }

    #[test]
    fn a_compiled_table_reaches_the_peer_in_chunks() {
        // Given a socketpair and this test binary, When the worker handles it, Then the peer
        // receives chunks that decode and concatenate to the table compile() gives.
        let (ours, theirs) = transport::pair().expect("socketpair");
        let exe = File::open("/proc/self/exe").expect("own exe");
        let expected = compile(&exe, &Limits::default())
            .expect("compiles")
            .table
            .encode();
        let mut sender = TableSender::spawn().expect("worker");
        sender.offer(Job {
            control: Arc::new(ours),
            file_id: 5,
            file: exe,
        });
        let mut joined = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let transport::Received::Message { len, .. } =
                transport::recv(theirs.as_fd(), &mut buf).expect("recv")
            else {
                panic!("connection ended early");
            };
            let message = ember_protocol::decode_relay_message(
                &buf[..len],
                &ember_protocol::Limits::default(),
            )
            .expect("decodes");
            let RelayMessage::UnwindTableChunk(chunk) = message else {
                panic!("not a chunk");
            };
            joined.extend_from_slice(&chunk.data);
            if chunk.chunk + 1 == chunk.chunks {
                break;
            }
        }
        assert_eq!(joined, expected);
    }
}
