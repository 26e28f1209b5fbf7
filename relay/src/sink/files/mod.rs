//! The files sink: `flamegraph.svg`, `profile.pb.gz` and `stacks.folded` of one window in one
//! directory (`record --output`, `run --output-dir`).
//!
//! Rendered when a window closes and at exit, never per batch: rendering is O(window), so doing
//! it per batch would cost O(window) every interval. The files therefore show the last closed
//! window, and after exit the last one (an empty last window does not replace a closed one). The files are created when the sink is (as root for
//! `record`, see [`writer`] for the invariants) and rewritten through their descriptors.

use std::{path::Path, time::Duration};

use super::{Sink, SinkReport};
use crate::model::Profile;

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

pub(crate) mod flamegraph;
pub(crate) mod folded;
pub(crate) mod pprof;
pub(crate) mod writer;

use writer::OutputSet;

pub(crate) struct FilesSink {
    files: OutputSet,
    /// A closed window was written: an empty last window at exit does not replace it.
    wrote_window: bool,
}

impl FilesSink {
    /// Creates `dir` if needed and the three (empty) files in it, owned by the `sudo` user when
    /// there is one.
    pub(crate) fn create(dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            files: OutputSet::create(dir)?,
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
        let files = OutputSet::create_owned(dir, None).expect("output files");
        Self {
            files,
            wrote_window: false,
        }
    }
}

impl Sink for FilesSink {
    fn window(&mut self, profile: &Profile) {
        match self.files.write(profile) {
            Ok(()) => self.wrote_window = true,
            Err(err) => tracing::error!("{:#}", anyhow::Error::from(err)),
        }
    }

    /// Writes the last window, unless it is empty and a closed window is already there (a stop
    /// right after a window closed keeps that window's files).
    fn finish(mut self: Box<Self>, window: &Profile, _: Duration) -> anyhow::Result<SinkReport> {
        if !(window.is_empty() && self.wrote_window) {
            self.files.write(window)?;
        }
        Ok(SinkReport::Files(std::mem::take(&mut self.files.paths)))
    }
}
