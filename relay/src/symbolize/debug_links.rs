//! Whether blazesym may follow a passed ELF file's links to separate debug information
//! (`.gnu_debuglink`, `.gnu_debugaltlink`, `.debug_sup`).
//!
//! blazesym 0.2.7 opens what such a link names by path, and has no option to stop it: the name
//! joined to /usr/lib/debug, /lib/debug and the directory the file itself resolves to, or the
//! name as it is when it is absolute (`..` works too). A file that names a FIFO its owner made
//! blocks the relay's `open` for ever, and with it symbolization for every process on the host;
//! it could as well name a device or another user's file. A file whose path cannot be resolved
//! (deleted, a memfd) is worse: blazesym then searches beside `/proc/self/fd/N`, among the
//! relay's own descriptors.
//!
//! So blazesym follows a file's links only when nothing a user other than root controls decides
//! where it looks ([`Policy::Follow`]):
//! - the file is owned by root and writable by nobody else, so its links cannot change between
//!   this check and blazesym's own read of them;
//! - every link names a plain file name (the alternate links may name an absolute path);
//! - the directories searched (the file's own, the named one, /usr/lib/debug and /lib/debug)
//!   are root's and writable by nobody else, up to `/`.
//!
//! Any other file with a link is symbolized from its symbol table alone
//! ([`Policy::SymbolsOnly`]): no DWARF is read, so nothing is followed. A file without any link
//! section has nothing to follow. The one case left open is a file another user may write that
//! gains a link section between this check and blazesym's read (a race on a file its owner
//! rewrites while it is mapped); closing it needs a blazesym option not to follow links.

use std::{
    fs::File,
    os::{
        fd::OwnedFd,
        unix::fs::{MetadataExt as _, PermissionsExt as _},
    },
    path::{Path, PathBuf},
};

use object::{
    elf,
    read::{
        elf::{FileHeader as _, SectionHeader as _},
        ReadCache,
    },
};

/// The directories blazesym searches for debug links besides the file's own (its defaults).
const DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

/// Largest link section read (real ones hold a file name and a checksum or build id).
const MAX_LINK_SECTION_BYTES: u64 = 4096;

/// What blazesym may do with a passed file.
#[derive(Debug, PartialEq, Eq)]
pub enum Policy {
    /// Symbols and DWARF, following the file's links (or it has none).
    Follow,
    /// Symbols only: the file has links blazesym must not follow, for this reason.
    SymbolsOnly(Refusal),
}

/// Why a file's links are not followed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error(
        "it may be rewritten by a user other than root (owner uid {uid}, mode {mode:o}), so its \
         links could change after they were checked"
    )]
    Writable { uid: u32, mode: u32 },
    #[error("{section} names {name:?}, which is not a plain file name")]
    Name { section: &'static str, name: String },
    #[error("{dir} may be written by a user other than root ({why})")]
    Directory { dir: String, why: String },
    #[error(
        "its path does not resolve ({0}), so blazesym would search beside the relay's own \
         descriptors"
    )]
    NoPath(String),
    #[error("its section table cannot be read ({0})")]
    Unreadable(String),
}

/// Decides for the file behind `fd`, reopened through `path` (`/proc/self/fd/N`).
pub fn policy(fd: &OwnedFd, path: &str) -> Policy {
    match check(fd, path) {
        Ok(()) => Policy::Follow,
        Err(refusal) => Policy::SymbolsOnly(refusal),
    }
}

fn check(fd: &OwnedFd, path: &str) -> Result<(), Refusal> {
    let links = links(path)?;
    if links.is_empty() {
        return Ok(());
    }
    let st = nix::sys::stat::fstat(fd).map_err(|errno| Refusal::Unreadable(errno.to_string()))?;
    decide(&links, (st.st_uid, st.st_mode), Path::new(path), &Host)
}

/// What the decision reads of the file system: the host's, or a made-up one in tests (so the
/// decision is tested for files and directories of owners the test cannot create).
trait FileSystem {
    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf>;
    /// Owner uid and mode of `path` itself (a symbolic link is not followed).
    fn owner_and_mode(&self, path: &Path) -> std::io::Result<(u32, u32)>;
}

/// The host's file system.
struct Host;

