//! OTLP profiles **v1.10.0** encoder: the neutral [`Request`] as the messages of the
//! `opentelemetry-proto` crate (0.33, which bundles v1.10.0; v1.11.0 is the same on the wire).
//! Receivers: Grafana Pyroscope >= 1.20, OpenTelemetry Collector >= 0.148.

use opentelemetry_proto::tonic::{
    collector::profiles::v1development::ExportProfilesServiceRequest,
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    profiles::v1development::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
        ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
    },
    resource::v1::Resource,
};
use prost::Message as _;

use super::request::{self, Request};

fn any_value(value: &request::Value) -> AnyValue {
    AnyValue {
        value: Some(match value {
            request::Value::Str(s) => any_value::Value::StringValue(s.to_string()),
            request::Value::Int(i) => any_value::Value::IntValue(*i),
        }),
    }
}

/// The v1.10 message for `request`.
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
                        ..KeyValue::default()
                    })
                    .collect(),
                ..Resource::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: super::SCOPE_NAME.to_owned(),
                    version: super::SCOPE_VERSION.to_owned(),
                    ..InstrumentationScope::default()
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
                            attribute_indices: s.attributes.clone(),
                            link_index: 0,
                            values: vec![s.count],
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

/// Encodes `request` in the v1.10 layout.
pub fn encode(request: &Request) -> Vec<u8> {
    message(request).encode_to_vec()
}
