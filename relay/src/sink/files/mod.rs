//! The files sink: `flamegraph.svg`, `profile.pb.gz`, `stacks.folded` and, when chosen,
//! `profile.speedscope.json` of one window in one directory (`record --output`,
//! `run --output-dir`; `--format` chooses which are written).
//!
//! Rendered when a window closes and at exit, never per batch: rendering is O(window), so doing
//! it per batch would cost O(window) every interval. A closed window is rendered on a thread of
//! its own (the batches go on meanwhile), and freed there when written. The files therefore show the last closed
//! window, and after exit the last one (an empty last window does not replace a closed one). The files are created when the sink is (as root for
//! `record`, see [`writer`] for the invariants) and rewritten through their descriptors.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    thread::JoinHandle,
    time::Duration,
};

use super::{Sink, SinkReport, WindowOutcome};
use crate::labels::labeled::LabeledProfile;

/// What the first frame of a `stacks.folded` line (and the flamegraph's root) names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum FoldedRoot {
    /// The process (executable) name, as before labels existed.
    #[default]
    Process,
    /// The process's `service.name` after relabeling.
    Service,
}

/// An output file `--format` can choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
#[non_exhaustive]
pub enum OutputFormat {
    /// flamegraph.svg: an interactive flame graph for a browser.
    Svg,
    /// profile.pb.gz: pprof (go tool pprof, `ember-relay report`, Pyroscope, Grafana).
    Pprof,
    /// stacks.folded: one `process;root;...;leaf COUNT` line per stack (inferno,
    /// flamegraph.pl, speedscope).
    Folded,
    /// profile.speedscope.json: speedscope's own format, one profile per process.
    Speedscope,
    /// flamegraph.offcpu.svg: where threads blocked, in nanoseconds (`--off-cpu` adds it
    /// with svg).
    #[value(skip)]
    OffCpuSvg,
    /// stacks.offcpu.folded: folded off-CPU stacks, nanoseconds per line (`--off-cpu` adds it
    /// with folded).
    #[value(skip)]
    OffCpuFolded,
}

impl OutputFormat {
    /// What `--format` writes when not given: the three files of every earlier release (the
    /// flags' `default_value` spells it out for --help; a test checks both agree).
    #[cfg(test)]
    pub const DEFAULT: [Self; 3] = [Self::Svg, Self::Pprof, Self::Folded];

    /// The file this format is written to, in the output directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Svg => writer::FLAMEGRAPH,
            Self::Pprof => writer::PPROF,
            Self::Folded => writer::FOLDED,
            Self::Speedscope => writer::SPEEDSCOPE,
            Self::OffCpuSvg => writer::OFF_CPU_FLAMEGRAPH,
            Self::OffCpuFolded => writer::OFF_CPU_FOLDED,
        }
    }

    /// `formats` with the off-CPU files of those that have one (`--off-cpu`): svg and folded.
    pub fn with_off_cpu(formats: &[Self]) -> Vec<Self> {
        let mut all = formats.to_vec();
        for (cpu, off_cpu) in [
            (Self::Svg, Self::OffCpuSvg),
            (Self::Folded, Self::OffCpuFolded),
        ] {
            if formats.contains(&cpu) {
                all.push(off_cpu);
            }
        }
        Self::normalize(&all)
    }

    /// `formats` without repeats, in the order files are listed (svg, pprof, folded,
    /// speedscope) whatever order they were given in.
    pub fn normalize(formats: &[Self]) -> Vec<Self> {
        let mut formats = formats.to_vec();
        formats.sort_unstable();
        formats.dedup();
        formats
    }
}

pub(crate) mod flamegraph;
pub(crate) mod folded;
pub(crate) mod pprof;
pub(crate) mod speedscope;
pub(crate) mod writer;

use writer::OutputSet;

