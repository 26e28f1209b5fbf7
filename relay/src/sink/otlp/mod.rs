//! OTLP profiles export: the relay's symbolized [`LabeledProfile`]s sent to Grafana Pyroscope or an
//! OpenTelemetry Collector over gRPC or HTTP/protobuf, in either wire generation.
//!
//! - [`config`]: the `exporters.otlp` file section, the `--otlp-*` flags and the
//!   `OTEL_EXPORTER_OTLP_*` variables, resolved into [`exporter::Settings`].
//! - [`request`]: the generation-neutral request (one dictionary per request).
//! - [`wire`]: one writer of the two generations ([`v1_9`], [`wire::v1_10`]) straight from the
//!   neutral request, and the split of a profile into requests that fit the size limit
//!   ([`wire::Encoder`], [`encode`](encode())).
//! - [`exporter`]: the exporter thread: intake -> [`queue`] -> [`transport`] (TLS, gRPC, HTTP,
//!   answers) with [`retry`], every outcome counted in [`stats`].
//!
//! Runs unprivileged, on the exporter's own thread; reads no files after start-up (TLS material
//! is loaded while the relay may still be root, by [`config`]).

pub mod config;
pub mod exporter;
pub(crate) mod queue;
pub(crate) mod request;
pub mod retry;
pub mod stats;
pub mod transport;
pub(crate) mod wire;

pub use self::{
    exporter::{Drained, Exporter},
    request::SampleAttributes,
    wire::{encode, v1_9, EncodeSettings, Encoded, ProtoVersion},
};

/// `InstrumentationScope.name` of every profile ember sends.
pub const SCOPE_NAME: &str = "ember";
pub const SCOPE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The gRPC method and the HTTP path of the profiles signal.
pub const GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
pub const HTTP_PATH: &str = "/v1development/profiles";

/// Pyroscope's (and the gRPC default) maximum message size.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 << 20;
