//! Which runtimes the relay has seen processes run, for the metrics
//! (`ember_relay_interpreters_seen_total{runtime,version}`) and `record`'s summary.
//!
//! One process-wide tally ([`SEEN`], like the files sink's failure counters): the session notes
//! each process once per runtime it maps ([`note_process`]), the metrics encoder and `record`
//! read a copy ([`snapshot`]). Bounded whatever files claim: at most [`MAX_RELEASES`] distinct
//! runtime releases and [`MAX_EXAMPLES`] example processes each.

use std::{
    collections::BTreeMap,
    fs::File,
    os::fd::OwnedFd,
    sync::{Arc, Mutex, PoisonError},
};

use super::{Limits, Recognized};

/// Most distinct (runtime, release) pairs kept; more are counted under the last one's name.
pub const MAX_RELEASES: usize = 64;

/// Most example processes kept per release (for `record`'s summary).
pub const MAX_EXAMPLES: usize = 3;

/// What was seen of one runtime release.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Release {
    /// Processes seen mapping it, since start.
    pub processes: u64,
    /// Exact versions seen (`CPython 3.11.2`), at most [`MAX_EXAMPLES`].
    pub versions: Vec<String>,
    /// Processes seen (`python3 (pid 1234)`), at most [`MAX_EXAMPLES`].
    pub examples: Vec<String>,
    /// Why a walker could not use it, when it could not.
    pub unusable: Option<String>,
    /// The language its functions are written in (`Python`).
    pub language: &'static str,
}

/// The tally, by (runtime, release): `("cpython", "3.11")`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub releases: BTreeMap<(&'static str, String), Release>,
}

impl Seen {
    /// Counts one process (`name`, `pid`) that maps `runtime`; true when it is the first of its
    /// release.
    pub fn note(&mut self, runtime: &Recognized, name: &str, pid: u32) -> bool {
        let key = (runtime.runtime(), runtime.release());
        if !self.releases.contains_key(&key) && self.releases.len() >= MAX_RELEASES {
            return false;
        }
        let release = self.releases.entry(key).or_default();
        release.processes += 1;
        release.language = runtime.language();
        let version = runtime.to_string();
        if release.versions.len() < MAX_EXAMPLES && !release.versions.contains(&version) {
            release.versions.push(version);
        }
        if release.examples.len() < MAX_EXAMPLES {
            release.examples.push(format!("{name} (pid {pid})"));
        }
        if release.unusable.is_none() {
            release.unusable = runtime.unusable().map(str::to_owned);
        }
        release.processes == 1
    }
}

/// The relay's tally.
pub static SEEN: Mutex<Seen> = Mutex::new(Seen {
    releases: BTreeMap::new(),
});

/// Counts a process that maps `runtime` in [`SEEN`]; the first process of each release is
/// logged at INFO, the others at DEBUG (a host may start thousands of Python processes).
pub(crate) fn note_process(runtime: &Recognized, name: &str, pid: u32) {
    let first = SEEN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .note(runtime, name, pid);
    let message = "a process runs an interpreter the relay recognized; its functions are not \
                   named yet (docs/runtimes.md)";
    let unusable = runtime.unusable().unwrap_or("");
    if first {
        tracing::info!(pid, process = name, runtime = runtime.runtime(), version = %runtime, unusable, "{message}");
    } else {
        tracing::debug!(pid, process = name, runtime = runtime.runtime(), version = %runtime, unusable, "{message}");
    }
}

