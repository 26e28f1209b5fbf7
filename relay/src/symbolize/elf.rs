//! Native (ELF) symbolization through descriptors the sampler passed: one blazesym resolver per
//! file, cached by the file's identity as the relay itself sees it (`fstat` of the passed
//! descriptor) and evicted when unused. Parsing untrusted ELF and DWARF happens here, in the
//! unprivileged relay, never in the sampler.
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
    helper::{read_elf_build_id, ElfResolver},
    symbolize::{FindSymOpts, Symbolize as _, TranslateFileOffset as _},
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
}

/// A passed file, opened for symbolization.
pub struct OpenElf {
    resolver: Option<ElfResolver>,
    /// Why the file cannot be symbolized, when `resolver` is `None`.
    pub error: Option<String>,
    last_used: Instant,
    /// Results by file offset.
    memo: HashMap<u64, Rc<[Resolved]>>,
}

/// Entries kept per file before its memo is cleared.
const MEMO_LIMIT: usize = 200_000;

/// Resolvers by [`FileKey`].
#[derive(Default)]
pub struct ElfCache {
    files: HashMap<FileKey, OpenElf>,
    pub opened: u64,
    pub evicted: u64,
}

/// The path through which a held descriptor can be opened again by this process.
fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Opens a resolver on a passed file. blazesym opens by path, and reopening a descriptor through
/// /proc/self/fd checks the file's permissions again; a file the relay's user may not read (e.g.
/// a root-only 0700 binary) is then copied through the descriptor into a private memfd.
fn open_resolver(fd: &OwnedFd) -> Result<ElfResolver, String> {
    match ElfResolver::open(fd_path(fd)) {
        Ok(resolver) => Ok(resolver),
        Err(err) if err.kind() == blazesym::ErrorKind::PermissionDenied => {
            let copy = private_copy(fd).map_err(|e| format!("{err}; copying it failed: {e}"))?;
            // The mapping blazesym makes outlives the memfd descriptor.
            ElfResolver::open(fd_path(&copy)).map_err(|e| e.to_string())
        }
        Err(err) => Err(err.to_string()),
    }
}

fn private_copy(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    use std::io::{Read as _, Seek as _, Write as _};
    let memfd = nix::sys::memfd::memfd_create("ember-elf", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(std::io::Error::from)?;
    let mut source = std::fs::File::from(fd.try_clone()?);
    source.seek(std::io::SeekFrom::Start(0))?;
    let mut target = std::fs::File::from(memfd);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = source.read(&mut buf)?;
        if n == 0 {
            break;
        }
        target.write_all(&buf[..n])?;
    }
    Ok(OwnedFd::from(target))
}

/// Reads the GNU build id of a passed file, as lowercase hex.
pub fn build_id(fd: &OwnedFd) -> Option<Arc<str>> {
    let id = read_elf_build_id(&fd_path(fd)).ok()??;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    Some(Arc::from(hex))
}

impl ElfCache {
    /// Symbolizes `file_offset` in the file `key`, opening it through `fd` on first use.
    pub fn resolve(
        &mut self,
        key: &FileKey,
        fd: &OwnedFd,
        file_offset: u64,
    ) -> Option<Rc<[Resolved]>> {
        let entry = self.files.entry(key.clone()).or_insert_with(|| {
            let (resolver, error) = match open_resolver(fd) {
                Ok(resolver) => (Some(resolver), None),
                Err(err) => (None, Some(err)),
            };
            OpenElf {
                resolver,
                error,
                last_used: Instant::now(),
                memo: HashMap::new(),
            }
        });
        if entry.memo.is_empty() && entry.resolver.is_some() {
            self.opened += 1;
        }
        entry.last_used = Instant::now();
        if let Some(found) = entry.memo.get(&file_offset) {
            return Some(Rc::clone(found));
        }
        let resolver = entry.resolver.as_ref()?;
        let resolved: Rc<[Resolved]> = lookup(resolver, file_offset).into();
        if entry.memo.len() >= MEMO_LIMIT {
            entry.memo.clear();
        }
        entry.memo.insert(file_offset, Rc::clone(&resolved));
        Some(resolved)
    }

    /// Why `key` cannot be symbolized, if it cannot.
    pub fn error(&self, key: &FileKey) -> Option<&str> {
        self.files.get(key).and_then(|f| f.error.as_deref())
    }

    /// Drops resolvers unused for `idle`.
    pub fn evict_idle(&mut self, idle: Duration) {
        let before = self.files.len();
        self.files.retain(|_, f| f.last_used.elapsed() < idle);
        self.evicted += (before - self.files.len()) as u64;
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

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
        });
    }
    out.push(Resolved {
        function: demangle(sym.name),
        file: sym.code_info.as_deref().map(code_file),
        line: sym.code_info.as_ref().and_then(|c| c.line),
        inlined: false,
    });
    out
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
        let addr = demangles_rust_and_cpp as *const () as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let offset = maps
            .lines()
            .find_map(|line| {
                let (range, rest) = line.split_once(' ')?;
                let (start, end) = range.split_once('-')?;
                let (start, end) = (
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(end, 16).ok()?,
                );
                if !(start..end).contains(&addr) {
                    return None;
                }
                let offset = u64::from_str_radix(rest.split(' ').nth(1)?, 16).ok()?;
                Some(addr - start + offset)
            })
            .expect("own function is mapped");
        // When it is resolved through the cache
        let mut cache = ElfCache::default();
        let key = FileKey::of(&fd).expect("fstat own exe");
        let frames = cache.resolve(&key, &fd, offset).expect("resolver opened");
        // Then the innermost non-inlined frame names the function
        let outer = frames.last().expect("one frame");
        assert!(
            outer.function.ends_with("demangles_rust_and_cpp"),
            "got {:?}",
            outer.function
        );
        assert_eq!(cache.len(), 1);
        cache.evict_idle(Duration::ZERO);
        assert!(cache.is_empty());
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
            .resolve(&attacker_key, &attacker, attacker_offset)
            .expect("attacker resolver");
        let v = cache
            .resolve(&victim_key, &victim, victim_offset)
            .expect("victim resolver");
        // Then each names its own function
        assert_eq!(a.last().map(|r| &*r.function), Some("PWNED_work_bbbb"));
        assert_eq!(v.last().map(|r| &*r.function), Some("victim_work_aaaa"));
        assert_eq!(cache.len(), 2);
    }
}
