//! What a Pyroscope series accepts, checked before sending: the label names a process's labels
//! become after Pyroscope's mapping of attribute names (every character outside `[A-Za-z0-9_]`
//! to `_`: `service.name` -> `service_name`), at most [`MAX_LABEL_NAMES_PER_SERIES`] names per
//! series with the lowest-priority labels dropped and counted, and no per-sample label
//! (`thread.id`, `thread.name`) promoted to a series label.
//!
//! Priority (highest first): `service.name`; `process.owner` (it keeps two users' processes
//! that name themselves alike in series of their own); the labels the user pinned (static tags,
//! relabel targets); the workload's names ([`NAMED`]); every other label; identifiers of one
//! machine or process ([`DETAIL`]); per-process values ([`VOLATILE`]); last, the labels whose
//! values the process chose itself (its `OTEL_RESOURCE_ATTRIBUTES`, the unit it made in its
//! delegated cgroup): however many it declares, they never push out what the relay observed.
//! Ties go by name, so the same labels always keep the same series. Pure: no I/O.

use std::collections::BTreeMap;

use super::{is_meta, keys, Labels};

/// Pyroscope's default `max_label_names_per_series`.
pub const MAX_LABEL_NAMES_PER_SERIES: usize = 30;
/// Names Pyroscope adds to every series itself (`__name__`), counted against the limit.
pub const ADDED_BY_PYROSCOPE: usize = 1;
/// Pyroscope's default `max_label_name_length` and `max_label_value_length`.
pub const MAX_LABEL_NAME_LENGTH: usize = 1024;
pub const MAX_LABEL_VALUE_LENGTH: usize = 2048;

/// Labels that stay sample attributes: one value per thread, never a series.
pub const SAMPLE_ONLY: [&str; 2] = [keys::THREAD_ID, keys::THREAD_NAME];
/// The workload's names: what users filter by.
pub const NAMED: [&str; 13] = [
    "k8s.namespace.name",
    "k8s.pod.name",
    "k8s.container.name",
    "k8s.node.name",
    "k8s.deployment.name",
    "k8s.statefulset.name",
    "k8s.daemonset.name",
    "k8s.cronjob.name",
    "k8s.job.name",
    keys::SYSTEMD_UNIT,
    keys::HOST_NAME,
    keys::PROCESS_EXECUTABLE_NAME,
    keys::CONTAINER_RUNTIME,
];
/// Identifiers: kept while there is room.
pub const DETAIL: [&str; 6] = [
    keys::CONTAINER_ID,
    "k8s.pod.uid",
    keys::SYSTEMD_SLICE,
    keys::HOST_ID,
    keys::HOST_ARCH,
    keys::OS_TYPE,
];
/// Per-process values: dropped first.
pub const VOLATILE: [&str; 3] = [
    keys::PROCESS_PID,
    keys::PROCESS_EXECUTABLE_PATH,
    keys::PROCESS_COMMAND_LINE,
];

/// Why a label did not become a series label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DropReason {
    /// Over [`MAX_LABEL_NAMES_PER_SERIES`]: a lower-priority label.
    TooMany,
    /// Its mapped name is taken by a higher-priority label (`a.b` and `a_b`).
    NameCollision,
    /// Its mapped name is not a valid label name (empty, too long).
    InvalidName,
    /// Its value is longer than [`MAX_LABEL_VALUE_LENGTH`].
    ValueTooLong,
}

/// The labels of one series as Pyroscope will store them, and what was left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    /// Pyroscope label name -> value.
    pub labels: BTreeMap<String, String>,
    /// Attribute names left out, with the reason.
    pub dropped: Vec<(String, DropReason)>,
}

impl Series {
    #[cfg(test)]
    pub fn dropped_for(&self, reason: DropReason) -> usize {
        self.dropped.iter().filter(|(_, r)| *r == reason).count()
    }
}

/// Pyroscope's label name for an attribute name.
pub fn label_name(attribute: &str) -> String {
    let mut name: String = attribute
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Whether `name` is a valid Prometheus/Pyroscope label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
pub fn is_valid_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= MAX_LABEL_NAME_LENGTH
}

/// The rank of an attribute: lower is kept first.
fn rank(name: &str, pinned: &[&str], supplied: &[&str]) -> u8 {
    if name == keys::SERVICE_NAME {
        0
    } else if name == keys::PROCESS_OWNER {
        1
    } else if pinned.contains(&name) {
        2
    } else if supplied.contains(&name) {
        7
    } else if NAMED.contains(&name) {
        3
    } else if DETAIL.contains(&name) {
        5
    } else if VOLATILE.contains(&name) {
        6
    } else {
        4
    }
}

