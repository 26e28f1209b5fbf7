//! Reads the facts only the privileged side can see about a process from /proc: executable
//! mappings, executable path, thread names, cgroup and start time, and opens each mapped file
//! once per (device, inode) so the relay can read it through the passed descriptor.
//!
//! Only kernel-formatted text is read here (maps, stat, cgroup); file contents are never parsed.
//! Every failure is per process and reported to the caller, never fatal: processes exit at any
//! moment.

use std::{
    collections::HashMap,
    fs::{self, File},
    os::{fd::OwnedFd, unix::fs::MetadataExt as _},
    path::Path,
    rc::Rc,
};

use ember_protocol::{FileInfo, Mapping, ProcessInfo, ThreadInfo, NO_FD};

/// One open mapped file, shared by every process that maps it.
pub struct OpenFile {
    pub id: u64,
    pub fd: Option<Rc<OwnedFd>>,
    pub info: FileInfo,
    /// Processes whose current facts refer to this file.
    refs: usize,
}

/// Mapped files by (device, inode), each opened once and reused.
#[derive(Default)]
pub struct FileTable {
    files: HashMap<(u64, u64), OpenFile>,
    /// File id -> (device, inode), so lookups by id need no scan.
    ids: HashMap<u64, (u64, u64)>,
    next_id: u64,
}