pub(crate) struct FilesSink {
    /// The files; `None` while a closed window is being written on its own thread.
    files: Option<OutputSet>,
    /// Where the files are, which and how rooted, to make them again if they are deleted.
    dir: PathBuf,
    formats: Vec<OutputFormat>,
    root: FoldedRoot,
    /// A closed window was written: an empty last window at exit does not replace it.
    wrote_window: bool,
    /// The closed window being written, off the batch path: it gives the files back, and the
    /// window's samples when it could not write them.
    writing: Option<JoinHandle<(OutputSet, Result<(), String>)>>,
    /// The samples of the window being written.
    writing_samples: u64,
}

impl FilesSink {
    /// Creates `dir` if needed and the (empty) files of `formats` in it, owned by the `sudo`
    /// user when there is one.
    pub(crate) fn create(dir: &Path, formats: &[OutputFormat]) -> anyhow::Result<Self> {
        Ok(Self::of(OutputSet::create(dir, formats)?, dir))
    }

    fn of(files: OutputSet, dir: &Path) -> Self {
        Self {
            formats: files.formats(),
            root: files.folded_root,
            files: Some(files),
            dir: dir.to_path_buf(),
            wrote_window: false,
            writing: None,
            writing_samples: 0,
        }
    }

    /// The folded lines' (and flamegraph's) root frame names the process or its service.
    pub(crate) fn with_folded_root(mut self, root: FoldedRoot) -> Self {
        self.root = root;
        if let Some(files) = &mut self.files {
            files.folded_root = root;
        }
        self
    }

    /// [`FilesSink::create`] for the current user only.
    #[cfg(test)]
    pub(crate) fn create_unowned(dir: &Path) -> Self {
        let files =
            OutputSet::create_owned(dir, None, &OutputFormat::DEFAULT).expect("output files");
        Self::of(files, dir)
    }
}

impl FilesSink {
    /// When an output file was deleted (nothing could read what is written to it), creates the
    /// directory and the files again where they were.
    fn recreate_if_deleted(&self, files: OutputSet) -> anyhow::Result<OutputSet> {
        if files.linked() {
            return Ok(files);
        }
        let mut again = OutputSet::create(&self.dir, &files.formats())?;
        again.folded_root = files.folded_root;
        tracing::warn!(
            dir = %self.dir.display(),
            "the output files were deleted (with their directory?); created them again"
        );
        Ok(again)
    }

    /// Waits for the window being written, if any, and takes the files back; logs how it
    /// went (here, on the loop's thread, so the log and the count agree). The samples of that
    /// window when it could not be written.
    fn finish_writing(&mut self) -> Option<u64> {
        let handle = self.writing.take()?;
        let samples = std::mem::take(&mut self.writing_samples);
        let written = match handle.join() {
            Ok((files, written)) => {
                self.files = Some(files);
                written
            }
            // The writer panicked (a bug): its files are gone with it; the next window makes
            // them again.
            Err(_) => Err("the window writer failed".to_owned()),
        };
        self.settle(samples, written)
    }

    /// Logs how writing a window of `samples` went; its samples when it was not written.
    fn settle(&mut self, samples: u64, written: Result<(), String>) -> Option<u64> {
        let error = match written {
            Ok(()) => {
                self.wrote_window = true;
                tracing::info!(samples, "window written");
                return None;
            }
            Err(error) => error,
        };
        tracing::error!(
            dir = %self.dir.display(),
            samples,
            error,
            "could not write the window's output files; fix it by making the output \
             directory writable with free space (or by choosing another --output-dir); \
             the window's samples went to the other sinks only, and the next window \
             is tried again"
        );
        Some(samples)
    }

    /// The files, made again when they were lost or deleted.
    fn files(&mut self) -> anyhow::Result<OutputSet> {
        let files = match self.files.take() {
            Some(files) => files,
            None => {
                let mut files = OutputSet::create(&self.dir, &self.formats)?;
                files.folded_root = self.root;
                files
            }
        };
        self.recreate_if_deleted(files)
    }
}

