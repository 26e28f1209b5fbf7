//! The labels stage: takes a batch's symbolized samples (keyed by thread, no labels) and files
//! them under their process's resource labels into the interval's [`LabeledProfile`], what the
//! sinks take ([`LabelStage::label`]). Each process's labels are resolved once per batch (not per
//! row), and computed once per process (keyed by pid + start time in a [`RelabelCache`]): one
//! shared `Arc<Labels>` per process, never copied per sample.
//!
//! Per process, in order: the `--process-filter` (the executable name must match, fully
//! anchored; a process that does not is dropped), [`resource::resource_labels`] (host, process,
//! cgroup, the allowlisted environment, static tags, `service.name` by its precedence), the
//! Kubernetes labels of its container when the provider runs ([`kubernetes::join`]; a change of
//! the node's pods drops the cached labels, so they are recomputed), the
//! relabel rules (a `drop`/`keep` may drop the process), [`resource::restore_service_name`], the
//! removal of `process.pid` (rules can read it; it is never a resource label), and
//! Pyroscope's series limits ([`pyroscope::series`]: the lowest-priority labels beyond 30 are
//! removed and counted, what the process supplied itself first). A dropped process's samples
//! are not exported; they are counted, and so are the reserved names a process claimed
//! (`claims_dropped`: never a label, see [`resource`]).
//!
//! The pipeline calls [`LabelStage::forget`] when a `Process` message brings new facts for a pid
//! (exec, or a reused pid), so labels follow exec; a config reload replaces the settings whole
//! ([`LabelStage::replace_settings`]) and forgets every cached result. Pure apart from
//! [`LabelStage::local`], which reads `/etc/passwd` and the machine id once (bounded) before
//! privileges are dropped.

use std::collections::HashMap;

use regex::Regex;

use super::{
    host::{self, HostFacts},
    keys,
    kubernetes::{self, Pods},
    labeled::{LabeledProfile, LabeledThread},
    process::{ProcessFacts, UserNames},
    pyroscope,
    resource::{self, ProcessEnv, Shared},
    service::ServiceNameSource,
    Labels,
};
use crate::{
    model::SymbolizedProfile,
    relabel::{
        self,
        cache::{Outcome, RelabelCache},
        Rule,
    },
};

/// Most processes whose labels are cached (one entry per live pid; beyond, recomputed).
pub const MAX_CACHED_PROCESSES: usize = 65_536;

/// What the operator configured: the same for every process, replaced as a whole.
#[derive(Clone, Debug, Default)]
pub struct LabelSettings {
    /// `labels:` of the config file with `--tags` merged over it.
    pub tags: Labels,
    /// `--service-name`: names a service when nothing else does (before the executable name).
    pub default_service_name: Option<String>,
    /// `relabel_configs:`, compiled.
    pub rules: Vec<Rule>,
    /// `--process-filter`: only executables whose name matches (anchored) are exported.
    pub process_filter: Option<Regex>,
}

impl LabelSettings {
    /// The config file's label settings: `labels:`, `process_filter:` and `relabel_configs:`
    /// (every bad rule reported with its index and reason); the flags are merged over them by the
    /// command line.
    pub fn from_file(
        labels: &std::collections::BTreeMap<String, String>,
        process_filter_pattern: Option<&str>,
        relabel_configs: &[crate::relabel::RelabelConfig],
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let tags = super::tags::from_map(labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        let process_filter = process_filter_pattern
            .map(|pattern| {
                process_filter(pattern).with_context(|| format!("process_filter: {pattern:?}"))
            })
            .transpose()?;
        let rules = crate::relabel::compile(relabel_configs).context("relabel_configs")?;
        Ok(Self {
            tags,
            default_service_name: None,
            rules,
            process_filter,
        })
    }
}

/// What the stage did, since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LabelStats {
    /// Processes the `--process-filter` left out.
    pub processes_filtered: u64,
    /// Processes a relabel rule dropped.
    pub processes_dropped: u64,
    /// Samples not exported because their process was filtered out or dropped.
    pub samples_dropped: u64,
    /// Labels removed to fit Pyroscope's series limits.
    pub labels_over_limit: u64,
    /// Processes whose `OTEL_RESOURCE_ATTRIBUTES` was malformed, hence discarded whole.
    pub env_attributes_discarded: u64,
    /// Reserved attributes (`k8s.*`, `container.*`, `host.*`, `process.*`, ...) processes
    /// claimed in their `OTEL_RESOURCE_ATTRIBUTES`: dropped, each counted once per computation
    /// of its process's labels.
    pub claims_dropped: u64,
    /// Processes that nothing named (no facts, no executable name): `unknown_service` or
    /// `--service-name`.
    pub services_unknown: u64,
}

