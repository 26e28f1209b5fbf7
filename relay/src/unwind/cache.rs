//! On-disk cache of compiled unwind tables under a state directory handed in, so a restarted
//! relay does not recompile.
//!
//! Invariants:
//! - The file name comes from the build id, else from the relay's own `fstat` of the file (dev,
//!   ino, size, mtime); it is only a name. A cached table is used only when the SHA-256 of the
//!   compiler version, the limits and the CFI input read from the file *now* equals the one stored
//!   with the table, so a binary that copies someone else's build id gets its own table, never
//!   theirs, and cannot poison the entry for the real one (it can only overwrite it, which costs
//!   the real one a recompile).
//! - A cache file is verified before use: magic, input digest, a digest of the table bytes, and
//!   every table invariant ([`UnwindTable::decode`]); anything else is ignored and rebuilt.
//! - A table cut short by `Limits::max_time` (machine-dependent) is not stored: a later,
//!   less busy run may finish it.
//! - Writes are atomic: a new file created with `O_EXCL` (mode 0600), written, synced, then
//!   renamed over the entry. Reads are bounded by the largest table `Limits::max_rows` allows.
//! - The directory's total size stays under `max_bytes`: after a store, the least recently used
//!   entries (by mtime, refreshed on every hit) are removed until it fits; temporary files left
//!   by a writer that died are removed once ten minutes old.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::SystemTime,
};

use ring::digest::{Context, SHA256};

use super::{compile_input, elf, row::ROW_BYTES, table::HEADER_BYTES, Error, Limits, UnwindTable};

/// Bumped whenever the compiler's output for the same input changes. 3: `.debug_frame` (also
/// compressed) is read beside `.eh_frame`, so a binary whose `.eh_frame` only covers the C
/// runtime gets a new table, never the one version 1 compiled from that `.eh_frame` alone, and
/// Go binaries get rows from their Go table (`go.rs`) (the digest's layout changed too: older
/// digests cannot match).
const COMPILER_VERSION: u32 = 3;
const MAGIC: [u8; 8] = *b"EMBRUNW1";
const DIGEST_BYTES: usize = 32;
const PREAMBLE_BYTES: usize = MAGIC.len() + 2 * DIGEST_BYTES;
/// Most entries looked at when enforcing the size bound.
const MAX_SCAN: usize = 100_000;
const SUFFIX: &str = ".unw";
const TMP_PREFIX: &str = ".tmp-";
/// Age after which a temporary file is taken as left by a dead writer.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(600);

/// Where a table came from.
#[derive(Debug)]
pub enum Outcome {
    /// Loaded from the cache and verified.
    Hit,
    /// Compiled now; `stored` says whether the cache kept it, and `replaced_bad` whether an
    /// unusable cache file (corrupt, or from other input) was there before.
    Compiled {
        stored: io::Result<()>,
        replaced_bad: bool,
    },
}

/// A table and how it was obtained.
#[derive(Debug)]
pub struct Cached {
    pub table: UnwindTable,
    pub key: String,
    pub outcome: Outcome,
    /// `p_vaddr - p_offset` of the file's executable segment, read from the file now.
    pub vaddr_minus_offset: i64,
}

