//! Process and thread labels: `process.pid`, `process.executable.{name,path}`, `process.owner`
//! (always: the uid's name, else its number, else [`UNKNOWN_OWNER`]),
//! optional `process.command_line`, the cgroup's labels ([`super::cgroup`]), and the per-sample
//! `thread.name` / `thread.id`.
//!
//! [`UserNames`] maps a uid to its user name from `/etc/passwd` text, read once with a bound
//! ([`UserNames::load`]); not `getpwuid_r`, whose NSS modules may open sockets or load libraries
//! inside the unprivileged relay. A uid without an entry is labelled by its number.

use std::{collections::HashMap, path::Path};

use super::{cgroup, keys, read_bounded, Labels};

/// The facts about one process the labels are made of (from the sampler's `Process` message).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    pub pid: u32,
    /// With `pid`, the process's identity: a new start time for a known pid is a new process.
    pub start_time_unix_ns: u64,
    pub executable_path: String,
    pub executable_name: String,
    /// The real uid, when the sampler sent it.
    pub uid: Option<u32>,
    /// The cgroup path (or `/proc/PID/cgroup` text).
    pub cgroup: String,
    /// The command line, only when the user turned it on (it can hold secrets).
    pub command_line: Option<String>,
    /// A kernel thread (no executable, no mappings; or pid 0, the idle task): its name is the
    /// thread's, so it names no service ([`super::service::KERNEL_SERVICE`] does).
    pub kernel_thread: bool,
}

/// The labels of a process (resource attributes), cgroup labels included.
pub fn labels(facts: &ProcessFacts, users: &UserNames) -> Labels {
    let mut labels = cgroup::labels(&facts.cgroup);
    labels.set(keys::PROCESS_PID, facts.pid.to_string());
    labels.set(
        keys::PROCESS_EXECUTABLE_NAME,
        facts.executable_name.as_str(),
    );
    labels.set(
        keys::PROCESS_EXECUTABLE_PATH,
        facts.executable_path.as_str(),
    );
    // Always there: it keeps apart the series of two users whose processes name themselves
    // alike (the resource stage ignores the claims of a process whose uid is unknown).
    labels.set(
        keys::PROCESS_OWNER,
        facts
            .uid
            .map_or_else(|| UNKNOWN_OWNER.to_owned(), |uid| users.name(uid)),
    );
    if let Some(command_line) = &facts.command_line {
        labels.set(keys::PROCESS_COMMAND_LINE, command_line.as_str());
    }
    labels
}

/// `process.owner` of a process whose uid the sampler could not read (it exited first, or the
/// sampler is older than the uid field).
pub const UNKNOWN_OWNER: &str = "unknown";

/// `process.command_line` from `/proc/PID/cmdline`'s bytes as the sampler forwarded them (with
/// `--command-line`): the NULs ending each argument become spaces (the last one dropped),
/// invalid UTF-8 is replaced, nothing else is escaped or quoted.
pub fn command_line(raw: &[u8]) -> String {
    let raw = raw.strip_suffix(b"\0").unwrap_or(raw);
    let spaced: Vec<u8> = raw.iter().map(|&b| if b == 0 { b' ' } else { b }).collect();
    String::from_utf8_lossy(&spaced).into_owned()
}

/// The per-sample labels of a thread (sample attributes: never series labels, see
/// [`super::pyroscope`]).
#[cfg(test)]
pub fn thread_labels(tid: u32, name: &str) -> Labels {
    let mut labels = Labels::new();
    labels.set(keys::THREAD_ID, tid.to_string());
    labels.set(keys::THREAD_NAME, name);
    labels
}

/// Where user names come from.
pub const PASSWD_PATH: &str = "/etc/passwd";

/// Most bytes of `/etc/passwd` read: far above any real file's size, small enough for memory.
pub const PASSWD_LIMIT: u64 = 4 << 20;

/// uid -> user name, from passwd(5) text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserNames {
    names: HashMap<u32, String>,
    /// Lines that were not `name:password:uid:...` with a numeric uid.
    pub malformed_lines: usize,
    /// Whether the file was longer than the bound (its tail was not read).
    pub truncated: bool,
}

