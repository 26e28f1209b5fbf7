//! Native (ELF) symbolization through descriptors the sampler passed: one blazesym resolver per
//! file, cached by the file's identity as the relay itself sees it (`fstat` of the passed
//! descriptor). Parsing untrusted ELF and DWARF happens here, in the unprivileged relay, never
//! in the sampler.
//!
//! Memory is bounded: at most `max_files` resolvers (`--symbolizer-cache-files`) holding at most
//! `max_bytes` of heap (`--symbolizer-cache-bytes`: what blazesym and the memo allocated for each
//! file, counted by the relay's allocator, `alloc`). Beyond the bytes, the parsed tables of the
//! files blazesym read least recently are dropped after a batch while their remembered lookups
//! stay: a hot binary's frames are nearly all remembered (the hit rate is 99.9% under churn),
//! so dropping its tables costs nothing until a new address in it is sampled, which opens it
//! again. Files are forgotten whole when idle or when no process maps them any more; at most [`MEMO_LIMIT`]
//! remembered lookups in all; and the pages of the files blazesym maps are
//! handed back to the page cache after the lookups of a batch ([`ElfCache::release_pages`]), so
//! a binary's debug info is not counted in the relay's memory once it has been read.
//!
//! Invariant: nothing a file *claims* about itself (its build id above all) decides which
//! resolver answers for it; a binary linked with someone else's build id gets its own resolver
//! and names only its own functions. The build id is kept for display only.

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, OwnedFd},
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use blazesym::{
    helper::ElfResolver,
    symbolize::{
        source::{Elf, Source},
        FindSymOpts, Input, Symbolize as _, Symbolized, Symbolizer, TranslateFileOffset as _,
    },
};

use super::{
    debug_links::{self, Policy},
    gofile::{self, GoBinary},
};

/// Cache key of a passed file: what the relay's own `fstat` of the descriptor says, never what
/// the file's content claims. Size and both times change whenever the content is rewritten
/// (ctime cannot be set back by the owner), so a rewritten file gets a new resolver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileKey {
    /// The identity of the file behind `fd`.
    pub fn of(fd: &OwnedFd) -> std::io::Result<Self> {
        let st = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?;
        let ns = |sec: i64, nsec: i64| sec.saturating_mul(1_000_000_000).saturating_add(nsec);
        Ok(Self {
            dev: st.st_dev,
            ino: st.st_ino,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
        })
    }
}

/// One named code location; inlined callees come first, the containing function last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub function: Arc<str>,
    pub file: Option<Arc<str>>,
    pub line: Option<u32>,
    pub inlined: bool,
    /// Named from the binary's Go table ([`super::gopclntab`]): a Go function.
    pub go: bool,
}

/// A passed file, opened for symbolization.
pub struct OpenElf {
    /// `None` when the file cannot be symbolized (the reason was logged when it was opened).
    resolver: Option<Resolver>,
    /// The file's Go table, when it is a Go binary: it names Go functions first (it is there
    /// even when the binary is stripped, and lists inlined calls and lines alike in every
    /// build); what it does not cover (a cgo binary's C code) goes to `resolver`.
    go: Option<Box<GoBinary>>,
    last_used: Instant,
    /// When blazesym (or the Go table) last looked something up in it, or it was opened: what
    /// decides whose tables are dropped first when over the bytes.
    last_parsed: Instant,
    /// Its parsed tables were dropped to stay within the bytes (`resolver` and `go` are
    /// `None`): its remembered lookups still answer, a new address opens it again.
    dropped: bool,
    /// Results by file offset.
    memo: HashMap<u64, Rc<[Resolved]>>,
    /// Bytes of the sealed memfd copy behind `resolver` (0 when reopened).
    copy_bytes: u64,
    /// blazesym looked something up in it since the last [`ElfCache::release_pages`].
    touched: bool,
    /// Heap bytes charged to it: what opening it and its lookups left allocated.
    bytes: u64,
}

impl OpenElf {
    /// Its parsed tables are held (not dropped, and it could be opened).
    fn has_tables(&self) -> bool {
        !self.dropped && (self.resolver.is_some() || self.go.is_some())
    }
}

/// Lookups remembered in all files together; beyond, every memo is cleared (each entry costs
/// about 100 bytes, so this is at most ~10 MB).
pub const MEMO_LIMIT: usize = 100_000;

/// Lookups in binaries after which their pages are handed back even within a batch (see
/// [`ElfCache::release_pages`]), so parsing a large binary's debug info never has all of it
/// resident at once.
const RELEASE_EVERY_MISSES: u64 = 256;

/// Default of `--symbolizer-cache-files`: resolvers kept open at once. Each holds its file's
/// parsed symbol and line tables (from a few KiB to tens of MiB for a large binary with debug
/// info); a busy host rarely runs more binaries than this at once.
pub const DEFAULT_MAX_FILES: usize = 64;

/// Default of `--symbolizer-cache-bytes`: heap the resolvers may hold together (the one used
/// last is kept whatever its size).
pub const DEFAULT_MAX_BYTES: u64 = 32 << 20;

/// Resolvers blazesym looked something up in within this long keep their tables over
/// `max_bytes`: a binary still sampled at new addresses would be parsed again at its next one,
/// which for a large binary costs far more CPU than its memory is worth (a 32 MiB budget with
/// the working set closed every batch took the relay from 0.0095 to 0.073 CPU s/s). Lookups
/// answered from memory do not count: a binary whose sampled addresses are all remembered
/// needs no tables. The hard cap below still bounds them.
pub const WORKING_SET: Duration = Duration::from_secs(10);

/// Over `max_bytes` times this, even resolvers of the working set drop their tables, least
/// recently parsed first.
const HARD_CAP_FACTOR: u64 = 2;

/// Default of `--max-copy-bytes`: the largest file the relay copies into memory when it may not
/// reopen it (a root-only binary). Larger ones stay unnamed; copies are charged to the relay's
/// memory, so this bounds what one hostile file can cost.
pub const DEFAULT_MAX_COPY_BYTES: u64 = 256 << 20;

/// Resolvers by [`FileKey`].
pub struct ElfCache {
    files: HashMap<FileKey, OpenElf>,
    /// Largest file copied into a private memfd (`--max-copy-bytes`).
    pub max_copy_bytes: u64,
    /// Most resolvers kept at once (`--symbolizer-cache-files`, at least 1).
    pub max_files: usize,
    /// Most heap bytes charged to the resolvers together (`--symbolizer-cache-bytes`), kept
    /// over it for resolvers used within `working_set`, up to [`HARD_CAP_FACTOR`] times.
    pub max_bytes: u64,
    /// See [`WORKING_SET`].
    pub working_set: Duration,
    /// Heap bytes charged to the resolvers now.
    bytes: u64,
    pub opened: u64,
    pub evicted: u64,
    /// Times a file's parsed tables were dropped to stay within `max_bytes` (its lookups kept).
    pub tables_dropped: u64,
    /// Lookups answered from a memo, and those that went to blazesym.
    pub hits: u64,
    pub misses: u64,
    /// Memo entries held now, in all files.
    memo_entries: usize,
    /// Files copied into a sealed memfd because the relay may not reopen them.
    pub copied: u64,
    /// Bytes copied in total.
    pub copied_bytes: u64,
    /// Files left unnamed because they exceed `max_copy_bytes` (or the copy budget).
    pub too_large: u64,
    /// Files whose parsing panicked inside blazesym (a hostile or broken file): their resolver
    /// is dropped and their frames stay unnamed.
    pub panicked: u64,
    /// Bytes of copies held by the cached resolvers right now.
    live_copy_bytes: u64,
    /// Files named from their symbol table only, their debug links refused ([`debug_links`]).
    pub symbols_only: u64,
}

