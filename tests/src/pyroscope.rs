//! A small model of what Grafana Pyroscope keeps of an OTLP profiles request, written from
//! reading its ingestion code (`pkg/ingester/otlp/ingest_handler.go` and `convert.go`, the label
//! validation, the symdb stack resolver) in v1.18.2 (OTLP profiles v1.9; 1.19 is the same) and
//! v2.2.1 (v1.10, the rules of every version from 1.20). No Pyroscope server runs in the tests:
//! every whole-chain test's requests go through this model instead.
//!
//! What it keeps:
//! - Frames: only a location's lines make frames (a function name per line). A location without
//!   lines contributes no frame (the fallback naming needs an experimental symbolizer that is off
//!   by default); a stack of such locations only is empty.
//! - Profile names: sample type `samples`/`count` with period type `cpu`/`nanoseconds` is
//!   `process_cpu`; sample type `off_cpu`/`nanoseconds` is `off_cpu` (values summed as they
//!   come: nanoseconds blocked); any other type is not ingested (counted in `unknown_type`).
//! - Series labels: `__name__` (the profile name), `service_name`, the string resource attributes and
//!   the string sample attributes; integer attributes are dropped up to 1.19 and become labels
//!   (as text) from 1.20. Each distinct label set is a series.
//! - `service_name`: the sample's `service.name`, else the resource's, else
//!   `unknown_service:<process.executable.name>`, else `unknown_service`.
//! - Label names: every character outside `[A-Za-z0-9_]` becomes `_`. At most 30 labels per
//!   series (`max_label_names_per_series`); a series over it is rejected.

use std::collections::{BTreeMap, BTreeSet};

use crate::otlp::Decoded;

/// Pyroscope's default `max_label_names_per_series`.
pub const MAX_LABELS: usize = 30;

/// Which ingestion rules: they differ in what becomes a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rules {
    /// Pyroscope 1.18 and 1.19 (OTLP profiles v1.9): string attributes only.
    V1_18,
    /// Pyroscope >= 1.20 (v1.10): integer attributes become labels too.
    V1_20,
}

/// What Pyroscope would store of some requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Series (label name -> value) with the samples each got.
    pub series: BTreeMap<BTreeMap<String, String>, i64>,
    /// Sample values in all (samples, and nanoseconds of off-CPU profiles).
    pub total: i64,
    /// Samples whose stack is empty in Pyroscope (every location without lines).
    pub empty_stack: i64,
    /// Samples that lost at least one frame (a location without lines).
    pub lost_frame: i64,
    /// Series over [`MAX_LABELS`] (rejected by Pyroscope).
    pub over_label_limit: usize,
    /// Samples of requests whose sample type maps to no profile name (not ingested).
    pub unknown_type: i64,
}

/// The profile name Pyroscope files a request's samples under, from its sample and period
/// types; `None`: a type it does not map.
pub fn profile_name(request: &Decoded) -> Option<&'static str> {
    let is = |t: &(String, String), a: &str, b: &str| t.0 == a && t.1 == b;
    if is(&request.sample_type, "off_cpu", "nanoseconds") {
        return Some("off_cpu");
    }
    if is(&request.sample_type, "samples", "count")
        && is(&request.period_type, "cpu", "nanoseconds")
    {
        return Some("process_cpu");
    }
    None
}

impl View {
    /// The `service_name` values of the series.
    pub fn services(&self) -> BTreeSet<&str> {
        self.series
            .keys()
            .filter_map(|labels| labels.get("service_name").map(String::as_str))
            .collect()
    }

    /// The series of one service.
    pub fn series_of(&self, service: &str) -> usize {
        self.series
            .keys()
            .filter(|labels| labels.get("service_name").map(String::as_str) == Some(service))
            .count()
    }
}

