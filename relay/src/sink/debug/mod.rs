//! The debug exporter: prints what the OTLP exporter sends, in readable form, like the
//! OpenTelemetry Collector's `debug` exporter. It renders the requests the exporter sends,
//! split the same way ([`wire::split`] with the same [`wire::EncodeSettings`]), so what it shows is
//! what goes out: per request its size, resource attributes, then each sample's count,
//! attributes and frames (leaf first) with their kind. Every name and value is printed with its
//! control and invisible format characters escaped ([`terminal_safe`]): they come from the
//! profiled processes.
//!
//! [`config`] owns the `exporters.debug` section.

pub mod config;

use std::{fmt::Write as _, io::Write as _};

pub use self::config::{DebugConfig, DebugSettings, Verbosity};
use crate::{
    labels::labeled::LabeledProfile,
    model::terminal_safe,
    sink::otlp::{
        request::{self, Dictionary, Location, Request},
        wire,
    },
};

/// Renders `profile` as the request(s) the OTLP exporter sends.
pub fn render(profile: &LabeledProfile, settings: &DebugSettings) -> String {
    let mut parts = Vec::new();
    wire::split(profile, &settings.encoding, |part| {
        parts.push((part.request, part.body.len()));
    });
    let count = parts.len();
    let mut out = String::new();
    for (i, (request, bytes)) in parts.iter().enumerate() {
        let _ = write!(out, "{}", header(request));
        let _ = write!(out, "; {bytes} bytes (v{})", settings.encoding.version);
        if count > 1 {
            let _ = write!(out, ", part {} of {count}", i + 1);
        }
        out.push('\n');
        render_request(&mut out, request, settings.verbosity);
    }
    out
}

/// Writes [`render`]'s text to stdout.
pub fn print(profile: &LabeledProfile, settings: &DebugSettings) {
    if profile.is_empty() {
        return;
    }
    let text = render(profile, settings);
    let mut out = std::io::stdout().lock();
    // A closed stdout is not worth failing the relay over.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// The request's first line: its resources, samples and dictionary sizes.
fn header(r: &Request) -> String {
    let d = &r.dictionary;
    let samples: usize = r.resources.iter().map(|x| x.samples.len()).sum();
    format!(
        "OTLP profiles request: {} resources, {} samples ({} counted), dictionary: {} strings, \
         {} functions, {} locations, {} mappings, {} stacks, {} attributes",
        r.resources.len(),
        samples,
        r.sample_count(),
        d.strings.len(),
        d.functions.len(),
        d.locations.len(),
        d.mappings.len(),
        d.stacks.len(),
        d.attributes.len()
    )
}

/// Everything after the header line, as much as `verbosity` asks for.
fn render_request(out: &mut String, r: &Request, verbosity: Verbosity) {
    if verbosity == Verbosity::Basic {
        return;
    }
    let d = &r.dictionary;
    let _ = writeln!(
        out,
        "  profile: sample type {}/{}, period {} {}/{}, time_unix_nano {}, duration {:.3}s",
        d.string(r.sample_type.0),
        d.string(r.sample_type.1),
        r.period,
        d.string(r.period_type.0),
        d.string(r.period_type.1),
        r.time_unix_nano,
        r.duration_nano as f64 / 1e9
    );
    for (i, resource) in r.resources.iter().enumerate() {
        let attrs: Vec<String> = resource
            .resource
            .iter()
            .map(|kv| terminal_safe(&format!("{}={}", kv.key, kv.value)))
            .collect();
        let total: i64 = resource.samples.iter().map(|s| s.count).sum();
        let _ = writeln!(
            out,
            "  resource #{i}: {} | {} samples ({total} counted)",
            attrs.join(" "),
            resource.samples.len()
        );
        if verbosity == Verbosity::Detailed {
            for (j, sample) in resource.samples.iter().enumerate() {
                render_sample(out, d, j, sample);
            }
        }
    }
}

/// The attributes `indexes` point at, as `key=value`.
fn attributes<'a>(
    d: &'a Dictionary,
    indexes: &'a [i32],
) -> impl Iterator<Item = &'a request::Attribute> + 'a {
    indexes
        .iter()
        .filter_map(|&a| d.attributes.get(usize::try_from(a).ok()?))
}

/// One sample: its count and attributes, then its stack's frames, leaf first.
fn render_sample(out: &mut String, d: &Dictionary, j: usize, sample: &request::Sample) {
    let attrs: Vec<String> = attributes(d, &sample.attributes)
        .map(|a| terminal_safe(&format!("{}={}", d.string(a.key), a.value)))
        .collect();
    let _ = writeln!(
        out,
        "    sample #{j}: count {} {}",
        sample.count,
        attrs.join(" ")
    );
    let stack = usize::try_from(sample.stack)
        .ok()
        .and_then(|s| d.stacks.get(s))
        .map_or(&[][..], Vec::as_slice);
    for &l in stack {
        if let Some(location) = usize::try_from(l).ok().and_then(|l| d.locations.get(l)) {
            render_location(out, d, location);
        }
    }
}

