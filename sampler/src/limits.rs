//! Every bound the sampler puts on what a process it looks at can make it read, hold or send, in
//! one place. Each process is hostile: without these, one process with many long mappings made
//! a single `process` datagram of 4.7 MB that no socket would take, and profiling stopped for
//! everyone (attack 1 in SECURITY.md). With them a process can lose only its own facts.

/// Most bytes of `/proc/PID/maps` read; only complete lines count. 4096 executable mappings with
/// 1 KiB paths fit, and a read of the whole file cannot grow without bound.
pub const MAPS_MAX_BYTES: u64 = 4 << 20;

/// Most bytes of a small /proc file (comm, stat, cgroup, status): all of them are far smaller.
pub const SMALL_FILE_MAX_BYTES: u64 = 64 << 10;

/// Most bytes of `/proc/PID/environ` scanned for the two allowlisted variables
/// ([`crate::procfs::ENV_ALLOWLIST`]); a variable past this bound is not seen.
pub const ENVIRON_MAX_BYTES: u64 = 64 << 10;

/// Longest value of an allowlisted variable forwarded; a longer one is cut at a char boundary.
pub const ENV_VALUE_MAX_BYTES: usize = 4 << 10;

/// Longer paths (mapping paths, exe link, cgroup) are cut at a char boundary and marked with
/// [`PATH_CUT_MARK`]; the mapped file is still opened, through map_files.
pub const PATH_MAX_BYTES: usize = 1024;

/// Appended to a path cut to [`PATH_MAX_BYTES`].
pub const PATH_CUT_MARK: &str = "...[path cut]";

/// Executable mappings kept per process (large JVMs and browsers have a few hundred).
pub const MAX_MAPPINGS_PER_PROCESS: usize = 4096;

/// Distinct mapped files one process may make the sampler open.
pub const MAX_FILES_PER_PROCESS: usize = 1024;

/// Mapped files the sampler holds open at most, all processes together ...
pub const MAX_OPEN_FILES: usize = 32768;

/// ... and never closer than this to its RLIMIT_NOFILE soft limit (sockets, /proc reads, BPF maps).
pub const NOFILE_RESERVE: u64 = 128;

/// Largest per-connection state datagram (files, process, processMappings). Fits the default
/// socket buffers (`net.core.wmem_default` is 212,992) with room for a batch behind it.
pub const MAX_DATAGRAM_BYTES: usize = 64 << 10;

/// Most file ids in one `filesClosed` datagram (8 bytes each: 32 KiB).
pub const MAX_CLOSED_PER_MESSAGE: usize = 4096;

/// Most pids in one `exited` datagram (4 bytes each: 32 KiB).
pub const MAX_EXITS_PER_MESSAGE: usize = 8192;

/// Largest encoded batch part.
pub const MAX_BATCH_BYTES: usize = 128 << 10;

/// Exited processes kept while queued batches may still refer to them; beyond, the oldest go
/// (their late samples lose their process facts, nothing else).
pub const MAX_EXITED_WAITING: usize = 4096;
