//! The files sink's writer: the chosen outputs (`stacks.folded`, `profile.pb.gz`,
//! `flamegraph.svg`, `profile.speedscope.json`) in one directory, created once (atomically
//! replacing what was there) and then replaced whole at each write, so a reader never sees a
//! file half written.
//!
//! Invariants (`record` creates them as root in a directory another user may own):
//! - the directory is opened once (O_DIRECTORY) and every name is resolved relative to that
//!   descriptor, so a rename of a parent cannot redirect us;
//! - each file is created fresh under a temporary name with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600,
//!   handed to the invoking user (`SUDO_UID`/`SUDO_GID`, when root) with fchown, and renamed onto
//!   its final name while still privileged: whatever was there (a symlink to a root-only file, a
//!   file of someone else) is replaced, never followed or truncated;
//! - each later write goes to a new temporary file made the same way in the same directory
//!   descriptor and renamed onto the name once complete (a program reading the outputs while
//!   `run --output-dir` rewrites them each window gets the old file or the new one, never a
//!   truncated one); where that is refused (`record` writes after dropping its privileges to a
//!   user that cannot create files in the invoking user's directory), the files are rewritten
//!   in place through the descriptors opened at creation (truncate + write from offset 0, one
//!   shared [`replace_with`]): nothing is ever reopened by name. There a render that fails
//!   midway (each format is rendered straight into its file) leaves that file short, as a full
//!   disk would.
//!
//! `run --output-dir` uses the same code unprivileged (no SUDO_*).

use super::FoldedRoot;
use std::{
    ffi::OsStr,
    fs::File,
    io::{self, Seek as _, Write as _},
    os::{
        fd::OwnedFd,
        unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    },
    path::{Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{self, AtFlags, OFlag},
    sys::stat::{self, Mode},
    unistd::{self, Gid, Uid},
};

use super::{flamegraph, folded, pprof, speedscope, OutputFormat};
use crate::{labels::labeled::LabeledProfile, model::SampleKind};

pub const FOLDED: &str = "stacks.folded";
pub const PPROF: &str = "profile.pb.gz";
pub const FLAMEGRAPH: &str = "flamegraph.svg";
pub const SPEEDSCOPE: &str = "profile.speedscope.json";
pub const OFF_CPU_FOLDED: &str = "stacks.offcpu.folded";
pub const OFF_CPU_FLAMEGRAPH: &str = "flamegraph.offcpu.svg";

/// Mode of a directory we create: the invoking user's, listable by others as today's outputs.
const DIR_MODE: u32 = 0o755;
/// Mode of every output file: its owner only.
const FILE_MODE: u32 = 0o600;
/// Bytes buffered between a renderer and an output file.
const WRITE_BUFFER: usize = 1 << 16;
/// Tries at a fresh temporary name before giving up (someone else creating the same names).
const TEMP_ATTEMPTS: u32 = 16;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    #[error("`{call}` failed for {path}: {source}")]
    Call {
        call: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a directory we created (it changed under us); not using it")]
    Replaced { path: PathBuf },
    #[error(
        "{path} is a symlink that uid {owner} could have placed (it, or a directory before it, \
         belongs to neither root nor you); not following it: give the real directory instead"
    )]
    UntrustedLink { path: PathBuf, owner: u32 },
    #[error("writing {name}: {message}")]
    Write { name: &'static str, message: String },
}

fn call<'a>(call: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> OutputError + 'a {
    move |errno| OutputError::Call {
        call,
        path: path.to_path_buf(),
        source: io::Error::from(errno),
    }
}

/// Who the files (and a directory we create) should belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: Uid,
    pub gid: Gid,
}

impl Owner {
    /// The invoking user of `sudo` (`SUDO_UID` and `SUDO_GID`, both set and numeric), if we are
    /// root: only root can give files away, and only then is there someone to give them to.
    pub fn from_sudo(env: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        if !Uid::effective().is_root() {
            return None;
        }
        let number = |name: &str| env(name)?.trim().parse::<u32>().ok();
        Some(Self {
            uid: Uid::from_raw(number("SUDO_UID")?),
            gid: Gid::from_raw(number("SUDO_GID")?),
        })
    }
}

