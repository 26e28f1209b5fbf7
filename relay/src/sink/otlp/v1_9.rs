//! OTLP profiles **v1.9.0** wire definitions, written by hand with prost derive from the field
//! numbers of the v1.9.0 `.proto` files (no release of the `opentelemetry-proto` crate bundles
//! v1.9), and the encoder from the neutral [`Request`].
//!
//! v1.9 differs from v1.10 only in `Sample` (values = 2, attribute_indices = 3, link_index = 4)
//! and in lacking the `*_strindex` fields of `common.proto`; everything else has the same
//! numbers. Only the fields ember writes or tests read are defined; prost skips the others.
//! Receivers: Grafana Pyroscope 1.18.x, OpenTelemetry Collector <= 0.147.

use prost::Message as _;

use super::request::{self, Request};

/// `opentelemetry.proto.collector.profiles.v1development.ExportProfilesServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportProfilesServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_profiles: Vec<ResourceProfiles>,
    #[prost(message, optional, tag = "2")]
    pub dictionary: Option<ProfilesDictionary>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProfilesDictionary {
    #[prost(message, repeated, tag = "1")]
    pub mapping_table: Vec<Mapping>,
    #[prost(message, repeated, tag = "2")]
    pub location_table: Vec<Location>,
    #[prost(message, repeated, tag = "3")]
    pub function_table: Vec<Function>,
    #[prost(message, repeated, tag = "4")]
    pub link_table: Vec<Link>,
    #[prost(string, repeated, tag = "5")]
    pub string_table: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub attribute_table: Vec<KeyValueAndUnit>,
    #[prost(message, repeated, tag = "7")]
    pub stack_table: Vec<Stack>,
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

/// `opentelemetry.proto.resource.v1.Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
    #[prost(uint32, tag = "2")]
    pub dropped_attributes_count: u32,
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

/// `opentelemetry.proto.common.v1.InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
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

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int32, tag = "1")]
    pub type_strindex: i32,
    #[prost(int32, tag = "2")]
    pub unit_strindex: i32,
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

#[derive(Clone, PartialEq, prost::Message)]
pub struct Stack {
    #[prost(int32, repeated, tag = "1")]
    pub location_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(int32, tag = "1")]
    pub mapping_index: i32,
    #[prost(uint64, tag = "2")]
    pub address: u64,
    #[prost(message, repeated, tag = "3")]
    pub lines: Vec<Line>,
    #[prost(int32, repeated, tag = "4")]
    pub attribute_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(int32, tag = "1")]
    pub function_index: i32,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(int32, tag = "1")]
    pub name_strindex: i32,
    #[prost(int32, tag = "2")]
    pub system_name_strindex: i32,
    #[prost(int32, tag = "3")]
    pub filename_strindex: i32,
    #[prost(int64, tag = "4")]
    pub start_line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub memory_start: u64,
    #[prost(uint64, tag = "2")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    #[prost(int32, tag = "4")]
    pub filename_strindex: i32,
    #[prost(int32, repeated, tag = "5")]
    pub attribute_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Link {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValueAndUnit {
    #[prost(int32, tag = "1")]
    pub key_strindex: i32,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
    #[prost(int32, tag = "3")]
    pub unit_strindex: i32,
}

/// `opentelemetry.proto.common.v1.KeyValue` (v1.9: no `key_strindex`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `opentelemetry.proto.common.v1.AnyValue` (scalars only: arrays and maps are not used).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4, 7")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        #[prost(int64, tag = "3")]
        IntValue(i64),
        #[prost(double, tag = "4")]
        DoubleValue(f64),
        #[prost(bytes, tag = "7")]
        BytesValue(Vec<u8>),
    }
}

fn any_value(value: &request::Value) -> AnyValue {
    AnyValue {
        value: Some(match value {
            request::Value::Str(s) => any_value::Value::StringValue(s.to_string()),
            request::Value::Int(i) => any_value::Value::IntValue(*i),
        }),
    }
}

/// The v1.9 message for `request`.
pub fn message(request: &Request) -> ExportProfilesServiceRequest {
    let d = &request.dictionary;
    let dictionary = ProfilesDictionary {
        mapping_table: d
            .mappings
            .iter()
            .map(|m| Mapping {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename_strindex: m.filename,
                attribute_indices: m.attributes.clone(),
            })
            .collect(),
        location_table: d
            .locations
            .iter()
            .map(|l| Location {
                mapping_index: l.mapping,
                address: l.address,
                lines: l
                    .lines
                    .iter()
                    .map(|line| Line {
                        function_index: line.function,
                        line: line.line,
                        column: 0,
                    })
                    .collect(),
                attribute_indices: l.attributes.clone(),
            })
            .collect(),
        function_table: d
            .functions
            .iter()
            .map(|f| Function {
                name_strindex: f.name,
                system_name_strindex: f.system_name,
                filename_strindex: f.filename,
                start_line: 0,
            })
            .collect(),
        link_table: vec![Link::default()],
        string_table: d.strings.iter().map(|s| s.to_string()).collect(),
        attribute_table: d
            .attributes
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if i == 0 {
                    KeyValueAndUnit::default()
                } else {
                    KeyValueAndUnit {
                        key_strindex: a.key,
                        value: Some(any_value(&a.value)),
                        unit_strindex: 0,
                    }
                }
            })
            .collect(),
        stack_table: d
            .stacks
            .iter()
            .map(|s| Stack {
                location_indices: s.clone(),
            })
            .collect(),
    };
    let resource_profiles = request
        .resources
        .iter()
        .map(|r| ResourceProfiles {
            resource: Some(Resource {
                attributes: r
                    .resource
                    .iter()
                    .map(|kv| KeyValue {
                        key: kv.key.to_owned(),
                        value: Some(any_value(&kv.value)),
                    })
                    .collect(),
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: super::SCOPE_NAME.to_owned(),
                    version: super::SCOPE_VERSION.to_owned(),
                }),
                profiles: vec![Profile {
                    sample_type: Some(ValueType {
                        type_strindex: request.sample_type.0,
                        unit_strindex: request.sample_type.1,
                    }),
                    samples: r
                        .samples
                        .iter()
                        .map(|s| Sample {
                            stack_index: s.stack,
                            values: vec![s.count],
                            attribute_indices: s.attributes.clone(),
                            link_index: 0,
                            timestamps_unix_nano: Vec::new(),
                        })
                        .collect(),
                    time_unix_nano: request.time_unix_nano,
                    duration_nano: request.duration_nano,
                    period_type: Some(ValueType {
                        type_strindex: request.period_type.0,
                        unit_strindex: request.period_type.1,
                    }),
                    period: request.period,
                    ..Profile::default()
                }],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dictionary),
    }
}

/// Encodes `request` in the v1.9 layout.
pub fn encode(request: &Request) -> Vec<u8> {
    message(request).encode_to_vec()
}
