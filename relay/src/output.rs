//! The local output set: `stacks.folded`, `profile.pb.gz` and `flamegraph.svg` in one directory.
//! Files are opened when the set is created (before `record` drops privileges) and rewritten in
//! place each time a profile is written.

use std::{
    fs::{self, File, OpenOptions},
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use crate::{model::Profile, sink};

pub const FOLDED: &str = "stacks.folded";
pub const PPROF: &str = "profile.pb.gz";
pub const FLAMEGRAPH: &str = "flamegraph.svg";

pub struct OutputSet {
    folded: File,
    pprof: File,
    flamegraph: File,
    pub paths: Vec<PathBuf>,
}

impl OutputSet {
    /// Creates `dir` if needed and opens the three files in it.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        fs::create_dir_all(dir)
            .with_context(|| format!("creating output directory {}", dir.display()))?;
        let open = |name: &str| -> anyhow::Result<(File, PathBuf)> {
            let path = dir.join(name);
            let file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            Ok((file, path))
        };
        let (folded, folded_path) = open(FOLDED)?;
        let (pprof, pprof_path) = open(PPROF)?;
        let (flamegraph, flamegraph_path) = open(FLAMEGRAPH)?;
        Ok(Self {
            folded,
            pprof,
            flamegraph,
            paths: vec![flamegraph_path, pprof_path, folded_path],
        })
    }

    /// Writes `profile` to all three files, replacing what they held.
    pub fn write(&mut self, profile: &Profile) -> anyhow::Result<()> {
        sink::folded::write(profile, &mut self.folded).context("writing stacks.folded")?;
        sink::pprof::write(profile, &mut self.pprof).context("writing profile.pb.gz")?;
        sink::flamegraph::write(profile, &mut self.flamegraph).context("writing flamegraph.svg")?;
        Ok(())
    }
}