/// All copies held at once stay below this many times `max_copy_bytes`, so many files just
/// under the per-file cap cannot add up to more memory than the relay has.
const COPY_BUDGET_FACTOR: u64 = 2;

impl Default for ElfCache {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_COPY_BYTES)
    }
}

/// What the cache holds now, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheSize {
    /// Resolvers (open files).
    pub files: u64,
    /// Remembered lookups.
    pub entries: u64,
    /// Heap bytes the resolvers and their remembered lookups hold (counted by the allocator).
    pub bytes: u64,
    /// Bytes of the files behind the resolvers (what blazesym may map; only the pages read
    /// count in the relay's memory, and only until [`ElfCache::release_pages`]).
    pub file_bytes: u64,
}

/// How a passed file is looked up in.
enum Resolver {
    /// blazesym's resolver: symbols and DWARF (source lines, inlined functions), following the
    /// file's links to separate debug info where [`debug_links`] allows.
    Dwarf(ElfResolver),
    /// Symbols only, through a symbolizer that reads no DWARF and so follows no link: for a
    /// file whose links [`debug_links`] refused. It opened the file once, when made, and keeps
    /// it (auto-reload off: the `/proc/self/fd` path it was opened by is never looked at again).
    SymbolsOnly(Box<SymbolsOnly>),
}

struct SymbolsOnly {
    symbolizer: Symbolizer,
    source: Source<'static>,
}

impl Resolver {
    /// A symbols-only resolver on the file at `path`, opened now.
    fn symbols_only(path: &str) -> Result<Self, OpenError> {
        let symbolizer = Symbolizer::builder()
            .enable_auto_reload(false)
            .enable_code_info(false)
            .enable_inlined_fns(false)
            .enable_demangling(false)
            .build();
        let mut elf = Elf::new(path);
        elf.debug_syms = false;
        let source = Source::Elf(elf);
        // The first lookup opens and maps the file while `path` still names it.
        guarded(|| symbolizer.symbolize_single(&source, Input::FileOffset(0)))
            .ok_or(OpenError::Panicked)?
            .map_err(OpenError::Open)?;
        Ok(Self::SymbolsOnly(Box::new(SymbolsOnly {
            symbolizer,
            source,
        })))
    }

    /// Names `file_offset` in the file: the function and the functions inlined into it.
    fn lookup(&self, file_offset: u64) -> Vec<Resolved> {
        match self {
            Self::Dwarf(resolver) => lookup(resolver, file_offset),
            Self::SymbolsOnly(only) => {
                let found = only
                    .symbolizer
                    .symbolize_single(&only.source, Input::FileOffset(file_offset));
                match found {
                    Ok(Symbolized::Sym(sym)) => vec![Resolved {
                        function: demangle(&sym.name),
                        file: None,
                        line: None,
                        inlined: false,
                        go: false,
                    }],
                    _ => Vec::new(),
                }
            }
        }
    }
}

/// Opens the resolver `policy` allows on the file at `path`.
fn resolver_at(path: String, policy: &Policy) -> Result<Resolver, OpenError> {
    match policy {
        Policy::Follow => guarded(|| ElfResolver::open(path))
            .ok_or(OpenError::Panicked)?
            .map(Resolver::Dwarf)
            .map_err(OpenError::Open),
        Policy::SymbolsOnly(_) => Resolver::symbols_only(&path),
    }
}

/// A passed file, opened.
struct Opened {
    resolver: Resolver,
    /// Bytes copied into a sealed memfd (0 when reopened).
    copy_bytes: u64,
    policy: Policy,
}