pub struct OutputSet {
    /// The output directory, opened once: every later name is resolved relative to it.
    dir_fd: OwnedFd,
    /// Who the files belong to (None: the current user).
    owner: Option<Owner>,
    /// One open file per chosen format, in [`OutputFormat::normalize`] order: the file now
    /// under the format's name.
    files: Vec<(OutputFormat, File)>,
    pub paths: Vec<PathBuf>,
    /// Set once a new file could not be created or renamed in the directory: from then on the
    /// files are rewritten in place.
    in_place: bool,
    /// What the folded lines' (and the flamegraph's) root frame names.
    pub folded_root: FoldedRoot,
}

impl OutputSet {
    /// Creates `dir` if needed and creates the files of `formats` in it, owned by the `sudo`
    /// user when there is one.
    pub fn create(dir: &Path, formats: &[OutputFormat]) -> Result<Self, OutputError> {
        let owner = Owner::from_sudo(&|name| std::env::var(name).ok());
        Self::create_owned(dir, owner, formats)
    }

    /// [`OutputSet::create`] with an explicit owner (None: the current user).
    pub fn create_owned(
        dir: &Path,
        owner: Option<Owner>,
        formats: &[OutputFormat],
    ) -> Result<Self, OutputError> {
        let dir_fd = open_dir(dir, owner)?;
        let mut files = Vec::new();
        let mut paths = Vec::new();
        for format in OutputFormat::normalize(formats) {
            let name = format.file_name();
            let path = dir.join(name);
            files.push((
                format,
                create_file(&dir_fd, OsStr::new(name), &path, owner)?,
            ));
            paths.push(path);
        }
        Ok(Self {
            dir_fd,
            owner,
            files,
            paths,
            in_place: false,
            folded_root: FoldedRoot::default(),
        })
    }

    /// The formats written, to create the same files again.
    pub fn formats(&self) -> Vec<OutputFormat> {
        self.files.iter().map(|(format, _)| *format).collect()
    }

    /// Whether every output file is still linked in a directory: false once one was deleted,
    /// e.g. with its directory (writes would then go to a file nobody can open).
    pub fn linked(&self) -> bool {
        self.files
            .iter()
            .all(|(_, file)| file.metadata().is_ok_and(|m| m.nlink() > 0))
    }

    /// Writes `profile` to every file: a new file renamed onto the name once complete, or, where
    /// the directory refuses that, the old one rewritten through its descriptor.
    pub fn write(&mut self, profile: &LabeledProfile) -> Result<(), OutputError> {
        let root = self.folded_root;
        let Self {
            dir_fd,
            owner,
            files,
            paths,
            in_place,
            ..
        } = self;
        for ((format, file), path) in files.iter_mut().zip(paths.iter()) {
            let name = format.file_name();
            let failed = |err: &io::Error| OutputError::Write {
                name,
                message: with_causes(err),
            };
            // Each format is rendered straight into its file, one after another: what one
            // render holds (its tables, inferno's frames) is freed before the next starts,
            // and no file's content is ever held whole in memory.
            let emit = |out: &mut dyn io::Write| -> io::Result<()> {
                match format {
                    OutputFormat::Folded => folded::write_of(profile, root, SampleKind::Cpu, out),
                    OutputFormat::OffCpuFolded => {
                        folded::write_of(profile, root, SampleKind::OffCpu, out)
                    }
                    OutputFormat::Pprof => pprof::encode_to(profile, out).map_err(io::Error::other),
                    OutputFormat::Svg => {
                        flamegraph::write_with(profile, root, out).map_err(io::Error::other)
                    }
                    OutputFormat::Speedscope => {
                        speedscope::write(profile, out).map_err(io::Error::other)
                    }
                    OutputFormat::OffCpuSvg => {
                        flamegraph::write_off_cpu(profile, root, out).map_err(io::Error::other)
                    }
                }
            };
            if !*in_place {
                match publish(dir_fd, OsStr::new(name), path, *owner, emit) {
                    Ok(Published::Replaced(new)) => {
                        *file = new;
                        continue;
                    }
                    Ok(Published::Refused(err)) => {
                        tracing::debug!(
                            error = %err,
                            "cannot create files in the output directory; rewriting the outputs in place"
                        );
                        *in_place = true;
                    }
                    Err(err) => return Err(failed(&err)),
                }
            }
            replace_with(file, emit).map_err(|e| failed(&e))?;
        }
        Ok(())
    }
}