impl FileSystem for Host {
    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
        std::fs::canonicalize(path)
    }

    fn owner_and_mode(&self, path: &Path) -> std::io::Result<(u32, u32)> {
        let meta = std::fs::symlink_metadata(path)?;
        Ok((meta.uid(), meta.permissions().mode()))
    }
}

/// The decision for a file with `links`, whose owner and mode are `(uid, mode)`, reached at
/// `path`.
fn decide(
    links: &[Link],
    (uid, mode): (u32, u32),
    path: &Path,
    fs: &impl FileSystem,
) -> Result<(), Refusal> {
    if uid != 0 || mode & 0o022 != 0 {
        return Err(Refusal::Writable {
            uid,
            mode: mode & 0o7777,
        });
    }
    let own = fs
        .canonicalize(path)
        .map_err(|err| Refusal::NoPath(err.to_string()))?;
    let mut dirs: Vec<PathBuf> = DEBUG_DIRS.iter().map(PathBuf::from).collect();
    dirs.extend(own.parent().map(Path::to_path_buf));
    for link in links {
        dirs.extend(link.check()?);
    }
    dirs.iter().try_for_each(|dir| trusted_dir(dir, fs))
}

/// One link section's target as the file states it.
struct Link {
    section: &'static str,
    name: Vec<u8>,
}

impl Link {
    /// Checks the name; returns the directory an absolute name points into.
    fn check(&self) -> Result<Option<PathBuf>, Refusal> {
        let refuse = || Refusal::Name {
            section: self.section,
            name: String::from_utf8_lossy(&self.name).into_owned(),
        };
        let name = std::str::from_utf8(&self.name).map_err(|_| refuse())?;
        if plain(name) {
            return Ok(None);
        }
        // dwz's alternate files are named by absolute path; the debug link itself never is.
        let path = Path::new(name);
        let absolute_ok = self.section != DEBUGLINK
            && path.is_absolute()
            && path
                .file_name()
                .is_some_and(|f| plain(&f.to_string_lossy()))
            && !path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
        match path.parent() {
            Some(dir) if absolute_ok => Ok(Some(dir.to_path_buf())),
            _ => Err(refuse()),
        }
    }
}

const DEBUGLINK: &str = ".gnu_debuglink";
const ALTLINK: &str = ".gnu_debugaltlink";
const SUP: &str = ".debug_sup";

/// A single path component: not empty, no `/`, not `.` or `..`.
fn plain(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name != "." && name != ".."
}

/// The link sections of the ELF file at `path` (none for a file that is not 64-bit ELF, which
/// blazesym does not symbolize either). Every section of a link's name counts, not only the
/// first.
fn links(path: &str) -> Result<Vec<Link>, Refusal> {
    let unreadable = |what: &str| Refusal::Unreadable(what.to_owned());
    let file = File::open(path).map_err(|err| Refusal::Unreadable(err.to_string()))?;
    let cache = ReadCache::new(file);
    let Ok(header) = elf::FileHeader64::<object::LittleEndian>::parse(&cache) else {
        return Ok(Vec::new());
    };
    let endian = header.endian().map_err(|_| unreadable("byte order"))?;
    let sections = header
        .sections(endian, &cache)
        .map_err(|_| unreadable("section headers"))?;
    let mut links = Vec::new();
    for section in sections.iter() {
        let name = sections
            .section_name(endian, section)
            .map_err(|_| unreadable("section names"))?;
        let Some(kind) = [DEBUGLINK, ALTLINK, SUP]
            .into_iter()
            .find(|kind| kind.as_bytes() == name)
        else {
            continue;
        };
        if section.sh_size(endian) > MAX_LINK_SECTION_BYTES {
            return Err(Refusal::Name {
                section: kind,
                name: format!("<{} bytes>", section.sh_size(endian)),
            });
        }
        let data = section.data(endian, &cache).map_err(|_| unreadable(kind))?;
        // .debug_sup starts with a 2-byte version and a 1-byte flag; the others with the name.
        let data = if kind == SUP {
            data.get(3..).unwrap_or(&[])
        } else {
            data
        };
        let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        links.push(Link {
            section: kind,
            name: data[..end].to_vec(),
        });
    }
    Ok(links)
}