/// Why a passed file has no resolver.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("it is not a regular file; only regular files are parsed")]
    NotRegular,
    #[error("its program headers are malformed ({0}); it is not parsed further")]
    Malformed(#[from] super::headers::HeaderError),
    #[error("opening it panicked inside blazesym (a malformed or hostile file)")]
    Panicked,
    #[error("blazesym could not open it: {0}")]
    Open(#[source] blazesym::Error),
    #[error("the relay cannot reopen it: {0}")]
    Reopen(#[source] std::io::Error),
    #[error(
        "the relay may not reopen it ({reopen}) and it is larger than what the relay may still \
         copy ({size} > {cap} bytes; --max-copy-bytes per file, twice that for all copies held \
         at once), so it is not copied; its frames stay unnamed"
    )]
    TooLarge { reopen: String, size: u64, cap: u64 },
    #[error(
        "the relay may not reopen it ({reopen}) and copying it failed: `{call}` failed: {source}"
    )]
    Copy {
        reopen: String,
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Whether `fd` is a regular file (`fstat`), the only kind the relay reads again by path.
pub fn regular_file(fd: &OwnedFd) -> std::io::Result<bool> {
    let st = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?;
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

/// The path through which a held descriptor can be opened again by this process.
fn fd_path(fd: &impl AsRawFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Opens a resolver on a passed file; returns how many bytes were copied (0 when reopened).
/// blazesym opens by path, and reopening a descriptor through /proc/self/fd checks the file's
/// permissions again; a file the relay's user may not read (e.g. a root-only 0700 binary) is
/// then copied through the descriptor into a sealed memfd of at most `cap` bytes. What blazesym
/// may follow from the file is [`debug_links`]'s decision.
fn open_resolver(fd: &OwnedFd, cap: u64) -> Result<Opened, OpenError> {
    if !regular_file(fd).map_err(OpenError::Reopen)? {
        // A device or FIFO mapped executable: reopening it could block or have effects.
        return Err(OpenError::NotRegular);
    }
    super::headers::check(fd)?;
    let path = fd_path(fd);
    let (copy, bytes) = match std::fs::File::open(&path) {
        Ok(_) => (None, 0),
        Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
            let reopen = err.to_string();
            match private_copy(fd, cap) {
                Ok((copy, bytes)) => (Some(copy), bytes),
                Err(CopyError::TooLarge(size)) => {
                    return Err(OpenError::TooLarge { reopen, size, cap })
                }
                Err(CopyError::Io(call, source)) => {
                    return Err(OpenError::Copy {
                        reopen,
                        call,
                        source,
                    })
                }
            }
        }
        Err(err) => return Err(OpenError::Reopen(err)),
    };
    // The mapping blazesym makes outlives the memfd descriptor, dropped on return.
    let opened = copy.as_ref().unwrap_or(fd);
    let path = fd_path(opened);
    let policy = debug_links::policy(opened, &path);
    Ok(Opened {
        resolver: resolver_at(path, &policy)?,
        copy_bytes: bytes,
        policy,
    })
}

enum CopyError {
    /// The file (or what could be read of it) is larger than the cap: the bytes seen.
    TooLarge(u64),
    Io(&'static str, std::io::Error),
}

fn io(call: &'static str) -> impl FnOnce(nix::errno::Errno) -> CopyError {
    move |errno| CopyError::Io(call, std::io::Error::from(errno))
}

/// Chunk size of the copy.
const COPY_CHUNK: usize = 1 << 20;

/// Copies what `fd` holds into a new memfd, reading at most `cap + 1` bytes with `pread` (the
/// descriptor's shared offset is left alone), then seals the copy against any change. A file
/// whose size is above `cap` is refused before a byte is read (a sparse 3 GiB file costs
/// nothing); one that grows while being read is refused when it passes `cap`. Chunks of zeros
/// are not written, so holes stay holes in the copy.
fn private_copy(fd: &OwnedFd, cap: u64) -> Result<(OwnedFd, u64), CopyError> {
    use nix::{
        fcntl::{fcntl, FcntlArg, SealFlag},
        sys::{
            memfd::{memfd_create, MFdFlags},
            uio::{pread, pwrite},
        },
    };
    let size = nix::sys::stat::fstat(fd).map_err(io("fstat"))?.st_size;
    let size = u64::try_from(size).unwrap_or(0);
    if size > cap {
        return Err(CopyError::TooLarge(size));
    }
    let memfd = memfd_create(
        "ember-elf",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(io("memfd_create"))?;
    let limit = cap.saturating_add(1);
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut total: u64 = 0;
    while total < limit {
        let want = usize::try_from(limit - total).map_or(COPY_CHUNK, |left| left.min(COPY_CHUNK));
        let offset = i64::try_from(total).map_err(|_| CopyError::TooLarge(total))?;
        let n = match pread(fd, &mut buf[..want], offset) {
            Ok(0) => break,
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(errno) => return Err(io("pread")(errno)),
        };
        let chunk = &buf[..n];
        if chunk.iter().any(|&b| b != 0) {
            let mut written = 0;
            while written < n {
                let at = offset + i64::try_from(written).unwrap_or(i64::MAX);
                written += pwrite(&memfd, &chunk[written..], at).map_err(io("pwrite"))?;
            }
        }
        total += n as u64;
    }
    if total > cap {
        return Err(CopyError::TooLarge(total));
    }
    let len = i64::try_from(total).map_err(|_| CopyError::TooLarge(total))?;
    nix::unistd::ftruncate(&memfd, len).map_err(io("ftruncate"))?;
    fcntl(
        &memfd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_WRITE
                | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(io("fcntl(F_ADD_SEALS)"))?;
    Ok((memfd, total))
}

/// Reads the GNU build id of a passed file, as lowercase hex: the descriptor of the first note
/// of type `NT_GNU_BUILD_ID` whose owner is "GNU". Other owners reuse type 3 (systemtap's
/// `.note.stapsdt` probes are `NT_STAPSDT` = 3), so the type alone names no build id; a file
/// without a GNU note has none (`None`), never another note's bytes.
pub fn build_id(fd: &OwnedFd) -> Option<Arc<str>> {
    let id = guarded(|| gnu_build_id(fd))??;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    Some(Arc::from(hex))
}

/// Most bytes of one note section read for the build id (real ones hold a few dozen bytes;
/// `.note.stapsdt` of large libraries some hundred KiB): a bigger section is skipped.
const MAX_NOTE_SECTION_BYTES: u64 = 4 << 20;

/// The raw GNU build id of the ELF file behind `fd`; `None` when absent or unreadable. Reads
/// only the header, the section table and note sections (object's `ReadCache`, no mapping),
/// through the descriptor itself: a file the relay may not reopen (a root-only binary, which it
/// symbolizes through a private copy) keeps its build id in every output.
fn gnu_build_id(fd: &OwnedFd) -> Option<Vec<u8>> {
    use object::{
        elf,
        read::elf::{FileHeader as _, SectionHeader as _},
        read::ReadCache,
    };
    let cache = ReadCache::new(PositionedRead { fd, position: 0 });
    let header = elf::FileHeader64::<object::LittleEndian>::parse(&cache).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, &cache).ok()?;
    for section in sections.iter() {
        if section.sh_type(endian) != elf::SHT_NOTE
            || section.sh_size(endian) > MAX_NOTE_SECTION_BYTES
        {
            continue;
        }
        let Ok(Some(mut notes)) = section.notes(endian, &cache) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                return Some(note.desc().to_vec());
            }
        }
    }
    None
}

/// Reads a held descriptor at offsets of its own (`pread`): never through a path the relay may
/// not open, and never moving the file offset the descriptor shares with the sampler's.
struct PositionedRead<'fd> {
    fd: &'fd OwnedFd,
    position: u64,
}

impl std::io::Read for PositionedRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let offset = i64::try_from(self.position)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let read = nix::sys::uio::pread(self.fd, buf, offset)?;
        self.position = self.position.saturating_add(read as u64);
        Ok(read)
    }
}

impl std::io::Seek for PositionedRead<'_> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let (from, delta) = match to {
            std::io::SeekFrom::Start(at) => (at, 0),
            std::io::SeekFrom::End(delta) => {
                let size = nix::sys::stat::fstat(self.fd)?.st_size;
                (u64::try_from(size).unwrap_or(0), delta)
            }
            std::io::SeekFrom::Current(delta) => (self.position, delta),
        };
        self.position = from
            .checked_add_signed(delta)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Ok(self.position)
    }
}

impl ElfCache {
    /// An empty cache that copies files of at most `max_copy_bytes`.
    pub fn new(max_copy_bytes: u64) -> Self {
        Self {
            files: HashMap::new(),
            max_copy_bytes,
            max_files: DEFAULT_MAX_FILES,
            max_bytes: DEFAULT_MAX_BYTES,
            working_set: WORKING_SET,
            bytes: 0,
            opened: 0,
            evicted: 0,
            tables_dropped: 0,
            hits: 0,
            misses: 0,
            memo_entries: 0,
            copied: 0,
            copied_bytes: 0,
            too_large: 0,
            panicked: 0,
            live_copy_bytes: 0,
            symbols_only: 0,
        }
    }

    /// Symbolizes `file_offset` in the file `key`, opening it through `fd` on first use;
    /// `path` (as the sampler named it) is for logs only.
    pub fn resolve(
        &mut self,
        key: &FileKey,
        fd: &OwnedFd,
        path: &str,
        file_offset: u64,
    ) -> Option<Rc<[Resolved]>> {
        if !self.files.contains_key(key) {
            self.make_room();
            let entry = self.open(fd, path);
            self.files.insert(*key, entry);
        }
        let entry = self.files.get_mut(key)?;
        entry.last_used = Instant::now();
        if let Some(found) = entry.memo.get(&file_offset) {
            self.hits += 1;
            return Some(Rc::clone(found));
        }
        if entry.dropped {
            self.reopen(key, fd, path);
        }
        let entry = self.files.get_mut(key)?;
        entry.last_parsed = Instant::now();
        if let Some(go) = &entry.go {
            // Our own bounded parser: it cannot panic on any input, but its answers are
            // memoized like blazesym's.
            if let Some(found) = go_lookup(go, file_offset) {
                self.misses += 1;
                let found: Rc<[Resolved]> = Rc::from(found);
                entry.memo.insert(file_offset, Rc::clone(&found));
                self.memo_entries += 1;
                if self.memo_entries > MEMO_LIMIT {
                    self.clear_memos();
                }
                return Some(found);
            }
        }
        let resolver = entry.resolver.as_ref()?;
        self.misses += 1;
        entry.touched = true;
        let (found, allocated) = super::alloc::measure(|| {
            let found: Option<Rc<[Resolved]>> =
                guarded(|| resolver.lookup(file_offset)).map(Rc::from);
            if let Some(found) = &found {
                entry.memo.insert(file_offset, Rc::clone(found));
            }
            found
        });
        let allocated = u64::try_from(allocated).unwrap_or(0);
        entry.bytes += allocated;
        self.bytes += allocated;
        let Some(resolved) = found else {
            // The resolver's state after a panic is unknown: the file is not parsed again.
            self.panicked += 1;
            tracing::warn!(
                file = %path,
                panicked = self.panicked,
                "symbolizing this file panicked inside blazesym (a malformed or hostile file); its \
                 frames stay unnamed. Please report the file to ember's maintainers"
            );
            entry.resolver = None;
            self.memo_entries -= entry.memo.len();
            entry.memo.clear();
            return None;
        };
        self.memo_entries += 1;
        if self.memo_entries > MEMO_LIMIT {
            self.clear_memos();
        }
        if self.misses.is_multiple_of(RELEASE_EVERY_MISSES) {
            // A batch that parses a large binary reads much of it: hand pages back on the way.
            self.release_pages();
        }
        Some(resolved)
    }

