//! Sends unwind tables to the sampler: with `--unwind dwarf`, every
//! executable file a sampler passes is compiled ([`super::compile`]) on one worker thread and
//! its encoded table sent back on that sampler's connection as `unwindTableChunk` messages of at
//! most [`MAX_UNWIND_CHUNK_BYTES`], in order, one table after another.
//!
//! The worker runs off the driver's thread (compiling libc takes tens of milliseconds) and takes
//! jobs from a bounded queue: when it falls behind, further files are skipped (counted) and
//! offered again later, never queued without bound. It sends blocking: a sampler that reads slowly slows only this thread.
//! Each job holds the connection and only a `Weak` handle on the session's descriptor of the
//! file: a queued job never keeps open a file the session has closed (up to [`QUEUE`] jobs wait,
//! and each used to hold a duplicate). A job whose file is gone when the worker reaches it is
//! skipped and counted (`files_gone`); the descriptor is held only while its table is built.
//!
//! Before a table is sent, the connection's [`Budget`] decides whether it fits the sampler's
//! rows within its file owner's fair share, and which tables the sampler must drop first
//! (`dropUnwindTable`, sent ahead of it on the same connection); a file the queue had no room
//! for is offered again at the next batch, not forgotten (`budget.rs`).
//!
//! With a state directory, tables come from the on-disk [`Cache`] (verified against the file's
//! CFI by SHA-256, see `cache.rs`) and new ones are stored there, so a restarted relay does not
//! recompile. After each burst of work the worker logs one line with its running totals: tables
//! from the cache, compiled, cache files found unusable (corrupt or from other input: ignored
//! and rewritten) and cache writes that failed.