/// Pyroscope's label name for an attribute name.
pub fn label_name(attribute: &str) -> String {
    attribute
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Walks `requests` through Pyroscope's ingestion `rules`.
pub fn ingest(requests: &[Decoded], rules: Rules) -> View {
    let mut view = View::default();
    for request in requests {
        let Some(name) = profile_name(request) else {
            view.unknown_type += request.total();
            continue;
        };
        for resource in &request.resources {
            for sample in &resource.samples {
                let service = sample
                    .attributes
                    .get("service.name")
                    .or_else(|| resource.attributes.get("service.name"))
                    .cloned()
                    .unwrap_or_else(
                        || match resource.attributes.get("process.executable.name") {
                            Some(exe) => format!("unknown_service:{exe}"),
                            None => "unknown_service".to_owned(),
                        },
                    );
                let mut labels = BTreeMap::new();
                let kept = |key: &String, ints: &BTreeSet<String>| {
                    rules == Rules::V1_20 || !ints.contains(key)
                };
                for (key, value) in &resource.attributes {
                    if kept(key, &resource.int_attributes) {
                        labels.insert(label_name(key), value.clone());
                    }
                }
                for (key, value) in &sample.attributes {
                    if kept(key, &sample.int_attributes) {
                        labels.insert(label_name(key), value.clone());
                    }
                }
                labels.insert("service_name".to_owned(), service);
                labels.insert("__name__".to_owned(), name.to_owned());
                view.total += sample.count;
                if sample.line_names.is_empty() {
                    view.empty_stack += sample.count;
                }
                if sample.line_names.len() < sample.stack.len() {
                    view.lost_frame += sample.count;
                }
                *view.series.entry(labels).or_default() += sample.count;
            }
        }
    }
    view.over_label_limit = view
        .series
        .keys()
        .filter(|labels| labels.len() > MAX_LABELS)
        .count();
    view
}

/// Prints the figures of `view` under `label` (for the test log).
pub fn report(label: &str, view: &View) {
    let share = |n: i64| 100.0 * n as f64 / view.total.max(1) as f64;
    eprintln!(
        "{label}: {} samples, {:.1}% with an empty stack, {:.1}% lost a frame, {} series, {} \
         services, {} series over {MAX_LABELS} labels",
        view.total,
        share(view.empty_stack),
        share(view.lost_frame),
        view.series.len(),
        view.services().len(),
        view.over_label_limit
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{DecodedResource, DecodedSample};

    fn sample(count: i64, stack: &[&str], lines: &[&str], attrs: &[(&str, &str)]) -> DecodedSample {
        DecodedSample {
            count,
            stack: stack.iter().map(|s| s.to_string()).collect(),
            frame_types: vec!["native".into(); stack.len()],
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            int_attributes: attrs
                .iter()
                .filter(|(_, v)| v.parse::<i64>().is_ok())
                .map(|(k, _)| k.to_string())
                .collect(),
            line_names: lines.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn integers_become_labels_from_1_20_and_lineless_locations_vanish() {
        // Given two processes of one service with an integer pid on the resource, a stack of
        // lineless locations only and one with a named frame
        let resource = |pid: &str, samples| DecodedResource {
            attributes: [("service.name", "api"), ("process.pid", pid)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            int_attributes: BTreeSet::from(["process.pid".to_owned()]),
            samples,
        };
        let decoded = Decoded {
            resources: vec![
                resource(
                    "1",
                    vec![sample(3, &["[unknown]"], &[], &[("thread.name", "w")])],
                ),
                resource("2", vec![sample(2, &["[unknown]", "main"], &["main"], &[])]),
            ],
            period: 1,
            sample_type: ("samples".to_owned(), "count".to_owned()),
            period_type: ("cpu".to_owned(), "nanoseconds".to_owned()),
            time_unix_nano: 0,
            duration_nano: 0,
            empty_first: true,
            build_ids: BTreeMap::new(),
            strings: 0,
        };
        // Then 1.18 sees a series per thread name, 1.20 also one per pid
        let old = ingest(std::slice::from_ref(&decoded), Rules::V1_18);
        let new = ingest(std::slice::from_ref(&decoded), Rules::V1_20);
        assert_eq!(old.series.len(), 2);
        assert_eq!(new.series.len(), 2);
        assert!(new.series.keys().all(|l| l.contains_key("process_pid")));
        assert!(old.series.keys().all(|l| !l.contains_key("process_pid")));
        assert_eq!((old.empty_stack, old.lost_frame, old.total), (3, 5, 5));
        assert_eq!(old.services(), BTreeSet::from(["api"]));
        assert_eq!(label_name("k8s.pod-name"), "k8s_pod_name");
    }
}
