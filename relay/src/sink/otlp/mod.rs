//! OTLP profiles export: the relay's symbolized [`Profile`]s sent to Grafana Pyroscope or an
//! OpenTelemetry Collector over gRPC or HTTP/protobuf, in either wire generation.
//!
//! - [`request`]: the generation-neutral request (one dictionary per request).
//! - [`v1_9`] / [`v1_10`]: the two wire encoders. A request is encoded wholly in the generation
//!   the exporter is configured for ([`ProtoVersion`]); nothing mixes them.
//! - [`encode`](encode()): profile -> encoded requests, split so none exceeds the size limit.
//! - [`queue`], [`transport`], [`exporter`]: delivery (bounded queue, retries, counters).
//!
//! Runs unprivileged, on the exporter's own thread; reads no files after start-up (TLS material
//! is loaded while the relay may still be root, see [`crate::config`]).

pub mod exporter;
pub mod queue;
pub mod request;
pub mod stats;
pub mod transport;
pub mod v1_10;
pub mod v1_9;

use std::fmt;

use crate::model::Profile;

pub use self::{
    exporter::{Drained, Exporter},
    request::SampleAttributes,
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

/// The OTLP profiles wire generation a receiver speaks (see the README's compatibility matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
pub enum ProtoVersion {
    /// Pyroscope 1.18.x, OpenTelemetry Collector <= 0.147.
    #[serde(rename = "1.9")]
    V1_9,
    /// Pyroscope >= 1.20, OpenTelemetry Collector >= 0.148 (v1.11 is the same on the wire).
    #[serde(rename = "1.10")]
    V1_10,
}

impl ProtoVersion {
    pub const DEFAULT: Self = Self::V1_10;

    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1_9 => "1.9",
            Self::V1_10 => "1.10",
        }
    }

    /// Encodes a neutral request in this generation.
    pub fn encode(self, request: &request::Request) -> Vec<u8> {
        match self {
            Self::V1_9 => v1_9::encode(request),
            Self::V1_10 => v1_10::encode(request),
        }
    }
}

impl fmt::Display for ProtoVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ProtoVersion {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().trim_start_matches('v') {
            "1.9" | "1.9.0" => Ok(Self::V1_9),
            "1.10" | "1.10.0" | "1.11" | "1.11.0" => Ok(Self::V1_10),
            other => Err(format!(
                "unknown OTLP profiles version `{other}`: use 1.9 (Pyroscope 1.18, Collector <= \
                 0.147) or 1.10 (Pyroscope >= 1.20, Collector >= 0.148)"
            )),
        }
    }
}

/// One encoded request, ready to send.
#[derive(Clone, Debug)]
pub struct Encoded {
    /// The protobuf message, uncompressed.
    pub body: bytes::Bytes,
    /// Samples it carries (sum of counts).
    pub samples: u64,
}

/// How a profile was encoded.
#[derive(Clone, Debug, Default)]
pub struct Encoding {
    pub requests: Vec<Encoded>,
    /// Requests that were over the limit on their own (a single sample bigger than the limit);
    /// sent anyway rather than dropped.
    pub oversized: usize,
}