    /// Opens a resolver for a file not in the cache (a failure is cached too, logged once).
    fn open(&mut self, fd: &OwnedFd, path: &str) -> OpenElf {
        let ((opened, go), allocated) =
            super::alloc::measure(|| (open_resolver(fd, self.copy_cap()), open_go(fd, path)));
        let bytes = u64::try_from(allocated).unwrap_or(0);
        self.bytes += bytes;
        let (resolver, copy_bytes) = match opened {
            Ok(Opened {
                resolver,
                copy_bytes: bytes,
                policy,
            }) => {
                self.opened += 1;
                if let Policy::SymbolsOnly(reason) = policy {
                    self.symbols_only += 1;
                    tracing::info!(
                        file = %path,
                        %reason,
                        "its links to separate debug info are not followed, so its frames are \
                         named from its symbol table only (no source lines or inlined \
                         functions). To get them, keep the DWARF in the binary or install its \
                         debug file under /usr/lib/debug for a binary root owns"
                    );
                }
                if bytes > 0 {
                    tracing::debug!(file = %path, bytes, "copied into a sealed memfd (the relay may not reopen it)");
                    self.copied += 1;
                    self.copied_bytes += bytes;
                    self.live_copy_bytes += bytes;
                }
                (Some(resolver), bytes)
            }
            Err(err) => {
                // Logged once per file: the failed entry stays cached until evicted.
                if matches!(err, OpenError::TooLarge { .. }) {
                    self.too_large += 1;
                    tracing::warn!(file = %path, error = %err, "file not symbolized");
                } else if matches!(err, OpenError::Panicked) {
                    self.panicked += 1;
                    tracing::warn!(file = %path, error = %err, "file not symbolized");
                } else {
                    tracing::debug!(file = %path, error = %err, "file not symbolized");
                }
                (None, 0)
            }
        };
        OpenElf {
            resolver,
            go,
            last_used: Instant::now(),
            last_parsed: Instant::now(),
            dropped: false,
            memo: HashMap::new(),
            copy_bytes,
            touched: true,
            bytes,
        }
    }

    /// Parses a file whose tables were dropped again, for an address not remembered; its
    /// remembered lookups stay.
    fn reopen(&mut self, key: &FileKey, fd: &OwnedFd, path: &str) {
        let fresh = self.open(fd, path);
        if let Some(entry) = self.files.get_mut(key) {
            entry.resolver = fresh.resolver;
            entry.go = fresh.go;
            entry.copy_bytes = fresh.copy_bytes;
            entry.bytes = entry.bytes.saturating_add(fresh.bytes);
            entry.touched = true;
            entry.dropped = false;
        }
    }

    /// Drops the parsed tables of `key`'s file (its remembered lookups stay), uncharging what
    /// that freed.
    fn drop_tables(&mut self, key: &FileKey) {
        let Some(file) = self.files.get_mut(key) else {
            return;
        };
        let tables = (file.resolver.take(), file.go.take());
        let ((), freed) = super::alloc::measure(move || drop(tables));
        let freed = u64::try_from(freed.saturating_neg()).unwrap_or(0);
        file.bytes = file.bytes.saturating_sub(freed);
        self.bytes = self.bytes.saturating_sub(freed);
        self.live_copy_bytes -= file.copy_bytes;
        file.copy_bytes = 0;
        file.dropped = true;
        self.tables_dropped += 1;
    }

    /// Closes the least recently used resolvers until one more fits under `max_files`.
    fn make_room(&mut self) {
        while self.files.len() >= self.max_files.max(1) {
            let Some(oldest) = self
                .files
                .iter()
                .min_by_key(|(_, f)| f.last_used)
                .map(|(key, _)| *key)
            else {
                return;
            };
            self.remove(&oldest);
        }
    }

    fn remove(&mut self, key: &FileKey) {
        if let Some(file) = self.files.remove(key) {
            self.evicted += 1;
            self.memo_entries -= file.memo.len();
            self.live_copy_bytes -= file.copy_bytes;
            self.bytes = self.bytes.saturating_sub(file.bytes);
        }
    }

    fn clear_memos(&mut self) {
        for file in self.files.values_mut() {
            let memo = std::mem::take(&mut file.memo);
            let ((), freed) = super::alloc::measure(move || drop(memo));
            let freed = u64::try_from(freed.saturating_neg()).unwrap_or(0);
            file.bytes = file.bytes.saturating_sub(freed);
            self.bytes = self.bytes.saturating_sub(freed);
        }
        self.memo_entries = 0;
    }

    /// Drops the parsed tables of the files blazesym read least recently while the cache holds
    /// more than `max_bytes`, keeping their remembered lookups, the tables of the file parsed
    /// last whatever their size, and those parsed within `working_set` unless the cache holds
    /// more than [`HARD_CAP_FACTOR`] times `max_bytes`.
    fn shrink_to_budget(&mut self) -> usize {
        let mut dropped = 0;
        let last = self
            .files
            .iter()
            .filter(|(_, f)| f.has_tables())
            .max_by_key(|(_, f)| f.last_parsed)
            .map(|(key, _)| *key);
        while self.bytes > self.max_bytes {
            let hard = self.bytes > self.max_bytes.saturating_mul(HARD_CAP_FACTOR);
            let Some(oldest) = self
                .files
                .iter()
                .filter(|(key, f)| f.has_tables() && Some(**key) != last)
                .filter(|(_, f)| hard || f.last_parsed.elapsed() >= self.working_set)
                .min_by_key(|(_, f)| f.last_parsed)
                .map(|(key, _)| *key)
            else {
                break;
            };
            self.drop_tables(&oldest);
            dropped += 1;
        }
        dropped
    }

    /// Drops resolvers unused for `idle`, and those of files no process maps any more
    /// (`referenced` says which are mapped) unused for `unreferenced`, then the least recently
    /// used while over `max_bytes`. Returns how many were dropped.
    pub fn evict(
        &mut self,
        idle: Duration,
        unreferenced: Duration,
        referenced: impl Fn(&FileKey) -> bool,
    ) -> usize {
        let stale: Vec<FileKey> = self
            .files
            .iter()
            .filter(|(key, f)| {
                let unused = f.last_used.elapsed();
                unused >= idle || (unused >= unreferenced && !referenced(key))
            })
            .map(|(key, _)| *key)
            .collect();
        for key in &stale {
            self.remove(key);
        }
        stale.len() + self.shrink_to_budget()
    }

