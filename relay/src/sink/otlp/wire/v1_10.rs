//! OTLP profiles **v1.10.0** (v1.11.0 is the same on the wire): its `Sample` field numbers, for
//! the writer ([`super::protobuf`]). The `opentelemetry-proto` crate (0.33, which bundles v1.10.0)
//! has the messages that read the bytes back.
//! Receivers: Grafana Pyroscope >= 1.20, OpenTelemetry Collector >= 0.148.

/// The v1.10 generation.
pub enum V1_10 {}

impl super::protobuf::Generation for V1_10 {
    const VALUES: u32 = 4;
    const ATTRIBUTE_INDICES: u32 = 2;
}