use std::{
    collections::HashMap,
    fs::File,
    os::{
        fd::{AsFd, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    sync::{Arc, Mutex, PoisonError, Weak},
    thread,
    time::Instant,
};

use ember_protocol::{
    encode_relay_message, transport, RelayMessage, UnwindTableChunk, MAX_UNWIND_CHUNK_BYTES,
};

use super::{
    budget::{Admission, Budget},
    cache::{Cache, Outcome},
    compile,
    queue::{JobQueue, Keyed, QUEUE},
    recent::{Kept, Recent},
    Error, Limits, UnwindTable,
};
use crate::symbolize::FileKey;

/// How user stacks are walked; `dwarf` makes the relay compile and send unwind tables.
pub(crate) use ember_common::UnwindMode;

/// Most bytes of cached tables kept under the state directory (oldest used removed first).
pub(crate) const CACHE_MAX_BYTES: u64 = 256 << 20;
/// The cache's folder under the state directory.
const CACHE_DIR: &str = "unwind-cache";

/// The table cache under `state_dir`, or `None` (logged) when it cannot be used.
pub(crate) fn open_cache(state_dir: &std::path::Path) -> Option<Cache> {
    let dir = state_dir.join(CACHE_DIR);
    match Cache::open(&dir, CACHE_MAX_BYTES, Limits::default()) {
        Ok(cache) => {
            tracing::info!(
                dir = %dir.display(),
                max_bytes = CACHE_MAX_BYTES,
                "unwind tables cached on disk"
            );
            Some(cache)
        }
        Err(err) => {
            tracing::warn!(
                dir = %dir.display(),
                %err,
                "cannot use the unwind-table cache; tables are compiled on every connection \
                 (fix the directory's ownership or pass another --state-dir)"
            );
            None
        }
    }
}

/// The state directory of `run` when `--state-dir` is not given: `$STATE_DIRECTORY` (set by
/// systemd's `StateDirectory=`; the first of a colon-separated list), else
/// `/var/lib/ember-relay` if this user may write there, else none (one INFO line says so).
pub(crate) fn default_state_dir() -> Option<std::path::PathBuf> {
    if let Some(dir) = std::env::var_os("STATE_DIRECTORY") {
        let first = dir.to_string_lossy().split(':').next().map(str::to_owned);
        if let Some(first) = first.filter(|d| !d.is_empty()) {
            return Some(first.into());
        }
    }
    let fallback = std::path::Path::new("/var/lib/ember-relay");
    let writable = nix::unistd::access(fallback, nix::unistd::AccessFlags::W_OK).is_ok();
    if writable {
        return Some(fallback.to_path_buf());
    }
    tracing::info!(
        "no state directory ($STATE_DIRECTORY unset, /var/lib/ember-relay not writable): \
         unwind tables are not cached on disk; pass --state-dir to cache them"
    );
    None
}

/// One file to compile and send.
pub(crate) struct Job {
    /// The sampler's connection (a duplicate of the source's descriptor).
    pub control: Arc<OwnedFd>,
    pub file_id: u64,
    /// The session's descriptor of the file; dead once the session closed it.
    pub file: Weak<OwnedFd>,
    /// The connection's account of what the sampler holds (`budget.rs`).
    pub budget: Arc<Mutex<Budget>>,
    /// The relay's `fstat` identity of the file, under which its table is kept in memory a
    /// while (`recent.rs`); `None`: not kept.
    pub key: Option<FileKey>,
}

impl Keyed for Job {
    /// The connection (its budget) and the file.
    type Key = (usize, u64);
    fn key(&self) -> (usize, u64) {
        (job_connection(&self.budget), self.file_id)
    }
}

/// The connection part of a job's queue key: its budget's address.
pub(crate) fn job_connection(budget: &Arc<Mutex<Budget>>) -> usize {
    Arc::as_ptr(budget) as usize
}

/// The driver's handle on the worker.
pub(crate) struct TableSender {
    jobs: Arc<JobQueue<Job>>,
    /// Files not compiled because the worker was behind.
    pub skipped: u64,
}

impl TableSender {
    /// Starts the worker thread; with `cache`, tables are looked up and stored there.
    pub(crate) fn spawn(cache: Option<Cache>) -> std::io::Result<Self> {
        let jobs = Arc::new(JobQueue::new(QUEUE));
        let queue = Arc::clone(&jobs);
        thread::Builder::new()
            .name("unwind".into())
            .spawn(move || worker(&queue, cache.as_ref()))?;
        Ok(Self { jobs, skipped: 0 })
    }

    /// Queues a file with its heat (`queue.rs`); when the queue is full the coldest file is
    /// left out, and the budget offers it again at the connection's next batch.
    pub(crate) fn offer(&mut self, job: Job, heat: u64) {
        lock(&job.budget).queued(job.file_id);
        let cost = job.key.map_or(u64::MAX, |key| key.size);
        if let Some(left_out) = self.jobs.push(job, heat, cost) {
            lock(&left_out.budget).skipped(left_out.file_id, Instant::now());
            self.skipped += 1;
            tracing::debug!(
                skipped = self.skipped,
                "unwind worker behind: file offered again at the next batch"
            );
        }
    }

    /// Raises the heat of queued files of one connection (`budget`): heat by file id.
    pub(crate) fn reheat(&self, budget: &Arc<Mutex<Budget>>, heat: &HashMap<u64, u64>) {
        let connection = job_connection(budget);
        let keyed: HashMap<(usize, u64), u64> = heat
            .iter()
            .map(|(&file_id, &h)| ((connection, file_id), h))
            .collect();
        self.jobs.reheat(&keyed);
    }
}

impl Drop for TableSender {
    fn drop(&mut self) {
        self.jobs.close();
    }
}

/// How long the idle worker lets a burst of files gather before it picks the hottest: a sampler
/// describes the processes of its first samples (and a restarted build its new ones) within a few
/// milliseconds, and the first file to arrive is not the one to compile first.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

/// The worker's running totals, logged after each burst of work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheStats {
    pub hits: u64,
    pub compiled: u64,
    /// Cache files found corrupt or compiled from other input: ignored, then rewritten.
    pub rewritten: u64,
    pub store_errors: u64,
    /// Queued files the session had closed before the worker reached them: skipped.
    pub files_gone: u64,
    /// Tables taken from the ones kept in memory (the same file passed again under a new id).
    pub recent_hits: u64,
}

/// Most bytes of compiled tables the worker keeps in memory (`recent.rs`).
const RECENT_MAX_BYTES: u64 = 64 << 20;

fn worker(queue: &JobQueue<Job>, cache: Option<&Cache>) {
    let limits = Limits::default();
    let (mut logged_too_large, mut logged_over_share, mut logged_cfi_refused) =
        (false, false, false);
    let mut stats = CacheStats::default();
    let mut logged = stats;
    let mut recent = Recent::new(RECENT_MAX_BYTES);
    loop {
        let job = match queue.try_pop() {
            Some(job) => job,
            None => {
                if stats != logged {
                    logged = stats;
                    tracing::info!(
                        cache = cache.is_some(),
                        cache_hits = stats.hits,
                        compiled = stats.compiled,
                        kept_in_memory = stats.recent_hits,
                        cache_files_rewritten = stats.rewritten,
                        cache_store_errors = stats.store_errors,
                        files_gone = stats.files_gone,
                        "unwind tables sent (running totals)"
                    );
                }
                if !queue.wait() {
                    return;
                }
                thread::sleep(SETTLE);
                continue;
            }
        };
        let Some(file) = open_job_file(&job, &mut stats) else {
            continue;
        };
        let built = match job.key.and_then(|key| recent.get(&key)) {
            Some(kept) => {
                stats.recent_hits += 1;
                Ok(kept)
            }
            None => table_for(job.file_id, &file, cache, &limits, &mut stats).map(
                |(table, vaddr_minus_offset)| {
                    // Encoded once, the rows freed here: only the bytes are sent and kept.
                    let kept = Kept::of(&table, vaddr_minus_offset);
                    if let Some(key) = job.key {
                        recent.put(key, kept.clone());
                    }
                    kept
                },
            ),
        };
        // Charged to the file's owner as the kernel reports it; unknown owners share one part.
        let owner = file.metadata().map_or(u32::MAX, |m| m.uid());
        drop(file);
        let table = match built {
            Ok(built) => built,
            Err(err) => {
                no_table(&job.budget, job.file_id, &err, &mut logged_cfi_refused);
                continue;
            }
        };
        let rows = table.rows;
        let admission = lock(&job.budget).admit(job.file_id, owner, rows, Instant::now());
        match admission {
            Admission::Send { drop } => {
                for file_id in drop {
                    tracing::debug!(file_id, owner, "unwind table withdrawn to make room");
                    send(&job, &RelayMessage::DropUnwindTable { file_id });
                }
                send_table(&job, &table);
            }
            Admission::TooLarge { rows, limit } => {
                if !std::mem::replace(&mut logged_too_large, true) {
                    tracing::warn!(
                        file_id = job.file_id,
                        owner,
                        rows,
                        limit,
                        "an unwind table larger than half of the sampler's rows is not \
                         sent: its binary unwinds by frame pointers (counted in \
                         ember_relay_unwind_tables_too_large_total; raise the sampler's \
                         --unwind-memory-bytes if such binaries matter)"
                    );
                }
            }
            Admission::OverShare { owner, rows, share } => {
                if !std::mem::replace(&mut logged_over_share, true) {
                    tracing::warn!(
                        file_id = job.file_id,
                        owner,
                        rows,
                        share,
                        "an unwind table does not fit its file owner's fair share of the \
                         sampler's rows: not sent now, offered again when its binary is sampled \
                         (counted in ember_relay_unwind_tables_over_share_total; raise the \
                         sampler's --unwind-memory-bytes if this is not one user flooding it)"
                    );
                }
            }
        }
    }
}

/// No table for `file_id`: not offered again; a refused compressed section is counted (and
/// logged once, at warning level, per worker).
fn no_table(budget: &Mutex<Budget>, file_id: u64, err: &Error, logged_cfi_refused: &mut bool) {
    if let Error::BadCompression { .. } = err {
        if !std::mem::replace(logged_cfi_refused, true) {
            tracing::warn!(
                file_id,
                %err,
                "a binary's compressed CFI was refused: it unwinds by frame pointers (counted \
                 in ember_relay_unwind_cfi_refused_total)"
            );
        }
        lock(budget).cfi_refused(file_id);
    } else {
        tracing::debug!(file_id, %err, "no unwind table");
        lock(budget).no_table(file_id);
    }
}

/// The budget, also when a thread panicked while holding it (its state is still consistent:
/// every change is one map update).
pub(crate) fn lock(budget: &Mutex<Budget>) -> std::sync::MutexGuard<'_, Budget> {
    budget.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends one message on the job's connection; false when that failed.
fn send(job: &Job, message: &RelayMessage) -> bool {
    let datagram = encode_relay_message(message);
    match transport::send(job.control.as_fd(), &datagram, &[], false) {
        Ok(_) => true,
        Err(err) => {
            tracing::debug!(file_id = job.file_id, %err, "sending to the sampler failed");
            false
        }
    }
}

/// The job's file, duplicated from the session's descriptor while that is still open; `None`
/// (counted in `files_gone`) once the session closed it.
fn open_job_file(job: &Job, stats: &mut CacheStats) -> Option<File> {
    let dup = job.file.upgrade().map(|fd| fd.try_clone());
    match dup {
        Some(Ok(fd)) => Some(File::from(fd)),
        Some(Err(err)) => {
            tracing::debug!(file_id = job.file_id, %err, "cannot duplicate a passed file");
            None
        }
        None => {
            stats.files_gone += 1;
            tracing::debug!(
                file_id = job.file_id,
                "file closed before its table was built"
            );
            None
        }
    }
}

/// The table of the job's file: from the cache, else compiled (and stored when there is one).
fn table_for(
    file_id: u64,
    file: &File,
    cache: Option<&Cache>,
    limits: &Limits,
    stats: &mut CacheStats,
) -> Result<(UnwindTable, i64), Error> {
    let Some(cache) = cache else {
        let compiled = compile(file, limits)?;
        stats.compiled += 1;
        return Ok((compiled.table, compiled.vaddr_minus_offset));
    };
    let cached = cache.get_or_compile(file)?;
    match &cached.outcome {
        Outcome::Hit => stats.hits += 1,
        Outcome::Compiled {
            stored,
            replaced_bad,
            ..
        } => {
            stats.compiled += 1;
            stats.rewritten += u64::from(*replaced_bad);
            if let Err(err) = stored {
                stats.store_errors += 1;
                tracing::debug!(key = %cached.key, %err, "unwind table not cached");
            }
        }
    }
    tracing::debug!(
        file_id,
        key = %cached.key,
        hit = matches!(cached.outcome, Outcome::Hit),
        "unwind table from the cache directory"
    );
    Ok((cached.table, cached.vaddr_minus_offset))
}

/// Sends one table in chunks on the job's connection.
fn send_table(job: &Job, table: &Kept) {
    let bytes = &table.encoded;
    let mut parts = 0;
    for message in chunks(job.file_id, bytes, table.vaddr_minus_offset) {
        if !send(job, &message) {
            break;
        }
        parts += 1;
    }
    tracing::debug!(
        file_id = job.file_id,
        rows = table.rows,
        bytes = bytes.len(),
        chunks = parts,
        "unwind table sent"
    );
}

/// An encoded table cut into chunk messages, in order, each made when taken (one chunk's copy
/// at a time, not a second copy of the table).
pub(crate) fn chunks(
    file_id: u64,
    bytes: &[u8],
    vaddr_minus_offset: i64,
) -> impl Iterator<Item = RelayMessage> + '_ {
    let parts = bytes.chunks(MAX_UNWIND_CHUNK_BYTES);
    // A table is at most a few tens of MiB: far fewer than u32::MAX chunks.
    let count = u32::try_from(parts.len()).unwrap_or(u32::MAX);
    parts.zip(0u32..).map(move |(data, chunk)| {
        RelayMessage::UnwindTableChunk(UnwindTableChunk {
            file_id,
            chunk,
            chunks: count,
            data: data.to_vec(),
            vaddr_minus_offset,
        })
    })
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, sync::atomic::Ordering};

    use super::*;
    use crate::unwind::{
        budget::BudgetCounters,
        synthetic::{elf_with_debug_frame, Form},
    };

    /// The error compiling `bytes` as a file gives.
    fn compile_error(bytes: &[u8]) -> Error {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        compile(&file, &Limits::default()).unwrap_err()
    }

    #[test]
    fn a_refused_compressed_section_is_counted_and_other_misses_are_not() {
        // Given: a zip bomb claiming 4 KiB, a section claiming more than its stream holds, and
        // a file that is not ELF.
        let counters = Arc::new(BudgetCounters::default());
        let budget = Mutex::new(Budget::new(1000, 10, Arc::clone(&counters)));
        let mut logged = false;
        let bomb = elf_with_debug_frame(&vec![0; 16 << 20], Form::ElfZlib, 4096 - (16 << 20));
        let short = elf_with_debug_frame(&[1; 4000], Form::GnuZlib, 100);
        let garbage = compile_error(b"not an ELF file at all, but long enough for a header ....");
        // When
        for (id, err) in [
            (1, compile_error(&bomb)),
            (2, compile_error(&short)),
            (3, garbage),
        ] {
            no_table(&budget, id, &err, &mut logged);
        }
        // Then: the two refusals counted (and logged), the plain miss not.
        assert_eq!(counters.cfi_refused.load(Ordering::Relaxed), 2);
        assert!(logged);
    }

    #[test]
    fn a_table_is_cut_into_ordered_chunks_that_concatenate_to_it() {
        // Given a table of 2.5 chunks, When cut, Then 3 chunks in order, each within the bound.
        let bytes: Vec<u8> = (0..MAX_UNWIND_CHUNK_BYTES * 5 / 2)
            .map(|i| i as u8)
            .collect();
        let messages: Vec<RelayMessage> = chunks(42, &bytes, 0x400000).collect();
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
        let control = Arc::new(ours);
        let session_fd = Arc::new(OwnedFd::from(exe));
        let closed = Arc::new(OwnedFd::from(
            File::open("/proc/self/exe").expect("own exe"),
        ));
        let closed_handle = Arc::downgrade(&closed);
        drop(closed);
        let mut sender = TableSender::spawn(None).expect("worker");
        let budget = Arc::new(Mutex::new(Budget::new(0, 0, Arc::default())));
        // A job whose file the session closed while it waited comes first: it is skipped.
        sender.offer(
            Job {
                control: Arc::clone(&control),
                file_id: 4,
                file: closed_handle,
                budget: Arc::clone(&budget),
                key: None,
            },
            0,
        );
        sender.offer(
            Job {
                control,
                file_id: 5,
                file: Arc::downgrade(&session_fd),
                budget,
                key: None,
            },
            0,
        );
        let mut joined = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let message = recv_relay_message(&theirs, &mut buf);
            let RelayMessage::UnwindTableChunk(chunk) = message else {
                panic!("not a chunk");
            };
            assert_eq!(chunk.file_id, 5, "a table was sent for a closed file");
            joined.extend_from_slice(&chunk.data);
            if chunk.chunk + 1 == chunk.chunks {
                break;
            }
        }
        assert_eq!(joined, expected);
    }

    #[test]
    fn a_table_that_displaces_another_is_sent_after_the_drop_of_that_one() {
        // Given a sampler whose table map holds one table, and two files (this test binary
        // twice) offered one after the other.
        let (ours, theirs) = transport::pair().expect("socketpair");
        let control = Arc::new(ours);
        let budget = Arc::new(Mutex::new(Budget::new(u32::MAX, 1, Arc::default())));
        let files: Vec<Arc<OwnedFd>> = (0..2)
            .map(|_| {
                Arc::new(OwnedFd::from(
                    File::open("/proc/self/exe").expect("own exe"),
                ))
            })
            .collect();
        let mut sender = TableSender::spawn(None).expect("worker");
        for (file_id, fd) in [5u64, 6].into_iter().zip(&files) {
            sender.offer(
                Job {
                    control: Arc::clone(&control),
                    file_id,
                    file: Arc::downgrade(fd),
                    budget: Arc::clone(&budget),
                    key: None,
                },
                0,
            );
        }
        // When the peer reads until the second table's last chunk.
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let message = recv_relay_message(&theirs, &mut buf);
            match message {
                RelayMessage::UnwindTableChunk(c) if c.chunk + 1 == c.chunks => {
                    seen.push(format!("table {}", c.file_id));
                    if c.file_id == 6 {
                        break;
                    }
                }
                RelayMessage::UnwindTableChunk(_) => {}
                RelayMessage::DropUnwindTable { file_id } => seen.push(format!("drop {file_id}")),
                other => panic!("unexpected {other:?}"),
            }
        }
        // Then the first table was dropped before the second was sent.
        assert_eq!(seen, ["table 5", "drop 5", "table 6"]);
    }

    #[test]
    fn a_queued_job_does_not_keep_a_closed_file_open() {
        // Given a job queued for a file, When the session closes that file before the worker
        // reaches it, Then the descriptor is closed at once (the job holds no duplicate) and
        // the worker skips the job and counts it.
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("queued-binary");
        std::fs::write(&path, b"\x7fELF").expect("write a file");
        let fd = Arc::new(OwnedFd::from(File::open(&path).expect("open it")));
        let (control, _peer) = transport::pair().expect("socketpair");
        let job = Job {
            control: Arc::new(control),
            file_id: 9,
            file: Arc::downgrade(&fd),
            budget: Arc::new(Mutex::new(Budget::new(0, 0, Arc::default()))),
            key: None,
        };
        let mut stats = CacheStats::default();
        assert!(
            open_job_file(&job, &mut stats).is_some(),
            "open file usable"
        );
        assert_eq!(descriptors_of(&path), 1);
        drop(fd);
        assert_eq!(
            descriptors_of(&path),
            0,
            "the queued job kept the file open"
        );
        assert!(open_job_file(&job, &mut stats).is_none());
        assert_eq!(stats.files_gone, 1);
    }

    /// How many of this process's descriptors refer to `path`.
    fn descriptors_of(path: &std::path::Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target == path)
            .count()
    }

    /// The next message the peer end `theirs` receives, decoded; panics when the connection
    /// ended first.
    fn recv_relay_message(theirs: &OwnedFd, buf: &mut [u8]) -> RelayMessage {
        let transport::Received::Message { len, .. } =
            transport::recv(theirs.as_fd(), buf).expect("recv")
        else {
            panic!("connection ended early");
        };
        ember_protocol::decode_relay_message(&buf[..len], &ember_protocol::Limits::default())
            .expect("decodes")
    }
}