/// One process as the stage sees it: its facts and its allowlisted environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessRecord {
    pub facts: ProcessFacts,
    pub env: ProcessEnv,
}

impl ProcessRecord {
    /// The record of a sampler's `Process` message. A kernel thread (no executable, no
    /// mappings) has no executable name: the sampler names it by its thread's `comm`.
    pub fn from_info(info: &ember_protocol::ProcessInfo) -> Self {
        let kernel_thread =
            info.pid == 0 || (info.executable_path.is_empty() && info.mappings.is_empty());
        let executable_name = if kernel_thread {
            String::new()
        } else {
            info.executable_name.clone()
        };
        Self {
            facts: ProcessFacts {
                pid: info.pid,
                start_time_unix_ns: info.start_time_unix_ns,
                executable_path: info.executable_path.clone(),
                executable_name,
                kernel_thread,
                uid: info.uid,
                cgroup: info.cgroup.clone(),
                command_line: info
                    .command_line
                    .as_deref()
                    .map(super::process::command_line),
            },
            env: ProcessEnv {
                otel_service_name: info.otel_service_name.clone(),
                otel_resource_attributes: info.otel_resource_attributes.clone(),
            },
        }
    }

    /// A process the sampler sent no facts for: its pid only. The sampled thread's name
    /// (`comm`) names no service (a thread of rustc is not the service `lto cgu.0`): the
    /// service falls back to `--service-name` or `unknown_service`, counted. Pid 0 is the
    /// kernel's idle task.
    pub fn unknown(pid: u32) -> Self {
        Self {
            facts: ProcessFacts {
                pid,
                kernel_thread: pid == 0,
                // The idle task is the kernel's; any other pid's owner is unknown.
                uid: (pid == 0).then_some(0),
                ..ProcessFacts::default()
            },
            env: ProcessEnv::default(),
        }
    }
}

#[derive(Debug)]
pub struct LabelStage {
    settings: LabelSettings,
    shared: Shared,
    machine_id: Option<String>,
    /// The host name `shared.host` was made for.
    hostname: Option<String>,
    /// Label names ranked right after `service.name` when a series must shrink.
    pinned: Vec<String>,
    cache: RelabelCache,
    stats: LabelStats,
    /// Processes the `--process-filter` left out since the last [`LabelStage::take_filtered_out`],
    /// to push down to their sampler (at most [`MAX_IGNORED`]).
    filtered_out: Vec<ember_protocol::IgnoredProcess>,
    /// The node's pods ([`kubernetes`]) and the generation the cache was filled with.
    kubernetes: Option<(Pods, u64)>,
}

/// Most filtered-out processes kept for the sampler between two batches (its own cap).
const MAX_IGNORED: usize = 16_384;

impl Default for LabelStage {
    fn default() -> Self {
        Self::new(LabelSettings::default(), UserNames::default(), None)
    }
}

impl LabelStage {
    /// A stage with the given user names and machine id (no I/O).
    pub fn new(settings: LabelSettings, users: UserNames, machine_id: Option<String>) -> Self {
        let pinned = pinned(&settings);
        let shared = Shared {
            tags: settings.tags.clone(),
            default_service_name: settings.default_service_name.clone(),
            users,
            ..Shared::default()
        };
        Self {
            settings,
            shared,
            machine_id,
            hostname: None,
            pinned,
            cache: RelabelCache::new(MAX_CACHED_PROCESSES),
            stats: LabelStats::default(),
            filtered_out: Vec::new(),
            kubernetes: None,
        }
    }

    /// Joins the Kubernetes pods of this node to processes (through their container id).
    pub fn with_kubernetes(mut self, pods: Pods) -> Self {
        self.kubernetes = Some((pods, u64::MAX));
        self
    }

    /// This machine's stage: reads `/etc/passwd` and the machine id (bounded; run it before
    /// dropping privileges).
    pub fn local(settings: LabelSettings) -> Self {
        let users =
            UserNames::load(std::path::Path::new(super::process::PASSWD_PATH)).unwrap_or_default();
        let machine_id = host::read_machine_id(&host::MACHINE_ID_PATHS.map(std::path::Path::new));
        Self::new(settings, users, machine_id)
    }

