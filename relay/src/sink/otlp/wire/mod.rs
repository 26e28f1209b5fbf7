//! The wire: a neutral [`Request`] as the bytes of one OTLP profiles generation, and a profile
//! split into requests that fit the size limit.
//!
//! The two generations ([`v1_9`], [`v1_10`]) differ on the wire only in `Sample` (v1.9: values
//! = 2, attribute indices = 3, link index = 4; v1.10: attribute indices = 2, link index = 3,
//! values = 4). Everything around it (dictionary, resource, scope) is the same message, so one
//! writer ([`protobuf`]) writes both, straight from the neutral request: a generation supplies
//! only the two field numbers that moved. A request is encoded wholly in the generation the
//! exporter is configured for ([`ProtoVersion`]); nothing mixes them.
//!
//! [`Encoder::split`] is the one place a profile becomes requests: the exporter sends what it
//! yields and the debug exporter prints it, so both show the same split. The exporter keeps one
//! [`Encoder`], whose bodies are written into one buffer reused from interval to interval
//! ([`buffer`]).

mod buffer;
mod protobuf;
pub mod v1_10;
pub mod v1_9;

use std::fmt;

use bytes::Bytes;

use self::{buffer::BodyBuffer, protobuf::Export};
use super::request::{self, Request, SampleAttributes};
use crate::{
    labels::labeled::{LabeledProfile, LabeledSample},
    model::SampleKind,
};

/// The OTLP profiles wire generation a receiver speaks (see docs/otlp.md's compatibility matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
pub enum ProtoVersion {
    /// Pyroscope 1.18.x and 1.19.x, OpenTelemetry Collector <= 0.147.
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

    /// Bytes `request` takes in this generation.
    fn encoded_len(self, request: &Request) -> usize {
        match self {
            Self::V1_9 => Export::<v1_9::V1_9>::new(request).encoded_len(),
            Self::V1_10 => Export::<v1_10::V1_10>::new(request).encoded_len(),
        }
    }

    /// Appends `request` in this generation to `buf`.
    fn write(self, request: &Request, buf: &mut bytes::BytesMut) {
        match self {
            Self::V1_9 => Export::<v1_9::V1_9>::new(request).write(buf),
            Self::V1_10 => Export::<v1_10::V1_10>::new(request).write(buf),
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
                "unknown OTLP profiles version `{other}`: use 1.9 (Pyroscope 1.18/1.19, Collector \
                 <= 0.147) or 1.10 (Pyroscope >= 1.20, Collector >= 0.148)"
            )),
        }
    }
}

/// What decides the bytes of the requests a profile becomes: the exporter sends them, the debug
/// exporter shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeSettings {
    pub version: ProtoVersion,
    pub attributes: SampleAttributes,
    /// Largest request (uncompressed); bigger ones are split.
    pub max_request_bytes: usize,
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

/// One request of a split profile: the neutral form and its bytes.
pub struct Part {
    pub request: Request,
    pub body: Bytes,
    /// Over the limit on its own (a single sample bigger than the limit); sent anyway.
    pub oversized: bool,
}

/// Encodes `profile` into requests of at most `max_bytes` each (uncompressed), with an encoder of
/// its own (see [`Encoder::encode`]).
pub fn encode(
    profile: &LabeledProfile,
    version: ProtoVersion,
    attributes: SampleAttributes,
    max_bytes: usize,
) -> Encoding {
    Encoder::new(EncodeSettings {
        version,
        attributes,
        max_request_bytes: max_bytes,
    })
    .encode(profile)
}

/// Hands `each` the requests `profile` becomes under `settings`, with an encoder of its own (see
/// [`Encoder::split`]).
pub fn split(profile: &LabeledProfile, settings: &EncodeSettings, each: impl FnMut(Part)) {
    Encoder::new(*settings).split(profile, each);
}

