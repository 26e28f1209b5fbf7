//! Reloading the label settings while `run` serves: on SIGHUP, and when the config file changes
//! (its device, inode, size, mtime or ctime, looked at every [`WATCH_PERIOD`]; no inotify, so
//! an editor's rename-over and a Kubernetes ConfigMap's symlink swap are seen alike).
//!
//! Only the label settings reload: `labels:`, `process_filter:`, `relabel_configs:`, with the
//! label flags (`--tags`, `--process-filter`, `--service-name`) merged over them again. The
//! exporters, the socket, the output files and every other flag need a restart.
//!
//! Invariants: a new file is parsed and checked whole before anything changes; a bad one is
//! refused (logged with the file, the error with its rule index or line, and the fix) and the
//! settings in effect stay. The swap itself is the driver's, between two events of its one loop,
//! so no sample is lost or labelled half by the old rules and half by the new. Reads the file as
//! the relay's own unprivileged user, which read it at start.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::labels::stage::LabelSettings;

/// How often the config file's metadata is looked at.
pub const WATCH_PERIOD: Duration = Duration::from_secs(2);

/// What the log lines say needs a restart instead.
pub const NOT_RELOADED: &str = "exporters and every flag other than --tags, --process-filter and \
                                --service-name (restart the relay to change them)";

/// The fix a refusal names.
const FIX: &str = "correct the file (`ember-relay validate --config FILE` checks it), then save \
                   it again or send SIGHUP";

/// Builds the label settings from the config file and the flags, as at start.
pub type Resolve = Box<dyn Fn() -> anyhow::Result<LabelSettings>>;

/// Why a reload was attempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Signal,
    FileChanged,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Signal => "SIGHUP",
            Self::FileChanged => "file changed",
        }
    }
}

/// Reloads applied and refused since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReloadStats {
    pub applied: u64,
    pub refused: u64,
}

/// What identifies one version of the file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Fingerprint {
    /// The file's fingerprint; `None` while it cannot be stat'ed (mid-replace, removed).
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// Watches the config file for changes, at most once per [`WATCH_PERIOD`].
#[derive(Debug)]
struct FileWatch {
    seen: Option<Fingerprint>,
    next_look: Instant,
}

impl FileWatch {
    /// Whether the file changed since the last look (a file that cannot be stat'ed has not: the
    /// next look after it is back decides).
    fn changed(&mut self, path: &Path, now: Instant) -> bool {
        if now < self.next_look {
            return false;
        }
        self.next_look = now + WATCH_PERIOD;
        let Some(current) = Fingerprint::of(path) else {
            return false;
        };
        let changed = self.seen != Some(current);
        self.seen = Some(current);
        changed
    }
}

/// The reload side of `run`: asked by the driver between events whether new settings apply.
pub struct Reloader {
    file: Option<PathBuf>,
    resolve: Resolve,
    watch: Option<FileWatch>,
    stats: ReloadStats,
}

impl Reloader {
    /// Reloads on SIGHUP with `resolve`; with `watch_file`, also when `file` changes. The file's
    /// current version is taken as the one the relay started with.
    pub fn new(file: Option<PathBuf>, resolve: Resolve, watch_file: bool) -> Self {
        let watch = file
            .as_deref()
            .filter(|_| watch_file)
            .map(|path| FileWatch {
                seen: Fingerprint::of(path),
                next_look: Instant::now() + WATCH_PERIOD,
            });
        Self {
            file,
            resolve,
            watch,
            stats: ReloadStats::default(),
        }
    }

    /// The counters (also in every reload's log line).
    #[cfg(test)]
    pub fn stats(&self) -> ReloadStats {
        self.stats
    }

    /// New settings when SIGHUP arrived or the file changed and the file is good; `None`
    /// otherwise (nothing to do, or refused: logged, the old settings stay).
    pub fn poll(&mut self, now: Instant) -> Option<LabelSettings> {
        self.check(ember_common::take_reload_request(), now)
    }

    /// [`Reloader::poll`] with the signal flag given (tests).
    pub fn check(&mut self, signalled: bool, now: Instant) -> Option<LabelSettings> {
        let (Some(watch), Some(path)) = (&mut self.watch, &self.file) else {
            return signalled.then(|| self.reload(Trigger::Signal)).flatten();
        };
        let trigger = if signalled {
            // The version a SIGHUP reads is the one the watch has seen: no second reload of it.
            watch.seen = Fingerprint::of(path);
            Trigger::Signal
        } else if watch.changed(path, now) {
            Trigger::FileChanged
        } else {
            return None;
        };
        self.reload(trigger)
    }