/// One location: a line per (inlined) function (an unnamed frame's is `[unknown] module`), or
/// the address alone for a location without lines.
fn render_location(out: &mut String, d: &Dictionary, location: &Location) {
    let kind = attributes(d, &location.attributes)
        .find(|a| d.string(a.key) == request::keys::FRAME_TYPE)
        .map_or_else(String::new, |a| match &a.value {
            request::Value::Str(s) => s.to_string(),
            other => other.to_string(),
        });
    let mapping = usize::try_from(location.mapping)
        .ok()
        .and_then(|m| d.mappings.get(m))
        .map_or_else(String::new, |m| terminal_safe(d.string(m.filename)));
    if location.lines.is_empty() {
        let _ = writeln!(
            out,
            "      {:#x} [{kind}] (unsymbolized) {mapping}",
            location.address
        );
    }
    for line in &location.lines {
        let function = usize::try_from(line.function)
            .ok()
            .and_then(|f| d.functions.get(f));
        let name = terminal_safe(function.map_or("", |f| d.string(f.name)));
        let file = terminal_safe(function.map_or("", |f| d.string(f.filename)));
        let _ = write!(out, "      {name} [{kind}]");
        if !file.is_empty() {
            let _ = write!(out, " {file}:{}", line.line);
        }
        let _ = writeln!(out, " {:#x} {mapping}", location.address);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        model::{Frame, FrameKind, Module, SymbolizedSample, Thread},
        sink::otlp::{EncodeSettings, ProtoVersion, SampleAttributes},
    };

    #[test]
    fn detailed_output_shows_resources_attributes_and_frames() {
        let module = Arc::new(Module {
            path: "/usr/bin/app".into(),
            build_id: None,
            start: 0x1000,
            end: 0x9000,
            file_offset: 0,
            file: None,
        });
        let mut profile = LabeledProfile::new(100);
        profile.add(
            SymbolizedSample {
                thread: Thread {
                    pid: 42,
                    tid: 43,
                    process_name: "app".into(),
                    thread_name: "worker".into(),
                    executable_path: "/usr/bin/app".into(),
                    container_id: None,
                },
                stack: vec![
                    Frame {
                        // A name with an OSC title sequence and a bidi override in it.
                        function: "hot\u{1b}]0;t\u{7}\u{202e}".into(),
                        file: Some("app.c".into()),
                        line: Some(12),
                        kind: FrameKind::Native,
                        inlined: false,
                        address: 0x1234,
                        module: Some(Arc::clone(&module)),
                    },
                    Frame {
                        function: "[unknown]".into(),
                        file: None,
                        line: None,
                        kind: FrameKind::Native,
                        inlined: false,
                        address: 0x2000,
                        module: Some(module),
                    },
                ]
                .into(),
                count: 5,
            },
            1,
            2,
        );
        let text = render(
            &profile,
            &DebugSettings {
                verbosity: Verbosity::Detailed,
                encoding: EncodeSettings {
                    version: ProtoVersion::V1_10,
                    attributes: SampleAttributes::default(),
                    max_request_bytes: 1 << 20,
                },
            },
        );
        for needle in [
            "service.name=\"app\"",
            "count 5 thread.name=\"worker\"",
            "hot\\u{1b}]0;t\\u{7}\\u{202e} [native] app.c:12",
            "[unknown] app [native]",
            "samples/count",
            "cpu/nanoseconds",
        ] {
            assert!(text.contains(needle), "no {needle:?} in:\n{text}");
        }
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "a raw control or bidi character in:\n{text}"
        );
    }

    #[test]
    fn a_split_profile_is_shown_as_the_requests_the_exporter_sends() {
        // Given a profile of 200 distinct stacks and a 4 KiB request limit
        let mut profile = LabeledProfile::new(99);
        for i in 0..200u64 {
            let frame = Frame {
                function: format!("function_{i}").into(),
                file: None,
                line: None,
                kind: FrameKind::Native,
                inlined: false,
                address: 0x1000 + i,
                module: None,
            };
            let thread = Thread {
                pid: 7,
                tid: 7,
                process_name: "app".into(),
                thread_name: "main".into(),
                executable_path: "/usr/bin/app".into(),
                container_id: None,
            };
            let stack = vec![frame].into();
            profile.add(
                SymbolizedSample {
                    thread,
                    stack,
                    count: 1,
                },
                1,
                2,
            );
        }
        for version in [ProtoVersion::V1_9, ProtoVersion::V1_10] {
            let encoding = EncodeSettings {
                version,
                attributes: SampleAttributes::default(),
                max_request_bytes: 4096,
            };
            let settings = DebugSettings {
                verbosity: Verbosity::Basic,
                encoding,
            };
            // When the exporter encodes it and the debug exporter renders it
            let sent = crate::sink::otlp::encode(&profile, version, encoding.attributes, 4096);
            let text = render(&profile, &settings);
            // Then the debug exporter shows one line per request sent, with its size and part
            let lines: Vec<&str> = text.lines().collect();
            assert!(sent.requests.len() > 2, "{version}: not split");
            assert_eq!(lines.len(), sent.requests.len(), "{version}:\n{text}");
            let total = sent.requests.len();
            for (i, (line, request)) in lines.iter().zip(&sent.requests).enumerate() {
                assert!(line.starts_with("OTLP profiles request:"), "{line}");
                let size = format!(
                    "; {} bytes (v{version}), part {} of {total}",
                    request.body.len(),
                    i + 1
                );
                assert!(line.ends_with(&size), "{line} does not end with {size}");
                assert!(
                    line.contains(&format!("({} counted)", request.samples)),
                    "{line}"
                );
            }
        }
    }
}