impl UserNames {
    /// Parses passwd(5) text; for a uid listed twice the first entry wins (as a `files` lookup).
    pub fn parse(text: &str) -> Self {
        let mut users = Self::default();
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split(':');
            let (name, uid) = (fields.next(), fields.nth(1));
            match (name, uid.and_then(|u| u.parse::<u32>().ok())) {
                (Some(name), Some(uid)) if !name.is_empty() => {
                    users.names.entry(uid).or_insert_with(|| name.to_owned());
                }
                _ => users.malformed_lines += 1,
            }
        }
        users
    }

    /// Reads and parses `path` (normally `/etc/passwd`), at most [`PASSWD_LIMIT`] bytes; a cut
    /// last line is dropped, not misread.
    pub fn load(path: &Path) -> std::io::Result<Self> {
        let (mut text, truncated) = read_bounded(path, PASSWD_LIMIT)?;
        if truncated {
            let whole_lines = text.rfind('\n').map_or(0, |at| at + 1);
            text.truncate(whole_lines);
        }
        Ok(Self {
            truncated,
            ..Self::parse(&text)
        })
    }

    /// The user name of `uid`, or the uid as a number when it has no entry.
    pub fn name(&self, uid: u32) -> String {
        self.names
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # a comment\n\
        \n\
        daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
        broken line\n\
        bad:x:notanumber:1::/:/bin/false\n\
        www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n\
        shadow-www:x:33:33::/:/bin/false\n\
        nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";

    #[test]
    fn passwd_names_first_entry_wins_and_bad_lines_counted() {
        let users = UserNames::parse(PASSWD);
        assert_eq!(users.name(0), "root");
        assert_eq!(users.name(33), "www-data");
        assert_eq!(users.name(65534), "nobody");
        assert_eq!(users.name(1000), "1000");
        assert_eq!(users.malformed_lines, 2);
    }

    #[test]
    fn passwd_load_is_bounded_and_drops_a_cut_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passwd");
        let mut text = String::from("root:x:0:0::/:/bin/sh\n");
        while text.len() as u64 <= PASSWD_LIMIT {
            text.push_str("filler-user-with-a-long-name:x:70000:70000::/:/bin/false\n");
        }
        text.push_str("late:x:4242:4242::/:/bin/sh\n");
        std::fs::write(&path, &text).unwrap();
        let users = UserNames::load(&path).unwrap();
        assert!(users.truncated);
        assert_eq!(users.name(0), "root");
        assert_eq!(users.name(4242), "4242", "past the bound: not read");
        assert_eq!(
            users.malformed_lines, 0,
            "the cut line was dropped, not misread"
        );
    }

    #[test]
    fn command_line_bytes_become_text() {
        assert_eq!(
            command_line(b"/usr/bin/app\0--port\x008080\0--name\0a b\0"),
            "/usr/bin/app --port 8080 --name a b"
        );
        // Not NUL-terminated (cut at the sampler's bound), empty arguments, bad UTF-8, quotes
        assert_eq!(
            command_line(b"x\0\0y\xff\0\"q\"=\\"),
            "x  y\u{fffd} \"q\"=\\"
        );
        assert_eq!(command_line(b""), "");
    }

    #[test]
    fn process_labels_from_facts() {
        let users = UserNames::parse(PASSWD);
        let facts = ProcessFacts {
            pid: 4321,
            start_time_unix_ns: 1,
            executable_path: "/usr/sbin/nginx".into(),
            executable_name: "nginx".into(),
            uid: Some(33),
            cgroup: "/system.slice/nginx.service".into(),
            command_line: None,
            kernel_thread: false,
        };
        let labels = labels(&facts, &users);
        assert_eq!(
            labels.to_string(),
            "{__meta_process_cgroup=\"/system.slice/nginx.service\", \
             process.executable.name=\"nginx\", process.executable.path=\"/usr/sbin/nginx\", \
             process.owner=\"www-data\", process.pid=\"4321\", \
             systemd.slice=\"system.slice\", systemd.unit=\"nginx.service\"}"
        );
        // The command line only when given; an unknown owner by number; nothing empty.
        let facts = ProcessFacts {
            uid: Some(1000),
            command_line: Some("nginx -g daemon off;".into()),
            executable_path: String::new(),
            cgroup: String::new(),
            ..facts
        };
        let labels = super::labels(&facts, &users);
        assert_eq!(labels.get(keys::PROCESS_OWNER), Some("1000"));
        assert_eq!(
            labels.get(keys::PROCESS_COMMAND_LINE),
            Some("nginx -g daemon off;")
        );
        assert_eq!(labels.get(keys::PROCESS_EXECUTABLE_PATH), None);
        assert_eq!(labels.get(keys::META_PROCESS_CGROUP), None);
        let thread = thread_labels(7, "worker-1");
        assert_eq!(
            thread.to_string(),
            r#"{thread.id="7", thread.name="worker-1"}"#
        );
    }
}