impl FileTable {
    /// Every file currently held, for re-sending after a reconnect.
    pub fn all(&self) -> impl Iterator<Item = &OpenFile> {
        self.files.values()
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Returns the id of the file behind `mapping` of `pid`, opening it if new; new files are
    /// pushed to `fresh` so their descriptors get sent.
    fn intern(&mut self, pid: u32, mapping: &Mapping, fresh: &mut Vec<u64>) -> u64 {
        let key = (mapping.device, mapping.inode);
        if let Some(file) = self.files.get_mut(&key) {
            file.refs += 1;
            return file.id;
        }
        self.next_id += 1;
        let id = self.next_id;
        let (fd, open_error) = match open_mapped(pid, mapping) {
            Ok(fd) => (Some(Rc::new(fd)), String::new()),
            Err(err) => (None, err),
        };
        let info = FileInfo {
            file_id: id,
            device: mapping.device,
            inode: mapping.inode,
            path: mapping.path.clone(),
            fd: NO_FD,
            open_error,
        };
        self.ids.insert(id, key);
        self.files.insert(
            key,
            OpenFile {
                id,
                fd,
                info,
                refs: 1,
            },
        );
        fresh.push(id);
        id
    }

    /// Forgets one reference of every file of `mappings`, closing files nobody maps any more.
    pub fn release(&mut self, mappings: &[Mapping]) {
        let mut seen = std::collections::HashSet::new();
        for mapping in mappings.iter().filter(|m| m.file_id != 0) {
            let key = (mapping.device, mapping.inode);
            if !seen.insert(key) {
                continue;
            }
            if let Some(file) = self.files.get_mut(&key) {
                file.refs = file.refs.saturating_sub(1);
                if file.refs == 0 {
                    self.ids.remove(&file.id);
                    self.files.remove(&key);
                }
            }
        }
    }

    pub fn by_id(&self, id: u64) -> Option<&OpenFile> {
        self.files.get(self.ids.get(&id)?)
    }
}

/// Opens the file behind a mapping: through `map_files/` (the exact mapped object, even when
/// deleted or in another mount namespace), else through the process's root. The device and
/// inode are checked so a replaced path is never passed off as the mapped file.
fn open_mapped(pid: u32, mapping: &Mapping) -> Result<OwnedFd, String> {
    let by_range = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    let by_root = format!(
        "/proc/{pid}/root{}",
        mapping.path.trim_end_matches(" (deleted)")
    );
    let mut last_error = String::new();
    for candidate in [by_range, by_root] {
        match File::open(&candidate) {
            Ok(file) => match file.metadata() {
                Ok(meta) if meta.dev() == mapping.device && meta.ino() == mapping.inode => {
                    return Ok(OwnedFd::from(file));
                }
                Ok(_) => {
                    last_error = format!("{candidate} is not the mapped file (device/inode differ)")
                }
                Err(err) => last_error = format!("fstat {candidate}: {err}"),
            },
            Err(err) => last_error = format!("open {candidate}: {err}"),
        }
    }
    Err(last_error)
}

/// Wall-clock boot time in ns, from /proc/stat's `btime`.
pub fn boot_time_unix_ns() -> u64 {
    fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|stat| {
            stat.lines()
                .find_map(|line| line.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map_or(0, |secs| secs.saturating_mul(1_000_000_000))
}

/// Reads the facts of `pid` and interns its mapped files. `fresh` receives ids of newly opened
/// files. Fails only when the process is gone or unreadable.
pub fn read_process(
    pid: u32,
    boot_time_unix_ns: u64,
    files: &mut FileTable,
    fresh: &mut Vec<u64>,
) -> std::io::Result<ProcessInfo> {
    let dir = format!("/proc/{pid}");
    let maps = fs::read_to_string(format!("{dir}/maps"))?;
    let executable_path = fs::read_link(format!("{dir}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let main_comm = fs::read_to_string(format!("{dir}/comm"))
        .map(|c| c.trim_end().to_owned())
        .unwrap_or_default();
    let executable_name =
        match Path::new(executable_path.trim_end_matches(" (deleted)")).file_name() {
            Some(name) => name.to_string_lossy().into_owned(),
            None => main_comm.clone(),
        };
    let cgroup = fs::read_to_string(format!("{dir}/cgroup"))
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        })
        .unwrap_or_default();
    let start_time_unix_ns = fs::read_to_string(format!("{dir}/stat"))
        .ok()
        .and_then(|stat| start_ticks(&stat))
        .map_or(0, |ticks| {
            boot_time_unix_ns + ticks * (1_000_000_000 / clock_ticks())
        });
    let mut threads = Vec::new();
    if let Ok(entries) = fs::read_dir(format!("{dir}/task")) {
        for entry in entries.flatten() {
            let Some(tid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Ok(name) = fs::read_to_string(entry.path().join("comm")) {
                threads.push(ThreadInfo {
                    tid,
                    name: name.trim_end().to_owned(),
                });
            }
        }
    }
    let mut mappings = parse_maps(&maps);
    let mut interned = std::collections::HashMap::new();
    for mapping in &mut mappings {
        if mapping.inode == 0 || !mapping.path.starts_with('/') {
            continue;
        }
        // One reference per process and file, however many segments map it.
        let key = (mapping.device, mapping.inode);
        mapping.file_id = match interned.get(&key) {
            Some(&id) => id,
            None => {
                let id = files.intern(pid, mapping, fresh);
                interned.insert(key, id);
                id
            }
        };
    }
    Ok(ProcessInfo {
        pid,
        start_time_unix_ns,
        executable_path,
        executable_name,
        cgroup,
        mappings,
        threads,
        mappings_omitted: 0,
        threads_omitted: 0,
    })
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// Field 22 (starttime, clock ticks since boot) of /proc/<pid>/stat; the comm field may hold
/// spaces and parentheses, so fields are counted after the last ')'.
fn start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Executable mappings of a /proc/<pid>/maps text, sorted by start.
pub fn parse_maps(maps: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut fields = line.splitn(6, ' ');
        let (Some(range), Some(perms), Some(offset), Some(dev), Some(inode)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        if !perms.contains('x') {
            continue;
        }
        let path = fields.next().unwrap_or("").trim_start().to_owned();
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(file_offset)) = (
            u64::from_str_radix(start, 16),
            u64::from_str_radix(end, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        let device = dev
            .split_once(':')
            .and_then(|(major, minor)| {
                Some(libc::makedev(
                    u32::from_str_radix(major, 16).ok()?,
                    u32::from_str_radix(minor, 16).ok()?,
                ))
            })
            .unwrap_or(0);
        out.push(Mapping {
            start,
            end,
            file_offset,
            path,
            device,
            inode: inode.parse().unwrap_or(0),
            file_id: 0,
            build_id: Vec::new(),
        });
    }
    out.sort_by_key(|m| m.start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_executable_mappings_only() {
        let maps = "\
55d4c0a00000-55d4c0a01000 r--p 00000000 08:01 1234 /usr/bin/my prog
55d4c0a01000-55d4c0a05000 r-xp 00001000 08:01 1234 /usr/bin/my prog
7f00000000-7f00001000 rwxp 00000000 00:00 0 
7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]
";
        let mappings = parse_maps(maps);
        assert_eq!(mappings.len(), 3);
        assert_eq!(mappings[0].path, "[vdso]");
        assert_eq!(mappings[1].start, 0x7f00000000);
        let prog = &mappings[2];
        assert_eq!(prog.path, "/usr/bin/my prog");
        assert_eq!(prog.file_offset, 0x1000);
        assert_eq!(prog.inode, 1234);
        assert_eq!(prog.device, libc::makedev(8, 1));
    }

    #[test]
    fn start_time_survives_odd_comm() {
        let stat = "42 (a) b) c) S 1 42 42 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 777 1000 10";
        assert_eq!(start_ticks(stat), Some(777));
    }
}