    /// Replaces the operator's settings (a config reload): every cached result is forgotten, so
    /// the next sample of each known process computes its labels with the new rules. User names,
    /// the machine id, the host labels and the counters stay.
    pub fn replace_settings(&mut self, settings: LabelSettings) {
        self.pinned = pinned(&settings);
        self.shared.tags = settings.tags.clone();
        self.shared.default_service_name = settings.default_service_name.clone();
        self.settings = settings;
        self.cache.clear();
    }

    pub fn stats(&self) -> LabelStats {
        self.stats
    }

    /// Files a batch's symbolized samples, sampled on `hostname`, under their process's labels
    /// into `into`; `facts` are the processes the sampler described. Each process's labels are
    /// resolved once per batch; samples of a process filtered out or dropped are counted, not
    /// added.
    pub fn label<'f>(
        &mut self,
        hostname: &str,
        batch: &SymbolizedProfile,
        facts: impl Fn(u32) -> Option<&'f ember_protocol::ProcessInfo>,
        into: &mut LabeledProfile,
    ) {
        let mut resolved: HashMap<u32, Outcome> = HashMap::new();
        let dropped = into.merge_with(batch, |thread| {
            let resource = resolved
                .entry(thread.pid)
                .or_insert_with(|| self.resource_of(hostname, thread.pid, facts(thread.pid)));
            Some(LabeledThread {
                thread: thread.clone(),
                resource: resource.clone()?,
            })
        });
        self.count_dropped_samples(dropped);
    }

    /// Whether this stage already left out the process `(pid, start time)` sampled on
    /// `hostname` (filtered out or dropped by a rule) and would again: then its samples need not
    /// be symbolized. False whenever the answer could change on the next lookup (another host,
    /// or the node's pods changed since the cache was filled).
    pub fn left_out(&self, hostname: &str, pid: u32, start_time_unix_ns: u64) -> bool {
        if self.hostname.as_deref() != Some(hostname) {
            return false;
        }
        if let Some((pods, seen)) = &self.kubernetes {
            if pods.generation() != *seen {
                return false;
            }
        }
        self.cache.is_left_out(pid, start_time_unix_ns)
    }

    /// Counts the samples of processes left out before symbolization ([`Self::left_out`]).
    pub fn count_left_out(&mut self, samples: u64) {
        self.count_dropped_samples(samples);
    }

    /// The labels of the process `pid` (described by `info`, if the sampler did) sampled on
    /// `hostname`; `None` when it is filtered out or dropped.
    fn resource_of(
        &mut self,
        hostname: &str,
        pid: u32,
        info: Option<&ember_protocol::ProcessInfo>,
    ) -> Outcome {
        let start_time_unix_ns = info.map_or(0, |info| info.start_time_unix_ns);
        self.resource_with(hostname, pid, start_time_unix_ns, || match info {
            Some(info) => ProcessRecord::from_info(info),
            None => ProcessRecord::unknown(pid),
        })
    }

    /// The labels of `process` sampled on `hostname`; `None` when it is filtered out or dropped.
    #[cfg(test)]
    pub fn resource(&mut self, hostname: &str, process: &ProcessRecord) -> Outcome {
        let facts = &process.facts;
        self.resource_with(hostname, facts.pid, facts.start_time_unix_ns, || {
            process.clone()
        })
    }

    /// The labels of the process `(pid, start time)`, its record made by `record` only when they
    /// are not cached.
    fn resource_with(
        &mut self,
        hostname: &str,
        pid: u32,
        start_time_unix_ns: u64,
        record: impl FnOnce() -> ProcessRecord,
    ) -> Outcome {
        if self.hostname.as_deref() != Some(hostname) {
            self.set_hostname(hostname);
        }
        if let Some((pods, seen)) = &mut self.kubernetes {
            // The pods changed: labels computed before may lack (or hold stale) k8s.* labels.
            let generation = pods.generation();
            if *seen != generation {
                *seen = generation;
                self.cache.clear();
            }
        }
        let Self {
            settings,
            shared,
            pinned,
            cache,
            stats,
            kubernetes,
            ..
        } = self;
        let pods = kubernetes.as_ref().map(|(pods, _)| pods);
        let filtered_before = stats.processes_filtered;
        let outcome = cache.get_or_insert_with(pid, start_time_unix_ns, || {
            compute(settings, shared, pinned, stats, pods, &record())
        });
        // Only a process the sampler described (it has a start time) can be pushed down.
        if stats.processes_filtered != filtered_before
            && start_time_unix_ns != 0
            && self.filtered_out.len() < MAX_IGNORED
        {
            self.filtered_out.push(ember_protocol::IgnoredProcess {
                pid,
                start_time_unix_ns,
            });
        }
        outcome
    }

    /// The processes the `--process-filter` left out since the last call, each once per
    /// computation of its labels (again only after new facts or a reload).
    pub fn take_filtered_out(&mut self) -> Vec<ember_protocol::IgnoredProcess> {
        std::mem::take(&mut self.filtered_out)
    }

    /// Counts samples of a filtered or dropped process.
    fn count_dropped_samples(&mut self, samples: u64) {
        self.stats.samples_dropped = self.stats.samples_dropped.saturating_add(samples);
    }

    /// Forgets a process's labels (new facts for its pid: exec or pid reuse; or it exited).
    pub fn forget(&mut self, pid: u32) {
        self.cache.forget(pid);
    }

    fn set_hostname(&mut self, hostname: &str) {
        self.shared.host = host::labels(&HostFacts {
            hostname: hostname.to_owned(),
            machine_id: self.machine_id.clone(),
            arch: std::env::consts::ARCH.to_owned(),
        });
        self.hostname = Some(hostname.to_owned());
        self.cache.clear();
    }
}

