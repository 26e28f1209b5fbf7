//! OTLP profiles **v1.10.0**: the messages of the `opentelemetry-proto` crate (0.33, which bundles
//! v1.10.0; v1.11.0 is the same on the wire) as a [`Generation`] of the generic encoder.
//! Receivers: Grafana Pyroscope >= 1.20, OpenTelemetry Collector >= 0.148.

pub use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::profiles::v1development::{
    Profile, ResourceProfiles, Sample, ScopeProfiles,
};

/// The v1.10 generation.
pub enum V1_10 {}

super::generation!(V1_10);