/// The cache directory and its size bound.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    max_bytes: u64,
    limits: Limits,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Cache {
    /// A cache in `dir` (created mode 0700 if missing) holding at most `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64, limits: Limits) -> io::Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            max_bytes,
            limits,
        })
    }

    /// The table of `file`: from the cache when a verified entry for its current CFI exists,
    /// else compiled and stored.
    pub fn get_or_compile(&self, file: &File) -> Result<Cached, Error> {
        let started = std::time::Instant::now();
        let input = elf::read(file, &self.limits)?;
        let key = key_for(file, input.build_id.as_deref());
        let digest = input_digest(&input, &self.limits);
        let path = self.dir.join(format!("{key}{SUFFIX}"));
        let replaced_bad = match self.load(&path, &digest) {
            Some(table) => {
                return Ok(Cached {
                    table,
                    key,
                    outcome: Outcome::Hit,
                    vaddr_minus_offset: input.vaddr_minus_offset,
                })
            }
            None => path.exists(),
        };
        let mut compiled = compile_input(&input, &self.limits);
        compiled.stats.elapsed = started.elapsed();
        let stored = if compiled.stats.truncated == Some(super::Truncation::TimeBudget) {
            Err(io::Error::other(
                "table cut short by the time limit: not cached",
            ))
        } else {
            self.store(&path, &key, &digest, &compiled.table)
        };
        Ok(Cached {
            table: compiled.table.clone(),
            key,
            vaddr_minus_offset: compiled.vaddr_minus_offset,
            outcome: Outcome::Compiled {
                stored,
                replaced_bad,
            },
        })
    }

    /// The verified table at `path` for `digest`, refreshing its mtime; `None` if absent or bad.
    fn load(&self, path: &Path, digest: &[u8; DIGEST_BYTES]) -> Option<UnwindTable> {
        let mut file = File::open(path).ok()?;
        let max = (PREAMBLE_BYTES + HEADER_BYTES)
            .saturating_add(self.limits.max_rows.saturating_mul(ROW_BYTES))
            as u64;
        if file.metadata().ok()?.len() > max {
            return None;
        }
        let mut bytes = Vec::new();
        Read::by_ref(&mut file)
            .take(max)
            .read_to_end(&mut bytes)
            .ok()?;
        let (magic, rest) = bytes.split_at_checked(MAGIC.len())?;
        let (stored_digest, rest) = rest.split_at_checked(DIGEST_BYTES)?;
        let (body_digest, body) = rest.split_at_checked(DIGEST_BYTES)?;
        if magic != MAGIC || stored_digest != digest || body_digest != sha256(&[body]) {
            return None;
        }
        let table = UnwindTable::decode(body).ok()?;
        // Least-recently-used order; failing to refresh only makes the entry look older.
        let _ = file.set_modified(SystemTime::now());
        Some(table)
    }

    /// Writes the entry atomically, then trims the directory to its size bound.
    fn store(
        &self,
        path: &Path,
        key: &str,
        digest: &[u8; DIGEST_BYTES],
        table: &UnwindTable,
    ) -> io::Result<()> {
        let body = table.encode();
        let size = (PREAMBLE_BYTES + body.len()) as u64;
        if size > self.max_bytes {
            return Err(io::Error::other(format!(
                "table of {size} bytes is over the cache bound of {}",
                self.max_bytes
            )));
        }
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{TMP_PREFIX}{key}-{}-{n}", std::process::id()));
        let written = (|| {
            let mut out = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            out.write_all(&MAGIC)?;
            out.write_all(digest)?;
            out.write_all(&sha256(&[&body]))?;
            out.write_all(&body)?;
            out.sync_data()?;
            fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written?;
        self.trim(path)
    }

    /// Removes the least recently used entries (never `keep`) until the total fits.
    fn trim(&self, keep: &Path) -> io::Result<()> {
        let mut entries = Vec::new();
        let mut total = 0u64;
        for entry in fs::read_dir(&self.dir)?.take(MAX_SCAN) {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let meta = entry.metadata()?;
            if name.starts_with(TMP_PREFIX) {
                // Left by a relay that died mid-write: gone after STALE_TMP.
                let age = meta.modified().ok().and_then(|m| m.elapsed().ok());
                if age.is_some_and(|age| age > STALE_TMP) {
                    let _ = fs::remove_file(entry.path());
                }
                continue;
            }
            if !name.ends_with(SUFFIX) {
                continue;
            }
            total = total.saturating_add(meta.len());
            entries.push((meta.mtime(), meta.mtime_nsec(), meta.len(), entry.path()));
        }
        entries.sort();
        for (_, _, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if path != keep && fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(len);
            }
        }
        Ok(())
    }
}

/// `b-<build id hex>` when the file names one (up to 64 bytes), else
/// `f-<dev>-<ino>-<size>-<mtime ns>` from `fstat`.
fn key_for(file: &File, build_id: Option<&[u8]>) -> String {
    if let Some(id) = build_id.filter(|id| !id.is_empty() && id.len() <= 64) {
        return format!(
            "b-{}",
            id.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
    }
    match file.metadata() {
        Ok(m) => {
            let ns = m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec());
            format!("f-{}-{}-{}-{ns}", m.dev(), m.ino(), m.len())
        }
        Err(_) => "f-unknown".to_owned(),
    }
}

/// SHA-256 of everything the compiled table depends on: both CFI sections as decompressed
/// (how a section was stored does not change the table), each with its length and address.
fn input_digest(input: &elf::Input, limits: &Limits) -> [u8; DIGEST_BYTES] {
    let present = |cfi: &Option<elf::CfiData>| {
        cfi.as_ref()
            .map_or((0, 0, 0), |c| (1, c.addr, c.data.len() as u64))
    };
    let (eh, eh_addr, eh_len) = present(&input.eh_frame);
    let (debug, debug_addr, debug_len) = present(&input.debug_frame);
    let words = [
        u64::from(COMPILER_VERSION),
        limits.max_read_bytes,
        limits.max_section_bytes,
        limits.max_cie_bytes,
        limits.max_fde_bytes,
        limits.max_work_bytes,
        limits.max_work_factor,
        limits.max_rows as u64,
        match input.section {
            elf::CfiSection::EhFrame => 1,
            elf::CfiSection::DebugFrame => 2,
            elf::CfiSection::Both => 3,
            elf::CfiSection::GoPclntab => 4,
        },
        eh,
        eh_addr,
        eh_len,
        debug,
        debug_addr,
        debug_len,
        input.text_addr,
        input.got_addr,
        input.exec.start,
        input.exec.end,
        input.go.as_ref().map_or(0, |t| t.text_start),
        input.go.as_ref().map_or(0, |t| t.byte_len() as u64),
    ];
    let header: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    sha256(&[
        &header,
        cfi_bytes(input.eh_frame.as_ref()),
        cfi_bytes(input.debug_frame.as_ref()),
        input.go.as_ref().map_or(&[], |t| t.data()),
    ])
}

fn cfi_bytes(cfi: Option<&elf::CfiData>) -> &[u8] {
    cfi.map_or(&[], |c| c.data.as_slice())
}

fn sha256(parts: &[&[u8]]) -> [u8; DIGEST_BYTES] {
    let mut ctx = Context::new(&SHA256);
    for part in parts {
        ctx.update(part);
    }
    let mut out = [0u8; DIGEST_BYTES];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}