/// Encodes `profile` into requests of at most `max_bytes` each (uncompressed). A request over the
/// limit is split in halves by sample (each half gets its own dictionary) until every part fits;
/// no sample is dropped to fit.
pub fn encode(
    profile: &Profile,
    version: ProtoVersion,
    attributes: SampleAttributes,
    max_bytes: usize,
) -> Encoding {
    let samples = profile.samples();
    let meta = request::Meta::of(profile);
    let mut out = Encoding::default();
    if samples.is_empty() {
        return out;
    }
    let mut pending: Vec<&[crate::model::SymbolizedSample]> = vec![&samples];
    while let Some(part) = pending.pop() {
        let request = request::build(part, &meta, attributes);
        let body = version.encode(&request);
        if body.len() > max_bytes && part.len() > 1 {
            let (first, second) = part.split_at(part.len() / 2);
            // Second pushed first so parts come out in sample order.
            pending.push(second);
            pending.push(first);
            continue;
        }
        if body.len() > max_bytes {
            out.oversized += 1;
        }
        out.requests.push(Encoded {
            body: body.into(),
            samples: request.sample_count(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use prost::Message as _;

    use super::*;
    use crate::model::{Frame, FrameKind, Module, SymbolizedSample, Thread};

    fn profile(processes: u32, stacks_each: u64) -> Profile {
        let mut profile = Profile::new(99);
        profile.hostname = Some("h".into());
        for pid in 1..=processes {
            let module = Arc::new(Module {
                path: format!("/usr/bin/app{pid}").into(),
                build_id: Some("00ff".into()),
                start: 0x1000,
                end: 0x100_0000,
                file_offset: 0,
            });
            for s in 0..stacks_each {
                let frames: Vec<Frame> = (0..20u64)
                    .map(|depth| Frame {
                        function: format!("function_{s}_{depth}").into(),
                        file: Some("src/app.c".into()),
                        line: Some(u32::try_from(depth).unwrap_or(0)),
                        kind: FrameKind::Native,
                        inlined: false,
                        address: 0x2000 + s * 64 + depth,
                        module: Some(Arc::clone(&module)),
                    })
                    .collect();
                profile.add(
                    SymbolizedSample {
                        thread: Thread {
                            pid,
                            tid: pid,
                            process_name: format!("app{pid}").into(),
                            thread_name: "main".into(),
                            executable_path: format!("/usr/bin/app{pid}").into(),
                            container_id: None,
                        },
                        stack: frames.into(),
                        count: 2,
                    },
                    1_000,
                    2_000,
                );
            }
        }
        profile
    }

    /// What a decoded request says, generation-neutral: per profile its period, period type
    /// (type, unit) and, per sample, the leaf function of its stack with its values.
    #[derive(Debug, PartialEq, Eq)]
    struct Decoded {
        period: i64,
        period_type: (String, String),
        samples: Vec<(String, Vec<i64>)>,
    }

    /// Reads `$message` (either generation: the field names are the same) into [`Decoded`]s.
    macro_rules! decoded {
        ($message:expr) => {{
            let message = $message;
            let d = message.dictionary.expect("a dictionary");
            let string = |i: i32| d.string_table[usize::try_from(i).unwrap()].clone();
            let leaf = |stack: i32| {
                let stack = &d.stack_table[usize::try_from(stack).unwrap()];
                let location =
                    &d.location_table[usize::try_from(stack.location_indices[0]).unwrap()];
                let function =
                    &d.function_table[usize::try_from(location.lines[0].function_index).unwrap()];
                string(function.name_strindex)
            };
            let mut out = Vec::new();
            for resource in &message.resource_profiles {
                for scope in &resource.scope_profiles {
                    for profile in &scope.profiles {
                        let period_type = profile.period_type.as_ref().expect("a period type");
                        out.push(Decoded {
                            period: profile.period,
                            period_type: (
                                string(period_type.type_strindex),
                                string(period_type.unit_strindex),
                            ),
                            samples: profile
                                .samples
                                .iter()
                                .map(|s| (leaf(s.stack_index), s.values.clone()))
                                .collect(),
                        });
                    }
                }
            }
            out
        }};
    }

    /// Every profile of every request of `profile`, encoded in `version` (split at
    /// `max_bytes`), decoded with that generation's definitions.
    fn decode_all(profile: &Profile, version: ProtoVersion, max_bytes: usize) -> Vec<Decoded> {
        let encoding = encode(profile, version, SampleAttributes::default(), max_bytes);
        assert!(!encoding.requests.is_empty());
        encoding
            .requests
            .iter()
            .flat_map(|r| match version {
                ProtoVersion::V1_9 => decoded!(
                    v1_9::ExportProfilesServiceRequest::decode(r.body.clone())
                        .expect("decodes as v1.9")
                ),
                ProtoVersion::V1_10 => decoded!(
                    opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest::decode(
                        r.body.clone(),
                    )
                    .expect("decodes as v1.10")
                ),
            })
            .collect()
    }

    /// One sample of `count` on a one-frame stack `leaf` of process `pid`.
    fn add_sample(profile: &mut Profile, pid: u32, leaf: &str, count: u64) {
        let module = Arc::new(Module {
            path: "/usr/bin/app".into(),
            build_id: None,
            start: 0x1000,
            end: 0x10_0000,
            file_offset: 0,
        });
        let frame = Frame {
            function: leaf.into(),
            file: None,
            line: None,
            kind: FrameKind::Native,
            inlined: false,
            // A distinct address per function, so every stack is its own location.
            address: 0x2000 + leaf.bytes().map(u64::from).sum::<u64>(),
            module: Some(module),
        };
        profile.add(
            SymbolizedSample {
                thread: Thread {
                    pid,
                    tid: pid,
                    process_name: "app".into(),
                    thread_name: "main".into(),
                    executable_path: "/usr/bin/app".into(),
                    container_id: None,
                },
                stack: vec![frame].into(),
                count,
            },
            1_000,
            2_000,
        );
    }

    #[test]
    fn every_profile_carries_the_sampling_period_of_its_frequency() {
        for (frequency_hz, max_bytes) in [(99, usize::MAX), (49, usize::MAX), (997, 1024)] {
            // Given a profile sampled at `frequency_hz`, with two processes and enough stacks
            // that a 1 KiB limit splits it into several requests
            let mut profile = Profile::new(frequency_hz);
            for pid in [1, 2] {
                for i in 0..20 {
                    add_sample(&mut profile, pid, &format!("function_{i}"), 1);
                }
            }
            for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
                // When encoded and decoded with the generation's own definitions
                let decoded = decode_all(&profile, version, max_bytes);
                if max_bytes != usize::MAX {
                    assert!(decoded.len() > 2, "{version}: the profile was not split");
                }
                // Then every profile's period is 1e9 / frequency ns of cpu time
                for profile in &decoded {
                    assert_eq!(
                        profile.period,
                        1_000_000_000 / i64::from(frequency_hz),
                        "{version} at {frequency_hz} Hz"
                    );
                    assert_eq!(
                        profile.period_type,
                        ("cpu".to_owned(), "nanoseconds".to_owned())
                    );
                }
            }
        }
    }

    #[test]
    fn every_stack_keeps_its_own_count() {
        // Given one process with three stacks of different counts next to each other, and a
        // second process with one more
        let mut profile = Profile::new(99);
        add_sample(&mut profile, 1, "alpha", 3);
        add_sample(&mut profile, 1, "beta", 5);
        add_sample(&mut profile, 1, "gamma", 7);
        add_sample(&mut profile, 2, "delta", 11);
        for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
            // When encoded in one request and decoded
            let decoded = decode_all(&profile, version, usize::MAX);
            // Then each process is its own profile and each stack has its own count, once
            let mut per_profile: Vec<Vec<(String, Vec<i64>)>> = decoded
                .into_iter()
                .map(|p| {
                    let mut samples = p.samples;
                    samples.sort();
                    samples
                })
                .collect();
            per_profile.sort();
            let expected = |rows: &[(&str, i64)]| -> Vec<(String, Vec<i64>)> {
                rows.iter()
                    .map(|&(leaf, count)| (leaf.to_owned(), vec![count]))
                    .collect()
            };
            assert_eq!(
                per_profile,
                vec![
                    expected(&[("alpha", 3), ("beta", 5), ("gamma", 7)]),
                    expected(&[("delta", 11)]),
                ],
                "{version}"
            );
        }
    }

    #[test]
    fn oversized_profiles_are_split_without_loss() {
        // Given a profile that encodes to far more than 64 KiB.
        let profile = profile(3, 400);
        let whole = encode(
            &profile,
            ProtoVersion::V1_10,
            SampleAttributes::default(),
            usize::MAX,
        );
        assert_eq!(whole.requests.len(), 1);
        assert!(whole.requests[0].body.len() > 4 * 65536);
        // When encoded with a 64 KiB limit.
        let split = encode(
            &profile,
            ProtoVersion::V1_10,
            SampleAttributes::default(),
            65536,
        );
        // Then every part fits, and all samples are there.
        assert!(split.requests.len() > 4, "{} parts", split.requests.len());
        assert_eq!(split.oversized, 0);
        assert!(split.requests.iter().all(|r| r.body.len() <= 65536));
        let total: u64 = split.requests.iter().map(|r| r.samples).sum();
        assert_eq!(total, profile.total_samples());
        // Each part decodes with its own dictionary holding every string it references.
        for part in &split.requests {
            let message =
                opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest::decode(
                    part.body.clone(),
                )
                .unwrap();
            let dictionary = message.dictionary.unwrap();
            assert_eq!(dictionary.string_table[0], "");
            for f in &dictionary.function_table {
                assert!((f.name_strindex as usize) < dictionary.string_table.len());
            }
        }
    }

    #[test]
    fn the_two_generations_differ_only_in_samples_and_v1_10_read_as_v1_9_is_wrong() {
        // Given the same profile in both generations.
        let profile = profile(1, 3);
        let v9 = encode(
            &profile,
            ProtoVersion::V1_9,
            SampleAttributes::default(),
            usize::MAX,
        );
        let v10 = encode(
            &profile,
            ProtoVersion::V1_10,
            SampleAttributes::default(),
            usize::MAX,
        );
        let v9 = v1_9::ExportProfilesServiceRequest::decode(v9.requests[0].body.clone()).unwrap();
        let v10_bytes = v10.requests[0].body.clone();
        let v10 =
            opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest::decode(
                v10_bytes.clone(),
            )
            .unwrap();
        // Then each decodes with its own definitions to the same values...
        let values_9: Vec<i64> = v9.resource_profiles[0].scope_profiles[0].profiles[0]
            .samples
            .iter()
            .flat_map(|s| s.values.clone())
            .collect();
        let values_10: Vec<i64> = v10.resource_profiles[0].scope_profiles[0].profiles[0]
            .samples
            .iter()
            .flat_map(|s| s.values.clone())
            .collect();
        assert_eq!(values_9, vec![2, 2, 2]);
        assert_eq!(values_9, values_10);
        // ...but v1.10 bytes read with v1.9 definitions are wrong: prost refuses them (field 4
        // is now packed values where v1.9 expects the link index), and decoders that skip
        // mismatched wire types (Go, Python) take the attribute indexes (field 2) for values.
        let wrong: Vec<i64> = match v1_9::ExportProfilesServiceRequest::decode(v10_bytes) {
            Err(err) => {
                assert!(err.to_string().contains("link_index"), "{err}");
                return;
            }
            Ok(misread) => misread.resource_profiles[0].scope_profiles[0].profiles[0]
                .samples
                .iter()
                .flat_map(|s| s.values.clone())
                .collect(),
        };
        assert_ne!(
            wrong, values_10,
            "a v1.10 message read as v1.9 must not look right"
        );
    }
}