/// The series labels of a process's `labels` (meta and sample-only labels are skipped);
/// `pinned` names rank right after `service.name` and `process.owner`, `supplied` ones (their
/// values chosen by the process) after everything else.
pub fn series(labels: &Labels, pinned: &[&str], supplied: &[&str]) -> Series {
    let mut candidates: Vec<(&str, &str)> = labels
        .iter()
        .filter(|(name, _)| !is_meta(name) && !SAMPLE_ONLY.contains(name))
        .collect();
    candidates.sort_by_key(|&(name, _)| (rank(name, pinned, supplied), name));
    let budget = MAX_LABEL_NAMES_PER_SERIES - ADDED_BY_PYROSCOPE;
    let mut series = Series::default();
    for (attribute, value) in candidates {
        let name = label_name(attribute);
        let reason = if !is_valid_label_name(&name) {
            Some(DropReason::InvalidName)
        } else if value.len() > MAX_LABEL_VALUE_LENGTH {
            Some(DropReason::ValueTooLong)
        } else if series.labels.contains_key(&name) {
            Some(DropReason::NameCollision)
        } else if series.labels.len() >= budget {
            Some(DropReason::TooMany)
        } else {
            None
        };
        match reason {
            Some(reason) => series.dropped.push((attribute.to_owned(), reason)),
            None => {
                series.labels.insert(name, value.to_owned());
            }
        }
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_like_pyroscope() {
        assert_eq!(label_name("service.name"), "service_name");
        assert_eq!(
            label_name("k8s.pod.label.app.kubernetes.io/name"),
            "k8s_pod_label_app_kubernetes_io_name"
        );
        assert_eq!(label_name("team-name"), "team_name");
        assert_eq!(label_name("9lives"), "_9lives");
        assert!(is_valid_label_name("service_name"));
        assert!(!is_valid_label_name(""));
        assert!(!is_valid_label_name("a.b"));
        assert!(!is_valid_label_name(&"a".repeat(MAX_LABEL_NAME_LENGTH + 1)));
    }

    #[test]
    fn at_most_thirty_names_lowest_priority_dropped_and_counted() {
        // Given a process with service.name, workload names, pid, path and 40 other labels
        let mut labels: Labels = (0..40).map(|i| (format!("custom.{i:02}"), "x")).collect();
        for (name, value) in [
            (keys::SERVICE_NAME, "checkout"),
            ("k8s.pod.name", "checkout-7d9f"),
            (keys::PROCESS_PID, "42"),
            (keys::PROCESS_EXECUTABLE_PATH, "/app/checkout"),
            (keys::CONTAINER_ID, "abc"),
            (keys::THREAD_ID, "43"),
            ("__meta_process_cgroup", "/kubepods.slice"),
        ] {
            labels.set(name, value);
        }
        // When it is checked for Pyroscope, with one custom label pinned by the user
        let series = series(&labels, &["custom.39"], &[]);
        // Then 29 of ours fit beside __name__, by priority
        assert_eq!(
            series.labels.len(),
            MAX_LABEL_NAMES_PER_SERIES - ADDED_BY_PYROSCOPE
        );
        assert_eq!(
            series.labels.get("service_name").map(String::as_str),
            Some("checkout")
        );
        assert!(series.labels.contains_key("custom_39"), "pinned");
        assert!(series.labels.contains_key("k8s_pod_name"));
        assert!(series.labels.contains_key("custom_00"));
        assert!(!series.labels.contains_key("custom_38"), "ties go by name");
        for gone in ["process_pid", "process_executable_path", "container_id"] {
            assert!(!series.labels.contains_key(gone), "{gone}");
        }
        // 40 custom + pod + service + pid + path + container.id = 45 candidates, 29 kept.
        assert_eq!(series.dropped_for(DropReason::TooMany), 45 - 29);
        // Never series labels: thread id (per sample) and meta labels.
        assert!(!series.labels.contains_key("thread_id"));
        assert!(series.dropped.iter().all(|(n, _)| n != keys::THREAD_ID));
        assert!(!series.labels.keys().any(|n| n.starts_with("__")));
    }

    #[test]
    fn what_a_process_supplies_goes_first_and_never_displaces_an_observation() {
        // Given observed labels and 30 fillers of the process's own, one colliding with
        // process.owner once mapped
        let mut labels: Labels = (0..30).map(|i| (format!("filler.{i:02}"), "x")).collect();
        labels.set("process_owner", "root");
        let observed = [
            (keys::SERVICE_NAME, "nginx"),
            (keys::PROCESS_OWNER, "eve"),
            (keys::PROCESS_EXECUTABLE_PATH, "/home/eve/nginx"),
            (keys::PROCESS_EXECUTABLE_NAME, "nginx"),
            (keys::HOST_ID, "4c4c4544004d3510804bb4c04f4e3732"),
            (keys::HOST_NAME, "node-1"),
            (keys::CONTAINER_ID, "abc"),
        ];
        for (name, value) in observed {
            labels.set(name, value);
        }
        let supplied: Vec<String> = labels
            .iter()
            .map(|(n, _)| n.to_owned())
            .filter(|n| n.starts_with("filler") || n == "process_owner")
            .collect();
        let supplied: Vec<&str> = supplied.iter().map(String::as_str).collect();
        // When the series is made
        let series = series(&labels, &[], &supplied);
        // Then every observed label is in it, with its own value, and only fillers went
        for (name, value) in observed {
            assert_eq!(
                series.labels.get(&label_name(name)).map(String::as_str),
                Some(value),
                "{name}"
            );
        }
        assert_eq!(
            series.labels.len(),
            MAX_LABEL_NAMES_PER_SERIES - ADDED_BY_PYROSCOPE
        );
        assert!(series
            .dropped
            .iter()
            .all(|(n, _)| supplied.contains(&n.as_str())));
        assert!(series
            .dropped
            .contains(&("process_owner".to_owned(), DropReason::NameCollision)));
    }

    #[test]
    fn collisions_and_long_values() {
        let labels: Labels = [
            ("team.name", "a"),
            ("team_name", "b"),
            ("big", "v".repeat(MAX_LABEL_VALUE_LENGTH + 1).as_str()),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
        let series = series(&labels, &[], &[]);
        // Same rank: `team.name` sorts first and keeps the name.
        assert_eq!(
            series.labels.get("team_name").map(String::as_str),
            Some("a")
        );
        assert_eq!(
            series.dropped,
            [
                ("big".to_owned(), DropReason::ValueTooLong),
                ("team_name".to_owned(), DropReason::NameCollision)
            ]
        );
    }
}