/// Turns profiles into request bodies under one set of [`EncodeSettings`], writing them into a
/// buffer it keeps from one profile to the next: the exporter's one per thread.
pub struct Encoder {
    settings: EncodeSettings,
    buffer: BodyBuffer,
}

impl Encoder {
    pub fn new(settings: EncodeSettings) -> Self {
        Self {
            settings,
            buffer: BodyBuffer::default(),
        }
    }

    /// Encodes `profile` into requests of at most the settings' `max_request_bytes` each
    /// (uncompressed). A request over the limit is split in halves by sample (each half gets its
    /// own dictionary) until every part fits; no sample is dropped to fit.
    pub fn encode(&mut self, profile: &LabeledProfile) -> Encoding {
        let mut out = Encoding::default();
        self.split(profile, |part| {
            out.oversized += usize::from(part.oversized);
            out.requests.push(Encoded {
                samples: part.request.sample_count(),
                body: part.body,
            });
        });
        out
    }

    /// Hands `each` the requests `profile` becomes, in sample order (see [`Encoder::encode`]).
    /// An empty profile becomes no request.
    pub fn split(&mut self, profile: &LabeledProfile, mut each: impl FnMut(Part)) {
        let meta = request::Meta::of(profile);
        let mut bytes = self.split_of(&profile.samples(), &meta, &mut each);
        // Off-CPU rows (`--off-cpu`) go in requests of their own, sample type off_cpu/nanoseconds.
        let off_cpu = profile.samples_of(SampleKind::OffCpu);
        let meta = request::Meta {
            off_cpu: true,
            ..meta
        };
        bytes += self.split_of(&off_cpu, &meta, &mut each);
        self.buffer.profile_done(bytes);
    }

