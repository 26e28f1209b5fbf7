//! The label flags of `run` and `record`: one clap struct, flattened into both, handed on as
//! plain [`LabelFlags`] for `config::labels` to merge with the config file.

use crate::{config::labels::LabelFlags, sink::files::FoldedRoot};

/// Labels and filtering: flags of `run` and `record`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LabelArgs {
    /// Static tags added to every profile, `k1=v1;k2=v2` (the OpenTelemetry eBPF profiler's
    /// flag); they win over the config file's `labels:`.
    #[arg(long, value_name = "K=V;...")]
    pub tags: Option<String>,
    /// The service name of processes nothing else names (before the executable name; see the
    /// docs/labels.md's precedence table).
    #[arg(long, value_name = "NAME")]
    pub service_name: Option<String>,
    /// Export only processes whose executable name matches this regex (fully anchored; RE2
    /// syntax). Overrides the config file's `process_filter:`. Applied in the relay, which also
    /// asks the sampler to stop sampling each filtered process (it verifies the request).
    #[arg(long, value_name = "REGEX")]
    pub process_filter: Option<String>,
    /// The first frame of stacks.folded and the flamegraph: the process name or its service.name.
    #[arg(long, value_enum, default_value_t = FoldedRoot::Process)]
    pub folded_root: FoldedRoot,
}

impl LabelArgs {
    /// The flags as given, for [`LabelFlags::resolve`].
    pub fn flags(&self) -> LabelFlags {
        LabelFlags {
            tags: self.tags.clone(),
            service_name: self.service_name.clone(),
            process_filter: self.process_filter.clone(),
            folded_root: self.folded_root,
        }
    }
}