    /// Drops resolvers unused for `idle`.
    #[cfg(test)]
    pub fn evict_idle(&mut self, idle: Duration) {
        self.evict(idle, idle, |_| true);
    }

    /// Hands the pages blazesym read back to the page cache once a batch's lookups are done
    /// (`MADV_DONTNEED` on its read-only shared whole-file mappings; the next read faults them
    /// in again from the page cache), when blazesym read anything since the last call. A
    /// binary's debug info is read at its first lookups and rarely after, so without this its
    /// pages would stay counted in the relay's RSS for as long as the resolver lives. Returns
    /// the bytes of mappings released.
    pub fn release_pages(&mut self) -> u64 {
        let mut touched = false;
        for file in self.files.values_mut() {
            touched |= std::mem::take(&mut file.touched);
        }
        if !touched {
            return 0;
        }
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return 0;
        };
        let mut released = 0;
        for (start, end) in blazesym_mappings(&maps) {
            // SAFETY: a read-only shared file mapping, which only blazesym makes in the relay
            // (see `blazesym_mappings`): nothing was ever written through it, so dropping its
            // pages loses nothing; the next access reads them again from the file.
            let dropped = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
            };
            if dropped == 0 {
                released += (end - start) as u64;
            }
        }
        released
    }

    /// What the cache holds now.
    pub fn size(&self) -> CacheSize {
        CacheSize {
            files: self.files.len() as u64,
            entries: self.memo_entries as u64,
            bytes: self.bytes,
            file_bytes: self.files.keys().map(|k| k.size).sum(),
        }
    }

    /// The largest copy allowed now: `max_copy_bytes`, or less when the copies held already
    /// use most of the budget.
    fn copy_cap(&self) -> u64 {
        let budget = self.max_copy_bytes.saturating_mul(COPY_BUDGET_FACTOR);
        self.max_copy_bytes
            .min(budget.saturating_sub(self.live_copy_bytes))
    }

    /// Drops every resolver (and its memory mappings), e.g. after a mapped file shrank.
    pub fn clear(&mut self) {
        self.evicted += self.files.len() as u64;
        self.files.clear();
        self.live_copy_bytes = 0;
        self.memo_entries = 0;
        self.bytes = 0;
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Files whose parsed tables are held now.
    #[cfg(test)]
    pub fn with_tables(&self) -> usize {
        self.files.values().filter(|f| f.has_tables()).count()
    }
}

/// The address ranges in `maps` (a `/proc/self/maps` text) of read-only shared file mappings
/// from offset 0: how blazesym maps a whole file (through memmap2), for the passed files and the
/// separate debug files it follows. Nothing else in the relay maps files shared (the loader maps
/// segments private), so dropping their pages never touches the relay's own code or data.
fn blazesym_mappings(maps: &str) -> Vec<(usize, usize)> {
    let parse = |line: &str| -> Option<(usize, usize)> {
        let mut fields = line.split_ascii_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let (perms, offset, _dev, inode) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        if perms != "r--s" || u64::from_str_radix(offset, 16).ok()? != 0 || inode == "0" {
            return None;
        }
        let start = usize::from_str_radix(start, 16).ok()?;
        let end = usize::from_str_radix(end, 16).ok()?;
        (end > start).then_some((start, end))
    };
    maps.lines().filter_map(parse).collect()
}

/// The Go table of a passed file, when it is a Go binary (read through the descriptor itself, so
/// a file the relay may not reopen has one too).
fn open_go(fd: &OwnedFd, path: &str) -> Option<Box<GoBinary>> {
    if !regular_file(fd).ok()? {
        return None;
    }
    let file = std::fs::File::from(fd.try_clone().ok()?);
    match gofile::locate(&file, true) {
        Ok(go) => {
            tracing::debug!(
                file = %path,
                version = go.table.version.name(),
                functions = go.table.func_count(),
                bytes = go.table.byte_len(),
                found_by = ?go.found_by,
                table_address = go.vaddr,
                funcdata_address = go.funcdata.as_ref().map(|f| f.vaddr),
                "Go binary: its Go functions are named from its pclntab"
            );
            Some(Box::new(go))
        }
        Err(gofile::LocateError::NotGo | gofile::LocateError::Elf) => None,
        Err(err) => {
            tracing::info!(file = %path, %err, "Go table not read; its Go functions are named from its symbols only");
            None
        }
    }
}

/// Runs `parse`, a call into blazesym on a file the relay does not trust, so that a panic in
/// it (a bug a hostile file reaches, like the unwrap in its DWARF line reader that the
/// `elf_symbolize` fuzz target found) leaves one file unnamed instead of ending the relay. The
/// panic's message still reaches stderr through the panic hook.
fn guarded<T>(parse: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(parse)).ok()
}

/// Names `file_offset` in `resolver`'s file: the function and the functions inlined into it.
fn lookup(resolver: &ElfResolver, file_offset: u64) -> Vec<Resolved> {
    let Ok(Some(virt)) = resolver.file_offset_to_virt_offset(file_offset) else {
        return Vec::new();
    };
    let Ok(Ok(sym)) = resolver.find_sym(virt, &FindSymOpts::CodeInfoAndInlined) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(1 + sym.inlined.len());
    // blazesym lists inlined calls outermost first; stacks here are leaf first.
    for inlined in sym.inlined.iter().rev() {
        out.push(Resolved {
            function: demangle(&inlined.name),
            file: inlined.code_info.as_ref().map(code_file),
            line: inlined.code_info.as_ref().and_then(|c| c.line),
            inlined: true,
            go: false,
        });
    }
    out.push(Resolved {
        function: demangle(sym.name),
        file: sym.code_info.as_deref().map(code_file),
        line: sym.code_info.as_ref().and_then(|c| c.line),
        inlined: false,
        go: false,
    });
    out
}

/// Names `file_offset` from a Go binary's table: the calls inlined there and the function,
/// when the offset is in a Go function.
fn go_lookup(go: &GoBinary, file_offset: u64) -> Option<Vec<Resolved>> {
    let pc = go.vaddr_of(file_offset)?;
    let func = go.table.find(pc)?;
    let frames = go.table.frames(&func, pc, go.funcdata.as_ref());
    Some(
        frames
            .into_iter()
            .map(|f| Resolved {
                function: Arc::from(f.function),
                file: f.file.map(Arc::from),
                line: f.line,
                inlined: f.inlined,
                go: true,
            })
            .collect(),
    )
}

fn code_file(info: &blazesym::symbolize::CodeInfo<'_>) -> Arc<str> {
    let path = match &info.dir {
        Some(dir) => dir.join(&*info.file),
        None => std::path::PathBuf::from(&*info.file),
    };
    Arc::from(path.to_string_lossy().as_ref())
}

