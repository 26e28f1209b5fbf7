//! ember-relay: the unprivileged half of ember. Receives batches from ember-sampler, symbolizes
//! them from the file descriptors the sampler passed, aggregates and writes profiles.
//!
//! Flow: `source` (socket threads) -> bounded intake -> `driver` (the one loop of `run` and
//! `record`) -> `pipeline`: the `session` symbolizes each batch (`symbolize`, `unwind`) into a
//! `model::SymbolizedProfile`, the `labels` stage files it under each process's labels into a
//! `labels::labeled::LabeledProfile` per interval -> `sink`s (files, OTLP, debug). `assembly`
//! builds these parts for `run` and `record` from one settings struct, and the two commands only
//! hold their policy; `cli` parses the command line and is the executable's whole [`main`].
//!
//! Every module is crate-private, so the compiler flags what nothing uses. The public surface
//! is [`main`] and [`testing`] (what the end-to-end tests drive directly).

pub(crate) mod assembly;
pub(crate) mod browser;
pub(crate) mod cli;
pub(crate) mod config;
pub(crate) mod driver;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod heap;
pub(crate) mod interp;
pub(crate) mod invoker_files;
pub(crate) mod jit;
pub(crate) mod labels;
pub(crate) mod layers;
pub(crate) mod metrics;
pub(crate) mod model;
pub(crate) mod pipeline;
pub(crate) mod privileges;
pub(crate) mod record;
pub(crate) mod relabel;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod sampler_binary;
pub(crate) mod session;
pub(crate) mod sink;
pub(crate) mod source;
pub(crate) mod symbolize;
pub(crate) mod unwind;
pub(crate) mod usage;

pub use cli::main;
/// The global allocator the executable installs (see `symbolize::alloc`).
pub use symbolize::alloc::Counting as CountingAllocator;

#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: symbolize::alloc::Counting = symbolize::alloc::Counting;

/// The relay's parts the end-to-end tests (tests/) drive without the binary: the OTLP exporter
/// and encoder with their settings and counters, the config resolution that builds those
/// settings, and the profile model they take. One place, so the rest stays crate-private.
pub mod testing {
    /// The relay config file and the resolution of its `exporters:` section into exporter
    /// settings.
    pub mod config {
        pub use crate::{
            config::parse, layers::ConfigError, sink::exporters::resolve,
            sink::otlp::config::OtlpFlags,
        };
    }

    /// The labelled profile the sinks take, and the symbolized samples it is built from (a
    /// thread added without labels has an empty resource).
    pub mod model {
        pub use crate::{
            labels::labeled::{LabeledProfile, LabeledThread},
            model::{Frame, FrameKind, JitRuntime, Module, SymbolizedSample, Thread},
        };
    }

    /// The OTLP sink.
    pub mod sink {
        /// The OTLP exporter, its encoder and the wire messages of both generations.
        pub mod otlp {
            pub use crate::sink::otlp::{
                encode, v1_9, Drained, Exporter, ProtoVersion, SampleAttributes, GRPC_PATH,
            };

            /// The exporter's settings, as [`config::resolve`](super::super::config::resolve)
            /// builds them.
            pub mod exporter {
                pub use crate::sink::otlp::exporter::Settings;
            }

            /// The exporter's counters.
            pub mod stats {
                pub use crate::sink::otlp::stats::{DropReason, Snapshot};
            }

            /// The OTLP transports.
            pub mod transport {
                pub use crate::sink::otlp::transport::Protocol;
            }
        }
    }
}