/// `err` and each error it was caused by, `: ` between them (the log says why, not only what
/// failed).
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut cause = err.source();
    while let Some(err) = cause {
        message.push_str(": ");
        message.push_str(&err.to_string());
        cause = err.source();
    }
    message
}

/// What became of a new version of an output file.
enum Published {
    /// It is now under the name; the file is open for the next write's fallback.
    Replaced(File),
    /// The directory refused a new file or the rename (nothing is left behind).
    Refused(OutputError),
}

/// Writes what `write` writes to a new file in `dir_fd` (made as [`create_temp`] makes it,
/// through a buffer) and renames it onto `name` once complete. An error writing (a full disk)
/// is returned as such.
fn publish(
    dir_fd: &OwnedFd,
    name: &OsStr,
    path: &Path,
    owner: Option<Owner>,
    write: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> io::Result<Published> {
    let (fd, temp) = match create_temp(dir_fd, name, path, owner) {
        Ok(created) => created,
        Err(err) => return Ok(Published::Refused(err)),
    };
    let remove = || {
        // Best effort: do not leave the temporary file behind.
        let _ = unistd::unlinkat(dir_fd, temp.as_os_str(), unistd::UnlinkatFlags::NoRemoveDir);
    };
    let mut file = File::from(fd);
    let written = {
        let mut out = io::BufWriter::with_capacity(WRITE_BUFFER, &mut file);
        write(&mut out).and_then(|()| out.flush())
    };
    if let Err(err) = written {
        remove();
        return Err(err);
    }
    match fcntl::renameat(dir_fd, temp.as_os_str(), dir_fd, name) {
        Ok(()) => Ok(Published::Replaced(file)),
        Err(errno) => {
            remove();
            Ok(Published::Refused(call("renameat", path)(errno)))
        }
    }
}

/// Replaces the whole content of `file` (opened by us earlier) with what `write` writes through
/// a buffer: truncate, rewind, write. Never reopens anything by name.
fn replace_with(
    file: &mut File,
    write: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> io::Result<()> {
    file.set_len(0)?;
    file.rewind()?;
    let mut out = io::BufWriter::with_capacity(WRITE_BUFFER, file);
    write(&mut out)?;
    out.flush()
}

/// Most symlinks followed on the way to the output directory (the kernel's own limit).
const MAX_LINKS: u32 = 40;

/// Opens `dir` (O_DIRECTORY), creating what is missing of it as `mkdir -p` would: parents as
/// the current user, the last component mode 0755 and given to `owner`.
///
/// The path is walked one component at a time from `/` (a relative `dir` from the working
/// directory), each opened with O_NOFOLLOW relative to the one before. A symlink on the way is
/// followed only when the link and every directory walked before it are owned by root, by us or
/// by `owner` (the `sudo` user), and the directory holding the link is not one that everybody
/// may write without the sticky bit: a link a third user could have placed (in a directory she
/// owns, or her own link in /tmp) is refused, so `record` run as root never writes where she
/// points it.
fn open_dir(dir: &Path, owner: Option<Owner>) -> Result<OwnedFd, OutputError> {
    // O_PATH while walking: passing through a directory needs search permission only, as a
    // path lookup by the kernel would; the output directory itself is opened for reading last.
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let trusted = |uid: u32| {
        uid == 0 || uid == Uid::effective().as_raw() || owner.is_some_and(|o| o.uid.as_raw() == uid)
    };
    let absolute = std::path::absolute(dir).map_err(|source| OutputError::Call {
        call: "getcwd",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut pending: Vec<std::ffi::OsString> = components(&absolute);
    pending.reverse();
    let root = || fcntl::open("/", flags, Mode::empty()).map_err(call("open", Path::new("/")));
    let mut current = root()?;
    let mut walked = PathBuf::from("/");
    let mut all_trusted = trusted(
        stat::fstat(&current)
            .map_err(call("fstat", &walked))?
            .st_uid,
    );
    let mut links = 0;
    while let Some(name) = pending.pop() {
        let last = pending.is_empty();
        let here = walked.join(&name);
        match fcntl::openat(
            &current,
            name.as_os_str(),
            flags | OFlag::O_NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(fd) => {
                let st = stat::fstat(&fd).map_err(call("fstat", &here))?;
                all_trusted &= trusted(st.st_uid);
                current = fd;
            }
            Err(Errno::ENOENT) => {
                current = make_dir(&current, &name, &here, last.then_some(owner))?;
            }
            Err(errno @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                let link = stat::fstatat(&current, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(call("fstatat", &here))?;
                if link.st_mode & libc::S_IFMT != libc::S_IFLNK {
                    return Err(call("openat", &here)(errno));
                }
                let holder = stat::fstat(&current).map_err(call("fstat", &walked))?;
                let open_to_all = holder.st_mode & 0o002 != 0 && holder.st_mode & 0o1000 == 0;
                if !all_trusted || !trusted(link.st_uid) || open_to_all {
                    return Err(OutputError::UntrustedLink {
                        path: here,
                        owner: link.st_uid,
                    });
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(call("openat", &here)(Errno::ELOOP));
                }
                let target = fcntl::readlinkat(&current, name.as_os_str())
                    .map_err(call("readlinkat", &here))?;
                let target = Path::new(&target);
                if target.is_absolute() {
                    current = root()?;
                    walked = PathBuf::from("/");
                    all_trusted &= trusted(
                        stat::fstat(&current)
                            .map_err(call("fstat", &walked))?
                            .st_uid,
                    );
                }
                pending.extend(components(target).into_iter().rev());
                continue;
            }
            Err(errno) => return Err(call("openat", &here)(errno)),
        }
        walked = here;
    }
    fcntl::openat(
        &current,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(call("open", &walked))
}

/// The names to walk in `path`, `..` included (resolved by the kernel against the directory
/// actually reached, not textually).
fn components(path: &Path) -> Vec<std::ffi::OsString> {
    use std::path::Component;
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Creates directory `name` in `parent` and opens it. `owner`: `Some` for the output directory
/// itself (made 0755 and given to the `sudo` user, if any), `None` for a missing parent (left
/// to the current user, as `mkdir -p` would).
fn make_dir(
    parent: &OwnedFd,
    name: &OsStr,
    path: &Path,
    owner: Option<Option<Owner>>,
) -> Result<OwnedFd, OutputError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    match stat::mkdirat(parent, name, Mode::from_bits_truncate(DIR_MODE)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(errno) => return Err(call("mkdirat", path)(errno)),
    }
    // O_NOFOLLOW: if someone swapped what we just made for a symlink, do not follow it, and
    // hand nothing over unless the directory is ours (made by this uid just now).
    let fd = fcntl::openat(parent, name, flags | OFlag::O_NOFOLLOW, Mode::empty())
        .map_err(call("openat", path))?;
    let st = stat::fstat(&fd).map_err(call("fstat", path))?;
    if st.st_uid != Uid::effective().as_raw() {
        return Err(OutputError::Replaced {
            path: path.to_path_buf(),
        });
    }
    if let Some(owner) = owner {
        // The umask may have narrowed mkdir's mode.
        stat::fchmod(&fd, Mode::from_bits_truncate(DIR_MODE)).map_err(call("fchmod", path))?;
        if let Some(owner) = owner {
            unistd::fchown(&fd, Some(owner.uid), Some(owner.gid)).map_err(call("fchown", path))?;
        }
    }
    Ok(fd)
}

/// Creates `name` in `dir_fd` as a new 0600 file (see [`create_temp`]) and renames it onto
/// `name`, replacing whatever entry was there without following it. Returns the open file;
/// nothing is written yet.
fn create_file(
    dir_fd: &OwnedFd,
    name: &OsStr,
    path: &Path,
    owner: Option<Owner>,
) -> Result<File, OutputError> {
    let (fd, temp) = create_temp(dir_fd, name, path, owner)?;
    if let Err(errno) = fcntl::renameat(dir_fd, temp.as_os_str(), dir_fd, name) {
        // Best effort: do not leave the temporary file behind.
        let _ = unistd::unlinkat(dir_fd, temp.as_os_str(), unistd::UnlinkatFlags::NoRemoveDir);
        return Err(call("renameat", path)(errno));
    }
    Ok(File::from(fd))
}

/// Creates a new 0600 file beside `name` in `dir_fd` under a fresh temporary name
/// (O_CREAT|O_EXCL|O_NOFOLLOW: never an existing entry, never through a link) and gives it to
/// `owner`. Returns it with its temporary name; on error nothing is left behind.
fn create_temp(
    dir_fd: &OwnedFd,
    name: &OsStr,
    path: &Path,
    owner: Option<Owner>,
) -> Result<(OwnedFd, std::ffi::OsString), OutputError> {
    let flags =
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
    let mut attempt = 0;
    let (fd, temp) = loop {
        let temp = temp_name(name, attempt);
        match fcntl::openat(
            dir_fd,
            temp.as_os_str(),
            flags,
            Mode::from_bits_truncate(FILE_MODE),
        ) {
            Ok(fd) => break (fd, temp),
            Err(Errno::EEXIST) if attempt + 1 < TEMP_ATTEMPTS => attempt += 1,
            Err(errno) => return Err(call("openat", &path.with_file_name(&temp))(errno)),
        }
    };
    let finish = || -> Result<(), OutputError> {
        // The umask may have narrowed the mode; it can never have widened it.
        stat::fchmod(&fd, Mode::from_bits_truncate(FILE_MODE)).map_err(call("fchmod", path))?;
        if let Some(owner) = owner {
            unistd::fchown(&fd, Some(owner.uid), Some(owner.gid)).map_err(call("fchown", path))?;
        }
        Ok(())
    };
    if let Err(err) = finish() {
        // Best effort: do not leave the temporary file behind.
        let _ = unistd::unlinkat(dir_fd, temp.as_os_str(), unistd::UnlinkatFlags::NoRemoveDir);
        return Err(err);
    }
    Ok((fd, temp))
}

/// `.NAME.PID.RANDOM.tmp`: hidden, and unlikely to exist already.
fn temp_name(name: &OsStr, attempt: u32) -> std::ffi::OsString {
    let mut bytes = b".".to_vec();
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(
        format!(
            ".{}.{:08x}{attempt}.tmp",
            std::process::id(),
            fastrand::u32(..)
        )
        .as_bytes(),
    );
    OsStr::from_bytes(&bytes).to_owned()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::{
        fd::AsFd as _,
        unix::fs::{MetadataExt as _, PermissionsExt as _},
    };

    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    /// A window like the churn soak's: `stacks` stacks each drawn once down a binary tree of
    /// functions 16 to 23 levels deep (nearly all distinct), from a few processes.
    fn churn_window(stacks: u32) -> LabeledProfile {
        use crate::model::{Frame, FrameKind, SymbolizedSample, Thread};
        let start = 1_700_000_000_000_000_000;
        let mut profile = LabeledProfile::new(4999);
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..stacks {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let depth = 16 + (seed % 8) as usize;
            let stack: Vec<Frame> = (0..depth)
                .map(|level| {
                    let side = (seed >> (8 + level)) & 1;
                    let name = format!("walk_{level}_{side}");
                    Frame::bare(&name, FrameKind::Native, 0x1000 + level as u64 * 16 + side)
                })
                .rev()
                .collect();
            let pid = i % 5 + 1;
            profile.add(
                SymbolizedSample {
                    thread: Thread::bare((pid, pid), "distinct", "distinct", "/bin/distinct"),
                    stack: stack.into(),
                    count: 1 + seed % 3,
                },
                start,
                start + 60_000_000_000,
            );
        }
        // (the rows' order is made once and kept: made here, not in what is measured)
        let _ = profile.samples();
        profile
    }

    /// The most heap the writer held at once writing `profile` to new files of `formats`, and
    /// the size of each file written.
    fn write_peak(formats: &[OutputFormat], profile: &LabeledProfile) -> (i64, Vec<u64>) {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let mut set = OutputSet::create_owned(&out, None, formats).unwrap();
        let (written, peak) = crate::symbolize::alloc::peak(|| set.write(profile));
        written.unwrap();
        let sizes = set
            .paths
            .iter()
            .map(|path| fs::metadata(path).unwrap().len())
            .collect();
        (peak, sizes)
    }

    #[test]
    fn a_window_is_written_one_format_at_a_time_straight_into_its_files() {
        // Given a window of 30,000 mostly distinct stacks, and what rendering each format in
        // memory holds at most (its tables, then the whole file beside them)
        let profile = churn_window(30_000);
        let in_memory = |format| {
            let render = || match format {
                OutputFormat::Svg => flamegraph::render_cpu(&profile, FoldedRoot::Process, true)
                    .unwrap()
                    .len(),
                OutputFormat::Pprof => pprof::encode(&profile).unwrap().len(),
                OutputFormat::Speedscope => speedscope::render(&profile).unwrap().len(),
                _ => folded::render_of(&profile, FoldedRoot::Process, SampleKind::Cpu).len(),
            };
            crate::symbolize::alloc::peak(render).1
        };
        let formats = [
            OutputFormat::Svg,
            OutputFormat::Pprof,
            OutputFormat::Folded,
            OutputFormat::Speedscope,
        ];
        // When each format is written alone, then all of them
        let alone: Vec<(OutputFormat, i64, i64)> = formats
            .iter()
            .map(|&format| {
                let (peak, sizes) = write_peak(&[format], &profile);
                (format, peak, i64::try_from(sizes[0]).unwrap())
            })
            .collect();
        let (all, sizes) = write_peak(&formats, &profile);
        // Then they were written one after another: all of them held no more than the format
        // that holds most does alone (and the buffers of the files, 64 KiB each)
        let largest_alone = alone.iter().map(|&(_, peak, _)| peak).max().unwrap();
        eprintln!("all: peak {all} B, largest alone {largest_alone} B, files {sizes:?}");
        assert!(
            all <= largest_alone + 4 * WRITE_BUFFER as i64,
            "all formats held {all} B at once; the largest alone {largest_alone} B"
        );
        for (format, peak, size) in alone {
            let rendered = in_memory(format);
            eprintln!(
                "{format:?}: peak {peak} B writing, {rendered} B rendering in memory, file {size} B"
            );
            // And each file's content was never held whole: writing it held less than
            // rendering it into memory did, by at least half the file (speedscope's stacks are
            // moved out of its tables into the document before it is serialized, so its file
            // never was on top of its peak)
            assert!(
                format == OutputFormat::Speedscope || peak + size / 2 <= rendered,
                "{format:?}: writing held {peak} B, rendering in memory {rendered} B, for a \
                 file of {size} B"
            );
        }
    }

    #[test]
    fn a_symlink_in_place_of_an_output_is_replaced_never_followed() {
        // Given an output directory holding a symlink named flamegraph.svg to another file
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
        let out = tmp.path().join("out");
        fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&victim, out.join(FLAMEGRAPH)).unwrap();
        // When the outputs are created and written
        let mut set = OutputSet::create_owned(&out, None, &OutputFormat::DEFAULT).unwrap();
        set.write(&LabeledProfile::default()).unwrap();
        // Then the other file is untouched and flamegraph.svg is a regular 0600 file
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(mode(&victim), 0o600);
        let meta = fs::symlink_metadata(out.join(FLAMEGRAPH)).unwrap();
        assert!(meta.file_type().is_file(), "still a symlink");
        assert_eq!(mode(&out.join(FLAMEGRAPH)), 0o600);
        assert!(meta.len() > 0, "the flamegraph was written");
        // And no temporary file is left behind
        let names: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[test]
    fn an_output_symlink_is_followed_only_when_no_third_user_could_have_placed_it() {
        if !Uid::effective().is_root() {
            return; // giving a link to another user needs root
        }
        // Given a root-only directory, a link to it that another user (1000) owns, and one
        // root owns in a directory that user owns, and one of root's in root's directory
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        fs::create_dir(&secret).unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o700)).unwrap();
        let hers = tmp.path().join("hers");
        fs::create_dir(&hers).unwrap();
        std::os::unix::fs::chown(&hers, Some(1000), Some(1000)).unwrap();
        let her_link = hers.join("her-link");
        std::os::unix::fs::symlink(&secret, &her_link).unwrap();
        std::os::unix::fs::lchown(&her_link, Some(1000), Some(1000)).unwrap();
        let roots_link_in_hers = hers.join("roots-link");
        std::os::unix::fs::symlink(&secret, &roots_link_in_hers).unwrap();
        let roots_link = tmp.path().join("roots-link");
        std::os::unix::fs::symlink("secret", &roots_link).unwrap();
        let formats = [OutputFormat::Folded];
        let refused = |dir: &Path, owner| match OutputSet::create_owned(dir, owner, &formats) {
            Err(OutputError::UntrustedLink { path, owner }) => (path, owner),
            Err(err) => panic!("{}: {err}", dir.display()),
            Ok(_) => panic!("{} was followed", dir.display()),
        };
        // Then her link is refused, and so is root's link in her directory, also below them
        assert_eq!(refused(&her_link, None), (her_link.clone(), 1000));
        assert_eq!(
            refused(&her_link.join("sub"), None),
            (her_link.clone(), 1000)
        );
        assert_eq!(refused(&roots_link_in_hers, None), (roots_link_in_hers, 0));
        assert!(
            fs::read_dir(&secret).unwrap().next().is_none(),
            "written through"
        );
        // And her link is followed when she is the one running sudo, as is root's own link
        let her = Owner {
            uid: Uid::from_raw(1000),
            gid: Gid::from_raw(1000),
        };
        assert!(OutputSet::create_owned(&her_link, Some(her), &formats).is_ok());
        assert!(OutputSet::create_owned(&roots_link.join("made"), None, &formats).is_ok());
        assert!(secret.join("made").join(FOLDED).exists());
    }

    #[test]
    fn existing_outputs_are_replaced_by_new_private_files() {
        // Given outputs left by an earlier run, world-readable and hard-linked elsewhere
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        fs::create_dir(&out).unwrap();
        for name in [FOLDED, PPROF, FLAMEGRAPH] {
            fs::write(
                out.join(name),
                "old content that is longer than the new one",
            )
            .unwrap();
            fs::set_permissions(out.join(name), fs::Permissions::from_mode(0o644)).unwrap();
        }
        let link = tmp.path().join("hardlink");
        fs::hard_link(out.join(FOLDED), &link).unwrap();
        let old_inode = fs::metadata(&link).unwrap().ino();
        // When the outputs are created and written twice
        let mut set = OutputSet::create_owned(&out, None, &OutputFormat::DEFAULT).unwrap();
        set.write(&LabeledProfile::default()).unwrap();
        set.write(&LabeledProfile::default()).unwrap();
        // Then each is a new 0600 file and the old inode kept its content
        for name in [FOLDED, PPROF, FLAMEGRAPH] {
            assert_eq!(mode(&out.join(name)), 0o600, "{name}");
            assert!(!fs::read(out.join(name))
                .unwrap()
                .starts_with(b"old content"));
        }
        assert_ne!(fs::metadata(out.join(FOLDED)).unwrap().ino(), old_inode);
        assert_eq!(
            fs::read_to_string(&link).unwrap(),
            "old content that is longer than the new one"
        );
        assert_eq!(set.paths.len(), 3);
    }

    #[test]
    fn a_reader_never_sees_an_output_half_written() {
        // Given written outputs, and a reader holding stacks.folded's and flamegraph.svg's
        // files open as a program watching the directory would
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let mut set = OutputSet::create_owned(&out, None, &OutputFormat::DEFAULT).unwrap();
        set.write(&LabeledProfile::default()).unwrap();
        let held: Vec<(fs::File, Vec<u8>)> = [FOLDED, FLAMEGRAPH]
            .iter()
            .map(|name| {
                (
                    fs::File::open(out.join(name)).unwrap(),
                    fs::read(out.join(name)).unwrap(),
                )
            })
            .collect();
        // When the outputs are written again
        set.write(&LabeledProfile::default()).unwrap();
        // Then each name holds a new file and what the reader holds was never truncated
        for (file, before) in held {
            let ino = file.metadata().unwrap().ino();
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut &file, &mut content).unwrap();
            assert_eq!(content, before);
            assert!(
                fs::read_dir(&out)
                    .unwrap()
                    .all(|e| e.unwrap().metadata().unwrap().ino() != ino),
                "rewritten in place"
            );
        }
        assert!(!set.in_place);
        assert_eq!(mode(&out.join(FOLDED)), 0o600);
        assert_eq!(
            fs::read_dir(&out).unwrap().count(),
            3,
            "a temporary file was left"
        );
    }

    #[test]
    fn where_no_new_file_can_take_the_name_the_outputs_are_rewritten_in_place() {
        // Given outputs whose stacks.folded name now holds a directory (a rename onto it fails,
        // for root too)
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let mut set = OutputSet::create_owned(&out, None, &OutputFormat::DEFAULT).unwrap();
        fs::remove_file(out.join(FOLDED)).unwrap();
        fs::create_dir(out.join(FOLDED)).unwrap();
        fs::write(out.join(FOLDED).join("x"), "x").unwrap();
        // When the outputs are written
        set.write(&LabeledProfile::default()).unwrap();
        // Then the writer fell back to its descriptors and left no temporary file behind
        assert!(set.in_place);
        assert!(fs::metadata(out.join(FOLDED)).unwrap().is_dir());
        let mut names: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [FLAMEGRAPH, PPROF, FOLDED]);
    }

    #[test]
    fn only_the_chosen_formats_are_created_and_written() {
        // Given --format speedscope,folded,speedscope (a repeat, out of order)
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let formats = [
            OutputFormat::Speedscope,
            OutputFormat::Folded,
            OutputFormat::Speedscope,
        ];
        // When the outputs are created and written
        let mut set = OutputSet::create_owned(&out, None, &formats).unwrap();
        set.write(&LabeledProfile::default()).unwrap();
        // Then exactly those two files exist, listed in the fixed order, each written
        let mut names: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [SPEEDSCOPE, FOLDED]);
        assert_eq!(set.paths, [out.join(FOLDED), out.join(SPEEDSCOPE)]);
        assert!(fs::metadata(out.join(SPEEDSCOPE)).unwrap().len() > 0);
        assert_eq!(mode(&out.join(SPEEDSCOPE)), 0o600);
    }

    #[test]
    fn a_missing_directory_is_created_0755_with_its_parents() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("a/b/out");
        let set = OutputSet::create_owned(&out, None, &OutputFormat::DEFAULT).unwrap();
        assert_eq!(mode(&out), 0o755);
        for path in &set.paths {
            assert_eq!(mode(path), 0o600, "{}", path.display());
        }
        let st = stat::fstat(set.files[0].1.as_fd()).unwrap();
        assert_eq!(st.st_uid, Uid::effective().as_raw());
    }

    #[test]
    fn a_symlink_another_user_put_where_a_directory_we_create_goes_is_not_followed() {
        if !Uid::effective().is_root() {
            return; // giving a link to another user needs root
        }
        // Given a dangling symlink of another user's where the output directory should go
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere");
        let out = tmp.path().join("out");
        std::os::unix::fs::symlink(&target, &out).unwrap();
        std::os::unix::fs::lchown(&out, Some(1000), Some(1000)).unwrap();
        // When creating the outputs there
        let result = OutputSet::create_owned(&out, None, &OutputFormat::DEFAULT);
        // Then nothing is created through the link
        assert!(matches!(result, Err(OutputError::UntrustedLink { .. })));
        assert!(!target.exists());
    }

    #[test]
    fn replace_leaves_only_the_new_content() {
        // Given a file holding longer content
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[b'x'; 4096]).unwrap();
        // When new bytes replace it
        replace_with(&mut file, |out| out.write_all(b"new")).unwrap();
        // Then the file holds exactly them
        let mut content = Vec::new();
        file.rewind().unwrap();
        std::io::Read::read_to_end(&mut file, &mut content).unwrap();
        assert_eq!(content, b"new");
    }

    #[test]
    fn the_sudo_owner_needs_both_numbers() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let root = Uid::effective().is_root();
        let both = Owner::from_sudo(&env(&[("SUDO_UID", "1000"), ("SUDO_GID", "100")]));
        assert_eq!(
            both,
            root.then_some(Owner {
                uid: Uid::from_raw(1000),
                gid: Gid::from_raw(100)
            })
        );
        assert_eq!(Owner::from_sudo(&env(&[("SUDO_UID", "1000")])), None);
        assert_eq!(
            Owner::from_sudo(&env(&[("SUDO_UID", "bob"), ("SUDO_GID", "100")])),
            None
        );
    }

    #[test]
    fn files_are_given_to_the_owner_when_root() {
        if !Uid::effective().is_root() {
            eprintln!("SKIPPED: giving files away needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let owner = Owner {
            uid: Uid::from_raw(61999),
            gid: Gid::from_raw(61998),
        };
        let set = OutputSet::create_owned(&out, Some(owner), &OutputFormat::DEFAULT).unwrap();
        let dir = fs::metadata(&out).unwrap();
        assert_eq!((dir.uid(), dir.gid()), (61999, 61998));
        for path in &set.paths {
            let meta = fs::metadata(path).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid()),
                (61999, 61998),
                "{}",
                path.display()
            );
        }
    }
}