/// Label names ranked right after `service.name` when a series must shrink: the static tags and
/// the rules' targets (what the operator asked for).
fn pinned(settings: &LabelSettings) -> Vec<String> {
    settings
        .tags
        .iter()
        .map(|(name, _)| name.to_owned())
        .chain(settings.rules.iter().map(|r| r.target_label().to_owned()))
        .filter(|name| !name.is_empty())
        .collect()
}

/// One process's labels, `None` when filtered out or dropped.
fn compute(
    settings: &LabelSettings,
    shared: &Shared,
    pinned: &[String],
    stats: &mut LabelStats,
    pods: Option<&Pods>,
    process: &ProcessRecord,
) -> Option<Labels> {
    if let Some(filter) = &settings.process_filter {
        if !filter.is_match(&process.facts.executable_name) {
            stats.processes_filtered += 1;
            return None;
        }
    }
    let (mut labels, report) = resource::resource_labels(shared, &process.facts, &process.env);
    if matches!(
        report.service_name_source,
        ServiceNameSource::Unknown | ServiceNameSource::Default
    ) && process.facts.executable_name.is_empty()
    {
        stats.services_unknown += 1;
    }
    if let Some(pods) = pods {
        kubernetes::join(pods, &mut labels, report.service_name_source, &shared.tags);
    }
    if !report.claims_dropped.is_empty() {
        stats.claims_dropped = stats
            .claims_dropped
            .saturating_add(report.claims_dropped.len() as u64);
        // Debug, not warn: a pod that copies its own k8s.* names into the variable (a common
        // downward-API habit) would log at every start; the count is in the labels stage line
        // and the metrics.
        tracing::debug!(
            pid = process.facts.pid,
            executable = process.facts.executable_name.as_str(),
            owner = labels.get(keys::PROCESS_OWNER).unwrap_or_default(),
            claims = ?report.claims_dropped,
            "a process claimed attributes only the relay or the cluster may set in its \
             OTEL_RESOURCE_ATTRIBUTES; they were dropped (the relay fills k8s.*, container.*, \
             host.*, process.* itself)"
        );
    }
    if let Some(malformed) = &report.discarded_attributes {
        stats.env_attributes_discarded += 1;
        // Once per process: its labels are computed once (again only on new facts or a reload).
        tracing::warn!(
            pid = process.facts.pid,
            executable = process.facts.executable_name.as_str(),
            reason = %malformed,
            discarded = stats.env_attributes_discarded,
            "a process's OTEL_RESOURCE_ATTRIBUTES is malformed; none of its attributes are used"
        );
    }
    let before_rules = labels.get(keys::SERVICE_NAME).unwrap_or("").to_owned();
    let Some(mut labels) = relabel::process(&settings.rules, labels) else {
        stats.processes_dropped += 1;
        return None;
    };
    resource::restore_service_name(&mut labels, &before_rules);
    // The pid is for the rules only: as a resource attribute it would start a series per
    // process in Pyroscope >= 1.20 (which makes integers labels) and split a service's
    // processes into resources of their own. Per sample it is opt-in (`sample_attributes`).
    labels.remove(keys::PROCESS_PID);
    let pinned: Vec<&str> = pinned.iter().map(String::as_str).collect();
    let supplied: Vec<&str> = report.supplied.iter().map(String::as_str).collect();
    for (name, _) in pyroscope::series(&labels, &pinned, &supplied).dropped {
        labels.remove(&name);
        stats.labels_over_limit += 1;
    }
    Some(labels)
}