/// A copy of [`SEEN`].
pub fn snapshot() -> Seen {
    SEEN.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Recognizes the runtime of a file passed by the sampler (`path` is what it reported: only its
/// file name is used, as a hint). `None` when it is no runtime the relay knows or unreadable
/// (logged at debug: most files are neither).
pub(crate) fn recognize_passed(fd: &OwnedFd, path: &str) -> Option<Arc<Recognized>> {
    let file = File::from(fd.try_clone().ok()?);
    let name = path.rsplit('/').next().unwrap_or(path);
    match super::recognize(&file, name, &Limits::default()) {
        Ok(found) => found.map(Arc::new),
        Err(err) => {
            tracing::debug!(path, %err, "runtime recognition skipped this file");
            None
        }
    }
}

/// `record`'s lines about the runtimes seen: per release, which processes ran it and whether
/// their functions are named (walked: `--interpreters on` and a layout for the release) or why
/// not. Empty when none was seen.
pub fn summary_lines(seen: &Seen, walked: bool) -> Vec<String> {
    seen.releases
        .values()
        .map(|release| {
            let more = release
                .processes
                .saturating_sub(release.examples.len() as u64);
            let others = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            let (run, their) = if release.processes == 1 {
                ("runs", "its")
            } else {
                ("run", "their")
            };
            let named = match (&release.unusable, walked) {
                (None, true) => format!(
                    "{their} {} functions are named from the interpreter's own frames, read in \
                     the kernel at each sample",
                    release.language
                ),
                (None, false) => format!(
                    "{their} {} functions are not named (--interpreters off): samples in them \
                     show the interpreter's own C functions",
                    release.language
                ),
                (Some(why), _) => format!(
                    "{their} {} functions are not named, samples in them show the \
                     interpreter's own C functions (see docs/runtimes.md): {why}",
                    release.language
                ),
            };
            format!(
                "{}{others} {run} {}: {named}",
                release.examples.join(", "),
                release.versions.join(", "),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::cpython::{Interpreter, Version};

    fn cpython(minor: u8, micro: u8) -> Recognized {
        Recognized::CPython(Interpreter {
            version: Version::new(3, minor, micro),
            shared_library: true,
            first_vaddr: 0,
            layout: Err("test".to_owned()),
        })
    }

    #[test]
    fn each_release_counts_its_processes_within_bounds() {
        // Given processes of two CPython releases
        let mut seen = Seen::default();
        let firsts: Vec<bool> = (1..=5)
            .map(|pid| seen.note(&cpython(11, 2), "python3", pid))
            .collect();
        assert_eq!(firsts, [true, false, false, false, false]);
        assert!(seen.note(&cpython(12, 1), "worker", 9));
        // Then each release counts its own, with a few examples
        let r311 = &seen.releases[&("cpython", "3.11".to_owned())];
        assert_eq!(r311.processes, 5);
        assert_eq!(r311.examples.len(), MAX_EXAMPLES);
        assert_eq!(r311.versions, ["CPython 3.11.2"]);
        assert_eq!(seen.releases[&("cpython", "3.12".to_owned())].processes, 1);
        let lines = summary_lines(&seen, true);
        println!("{lines:#?}");
        assert!(lines[0].starts_with(
            "python3 (pid 1), python3 (pid 2), python3 (pid 3) and 2 more run CPython 3.11.2: \
             their Python functions are not named, samples in them show"
        ));
        assert!(lines[0].ends_with(": test"), "{}", lines[0]);
        assert!(lines[1].starts_with("worker (pid 9) runs CPython 3.12.1: its Python functions"));
        // And hostile files claiming endless releases cannot grow the tally past its bound
        for micro in 0..=255 {
            for minor in 0..=255 {
                seen.note(&cpython(minor, micro), "x", 1);
            }
        }
        assert_eq!(seen.releases.len(), MAX_RELEASES);
    }

    #[test]
    fn a_walked_release_says_its_functions_are_named_unless_walking_is_off() {
        // Given a process of a release with a layout
        let mut seen = Seen::default();
        let usable = Recognized::CPython(Interpreter {
            version: Version::new(3, 12, 1),
            shared_library: true,
            first_vaddr: 0,
            layout: crate::interp::cpython::table::layout(Version::new(3, 12, 1))
                .ok_or_else(|| "no table".to_owned()),
        });
        seen.note(&usable, "worker", 9);
        // Then the summary says its functions are named, or why not with --interpreters off
        assert_eq!(
            summary_lines(&seen, true),
            [
                "worker (pid 9) runs CPython 3.12.1: its Python functions are named from the \
              interpreter's own frames, read in the kernel at each sample"
            ]
        );
        assert!(summary_lines(&seen, false)[0].contains("not named (--interpreters off)"));
    }
}
