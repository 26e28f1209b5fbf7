//! The files sink: `flamegraph.svg`, `profile.pb.gz`, `stacks.folded` and, when chosen,
//! `profile.speedscope.json` of one window in one directory (`record --output`,
//! `run --output-dir`; `--format` chooses which are written).
//!
//! Rendered when a window closes and at exit, never per batch: rendering is O(window), so doing
//! it per batch would cost O(window) every interval. The files therefore show the last closed
//! window, and after exit the last one (an empty last window does not replace a closed one). The files are created when the sink is (as root for
//! `record`, see [`writer`] for the invariants) and rewritten through their descriptors.

use std::{
    path::{Path, PathBuf},
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
    files: OutputSet,
    /// Where the files are, to make them again if they are deleted.
    dir: PathBuf,
    /// A closed window was written: an empty last window at exit does not replace it.
    wrote_window: bool,
}

impl FilesSink {
    /// Creates `dir` if needed and the (empty) files of `formats` in it, owned by the `sudo`
    /// user when there is one.
    pub(crate) fn create(dir: &Path, formats: &[OutputFormat]) -> anyhow::Result<Self> {
        Ok(Self {
            files: OutputSet::create(dir, formats)?,
            dir: dir.to_path_buf(),
            wrote_window: false,
        })
    }

    /// The folded lines' (and flamegraph's) root frame names the process or its service.
    pub(crate) fn with_folded_root(mut self, root: FoldedRoot) -> Self {
        self.files.folded_root = root;
        self
    }

    /// [`FilesSink::create`] for the current user only.
    #[cfg(test)]
    pub(crate) fn create_unowned(dir: &Path) -> Self {
        let files =
            OutputSet::create_owned(dir, None, &OutputFormat::DEFAULT).expect("output files");
        Self {
            files,
            dir: dir.to_path_buf(),
            wrote_window: false,
        }
    }
}

impl FilesSink {
    /// When an output file was deleted (nothing could read what is written to it), creates the
    /// directory and the files again where they were.
    fn recreate_if_deleted(&mut self) -> anyhow::Result<()> {
        if self.files.linked() {
            return Ok(());
        }
        let mut files = OutputSet::create(&self.dir, &self.files.formats())?;
        files.folded_root = self.files.folded_root;
        self.files = files;
        tracing::warn!(
            dir = %self.dir.display(),
            "the output files were deleted (with their directory?); created them again"
        );
        Ok(())
    }
}

impl Sink for FilesSink {
    fn wants_window(&self) -> bool {
        true
    }

    /// Writes a closed window. Files deleted meanwhile (with their directory, say) are made
    /// again first; a window that cannot be written is logged with the fix and reported
    /// [`WindowOutcome::Unwritten`] (the driver counts it), and the next window tries again.
    fn window(&mut self, profile: &LabeledProfile) -> WindowOutcome {
        let written = self
            .recreate_if_deleted()
            .and_then(|()| self.files.write(profile).map_err(anyhow::Error::from));
        match written {
            Ok(()) => {
                self.wrote_window = true;
                WindowOutcome::Kept
            }
            Err(err) => {
                tracing::error!(
                    dir = %self.dir.display(),
                    samples = profile.total_samples(),
                    error = format!("{err:#}"),
                    "could not write the window's output files; fix it by making the output \
                     directory writable with free space (or by choosing another --output-dir); \
                     the window's samples went to the other sinks only, and the next window \
                     is tried again"
                );
                WindowOutcome::Unwritten
            }
        }
    }

    /// Writes the last window, unless it is empty and a closed window is already there (a stop
    /// right after a window closed keeps that window's files).
    fn finish(
        mut self: Box<Self>,
        window: &LabeledProfile,
        _: Duration,
    ) -> anyhow::Result<SinkReport> {
        if !(window.is_empty() && self.wrote_window) {
            self.files.write(window)?;
        }
        Ok(SinkReport::Files(std::mem::take(&mut self.files.paths)))
    }
}