/// An anchored regex over the whole executable name (`--process-filter`, `process_filter:`).
pub fn process_filter(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{pattern})$"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::relabel::{compile, RelabelConfig};

    fn record(pid: u32, start: u64, name: &str, env: ProcessEnv) -> ProcessRecord {
        ProcessRecord {
            facts: ProcessFacts {
                pid,
                start_time_unix_ns: start,
                executable_name: name.into(),
                executable_path: format!("/opt/{name}"),
                uid: Some(0),
                ..ProcessFacts::default()
            },
            env,
        }
    }

    fn rules(yaml: &str) -> Vec<Rule> {
        let configs: Vec<RelabelConfig> =
            serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("yaml: {e}"));
        compile(&configs).unwrap_or_else(|e| panic!("rules: {e}"))
    }

    #[test]
    fn filter_rules_precedence_and_cache() {
        // Given a filter, a tag, a rename rule and a drop rule
        let settings = LabelSettings {
            tags: [("team", "core")].into_iter().collect(),
            default_service_name: Some("fallback".into()),
            rules: rules(
                "- source_labels: [service.name]\n  regex: ledger\n  target_label: service.name\n  replacement: books\n\
                 - source_labels: [process.executable.name]\n  regex: noisy\n  action: drop\n",
            ),
            process_filter: Some(process_filter("app|noisy|other").expect("regex")),
        };
        let mut stage = LabelStage::new(
            settings,
            UserNames::parse("root:x:0:0::/:/bin/sh\n"),
            Some("0123456789abcdef0123456789abcdef".into()),
        );
        let env = |attrs: &str| ProcessEnv {
            otel_resource_attributes: Some(attrs.into()),
            ..ProcessEnv::default()
        };
        // When four processes are labelled
        let renamed = stage.resource("node", &record(1, 10, "app", env("service.name=ledger")));
        let plain = stage.resource("node", &record(2, 10, "other", ProcessEnv::default()));
        let dropped = stage.resource("node", &record(3, 10, "noisy", ProcessEnv::default()));
        let filtered = stage.resource("node", &record(4, 10, "sshd", ProcessEnv::default()));
        // Then the rule renamed one, the default names the other, two are gone
        let renamed = renamed.expect("kept");
        assert_eq!(renamed.get(keys::SERVICE_NAME), Some("books"));
        assert_eq!(renamed.get("team"), Some("core"));
        assert_eq!(renamed.get(keys::HOST_NAME), Some("node"));
        assert_eq!(renamed.get(keys::PROCESS_OWNER), Some("root"));
        assert_eq!(
            plain.expect("kept").get(keys::SERVICE_NAME),
            Some("fallback")
        );
        assert_eq!((dropped, filtered), (None, None));
        let stats = stage.stats();
        assert_eq!((stats.processes_dropped, stats.processes_filtered), (1, 1));
        // And the labels are computed once per (pid, start time): the same Arc comes back, a
        // new start time (pid reuse) computes anew
        let again = stage.resource("node", &record(1, 10, "app", ProcessEnv::default()));
        assert!(Arc::ptr_eq(&renamed, &again.expect("cached")));
        let reused = stage.resource("node", &record(1, 11, "app", ProcessEnv::default()));
        assert_eq!(
            reused.expect("kept").get(keys::SERVICE_NAME),
            Some("fallback")
        );
    }

    #[test]
    fn filtered_out_processes_with_facts_are_listed_once_for_the_sampler() {
        // Given a filter keeping `app` only
        let settings = LabelSettings {
            rules: rules(
                "- source_labels: [process.executable.name]\n  regex: noisy\n  action: drop\n",
            ),
            process_filter: Some(process_filter("app|noisy").expect("regex")),
            ..LabelSettings::default()
        };
        let mut stage = LabelStage::new(settings, UserNames::default(), None);
        // When a kept process, a filtered one (twice), one dropped by a rule and a filtered one
        // the sampler sent no facts for are labelled
        for r in [
            record(1, 10, "app", ProcessEnv::default()),
            record(2, 20, "sshd", ProcessEnv::default()),
            record(2, 20, "sshd", ProcessEnv::default()),
            record(3, 30, "noisy", ProcessEnv::default()),
        ] {
            stage.resource("h", &r);
        }
        stage.resource("h", &ProcessRecord::unknown(4));
        // Then only the filtered process with facts is listed, once, and the list empties
        let expected = ember_protocol::IgnoredProcess {
            pid: 2,
            start_time_unix_ns: 20,
        };
        assert_eq!(stage.take_filtered_out(), [expected]);
        assert!(stage.take_filtered_out().is_empty());
        // And after new facts (forget) it is listed again
        stage.forget(2);
        stage.resource("h", &record(2, 20, "sshd", ProcessEnv::default()));
        assert_eq!(stage.take_filtered_out(), [expected]);
    }

    #[test]
    fn thread_names_never_name_services() {
        let mut stage = LabelStage::default();
        // Given kernel threads as the sampler describes them (no executable, no mappings, named
        // by their comm), and the idle task
        let kthread = |pid, comm: &str| {
            ProcessRecord::from_info(&ember_protocol::ProcessInfo {
                pid,
                start_time_unix_ns: 1,
                executable_name: comm.into(),
                ..Default::default()
            })
        };
        for record in [
            kthread(12, "kworker/1:1-events"),
            kthread(13, "ksoftirqd/0"),
            ProcessRecord::unknown(0),
        ] {
            // Then they share the service `kernel`, without an executable name label
            let labels = stage.resource("h", &record).expect("kept");
            assert_eq!(labels.get(keys::SERVICE_NAME), Some("kernel"), "{labels}");
            assert_eq!(labels.get(keys::PROCESS_EXECUTABLE_NAME), None, "{labels}");
        }
        // And a process without facts is not named by its thread: the fallback, counted
        let labels = stage
            .resource("h", &ProcessRecord::unknown(77))
            .expect("kept");
        assert_eq!(
            labels.get(keys::SERVICE_NAME),
            Some(super::super::service::UNKNOWN_SERVICE)
        );
        assert_eq!(stage.stats().services_unknown, 1);
        // While a process with an executable keeps its name
        let mut info = ember_protocol::ProcessInfo {
            pid: 78,
            start_time_unix_ns: 1,
            executable_path: "/usr/bin/rustc".into(),
            executable_name: "rustc".into(),
            ..Default::default()
        };
        let labels = stage
            .resource("h", &ProcessRecord::from_info(&info))
            .expect("kept");
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("rustc"));
        // A process whose exe link was unreadable but which maps files is no kernel thread
        info.pid = 79;
        info.executable_path = String::new();
        info.mappings = vec![Default::default()];
        let labels = stage
            .resource("h", &ProcessRecord::from_info(&info))
            .expect("kept");
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("rustc"));
        assert_eq!(stage.stats().services_unknown, 1);
    }

    #[test]
    fn a_series_keeps_at_most_30_labels_service_name_first() {
        // Given a process declaring 40 attributes of its own
        let attributes: Vec<String> = (0..40).map(|i| format!("attr.{i:02}=v")).collect();
        let env = ProcessEnv {
            otel_service_name: Some("big".into()),
            otel_resource_attributes: Some(attributes.join(",")),
        };
        let mut stage = LabelStage::default();
        // When labelled
        let labels = stage
            .resource("h", &record(9, 1, "app", env))
            .expect("kept");
        // Then the series fits Pyroscope's limit (30 names, one of them its own __name__), the
        // service name stays, the per-process values went first, and the removals are counted
        assert_eq!(labels.len(), pyroscope::MAX_LABEL_NAMES_PER_SERIES - 1);
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("big"));
        assert_eq!(labels.get(keys::PROCESS_PID), None);
        assert!(stage.stats().labels_over_limit > 10);
        // And what the relay observed stayed: the process's own attributes went instead
        assert_eq!(labels.get(keys::PROCESS_OWNER), Some("0"));
        assert_eq!(labels.get(keys::PROCESS_EXECUTABLE_PATH), Some("/opt/app"));
        assert_eq!(labels.get(keys::OS_TYPE), Some("linux"));
    }

    #[test]
    fn forged_labels_are_dropped_counted_and_displace_nothing() {
        // Given a user's process naming itself nginx, claiming a kube-system pod and carrying
        // 30 fillers, and the machine's id known
        let mut attributes: Vec<String> = (0..30).map(|i| format!("filler.{i:02}=x")).collect();
        attributes.push("k8s.namespace.name=kube-system".into());
        attributes.push("k8s.pod.name=coredns-0".into());
        let env = ProcessEnv {
            otel_service_name: Some("nginx".into()),
            otel_resource_attributes: Some(attributes.join(",")),
        };
        let mut stage = LabelStage::new(
            LabelSettings::default(),
            UserNames::parse("eve:x:1001:1001::/:/bin/sh\n"),
            Some("0123456789abcdef0123456789abcdef".into()),
        );
        let mut process = record(21, 1, "nginx", env);
        process.facts.uid = Some(1001);
        process.facts.cgroup = "0::/user.slice/user-1001.slice/session-4.scope".into();
        // When labelled
        let labels = stage.resource("node", &process).expect("kept");
        // Then it keeps its name, and every observed attribute is there: its owner, path, host
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("nginx"));
        assert_eq!(labels.get(keys::PROCESS_OWNER), Some("eve"), "{labels}");
        assert_eq!(
            labels.get(keys::PROCESS_EXECUTABLE_PATH),
            Some("/opt/nginx")
        );
        assert_eq!(
            labels.get(keys::HOST_ID),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert_eq!(labels.get(keys::SYSTEMD_UNIT), Some("session-4.scope"));
        // And no claim stands; the two are counted, the fillers over the cap too
        assert!(
            !labels.iter().any(|(n, _)| n.starts_with("k8s.")),
            "{labels}"
        );
        assert_eq!(stage.stats().claims_dropped, 2);
        assert!(stage.stats().labels_over_limit > 0);
    }

    #[test]
    fn a_malformed_attributes_variable_is_discarded_and_counted_once_per_process() {
        // Given a process whose OTEL_RESOURCE_ATTRIBUTES has one bad entry, and OTEL_SERVICE_NAME
        let env = ProcessEnv {
            otel_service_name: Some("named".into()),
            otel_resource_attributes: Some("team=a,oops".into()),
        };
        let mut stage = LabelStage::default();
        // When its samples are labelled, batch after batch
        let labels = stage
            .resource("h", &record(11, 1, "app", env.clone()))
            .expect("kept");
        stage.resource("h", &record(11, 1, "app", env));
        // Then none of its attributes are used, its OTEL_SERVICE_NAME is, and it counts once
        assert_eq!(labels.get("team"), None);
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("named"));
        assert_eq!(stage.stats().env_attributes_discarded, 1);
    }

    #[test]
    fn exec_refreshes_after_forget() {
        let mut stage = LabelStage::default();
        let first = stage.resource("h", &record(5, 1, "sh", ProcessEnv::default()));
        assert_eq!(first.expect("kept").get(keys::SERVICE_NAME), Some("sh"));
        // Given an exec (same pid and start time, new facts), When the session forgets it
        stage.forget(5);
        // Then the new executable names it
        let after = stage.resource("h", &record(5, 1, "worker", ProcessEnv::default()));
        assert_eq!(after.expect("kept").get(keys::SERVICE_NAME), Some("worker"));
    }

    #[test]
    fn replaced_settings_apply_to_known_processes() {
        // Given a process labelled with no rules
        let mut stage = LabelStage::default();
        let before = stage.resource("h", &record(7, 1, "api", ProcessEnv::default()));
        assert_eq!(before.expect("kept").get(keys::SERVICE_NAME), Some("api"));
        // When the settings are replaced with a rename rule and a tag (a reload)
        stage.replace_settings(LabelSettings {
            tags: [("env", "prod")].into_iter().collect(),
            rules: rules(
                "- source_labels: [process.executable.name]\n  regex: api\n  \
                 target_label: service.name\n  replacement: gateway\n",
            ),
            ..LabelSettings::default()
        });
        // Then the same process (no new facts) gets the new labels
        let after = stage
            .resource("h", &record(7, 1, "api", ProcessEnv::default()))
            .expect("kept");
        assert_eq!(after.get(keys::SERVICE_NAME), Some("gateway"));
        assert_eq!(after.get("env"), Some("prod"));
        // And a filter set by the next reload leaves it out
        stage.replace_settings(LabelSettings {
            process_filter: Some(process_filter("other").expect("regex")),
            ..LabelSettings::default()
        });
        assert_eq!(
            stage.resource("h", &record(7, 1, "api", ProcessEnv::default())),
            None
        );
        assert_eq!(stage.stats().processes_filtered, 1);
    }

    /// A symbolized batch of `pids`, each with `threads` threads of `stacks` stacks.
    fn symbolized(pids: &[u32], threads: u32, stacks: u64) -> SymbolizedProfile {
        let mut batch = SymbolizedProfile::new(99);
        for &pid in pids {
            for tid in 0..threads {
                let thread = crate::model::Thread::bare((pid, pid + tid), "app", "t", "/opt/app");
                for s in 0..stacks {
                    let frame = crate::model::Frame::bare(
                        &format!("f{s}"),
                        crate::model::FrameKind::Native,
                        0x1000 + s,
                    );
                    batch.add_frames(&thread, [&frame], 1 + s);
                }
            }
        }
        batch
    }

    #[test]
    fn a_batch_resolves_each_process_once_whatever_its_rows() {
        // Given a batch of three processes, each of 4 threads x 5 stacks (20 rows), the sampler's
        // facts of two of them, and a filter leaving the third out
        let settings = LabelSettings {
            process_filter: Some(process_filter("app|web").expect("regex")),
            ..LabelSettings::default()
        };
        let mut stage = LabelStage::new(settings, UserNames::default(), None);
        let info = |pid: u32, name: &str| ember_protocol::ProcessInfo {
            pid,
            start_time_unix_ns: 5,
            executable_name: name.into(),
            executable_path: format!("/opt/{name}"),
            ..ember_protocol::ProcessInfo::default()
        };
        let facts = [info(1, "app"), info(2, "web"), info(3, "sshd")];
        let batch = symbolized(&[1, 2, 3], 4, 5);
        let mut interval = LabeledProfile::new(99);
        // When the stage labels it, twice (a second batch)
        for _ in 0..2 {
            stage.label(
                "h",
                &batch,
                |pid| facts.iter().find(|f| f.pid == pid),
                &mut interval,
            );
        }
        // Then each process's labels were looked up once per batch, not once per row or thread
        let lookups = stage.cache.stats();
        assert_eq!((lookups.misses, lookups.hits), (3, 3), "{lookups:?}");
        // And every row of the kept processes is there under its process's one shared set, the
        // filtered process's samples counted as dropped (2 batches x 4 threads x (1+..+5))
        let samples = interval.samples();
        assert_eq!(samples.len(), 2 * 4 * 5);
        for sample in &samples {
            let first = samples.iter().find(|s| s.thread.pid == sample.thread.pid);
            let shared = &first.expect("its process").thread.resource;
            assert!(Arc::ptr_eq(&sample.thread.resource, shared));
        }
        assert_eq!(samples[0].thread.service_name(), "app");
        assert_eq!(interval.total_samples(), 2 * 2 * 4 * 15);
        assert_eq!(stage.stats().samples_dropped, 2 * 4 * 15);
        assert_eq!(stage.stats().processes_filtered, 1);
    }

    /// The stage's cost, printed: `cargo test -p ember-relay --lib stage_cost -- --ignored
    /// --nocapture`. 1,000 processes, 10 rules, Pyroscope trimming included: cold (labels
    /// computed) and warm (one cached lookup per process, as each batch makes).
    #[test]
    #[ignore = "a measurement, not a check: run it by name"]
    fn stage_cost() {
        use std::time::Instant;
        let mut yaml = String::new();
        for i in 0..8 {
            yaml.push_str(&format!(
                "- source_labels: [process.executable.name]\n  regex: app-{i}\n  \
                 target_label: service.name\n  replacement: svc-{i}\n"
            ));
        }
        yaml.push_str(
            "- source_labels: [process.executable.name]\n  regex: app-99.\n  action: drop\n",
        );
        yaml.push_str("- regex: process\\.executable\\.path\n  action: labeldrop\n");
        let settings = LabelSettings {
            tags: [("env", "prod"), ("region", "eu")].into_iter().collect(),
            rules: rules(&yaml),
            ..LabelSettings::default()
        };
        let mut stage = LabelStage::new(settings, UserNames::default(), None);
        let records: Vec<ProcessRecord> = (0..1000u32)
            .map(|pid| {
                let env = ProcessEnv {
                    otel_resource_attributes: Some(format!("team=t{},tier=web", pid % 7)),
                    ..ProcessEnv::default()
                };
                let mut r = record(pid, 1, &format!("app-{pid}"), env);
                r.facts.cgroup = format!("/system.slice/app-{pid}.service");
                r
            })
            .collect();
        let started = Instant::now();
        let kept = records
            .iter()
            .filter(|r| stage.resource("node", r).is_some())
            .count();
        let cold = started.elapsed();
        let started = Instant::now();
        for r in &records {
            std::hint::black_box(stage.resource("node", r));
        }
        let warm = started.elapsed();
        eprintln!(
            "labels stage, 1,000 processes x 10 rules ({} build): cold {cold:?} ({:?}/process), \
             warm {warm:?} ({:?}/process), {kept} kept",
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            cold / 1000,
            warm / 1000
        );
        assert_eq!(kept, 990);
    }
}