    /// [`Encoder::split`] of one kind of samples; returns the bytes of the bodies.
    fn split_of(
        &mut self,
        samples: &[LabeledSample<'_>],
        meta: &request::Meta,
        each: &mut impl FnMut(Part),
    ) -> usize {
        if samples.is_empty() {
            return 0;
        }
        let (version, max) = (self.settings.version, self.settings.max_request_bytes);
        let mut bytes = 0;
        let mut pending: Vec<&[LabeledSample<'_>]> = vec![samples];
        while let Some(part) = pending.pop() {
            let request = request::build(part, meta, self.settings.attributes);
            // Measured before a byte is written: a part over the limit is never written.
            let len = version.encoded_len(&request);
            let over = len > max;
            if over && part.len() > 1 {
                let (first, second) = part.split_at(part.len() / 2);
                // Second pushed first so parts come out in sample order.
                pending.push(second);
                pending.push(first);
                continue;
            }
            let body = self.buffer.body(len, |buf| version.write(&request, buf));
            bytes += body.len();
            each(Part {
                request,
                body,
                oversized: over,
            });
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use prost::Message as _;

    use super::*;
    use crate::model::{Frame, FrameKind, Module, SymbolizedSample, Thread};

    fn profile(processes: u32, stacks_each: u64) -> LabeledProfile {
        let mut profile = LabeledProfile::new(99);
        profile.hostname = Some("h".into());
        for pid in 1..=processes {
            let module = Arc::new(Module {
                path: format!("/usr/bin/app{pid}").into(),
                build_id: Some("00ff".into()),
                start: 0x1000,
                end: 0x100_0000,
                file_offset: 0,
                file: None,
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
    fn decode_all(
        profile: &LabeledProfile,
        version: ProtoVersion,
        max_bytes: usize,
    ) -> Vec<Decoded> {
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
    fn add_sample(profile: &mut LabeledProfile, pid: u32, leaf: &str, count: u64) {
        profile.add(one_sample(pid, leaf, count), 1_000, 2_000);
    }

    /// A sample of `count` on a one-frame stack `leaf` of process `pid`.
    fn one_sample(pid: u32, leaf: &str, count: u64) -> SymbolizedSample {
        let module = Arc::new(Module {
            path: "/usr/bin/app".into(),
            build_id: None,
            start: 0x1000,
            end: 0x10_0000,
            file_offset: 0,
            file: None,
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
        }
    }

    /// Per profile of `$message` (either generation), its start and duration.
    macro_rules! times {
        ($message:expr) => {{
            let message = $message;
            let mut out = Vec::new();
            for resource in &message.resource_profiles {
                for scope in &resource.scope_profiles {
                    for profile in &scope.profiles {
                        out.push((profile.time_unix_nano, profile.duration_nano));
                    }
                }
            }
            out
        }};
    }

    /// A decoded stack, leaf first: per location its address, its mapping's file name and its
    /// lines as (function name, line).
    type DecodedStack = Vec<(u64, String, Vec<(String, i64)>)>;

    /// Per sample of `$message` (either generation), its [`DecodedStack`].
    macro_rules! stacks {
        ($message:expr) => {{
            let message = $message;
            let d = message.dictionary.expect("a dictionary");
            let at = |i: i32| usize::try_from(i).expect("an index");
            let string = |i: i32| d.string_table[at(i)].clone();
            let mut out = Vec::new();
            for resource in &message.resource_profiles {
                for scope in &resource.scope_profiles {
                    for profile in &scope.profiles {
                        for sample in &profile.samples {
                            let stack = &d.stack_table[at(sample.stack_index)];
                            let locations: DecodedStack = stack
                                .location_indices
                                .iter()
                                .map(|&l| {
                                    let location = &d.location_table[at(l)];
                                    let mapping = &d.mapping_table[at(location.mapping_index)];
                                    let lines = location
                                        .lines
                                        .iter()
                                        .map(|line| {
                                            let function =
                                                &d.function_table[at(line.function_index)];
                                            (string(function.name_strindex), line.line)
                                        })
                                        .collect();
                                    (location.address, string(mapping.filename_strindex), lines)
                                })
                                .collect();
                            out.push(locations);
                        }
                    }
                }
            }
            out
        }};
    }

    /// Every request of `profile` in `version` (split at `max_bytes`), decoded with that
    /// generation's definitions and read by `$read` (a macro above).
    macro_rules! decode_each {
        ($profile:expr, $version:expr, $max_bytes:expr, $read:ident) => {{
            let encoding = encode($profile, $version, SampleAttributes::default(), $max_bytes);
            assert!(!encoding.requests.is_empty());
            let mut out = Vec::new();
            for request in &encoding.requests {
                out.extend(match $version {
                    ProtoVersion::V1_9 => $read!(
                        v1_9::ExportProfilesServiceRequest::decode(request.body.clone())
                            .expect("decodes as v1.9")
                    ),
                    ProtoVersion::V1_10 => $read!(
                        opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest::decode(
                            request.body.clone(),
                        )
                        .expect("decodes as v1.10")
                    ),
                });
            }
            out
        }};
    }

    #[test]
    fn every_profile_starts_when_the_first_interval_did_and_lasts_the_observed_span_in_ns() {
        // Given a profile of two consecutive 10 s intervals, with samples in each, the first
        // starting at a real wall-clock time
        let second = 1_000_000_000_u64;
        let start = 1_764_000_000 * second + 123_456_789;
        let mut profile = LabeledProfile::new(99);
        for (interval, pid) in [(0, 1), (1, 2)] {
            let from = start + interval * 10 * second;
            profile.observe(from, from + 10 * second);
            for i in 0..20 {
                let sample = one_sample(pid, &format!("function_{i}"), 1);
                profile.add(sample, from, from + 10 * second);
            }
        }
        assert_eq!(
            (profile.start_unix_ns, profile.end_unix_ns),
            (start, start + 20 * second)
        );
        for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
            for max_bytes in [usize::MAX, 1024] {
                // When encoded (whole, and split into several requests) and decoded with the
                // generation's own definitions
                let times: Vec<(u64, u64)> = decode_each!(&profile, version, max_bytes, times);
                if max_bytes != usize::MAX {
                    assert!(times.len() > 2, "{version}: the profile was not split");
                }
                // Then every profile starts at the first interval's start (not an interval
                // before or after) and lasts the 20 s observed, in nanoseconds
                for (time_unix_nano, duration_nano) in times {
                    assert_eq!(time_unix_nano, start, "{version}: start");
                    assert_eq!(duration_nano, 20 * second, "{version}: duration in ns");
                }
            }
        }
    }

    #[test]
    fn unnamed_frames_keep_their_line_in_both_generations() {
        // Given one stack, leaf first: an unnamed frame of /usr/bin/app, a function inlined
        // into its caller (one address), and an unnamed frame outside any module
        let app = Arc::new(Module {
            path: "/usr/bin/app".into(),
            build_id: Some("00ff".into()),
            start: 0x40_0000,
            end: 0x50_0000,
            file_offset: 0,
            file: None,
        });
        let frame = |function: &str, line: Option<u32>, inlined, address| Frame {
            function: function.into(),
            file: line.map(|_| "src/app.c".into()),
            line,
            kind: FrameKind::Native,
            inlined,
            address,
            module: Some(Arc::clone(&app)),
        };
        let unknown = crate::model::UNKNOWN;
        let stack = vec![
            frame(unknown, None, false, 0x40_1234),
            frame("helper", Some(3), true, 0x40_2000),
            frame("caller", Some(9), false, 0x40_2000),
            Frame {
                module: None,
                ..frame(unknown, None, false, 0x99)
            },
        ];
        let mut profile = LabeledProfile::new(99);
        profile.add(
            SymbolizedSample {
                thread: Thread {
                    pid: 1,
                    tid: 1,
                    process_name: "app".into(),
                    thread_name: "main".into(),
                    executable_path: "/usr/bin/app".into(),
                    container_id: None,
                },
                stack: stack.into(),
                count: 1,
            },
            1_000,
            2_000,
        );
        let line = |name: &str, line| (name.to_owned(), line);
        let expected = vec![vec![
            (
                0x40_1234,
                "/usr/bin/app".to_owned(),
                vec![line("[unknown] app", 0)],
            ),
            (
                0x40_2000,
                "/usr/bin/app".to_owned(),
                vec![line("helper", 3), line("caller", 9)],
            ),
            (0x99, String::new(), vec![line("[unknown]", 0)]),
        ]];
        for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
            // When encoded and decoded with the generation's own definitions
            let stacks: Vec<DecodedStack> = decode_each!(&profile, version, usize::MAX, stacks);
            // Then each unnamed frame keeps its one line, named after its module (Pyroscope
            // drops a location without lines), with its address and mapping; the inlined
            // function and its caller share one location, leaf first
            assert_eq!(stacks, expected, "{version}");
        }
    }

    #[test]
    fn every_profile_carries_the_sampling_period_of_its_frequency() {
        for (frequency_hz, max_bytes) in [(99, usize::MAX), (49, usize::MAX), (997, 1024)] {
            // Given a profile sampled at `frequency_hz`, with two processes and enough stacks
            // that a 1 KiB limit splits it into several requests
            let mut profile = LabeledProfile::new(frequency_hz);
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
    fn off_cpu_rows_go_in_profiles_of_their_own_in_both_generations() {
        // Given a profile with CPU samples and off-CPU nanoseconds of one process
        let mut profile = LabeledProfile::new(99);
        add_sample(&mut profile, 1, "compute", 3);
        let waiting = one_sample(1, "wait_for_lock", 0);
        let thread: crate::labels::labeled::LabeledThread = waiting.thread.into();
        profile.add_frames_of(SampleKind::OffCpu, &thread, waiting.stack.iter(), 5_000_000);
        for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
            // When encoded and decoded with the generation's own definitions
            let decoded = decode_all(&profile, version, usize::MAX);
            // Then the CPU samples are one profile and the off-CPU time another, typed
            // off_cpu / nanoseconds with period 1, its values nanoseconds
            assert_eq!(decoded.len(), 2, "{version}");
            assert_eq!(
                decoded[0].period_type,
                ("cpu".to_owned(), "nanoseconds".to_owned())
            );
            assert_eq!(decoded[0].samples, [("compute".to_owned(), vec![3])]);
            assert_eq!(
                decoded[1].period_type,
                ("off_cpu".to_owned(), "nanoseconds".to_owned()),
                "{version}"
            );
            assert_eq!(decoded[1].period, 1, "{version}");
            assert_eq!(
                decoded[1].samples,
                [("wait_for_lock".to_owned(), vec![5_000_000])],
                "{version}"
            );
        }
        // And the export counts CPU samples only
        let encoded = encode(
            &profile,
            ProtoVersion::V1_10,
            SampleAttributes::default(),
            1 << 20,
        );
        let samples: u64 = encoded.requests.iter().map(|r| r.samples).sum();
        assert_eq!(samples, 3);
    }

    #[test]
    fn every_stack_keeps_its_own_count() {
        // Given one process with three stacks of different counts next to each other, and a
        // second process with one more
        let mut profile = LabeledProfile::new(99);
        add_sample(&mut profile, 1, "alpha", 3);
        add_sample(&mut profile, 1, "beta", 5);
        add_sample(&mut profile, 1, "gamma", 7);
        add_sample(&mut profile, 2, "delta", 11);
        for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
            // When encoded in one request and decoded
            let decoded = decode_all(&profile, version, usize::MAX);
            // Then the two processes of one executable share one profile (one service, no pid on
            // the resource) and each stack has its own count, once
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
                vec![expected(&[
                    ("alpha", 3),
                    ("beta", 5),
                    ("delta", 11),
                    ("gamma", 7)
                ])],
                "{version}"
            );
        }
    }

    #[test]
    fn a_request_is_written_into_its_body_alone_and_the_next_interval_into_the_same_buffer() {
        use crate::symbolize::alloc::measure_all;
        // Given an interval of 4,000 distinct stacks, built into its neutral request
        let profile = profile(2, 2_000);
        let samples = profile.samples();
        let meta = request::Meta::of(&profile);
        let request = request::build(&samples, &meta, SampleAttributes::default());
        for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
            let settings = EncodeSettings {
                version,
                attributes: SampleAttributes::default(),
                max_request_bytes: usize::MAX,
            };
            let mut encoder = Encoder::new(settings);
            // When its bytes are measured and written
            let (body, m) = measure_all(|| {
                let len = version.encoded_len(&request);
                encoder.buffer.body(len, |buf| version.write(&request, buf))
            });
            // Then what was allocated is the body (an eighth over) and the few bytes of the
            // handle that shares it: no other form of the request was made on the way
            let len = body.len();
            assert!(
                len > 1 << 20,
                "{len} bytes: not an interval worth measuring"
            );
            let body_bytes = (len + len / 8) as u64;
            assert!(
                (body_bytes..=body_bytes + 64).contains(&m.allocated),
                "{version}: writing a {len}-byte body allocated {} bytes",
                m.allocated
            );
            drop(body);
            // And when the exporter's encoder encodes one interval, sends it, then the next
            let mut encoder = Encoder::new(settings);
            let (first, m1) = measure_all(|| encoder.encode(&profile));
            let len = first.requests[0].body.len();
            drop(first);
            let (second, m2) = measure_all(|| encoder.encode(&profile));
            // Then the next one allocates no body: it is written where the last one was
            assert_eq!(second.requests[0].body.len(), len);
            assert!(
                m2.allocated + len as u64 <= m1.allocated,
                "{version}: the second interval allocated {} bytes, the first {}; a body is \
                 {len}: it was allocated again",
                m2.allocated,
                m1.allocated
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

#[cfg(test)]
mod pinned {
    use std::sync::Arc;

    use super::*;
    use crate::model::{Frame, FrameKind, Module, SymbolizedSample, Thread};

    /// Four processes, 60 stacks each, with every kind of frame and attribute the builder emits.
    ///
    /// Note: these samples carry no resource labels (`LabeledThread::resource` empty), which
    /// takes the builder's unlabelled path, so the pinned bytes did not change when the labels
    /// stage landed. A relay with the stage adds resource attributes only (`host.arch`,
    /// `os.type`, `process.owner`, `host.id`, tags, relabel results) after the former ones, in
    /// name order; `request::tests::labelled_samples_make_one_resource_per_label_set` pins that.
    fn profile() -> LabeledProfile {
        let mut profile = LabeledProfile::new(97);
        profile.hostname = Some("host-a".into());
        for pid in 1..=4u32 {
            let module = Arc::new(Module {
                path: format!("/usr/bin/app{pid}").into(),
                build_id: (pid % 2 == 0).then(|| "00ff".into()),
                start: 0x1000,
                end: 0x100_0000,
                file_offset: 0x10,
                file: None,
            });
            for s in 0..60u64 {
                let frames: Vec<Frame> = (0..12u64)
                    .map(|depth| Frame {
                        function: format!("function_{}_{depth}", s % 7).into(),
                        file: (depth % 3 != 0).then(|| "src/app.c".into()),
                        line: u32::try_from(depth).ok(),
                        kind: if depth == 11 {
                            FrameKind::Kernel
                        } else {
                            FrameKind::Native
                        },
                        inlined: depth % 4 == 1,
                        address: 0x2000 + s * 64 + depth,
                        module: (depth != 11).then(|| Arc::clone(&module)),
                    })
                    .collect();
                let thread = Thread {
                    pid,
                    tid: pid + u32::try_from(s % 3).unwrap(),
                    process_name: format!("app{pid}").into(),
                    thread_name: format!("t{}", s % 3).into(),
                    executable_path: format!("/usr/bin/app{pid}").into(),
                    container_id: (pid == 3).then(|| "abc123".into()),
                };
                let sample = SymbolizedSample {
                    thread,
                    stack: frames.into(),
                    count: 1 + s,
                };
                profile.add(sample, 1_000, 2_000_000);
            }
        }
        profile
    }

    #[test]
    fn the_bytes_on_the_wire_are_those_of_the_hand_written_encoders() {
        // Given a varied profile, both generations, two attribute sets and three size limits
        let profile = profile();
        let attributes = [
            SampleAttributes::default(),
            SampleAttributes {
                thread_name: false,
                pid: true,
                tid: true,
            },
        ];
        // When every request is encoded, FNV-1a over all bodies in order
        let (mut hash, mut requests) = (0xcbf2_9ce4_8422_2325_u64, 0);
        for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
            for attributes in attributes {
                for max in [usize::MAX, 4096, 1024] {
                    for request in encode(&profile, version, attributes, max).requests {
                        requests += 1;
                        for byte in request.body {
                            hash = (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
                        }
                    }
                }
            }
        }
        // Then they are byte for byte what the two hand-written encoders before the generic
        // one produced (main at f6e9ea9), but for one intended wire change since: no
        // `process.pid` on resources (it made a series per process in Pyroscope >= 1.20).
        // A different hash is a wire change, not a stale number: do not paste the new hash to
        // make this pass. First find which decoded field changed (the tests of this module
        // decode start, duration, period, counts and every frame's lines in both generations;
        // add one for the field if none fails), and only if that change is intended and
        // described in its commit, update the pin with it.
        assert_eq!((requests, hash), (1020, 0x9ac1_48de_cfe8_852b));
    }
}
