//! The debug exporter: prints what the OTLP exporter would send, in readable form, like the
//! OpenTelemetry Collector's `debug` exporter. It renders the same neutral request the wire
//! encoders encode ([`request::build`]), so what it shows is what goes out: resource attributes,
//! then each sample's count, attributes and frames (leaf first) with their kind.

use std::{fmt::Write as _, io::Write as _};

use crate::{
    model::Profile,
    sink::otlp::request::{self, Request, SampleAttributes},
};

/// How much to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verbosity {
    /// One line per request.
    Basic,
    /// Plus each resource's attributes and sample count.
    Normal,
    /// Plus every sample with its attributes and frames.
    Detailed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugSettings {
    pub verbosity: Verbosity,
    pub attributes: SampleAttributes,
    pub max_request_bytes: usize,
}

/// Renders `profile` as the request(s) the OTLP exporter would build.
pub fn render(profile: &Profile, settings: &DebugSettings) -> String {
    let samples = profile.samples();
    let request = request::build(&samples, &request::Meta::of(profile), settings.attributes);
    render_request(&request, settings.verbosity)
}

/// Writes [`render`]'s text to stdout.
pub fn print(profile: &Profile, settings: &DebugSettings) {
    if profile.is_empty() {
        return;
    }
    let text = render(profile, settings);
    let mut out = std::io::stdout().lock();
    // A closed stdout is not worth failing the relay over.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

pub fn render_request(r: &Request, verbosity: Verbosity) -> String {
    let d = &r.dictionary;
    let mut out = String::new();
    let samples: usize = r.resources.iter().map(|x| x.samples.len()).sum();
    let _ = writeln!(
        out,
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
    );
    if verbosity == Verbosity::Basic {
        return out;
    }
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
            .map(|kv| format!("{}={}", kv.key, kv.value))
            .collect();
        let total: i64 = resource.samples.iter().map(|s| s.count).sum();
        let _ = writeln!(
            out,
            "  resource #{i}: {} | {} samples ({total} counted)",
            attrs.join(" "),
            resource.samples.len()
        );
        if verbosity != Verbosity::Detailed {
            continue;
        }
        for (j, sample) in resource.samples.iter().enumerate() {
            let attrs: Vec<String> = sample
                .attributes
                .iter()
                .filter_map(|&a| d.attributes.get(usize::try_from(a).ok()?))
                .map(|a| format!("{}={}", d.string(a.key), a.value))
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
                let Some(location) = usize::try_from(l).ok().and_then(|l| d.locations.get(l))
                else {
                    continue;
                };
                let kind = location
                    .attributes
                    .iter()
                    .filter_map(|&a| d.attributes.get(usize::try_from(a).ok()?))
                    .find(|a| d.string(a.key) == request::keys::FRAME_TYPE)
                    .map_or_else(String::new, |a| match &a.value {
                        request::Value::Str(s) => s.to_string(),
                        other => other.to_string(),
                    });
                let mapping = usize::try_from(location.mapping)
                    .ok()
                    .and_then(|m| d.mappings.get(m))
                    .map_or("", |m| d.string(m.filename));
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
                    let name = function.map_or("", |f| d.string(f.name));
                    let file = function.map_or("", |f| d.string(f.filename));
                    let _ = write!(out, "      {name} [{kind}]");
                    if !file.is_empty() {
                        let _ = write!(out, " {file}:{}", line.line);
                    }
                    let _ = writeln!(out, " {:#x} {mapping}", location.address);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{Frame, FrameKind, Module, SymbolizedSample, Thread};

    #[test]
    fn detailed_output_shows_resources_attributes_and_frames() {
        let module = Arc::new(Module {
            path: "/usr/bin/app".into(),
            build_id: None,
            start: 0x1000,
            end: 0x9000,
            file_offset: 0,
        });
        let mut profile = Profile::new(100);
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
                        function: "hot".into(),
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
                attributes: SampleAttributes::default(),
                max_request_bytes: 1 << 20,
            },
        );
        for needle in [
            "service.name=\"app\"",
            "process.pid=42",
            "count 5 thread.name=\"worker\"",
            "hot [native] app.c:12",
            "(unsymbolized) /usr/bin/app",
            "samples/count",
            "cpu/nanoseconds",
        ] {
            assert!(text.contains(needle), "no {needle:?} in:\n{text}");
        }
    }
}