/// `dir` (or, when it does not exist, its nearest existing ancestor, which decides who may
/// create it) resolves to a directory that only root may change, and so does every directory
/// above it.
fn trusted_dir(dir: &Path, fs: &impl FileSystem) -> Result<(), Refusal> {
    let refuse = |dir: &Path, why: String| Refusal::Directory {
        dir: dir.display().to_string(),
        why,
    };
    let mut probe = dir;
    let canonical = loop {
        match fs.canonicalize(probe) {
            Ok(canonical) => break canonical,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => match probe.parent() {
                Some(parent) => probe = parent,
                None => return Err(refuse(dir, err.to_string())),
            },
            Err(err) => return Err(refuse(dir, err.to_string())),
        }
    };
    for ancestor in canonical.ancestors() {
        let (uid, mode) = fs
            .owner_and_mode(ancestor)
            .map_err(|err| refuse(ancestor, err.to_string()))?;
        if uid != 0 || mode & 0o022 != 0 {
            return Err(refuse(
                ancestor,
                format!("owner uid {uid}, mode {:o}", mode & 0o7777),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{os::fd::OwnedFd, path::Path, process::Command, sync::mpsc, time::Duration};

    use super::*;
    use crate::symbolize::elf::{ElfCache, FileKey};

    fn run(cmd: &mut Command) {
        let out = cmd.output().expect("run a binutils or C compiler command");
        assert!(
            out.status.success(),
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Builds `dir/victim` with a function `hot`, moves its DWARF into `dir/victim.debug` and
    /// links the binary to it, the way distributions ship split debug info. Returns the
    /// binary's path and `hot`'s file offset.
    fn split_binary(dir: &Path) -> (PathBuf, u64) {
        let src = dir.join("victim.c");
        std::fs::write(
            &src,
            "volatile unsigned long sink;\n\
             __attribute__((noinline)) void hot(void) { for (int i = 0; i < 1000; i++) sink += i; }\n\
             int main(void) { hot(); return 0; }\n",
        )
        .expect("write source");
        let bin = dir.join("victim");
        let debug = dir.join("victim.debug");
        run(Command::new("cc")
            .args(["-O1", "-g", "-no-pie", "-o"])
            .arg(&bin)
            .arg(&src));
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&bin)
            .arg(&debug));
        run(Command::new("objcopy").arg("--strip-debug").arg(&bin));
        run(Command::new("objcopy")
            .current_dir(dir)
            .arg("--add-gnu-debuglink=victim.debug")
            .arg(&bin));
        // -no-pie: the text segment's file offsets are its addresses minus 0x400000.
        let nm = Command::new("nm").arg(&bin).output().expect("run nm");
        let symbols = String::from_utf8_lossy(&nm.stdout);
        let address = symbols
            .lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                let address = fields.next()?;
                (fields.nth(1)? == "hot").then(|| u64::from_str_radix(address, 16).ok())?
            })
            .expect("hot in the symbol table");
        (bin, address - 0x40_0000)
    }

    fn open(path: &Path) -> OwnedFd {
        OwnedFd::from(File::open(path).expect("open fixture"))
    }

    fn fd_path(fd: &OwnedFd) -> String {
        use std::os::fd::AsRawFd as _;
        format!("/proc/self/fd/{}", fd.as_raw_fd())
    }

    #[test]
    fn a_debug_link_to_a_fifo_is_not_followed() {
        // Given a binary whose debug link names a FIFO its owner put in its place (opening a
        // FIFO with no writer blocks for ever)
        let dir = tempfile::tempdir().expect("tempdir");
        let (bin, offset) = split_binary(dir.path());
        let debug = dir.path().join("victim.debug");
        std::fs::remove_file(&debug).expect("remove debug file");
        nix::unistd::mkfifo(&debug, nix::sys::stat::Mode::from_bits_truncate(0o666))
            .expect("mkfifo");
        // When the relay symbolizes its function through a descriptor
        let fd = open(&bin);
        let decided = policy(&fd, &fd_path(&fd));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut cache = ElfCache::default();
            let key = FileKey::of(&fd).expect("fstat");
            let found = cache
                .resolve(&key, &fd, "victim", offset)
                .map(|f| f.to_vec());
            let _ = tx.send((found, cache.symbols_only));
        });
        // Then it answers, with the name from the symbol table
        let (found, symbols_only) = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("symbolization blocked: the relay followed the debug link into the FIFO");
        let frames = found.expect("the file has a resolver");
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(&*frames[0].function, "hot");
        assert_eq!(frames[0].line, None, "no DWARF is read");
        assert_eq!(symbols_only, 1);
        assert!(
            matches!(
                decided,
                Policy::SymbolsOnly(Refusal::Directory { .. } | Refusal::Writable { .. })
            ),
            "a temporary directory is not root's alone: {decided:?}"
        );
    }

    #[test]
    fn a_file_without_a_path_is_not_followed() {
        // Given the split binary's content in a memfd (its path resolves nowhere, so blazesym
        // would look beside /proc/self/fd/N)
        let dir = tempfile::tempdir().expect("tempdir");
        let (bin, _) = split_binary(dir.path());
        let memfd = nix::sys::memfd::memfd_create("ember-test", nix::sys::memfd::MFdFlags::empty())
            .expect("memfd");
        let mut file = File::from(memfd);
        std::io::copy(&mut File::open(&bin).expect("open"), &mut file).expect("copy");
        let fd = OwnedFd::from(file);
        // When its policy is decided
        let decided = policy(&fd, &fd_path(&fd));
        // Then its links are refused: as root for want of a path, as a user first because the
        // memfd is the user's to rewrite
        assert!(
            matches!(
                decided,
                Policy::SymbolsOnly(Refusal::NoPath(_) | Refusal::Writable { .. })
            ),
            "{decided:?}"
        );
    }

    #[test]
    fn a_binary_without_links_keeps_its_dwarf_wherever_it_is() {
        // Given this test binary (no debug link) in a temporary directory
        let dir = tempfile::tempdir().expect("tempdir");
        let copy = dir.path().join("copy");
        std::fs::copy("/proc/self/exe", &copy).expect("copy own exe");
        let fd = open(&copy);
        // Then nothing stops blazesym from reading its DWARF
        assert_eq!(policy(&fd, &fd_path(&fd)), Policy::Follow);
    }

    #[test]
    fn the_c_library_in_roots_directories_is_followed() {
        // Given the C library this process maps, a root-owned file in root's directories
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let libc = maps
            .lines()
            .filter_map(|line| line.split_whitespace().nth(5))
            .find(|path| path.contains("/libc.so"))
            .expect("libc mapped");
        let fd = open(Path::new(libc));
        // Then blazesym may follow its debug link (distributions ship debug info that way)
        assert_eq!(policy(&fd, &fd_path(&fd)), Policy::Follow, "{libc}");
    }

    #[test]
    fn link_names_must_be_plain_file_names() {
        let link = |section, name: &str| Link {
            section,
            name: name.as_bytes().to_vec(),
        };
        assert_eq!(link(DEBUGLINK, "libc.so.6.debug").check(), Ok(None));
        for bad in ["", ".", "..", "../../tmp/fifo", "/tmp/fifo", "0/x"] {
            assert!(link(DEBUGLINK, bad).check().is_err(), "{bad:?}");
        }
        // dwz's alternate file is named by absolute path: its directory is checked too
        assert_eq!(
            link(ALTLINK, "/usr/lib/debug/.dwz/x86_64-linux-gnu/perl.debug").check(),
            Ok(Some(PathBuf::from("/usr/lib/debug/.dwz/x86_64-linux-gnu")))
        );
        for bad in ["/usr/lib/../../tmp/x", "dir/x", "/"] {
            assert!(link(ALTLINK, bad).check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn directories_others_may_write_are_not_trusted() {
        assert_eq!(trusted_dir(Path::new("/usr/lib"), &Host), Ok(()));
        // /tmp is sticky and world-writable: anyone may create a file in it.
        assert!(trusted_dir(Path::new("/tmp"), &Host).is_err());
        assert!(trusted_dir(Path::new("/tmp/no/such/dir"), &Host).is_err());
    }

    /// A made-up file system: each path's owner uid and mode; no symbolic links.
    struct Made(std::collections::BTreeMap<PathBuf, (u32, u32)>);

    impl Made {
        /// Root's `/`, `/usr/lib/debug`, `/lib` (no `/lib/debug`: its parent decides),
        /// `/opt/app/bin` and `/srv/dwz`, all mode 755, with `changes` applied.
        fn with(changes: &[(&str, (u32, u32))]) -> Self {
            let mut paths: std::collections::BTreeMap<PathBuf, (u32, u32)> = [
                "/",
                "/usr",
                "/usr/lib",
                "/usr/lib/debug",
                "/lib",
                "/opt",
                "/opt/app",
                "/opt/app/bin",
                "/srv",
                "/srv/dwz",
            ]
            .into_iter()
            .map(|path| (PathBuf::from(path), (0, 0o755)))
            .collect();
            for (path, owner_and_mode) in changes {
                paths.insert(PathBuf::from(path), *owner_and_mode);
            }
            Self(paths)
        }
    }

    impl FileSystem for Made {
        fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
            if self.0.contains_key(path) {
                Ok(path.to_path_buf())
            } else {
                Err(std::io::ErrorKind::NotFound.into())
            }
        }

        fn owner_and_mode(&self, path: &Path) -> std::io::Result<(u32, u32)> {
            self.0
                .get(path)
                .copied()
                .ok_or_else(|| std::io::ErrorKind::NotFound.into())
        }
    }

    #[test]
    fn a_root_owned_file_is_followed_only_from_directories_only_root_may_write() {
        // Given a root-owned binary /opt/app/bin, mode 755, with a debug link to a plain name,
        // and one with an alternate link into /srv/dwz
        let link = |section, name: &str| Link {
            section,
            name: name.as_bytes().to_vec(),
        };
        let debuglink = [link(DEBUGLINK, "bin.debug")];
        let altlink = [
            link(DEBUGLINK, "bin.debug"),
            link(ALTLINK, "/srv/dwz/x.debug"),
        ];
        let root_file = (0, 0o100_755);
        let bin = Path::new("/opt/app/bin");
        let refused_dir = |fs: &Made, links: &[Link]| match decide(links, root_file, bin, fs) {
            Err(Refusal::Directory { dir, .. }) => Some(dir),
            other => {
                assert_eq!(
                    other,
                    Ok(()),
                    "neither followed nor refused for a directory"
                );
                None
            }
        };
        // When every directory searched, and every one above, is root's and mode 755
        // Then its links are followed
        assert_eq!(refused_dir(&Made::with(&[]), &debuglink), None);
        assert_eq!(refused_dir(&Made::with(&[]), &altlink), None);
        // When the file's own directory, a directory above it, a debug directory (or, when it
        // does not exist, the directory that decides who may create it) or the alternate
        // link's directory may be written by others (sticky or not, by group or by all), or
        // is another user's
        let cases = [
            ("/opt/app", (0, 0o1777), &debuglink[..], "/opt/app"),
            ("/opt/app", (0, 0o777), &debuglink[..], "/opt/app"),
            ("/opt/app", (0, 0o775), &debuglink[..], "/opt/app"),
            ("/opt/app", (1000, 0o755), &debuglink[..], "/opt/app"),
            ("/opt", (0, 0o1777), &debuglink[..], "/opt"),
            ("/", (0, 0o777), &debuglink[..], "/"),
            (
                "/usr/lib/debug",
                (0, 0o1777),
                &debuglink[..],
                "/usr/lib/debug",
            ),
            ("/lib", (1000, 0o755), &debuglink[..], "/lib"),
            ("/srv/dwz", (0, 0o1777), &altlink[..], "/srv/dwz"),
        ];
        for (path, owner_and_mode, links, dir) in cases {
            let fs = Made::with(&[(path, owner_and_mode)]);
            // Then they are refused, naming that directory
            assert_eq!(
                refused_dir(&fs, links).as_deref(),
                Some(dir),
                "{path}: uid {}, mode {:o}",
                owner_and_mode.0,
                owner_and_mode.1
            );
        }
        // And a file others may write, or another user's, is refused before any directory
        for owner_and_mode in [(0, 0o100_775), (0, 0o100_757), (1000, 0o100_755)] {
            assert!(
                matches!(
                    decide(&debuglink, owner_and_mode, bin, &Made::with(&[])),
                    Err(Refusal::Writable { .. })
                ),
                "uid {}, mode {:o}",
                owner_and_mode.0,
                owner_and_mode.1
            );
        }
    }
}
