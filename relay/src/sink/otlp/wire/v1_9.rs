//! OTLP profiles **v1.9.0**: its `Sample` field numbers, for the writer ([`super::protobuf`]),
//! and the messages that read v1.9 bytes back (tests, the debug tools). The messages that hold a
//! `Sample` are written by hand with prost derive from the field numbers of the v1.9.0 `.proto`
//! files (no release of the `opentelemetry-proto` crate bundles v1.9); the rest are v1.10's.
//!
//! v1.9 differs from v1.10 only in `Sample` (values = 2, attribute_indices = 3, link_index = 4)
//! and in lacking the `*_strindex` fields of `common.proto`. Every other field has the same
//! number, and the `*_strindex` fields ember leaves at 0 are not written, so v1.10's messages
//! for the dictionary, resource, scope and values encode to the same bytes and decode v1.9
//! requests as well. Only the fields ember writes or tests read are defined; prost skips the
//! others. Receivers: Grafana Pyroscope 1.18.x, OpenTelemetry Collector <= 0.147.

pub use opentelemetry_proto::tonic::{
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    profiles::v1development::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, ProfilesDictionary, Stack,
        ValueType,
    },
    resource::v1::Resource,
};

/// `opentelemetry.proto.collector.profiles.v1development.ExportProfilesServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportProfilesServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_profiles: Vec<ResourceProfiles>,
    #[prost(message, optional, tag = "2")]
    pub dictionary: Option<ProfilesDictionary>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceProfiles {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_profiles: Vec<ScopeProfiles>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeProfiles {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub profiles: Vec<Profile>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, optional, tag = "1")]
    pub sample_type: Option<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    #[prost(uint64, tag = "4")]
    pub duration_nano: u64,
    #[prost(message, optional, tag = "5")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "6")]
    pub period: i64,
    #[prost(bytes = "vec", tag = "7")]
    pub profile_id: Vec<u8>,
    #[prost(uint32, tag = "8")]
    pub dropped_attributes_count: u32,
    #[prost(string, tag = "9")]
    pub original_payload_format: String,
    #[prost(bytes = "vec", tag = "10")]
    pub original_payload: Vec<u8>,
    #[prost(int32, repeated, tag = "11")]
    pub attribute_indices: Vec<i32>,
}

/// The v1.9 layout: `values` is field 2 (in v1.10 it is field 4, and field 2 holds the
/// attribute indices).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(int32, tag = "1")]
    pub stack_index: i32,
    #[prost(int64, repeated, tag = "2")]
    pub values: Vec<i64>,
    #[prost(int32, repeated, tag = "3")]
    pub attribute_indices: Vec<i32>,
    #[prost(int32, tag = "4")]
    pub link_index: i32,
    #[prost(fixed64, repeated, tag = "5")]
    pub timestamps_unix_nano: Vec<u64>,
}

/// The v1.9 generation.
pub enum V1_9 {}

impl super::protobuf::Generation for V1_9 {
    const VALUES: u32 = 2;
    const ATTRIBUTE_INDICES: u32 = 3;
}
