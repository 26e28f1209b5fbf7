//! Labels: the attributes a process's profile is filed under (`service.name`, `container.id`,
//! `systemd.unit`, ...), and the pure providers that derive them from facts the relay has.
//!
//! Owns the [`Labels`] set (attribute name -> value, ordered by name), the attribute names of the
//! OpenTelemetry semantic conventions the relay emits ([`keys`]), and one provider per source:
//! [`process`] (pid, executable, owner), [`cgroup`] (container id and runtime, systemd unit and
//! slice), [`kubernetes`] (the node's pods, joined by container id), [`host`], [`resource_env`] (a process's `OTEL_SERVICE_NAME` /
//! `OTEL_RESOURCE_ATTRIBUTES`), [`tags`] (`--tags`), [`service`] (the `service.name` precedence)
//! and [`pyroscope`] (what a Pyroscope series accepts). [`resource`] merges them into one
//! process's labels before relabeling ([`crate::relabel`] runs the rules on them). The stage
//! itself ([`stage`]) runs after symbolization: it files a batch's symbolized samples under their
//! process's labels into its own output type ([`labeled`]: what the sinks take).
//!
//! Invariants: providers are pure functions of their inputs (no `/proc` reads; the sampler is the
//! only reader of other processes); the Kubernetes index is filled by a background watch on the
//! API server, and reading it never waits for the network. The two file reads here
//! ([`read_bounded`]: `/etc/passwd`, `/etc/machine-id`) are bounded and run before the relay
//! drops privileges, like the config.
//! Names under [`RESERVED_PREFIXES`] are the relay's and the cluster's: a process never sets
//! them ([`resource`] states the trust order).
//! Labels whose name starts with `__` are meta labels: visible to relabel rules, removed after
//! them ([`Labels::strip_meta`]). An empty value is the same as no label (Prometheus' rule), so
//! [`Labels::set`] with `""` removes the label.

pub mod cgroup;
pub mod host;
// Without the `kubernetes` feature nothing fills the pod index (the watch is left out): its
// writers are dead code there. `allow`, not `expect`: what is dead differs between the library
// and its tests.
#[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
pub mod kubernetes;
pub mod labeled;
pub mod process;
pub mod pushdown;
pub mod pyroscope;
pub mod resource;
pub mod resource_env;
pub mod service;
pub mod stage;
pub mod tags;

use std::{collections::BTreeMap, fmt, io::Read, path::Path};

/// Attribute names (OpenTelemetry semantic conventions where one exists).
pub mod keys {
    pub const SERVICE_NAME: &str = "service.name";
    pub const PROCESS_PID: &str = "process.pid";
    pub const PROCESS_EXECUTABLE_NAME: &str = "process.executable.name";
    pub const PROCESS_EXECUTABLE_PATH: &str = "process.executable.path";
    pub const PROCESS_OWNER: &str = "process.owner";
    pub const PROCESS_COMMAND_LINE: &str = "process.command_line";
    pub const THREAD_NAME: &str = "thread.name";
    pub const THREAD_ID: &str = "thread.id";
    pub const HOST_NAME: &str = "host.name";
    pub const HOST_ID: &str = "host.id";
    pub const HOST_ARCH: &str = "host.arch";
    pub const OS_TYPE: &str = "os.type";
    pub const CONTAINER_ID: &str = "container.id";
    pub const CONTAINER_RUNTIME: &str = "container.runtime";
    /// Not in the semantic conventions (yet): the systemd unit and the slice holding it.
    pub const SYSTEMD_UNIT: &str = "systemd.unit";
    pub const SYSTEMD_SLICE: &str = "systemd.slice";
    /// The unit and slice a user made in the cgroup subtree delegated to her (below
    /// `user@UID.service`): her own names, never taken for `systemd.unit` or a container.
    pub const SYSTEMD_USER_UNIT: &str = "systemd.user_unit";
    pub const SYSTEMD_USER_SLICE: &str = "systemd.user_slice";
    /// The process's path in systemd's tree (the cgroup v2 `0::` line, or v1's `name=systemd`),
    /// for relabel rules; removed after them.
    pub const META_PROCESS_CGROUP: &str = "__meta_process_cgroup";
}

/// The prefix of meta labels: available to relabel rules, never exported.
pub const META_PREFIX: &str = "__";

/// Whether `name` is a meta label.
pub fn is_meta(name: &str) -> bool {
    name.starts_with(META_PREFIX)
}