/// Writes `profile` to `files`; why not, when it could not.
fn write_window(files: &mut OutputSet, profile: &LabeledProfile) -> Result<(), String> {
    files
        .write(profile)
        .map_err(|err| format!("{:#}", anyhow::Error::from(err)))
}

impl Sink for FilesSink {
    fn wants_window(&self) -> bool {
        true
    }

    /// Writes a closed window on a thread of its own, so batches keep flowing while it is
    /// rendered (rendering a window of hundreds of thousands of stacks takes seconds). Files
    /// deleted meanwhile (with their directory, say) are made again first; a window that
    /// cannot be written is logged with the fix and reported [`WindowOutcome::Unwritten`]
    /// (the driver counts it) as soon as the writer is done ([`Sink::poll`]), and the next
    /// window is tried again. A window still being written when the next closes is waited
    /// for: at most one is held.
    fn window(&mut self, profile: &Arc<LabeledProfile>) -> WindowOutcome {
        let before = self.finish_writing();
        let outcome = |unwritten: Option<u64>| match unwritten {
            Some(samples) => WindowOutcome::Unwritten { samples },
            None => WindowOutcome::Kept,
        };
        let mut files = match self.files() {
            Ok(files) => files,
            Err(err) => {
                let now = self.settle(profile.total_samples(), Err(format!("{err:#}")));
                let samples = before.unwrap_or(0) + now.unwrap_or(0);
                return WindowOutcome::Unwritten { samples };
            }
        };
        let shared = Arc::clone(profile);
        let spawned = std::thread::Builder::new()
            .name("window-writer".into())
            .spawn(move || {
                let written = write_window(&mut files, &shared);
                drop(shared);
                release_freed_heap();
                (files, written)
            });
        match spawned {
            Ok(handle) => {
                self.writing = Some(handle);
                self.writing_samples = profile.total_samples();
            }
            Err(err) => {
                // No thread to be had: written here, as before.
                tracing::warn!(error = %err, "no thread for the window writer; writing inline");
                let mut files = match self.files() {
                    Ok(files) => files,
                    Err(_) => return outcome(before),
                };
                let written = write_window(&mut files, profile);
                self.files = Some(files);
                let now = self.settle(profile.total_samples(), written);
                let samples = before.unwrap_or(0) + now.unwrap_or(0);
                return outcome((samples > 0).then_some(samples));
            }
        }
        outcome(before)
    }

    /// The window being written, when its writer is done: how it went.
    fn poll(&mut self) -> WindowOutcome {
        if !self.writing.as_ref().is_some_and(JoinHandle::is_finished) {
            return WindowOutcome::Kept;
        }
        match self.finish_writing() {
            Some(samples) => WindowOutcome::Unwritten { samples },
            None => WindowOutcome::Kept,
        }
    }

    /// Writes the last window, unless it is empty and a closed window is already there (a stop
    /// right after a window closed keeps that window's files); waits for a closed window still
    /// being written first.
    fn finish(
        mut self: Box<Self>,
        window: &LabeledProfile,
        _: Duration,
    ) -> anyhow::Result<SinkReport> {
        self.finish_writing();
        let mut files = self.files()?;
        if !(window.is_empty() && self.wrote_window) {
            files.write(window)?;
        }
        Ok(SinkReport::Files(std::mem::take(&mut files.paths)))
    }
}

/// Hands the heap a written window freed back to the kernel when the relay grew past the level
/// it keeps for the next window ([`crate::heap::window_worth_trimming`]): the writer's thread
/// allocates from an arena glibc would otherwise keep (and count in the relay's RSS) until
/// reused. Under it, the next window reuses that space and the RSS stays level.
fn release_freed_heap() {
    if crate::heap::window_worth_trimming(crate::heap::resident_bytes()) {
        crate::heap::trim();
    }
}