/// Demangles Rust (legacy and v0) and C++ (Itanium) names; others are returned as they are.
pub fn demangle(name: &str) -> Arc<str> {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return Arc::from(format!("{rust:#}"));
    }
    if name.starts_with("_Z") {
        if let Ok(symbol) = cpp_demangle::Symbol::new(name) {
            if let Ok(text) = symbol.demangle(&cpp_demangle::DemangleOptions::default()) {
                return Arc::from(text);
            }
        }
    }
    Arc::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            &*demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(&*demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(&*demangle("main"), "main");
    }

    #[test]
    fn symbolizes_this_test_binary_through_an_fd() {
        // Given a descriptor of our own executable
        let exe = std::fs::File::open("/proc/self/exe").expect("open own exe");
        let fd = OwnedFd::from(exe);
        // and the file offset of a function of ours
        let offset = own_offset(demangles_rust_and_cpp as *const () as usize as u64);
        // When it is resolved through the cache
        let mut cache = ElfCache::default();
        let key = FileKey::of(&fd).expect("fstat own exe");
        let frames = cache
            .resolve(&key, &fd, "own exe", offset)
            .expect("resolver opened");
        // Then the innermost non-inlined frame names the function
        let outer = frames.last().expect("one frame");
        assert!(
            outer.function.ends_with("demangles_rust_and_cpp"),
            "got {:?}",
            outer.function
        );
        assert_eq!(cache.len(), 1);
        cache.evict_idle(Duration::ZERO);
        assert_eq!(cache.len(), 0);
    }

    /// Descriptors of this test binary and of a copy of it (another file, same content), with
    /// the directory that holds the copy.
    fn exe_and_copy() -> (tempfile::TempDir, OwnedFd, OwnedFd) {
        let fd = OwnedFd::from(std::fs::File::open("/proc/self/exe").expect("open own exe"));
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("copy");
        std::fs::copy("/proc/self/exe", &path).expect("copy own exe");
        let copy = OwnedFd::from(std::fs::File::open(&path).expect("open copy"));
        (dir, fd, copy)
    }

    /// This binary and a copy of it, with their keys, and the file offset of one of this
    /// binary's functions (the same in both): two files the cache parses alike.
    struct TwoFiles {
        _dir: tempfile::TempDir,
        fd: OwnedFd,
        copy: OwnedFd,
        key: FileKey,
        copy_key: FileKey,
        offset: u64,
    }

    fn two_files() -> TwoFiles {
        let (_dir, fd, copy) = exe_and_copy();
        TwoFiles {
            key: FileKey::of(&fd).expect("fstat"),
            copy_key: FileKey::of(&copy).expect("fstat"),
            offset: own_offset(demangles_rust_and_cpp as *const () as usize as u64),
            _dir,
            fd,
            copy,
        }
    }

    /// The file offset in this test binary of one of its own functions, from /proc/self/maps.
    fn own_offset(address: u64) -> u64 {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        maps.lines()
            .find_map(|line| {
                let (range, rest) = line.split_once(' ')?;
                let (start, end) = range.split_once('-')?;
                let (start, end) = (
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(end, 16).ok()?,
                );
                if !(start..end).contains(&address) {
                    return None;
                }
                let offset = u64::from_str_radix(rest.split(' ').nth(1)?, 16).ok()?;
                Some(address - start + offset)
            })
            .expect("own function is mapped")
    }

    /// Resident kB of blazesym's mappings of the file with inode `ino` in this process.
    fn resident_kb(ino: u64) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut ours = false;
        let mut kb = 0;
        for line in smaps.lines() {
            let first = line.split(' ').next().unwrap_or("");
            if let Some(rss) = line.strip_prefix("Rss:") {
                if ours {
                    kb += rss
                        .trim()
                        .trim_end_matches(" kB")
                        .parse::<u64>()
                        .expect("kB");
                }
            } else if first
                .split_once('-')
                .is_some_and(|(start, _)| u64::from_str_radix(start, 16).is_ok())
            {
                let inode = line.split_ascii_whitespace().nth(4).unwrap_or("");
                ours = !blazesym_mappings(line).is_empty() && inode == ino.to_string();
            }
        }
        kb
    }

    #[test]
    fn the_cache_is_bounded_in_files_and_counts_hits_and_misses() {
        // Given a cache of one file and two files (this binary, and a copy of it elsewhere)
        let exe = std::fs::File::open("/proc/self/exe").expect("open own exe");
        let fd = OwnedFd::from(exe);
        let dir = tempfile::tempdir().expect("tempdir");
        let copy = dir.path().join("copy");
        std::fs::copy("/proc/self/exe", &copy).expect("copy own exe");
        let copy = OwnedFd::from(std::fs::File::open(&copy).expect("open copy"));
        let offset = own_offset(demangles_rust_and_cpp as *const () as usize as u64);
        let mut cache = ElfCache {
            max_files: 1,
            ..ElfCache::default()
        };
        let (key, copy_key) = (
            FileKey::of(&fd).expect("fstat"),
            FileKey::of(&copy).expect("fstat"),
        );
        // When one offset is looked up twice, then in the other file
        for _ in 0..2 {
            cache.resolve(&key, &fd, "exe", offset).expect("resolver");
        }
        assert_eq!((cache.hits, cache.misses), (1, 1));
        assert_eq!(cache.size().entries, 1);
        let named = cache
            .resolve(&copy_key, &copy, "copy", offset)
            .expect("resolver");
        // Then the first file was closed to make room, its entries with it, and the second
        // names the same function
        assert_eq!((cache.len(), cache.evicted, cache.opened), (1, 1, 2));
        assert_eq!(cache.size().entries, 1);
        assert_eq!(cache.size().file_bytes, copy_key.size);
        assert!(named
            .last()
            .expect("a frame")
            .function
            .ends_with("demangles_rust_and_cpp"));
        // And a file no process maps is closed once unused for the unreferenced time, one that
        // is mapped only once idle
        assert_eq!(cache.evict(Duration::MAX, Duration::ZERO, |_| true), 0);
        assert_eq!(cache.evict(Duration::MAX, Duration::ZERO, |_| false), 1);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn the_cache_is_bounded_in_heap_bytes_keeping_the_last_used() {
        // Given a cache of at most 1 byte of heap and two files (this binary and a copy)
        let TwoFiles {
            _dir,
            fd,
            copy,
            key,
            copy_key,
            offset,
        } = two_files();
        let mut cache = ElfCache {
            max_bytes: 1,
            ..ElfCache::default()
        };
        // When both are looked up (the copy last)
        cache.resolve(&key, &fd, "exe", offset).expect("resolver");
        let one = cache.size().bytes;
        cache
            .resolve(&copy_key, &copy, "copy", offset)
            .expect("resolver");
        // Then each parse was charged (a binary with debug info: well over 64 KiB each)
        assert!(one > 64 << 10, "{one} bytes charged to one file");
        assert!(cache.size().bytes > one, "{:?}", cache.size());
        // And after the batch, the tables of the least recently used are dropped, the last one's
        // kept alone
        assert_eq!(cache.evict(Duration::MAX, Duration::MAX, |_| true), 1);
        assert_eq!(cache.with_tables(), 1);
        assert!(cache.resolve(&copy_key, &copy, "copy", offset).is_some());
        assert_eq!(cache.opened, 2, "the copy stayed open");
    }

    #[test]
    fn resolvers_of_the_working_set_stay_over_the_budget_up_to_the_hard_cap() {
        // Given two files looked up just now, holding more than the budget but less than the
        // hard cap
        let TwoFiles {
            _dir,
            fd,
            copy,
            key,
            copy_key,
            offset,
        } = two_files();
        let mut cache = ElfCache::default();
        cache.resolve(&key, &fd, "exe", offset).expect("resolver");
        cache
            .resolve(&copy_key, &copy, "copy", offset)
            .expect("resolver");
        let held = cache.size().bytes;
        cache.max_bytes = held / 2;
        // When the batch ends: both are in the working set, so both stay
        assert_eq!(cache.evict(Duration::MAX, Duration::MAX, |_| true), 0);
        assert_eq!(cache.with_tables(), 2);
        // And once they are older than the working set, the budget applies again
        cache.working_set = Duration::ZERO;
        assert_eq!(cache.evict(Duration::MAX, Duration::MAX, |_| true), 1);
        // And over the hard cap, even the working set drops its tables (a new address opens
        // the first file again: it is now the one parsed last)
        let other = own_offset(symbol_file_offset as *const () as usize as u64);
        cache.resolve(&key, &fd, "exe", other).expect("resolver");
        assert_eq!(cache.with_tables(), 2);
        cache.working_set = Duration::MAX;
        cache.max_bytes = 1;
        assert_eq!(cache.evict(Duration::MAX, Duration::MAX, |_| true), 1);
        assert_eq!(cache.with_tables(), 1);
        assert_eq!(cache.len(), 2, "both files' lookups are remembered");
    }

    #[test]
    fn over_its_bytes_the_cache_drops_parsed_tables_and_keeps_answering_what_it_remembers() {
        // Given two files (this binary and a copy) parsed just now, holding three times the
        // cache's bytes
        let TwoFiles {
            _dir,
            fd,
            copy,
            key,
            copy_key,
            offset,
        } = two_files();
        let mut cache = ElfCache::default();
        cache.resolve(&key, &fd, "exe", offset).expect("resolver");
        let one = cache.size().bytes;
        cache
            .resolve(&copy_key, &copy, "copy", offset)
            .expect("resolver");
        cache.max_bytes = cache.size().bytes / 3;
        // When the batch ends
        cache.evict(Duration::MAX, Duration::MAX, |_| true);
        // Then the cache holds at most the tables of the file parsed last (the bound is kept
        // but for the one in use), not both
        assert!(
            cache.size().bytes <= one + (64 << 10),
            "{} bytes held, one file's tables are {one}",
            cache.size().bytes
        );
        // And both files still name the addresses they named, without parsing anything again
        for (k, f) in [(&key, &fd), (&copy_key, &copy)] {
            let named = cache.resolve(k, f, "f", offset).expect("remembered");
            assert!(named[named.len() - 1]
                .function
                .ends_with("demangles_rust_and_cpp"));
        }
        assert_eq!(cache.opened, 2, "a remembered address parsed a file again");
        // And a new address in the file whose tables were dropped parses it again and is named
        let other = own_offset(symbol_file_offset as *const () as usize as u64);
        let named = cache.resolve(&key, &fd, "exe", other).expect("reopened");
        assert!(named[named.len() - 1]
            .function
            .ends_with("symbol_file_offset"));
        assert_eq!(cache.opened, 3);
    }

    #[test]
    fn pages_blazesym_read_are_handed_back_and_lookups_still_work() {
        // Given a copy of this binary (with debug info; a file of this test's own) looked up
        // through the cache
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("copy");
        std::fs::copy("/proc/self/exe", &path).expect("copy own exe");
        let fd = OwnedFd::from(std::fs::File::open(&path).expect("open copy"));
        let key = FileKey::of(&fd).expect("fstat");
        let offset = own_offset(demangles_rust_and_cpp as *const () as usize as u64);
        let mut cache = ElfCache::default();
        cache.resolve(&key, &fd, "copy", offset).expect("resolver");
        let before = resident_kb(key.ino);
        assert!(before > 0, "blazesym's mapping of the binary is resident");
        // When its pages are released
        let released = cache.release_pages();
        // Then none stays resident (the whole mapping was released), and a new lookup reads
        // it again and still names the function
        assert!(
            released >= key.size,
            "released {released} of {} bytes",
            key.size
        );
        assert_eq!(resident_kb(key.ino), 0, "{before} kB resident before");
        let other = own_offset(symbol_file_offset as *const () as usize as u64);
        let named = cache.resolve(&key, &fd, "copy", other).expect("resolver");
        assert!(named
            .last()
            .expect("frame")
            .function
            .ends_with("symbol_file_offset"));
        assert!(resident_kb(key.ino) > 0, "read again");
        // And once released, with nothing read since, nothing more is released
        assert!(cache.release_pages() > 0);
        assert_eq!(cache.release_pages(), 0);
    }

    /// The file offset of `symbol` in the ELF file at `path`, through `nm` and the program
    /// headers (PT_LOAD segment containing the symbol's virtual address).
    fn symbol_file_offset(path: &std::path::Path, symbol: &str) -> u64 {
        let out = std::process::Command::new("nm")
            .arg(path)
            .output()
            .expect("run nm");
        let text = String::from_utf8_lossy(&out.stdout);
        let vaddr = text
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let (addr, _, name) = (f.next()?, f.next()?, f.next()?);
                (name == symbol).then(|| u64::from_str_radix(addr, 16).ok())?
            })
            .unwrap_or_else(|| panic!("{symbol} not in nm output of {}", path.display()));
        let elf = std::fs::read(path).expect("read elf");
        let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().expect("8 bytes"));
        let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().expect("2 bytes"));
        let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
        (0..usize::from(phnum))
            .map(|i| phoff + i * usize::from(phentsize))
            .find_map(|ph| {
                let kind = u32::from_le_bytes(elf[ph..ph + 4].try_into().ok()?);
                let (offset, va, filesz) = (u64_at(ph + 8), u64_at(ph + 16), u64_at(ph + 32));
                (kind == 1 && (va..va + filesz).contains(&vaddr)).then(|| vaddr - va + offset)
            })
            .expect("symbol inside a PT_LOAD segment")
    }

    /// Builds `main.c` with `cc` and `link` flags into `dir`; the source has a systemtap probe
    /// note (`.note.stapsdt`, owner "stapsdt", type 3 like `NT_GNU_BUILD_ID`), written with
    /// inline assembly as `sys/sdt.h` would write it.
    fn build_with_stapsdt(dir: &std::path::Path, name: &str, link: &str) -> std::path::PathBuf {
        let src = dir.join(format!("{name}.c"));
        let bin = dir.join(name);
        std::fs::write(
            &src,
            r#"int main(void) {
    __asm__ volatile(
        "990: nop\n"
        ".pushsection .note.stapsdt,\"?\",\"note\"\n"
        ".balign 4\n"
        ".4byte 992f-991f, 994f-993f, 3\n"
        "991: .asciz \"stapsdt\"\n"
        "992: .balign 4\n"
        "993: .8byte 990b\n"
        ".8byte 0\n"
        ".8byte 0\n"
        ".asciz \"ember\"\n"
        ".asciz \"probe\"\n"
        ".asciz \"\"\n"
        "994: .balign 4\n"
        ".popsection\n");
    return 0;
}
"#,
        )
        .expect("write source");
        let out = std::process::Command::new("cc")
            .args(["-O1", "-g0", link])
            .arg(&src)
            .arg("-o")
            .arg(&bin)
            .output()
            .expect("run cc (a C compiler is needed for this fixture)");
        assert!(
            out.status.success(),
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    }

    /// `readelf -n`'s notes of `bin` as (owner, description) pairs.
    fn readelf_notes(bin: &std::path::Path) -> String {
        let out = std::process::Command::new("readelf")
            .arg("-n")
            .arg(bin)
            .output()
            .expect("run readelf");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn a_stapsdt_note_is_no_build_id() {
        // Given a binary with a systemtap probe note and no build id, as readelf sees it
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = build_with_stapsdt(dir.path(), "probed", "-Wl,--build-id=none");
        let notes = readelf_notes(&bin);
        assert!(
            notes.contains("stapsdt"),
            "fixture lacks the probe note:\n{notes}"
        );
        assert!(
            !notes.contains("NT_GNU_BUILD_ID"),
            "fixture has a build id:\n{notes}"
        );
        // When its build id is read, Then there is none (not the probe note's bytes)
        let fd = OwnedFd::from(std::fs::File::open(&bin).expect("open fixture"));
        assert_eq!(build_id(&fd), None);
        // And with a GNU build id next to the probe note, exactly that id is read
        let bin = build_with_stapsdt(
            dir.path(),
            "probed-with-id",
            "-Wl,--build-id=0xfeedface00112233445566778899aabbccddeeff",
        );
        let notes = readelf_notes(&bin);
        assert!(
            notes.contains("stapsdt") && notes.contains("NT_GNU_BUILD_ID"),
            "{notes}"
        );
        let fd = OwnedFd::from(std::fs::File::open(&bin).expect("open fixture"));
        assert_eq!(
            build_id(&fd).as_deref(),
            Some("feedface00112233445566778899aabbccddeeff")
        );
    }

    #[test]
    fn a_file_the_relay_may_not_reopen_keeps_its_build_id() {
        // Given a binary with a build id, held open, that this thread may no longer open by
        // path: mode 000, and (when root) a filesystem uid of nobody, which also drops the
        // capability to override file permissions, as the relay's user is
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = build_with_stapsdt(
            dir.path(),
            "unreadable",
            "-Wl,--build-id=0xfeedface00112233445566778899aabbccddeeff",
        );
        let fd = OwnedFd::from(std::fs::File::open(&bin).expect("open fixture"));
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o000))
            .expect("chmod 000");
        let id = std::thread::spawn(move || {
            // SAFETY: setfsuid changes only this thread's filesystem uid; the thread ends here.
            unsafe { libc::setfsuid(65534) };
            assert!(
                std::fs::File::open(fd_path(&fd)).is_err(),
                "the fixture could still be reopened: the test proves nothing"
            );
            // When its build id is read
            build_id(&fd)
        })
        .join()
        .expect("the reading thread");
        // Then it is the file's own
        assert_eq!(
            id.as_deref(),
            Some("feedface00112233445566778899aabbccddeeff")
        );
    }

    #[test]
    fn two_files_claiming_one_build_id_keep_their_own_names() {
        // Given two different programs linked with the same build id (the attack: the second
        // claims the victim's id to rename the victim's functions)
        if std::process::Command::new("cc")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipping: no C compiler (cc) to build the fixtures");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let build = |name: &str, function: &str| {
            let src = dir.path().join(format!("{name}.c"));
            let bin = dir.path().join(name);
            std::fs::write(
                &src,
                format!(
                    "__attribute__((noinline)) int {function}(int x) {{ return x * 3 + 1; }}\n\
                     int main(int argc, char **argv) {{ (void)argv; return {function}(argc); }}\n"
                ),
            )
            .expect("write source");
            let status = std::process::Command::new("cc")
                .args([
                    "-O1",
                    "-g0",
                    "-Wl,--build-id=0x0123456789abcdef0123456789abcdef01234567",
                ])
                .arg(&src)
                .arg("-o")
                .arg(&bin)
                .status()
                .expect("run cc");
            assert!(status.success(), "cc failed for {name}");
            let offset = symbol_file_offset(&bin, function);
            let fd = OwnedFd::from(std::fs::File::open(&bin).expect("open fixture"));
            (fd, offset)
        };
        let (victim, victim_offset) = build("victim", "victim_work_aaaa");
        let (attacker, attacker_offset) = build("attacker", "PWNED_work_bbbb");
        assert_eq!(
            build_id(&victim),
            build_id(&attacker),
            "fixtures share a build id"
        );
        // When both are resolved through one cache, the attacker's first
        let mut cache = ElfCache::default();
        let attacker_key = FileKey::of(&attacker).expect("fstat");
        let victim_key = FileKey::of(&victim).expect("fstat");
        assert_ne!(attacker_key, victim_key);
        let a = cache
            .resolve(&attacker_key, &attacker, "attacker", attacker_offset)
            .expect("attacker resolver");
        let v = cache
            .resolve(&victim_key, &victim, "victim", victim_offset)
            .expect("victim resolver");
        // Then each names its own function
        assert_eq!(a.last().map(|r| &*r.function), Some("PWNED_work_bbbb"));
        assert_eq!(v.last().map(|r| &*r.function), Some("victim_work_aaaa"));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_copy_is_sealed_and_identical() {
        // Given a small file with a hole in the middle
        use std::io::{Seek as _, Write as _};
        let mut file = tempfile::tempfile().expect("temp file");
        file.write_all(b"\x7fELF head").expect("write");
        file.seek(std::io::SeekFrom::Start(3 << 20)).expect("seek");
        file.write_all(b"tail").expect("write");
        let fd = OwnedFd::from(file);
        // When it is copied
        let Ok((copy, bytes)) = private_copy(&fd, DEFAULT_MAX_COPY_BYTES) else {
            panic!("copy failed");
        };
        // Then the copy holds the same bytes and cannot change any more
        assert_eq!(bytes, (3 << 20) + 4);
        let content = std::fs::read(fd_path(&copy)).expect("read copy");
        assert_eq!(&content[..9], b"\x7fELF head");
        assert_eq!(&content[3 << 20..], b"tail");
        let seals = nix::fcntl::fcntl(&copy, nix::fcntl::FcntlArg::F_GET_SEALS).expect("seals");
        assert_eq!(
            seals,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL
        );
        assert!(
            nix::unistd::ftruncate(&copy, 0).is_err(),
            "shrinking a sealed copy"
        );
    }

    #[test]
    fn files_above_the_cap_are_not_copied() {
        // Given a 3 GiB sparse file and an endless one (/dev/zero reports size 0)
        let sparse = tempfile::tempfile().expect("temp file");
        sparse.set_len(3 << 30).expect("set_len");
        let sparse = OwnedFd::from(sparse);
        let zero = OwnedFd::from(std::fs::File::open("/dev/zero").expect("open /dev/zero"));
        // When they are copied with a cap
        let started = Instant::now();
        let huge = private_copy(&sparse, DEFAULT_MAX_COPY_BYTES);
        let endless = private_copy(&zero, 1 << 20);
        // Then both are refused, the sparse one at once, the endless one after cap + 1 bytes
        assert!(matches!(huge, Err(CopyError::TooLarge(n)) if n == 3 << 30));
        assert!(matches!(endless, Err(CopyError::TooLarge(n)) if n == (1 << 20) + 1));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn copies_held_at_once_stay_within_twice_the_per_file_cap() {
        // Given a cache allowing 100-byte copies that already holds 150 bytes of copies
        let mut cache = ElfCache::new(100);
        assert_eq!(cache.copy_cap(), 100);
        cache.live_copy_bytes = 150;
        // Then the next copy may be 50 bytes at most, and none once 200 are held
        assert_eq!(cache.copy_cap(), 50);
        cache.live_copy_bytes = 250;
        assert_eq!(cache.copy_cap(), 0);
        // And dropping the resolvers frees the budget
        cache.clear();
        assert_eq!(cache.copy_cap(), 100);
    }
}