    fn reload(&mut self, trigger: Trigger) -> Option<LabelSettings> {
        let file = self.file.as_deref().map_or_else(
            || "(none: flags only)".to_owned(),
            |p| p.display().to_string(),
        );
        match (self.resolve)() {
            Ok(settings) => {
                self.stats.applied += 1;
                tracing::info!(
                    file,
                    trigger = trigger.as_str(),
                    tags = settings.tags.len(),
                    process_filter = settings.process_filter.as_ref().map(|r| r.as_str()),
                    relabel_rules = settings.rules.len(),
                    service_name_default = settings.default_service_name.as_deref(),
                    reloads_applied = self.stats.applied,
                    reloads_refused = self.stats.refused,
                    not_reloaded = NOT_RELOADED,
                    "config reloaded"
                );
                Some(settings)
            }
            Err(err) => {
                self.stats.refused += 1;
                tracing::error!(
                    file,
                    trigger = trigger.as_str(),
                    error = format!("{err:#}"),
                    kept = "the label settings in effect before",
                    fix = FIX,
                    reloads_applied = self.stats.applied,
                    reloads_refused = self.stats.refused,
                    "config reload refused"
                );
                None
            }
        }
    }
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("file", &self.file)
            .field("watch", &self.watch)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::labels::stage::LabelSettings;

    fn reloader(path: &Path) -> Reloader {
        let file = path.to_owned();
        let resolve: Resolve = Box::new(move || {
            let config = crate::config::load(&file)?;
            crate::labels::stage::LabelSettings::from_file(
                &config.labels,
                config.process_filter.as_deref(),
                &config.relabel_configs,
            )
        });
        Reloader::new(Some(path.to_owned()), resolve, true)
    }

    fn rules(settings: &Option<LabelSettings>) -> Option<usize> {
        settings.as_ref().map(|s| s.rules.len())
    }

    #[test]
    fn a_signal_or_a_changed_file_reloads_and_a_bad_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("relay.yaml");
        let rule = "  - source_labels: [process.executable.name]\n    target_label: x\n";
        fs::write(&path, format!("relabel_configs:\n{rule}")).expect("write");
        let mut reloader = reloader(&path);
        let start = Instant::now();
        let at = |periods: u32| start + WATCH_PERIOD * periods;
        // Given nothing happened, Then nothing reloads, however much time passed
        assert_eq!(rules(&reloader.check(false, at(2))), None);
        // When the file is edited and SIGHUP arrives, Then the file is read again
        fs::write(&path, format!("relabel_configs:\n{rule}{rule}")).expect("write");
        assert_eq!(rules(&reloader.check(true, at(2))), Some(2));
        // And the version SIGHUP read does not reload again when the watch next looks
        assert_eq!(rules(&reloader.check(false, at(4))), None);
        // When the file changes (size, mtime), Then the next look after the period sees it
        fs::write(&path, format!("relabel_configs:\n{rule}")).expect("write");
        assert_eq!(rules(&reloader.check(false, at(4))), None, "too early");
        assert_eq!(rules(&reloader.check(false, at(6))), Some(1));
        assert_eq!(rules(&reloader.check(false, at(8))), None, "seen already");
        // When it is replaced by a bad file, Then the reload is refused and counted, by either
        // trigger
        fs::write(&path, "relabel_configs:\n  - regex: '('\n").expect("write");
        assert_eq!(rules(&reloader.check(false, at(10))), None);
        assert_eq!(rules(&reloader.check(true, at(10))), None);
        assert_eq!(
            reloader.stats(),
            ReloadStats {
                applied: 2,
                refused: 2
            }
        );
        // When the file disappears, Then that is no change (the next version decides)
        fs::remove_file(&path).expect("rm");
        assert_eq!(rules(&reloader.check(false, at(12))), None);
        assert_eq!(reloader.stats().refused, 2);
        // When it comes back good, Then it is reloaded
        fs::write(&path, format!("relabel_configs:\n{rule}{rule}{rule}")).expect("write");
        assert_eq!(rules(&reloader.check(false, at(14))), Some(3));
    }

    #[test]
    fn without_watching_only_the_signal_reloads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("relay.yaml");
        fs::write(&path, "labels: { a: b }\n").expect("write");
        let resolve: Resolve = Box::new(|| Ok(LabelSettings::default()));
        let mut reloader = Reloader::new(Some(path.clone()), resolve, false);
        fs::write(&path, "labels: { a: c, d: e }\n").expect("write");
        let later = Instant::now() + WATCH_PERIOD * 2;
        assert!(reloader.check(false, later).is_none());
        assert!(reloader.check(true, later).is_some());
    }
}