/// Attribute namespaces that only the relay and the cluster fill: what the kernel, the host and
/// the Kubernetes API say about a process. A process's own claim to a name in them (through
/// `OTEL_RESOURCE_ATTRIBUTES`) is dropped and counted ([`is_reserved`]). Compared as Pyroscope
/// sees names (every character outside `[A-Za-z0-9]` as `_`, any case), so `k8s_pod_name` or
/// `Host.Id` reserve as much as `k8s.pod.name` and `host.id`.
pub const RESERVED_PREFIXES: [&str; 8] = [
    "k8s_",
    "container_",
    "host_",
    "os_",
    "process_",
    "systemd_",
    "thread_",
    META_PREFIX,
];

/// Whether `name` is one only the relay or the cluster may set (see [`RESERVED_PREFIXES`]);
/// also `service_name` spelled otherwise than `service.name`, which Pyroscope would take for it.
pub fn is_reserved(name: &str) -> bool {
    let seen: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    RESERVED_PREFIXES.iter().any(|p| seen.starts_with(p))
        || (seen == "service_name" && name != keys::SERVICE_NAME)
}

/// A set of labels: attribute name -> value, iterated in name order, no empty values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels(BTreeMap<String, String>);

impl Labels {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Sets `name` to `value`, replacing any value; an empty value removes the label.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let (name, value) = (name.into(), value.into());
        if value.is_empty() {
            self.0.remove(&name);
        } else {
            self.0.insert(name, value);
        }
    }

    /// Sets `name` to `value` unless it already has a value.
    pub fn set_default(&mut self, name: &str, value: impl Into<String>) {
        if !self.contains(name) {
            self.set(name, value);
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }

    /// Copies every label of `other` into `self`; `other` wins on a shared name.
    pub fn merge(&mut self, other: &Labels) {
        for (name, value) in other.iter() {
            self.set(name, value);
        }
    }

    /// Keeps the labels for which `keep(name, value)` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &str) -> bool) {
        self.0.retain(|name, value| keep(name, value));
    }

    /// Removes the meta labels (`__...`).
    pub fn strip_meta(&mut self) {
        self.retain(|name, _| !is_meta(name));
    }

    /// The labels in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<N: Into<String>, V: Into<String>> FromIterator<(N, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Self {
        let mut labels = Self::new();
        for (name, value) in iter {
            labels.set(name, value);
        }
        labels
    }
}

impl fmt::Display for Labels {
    /// `{name="value", ...}`, as Prometheus prints a label set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (name, value)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name}={value:?}")?;
        }
        f.write_str("}")
    }
}

/// A small system file's text, at most `limit` bytes of it (invalid UTF-8 replaced), and whether
/// the file was longer than that.
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<(String, bool)> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    let truncated = u64::try_from(bytes.len()).map_or(true, |n| n > limit);
    if truncated {
        bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    Ok((String::from_utf8_lossy(&bytes).into_owned(), truncated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_value_is_no_label_and_meta_labels_strip() {
        let mut labels: Labels = [("b", "2"), ("a", "1"), ("__meta_x", "m")]
            .into_iter()
            .collect();
        assert_eq!(labels.to_string(), r#"{__meta_x="m", a="1", b="2"}"#);
        labels.set("a", "");
        assert_eq!(labels.get("a"), None);
        labels.set_default("b", "other");
        assert_eq!(labels.get("b"), Some("2"));
        labels.strip_meta();
        assert_eq!(labels.to_string(), r#"{b="2"}"#);
    }

    #[test]
    fn reserved_names_as_pyroscope_sees_them() {
        for name in [
            "k8s.namespace.name",
            "k8s_pod_name",
            "K8S.Pod.Name",
            "container.id",
            "host.id",
            "host-name",
            "os.type",
            "process.owner",
            "process.executable.path",
            "systemd.unit",
            "systemd.user_unit",
            "thread.name",
            "__meta_process_cgroup",
            "..meta",
            "service_name",
            "Service.Name",
        ] {
            assert!(is_reserved(name), "{name}");
        }
        for name in [
            "service.name",
            "service.version",
            "service.namespace",
            "deployment.environment.name",
            "team",
            "k8s",
            "hostname",
            "processor",
            "_meta",
        ] {
            assert!(!is_reserved(name), "{name}");
        }
    }

    #[test]
    fn bounded_read_cuts_and_says_so() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("f");
        std::fs::write(&path, "0123456789").unwrap_or_else(|e| panic!("write: {e}"));
        assert_eq!(
            read_bounded(&path, 4).unwrap_or_else(|e| panic!("read: {e}")),
            ("0123".to_owned(), true)
        );
        assert_eq!(
            read_bounded(&path, 10).unwrap_or_else(|e| panic!("read: {e}")),
            ("0123456789".to_owned(), false)
        );
    }
}
