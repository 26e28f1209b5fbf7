//! Kubernetes labels: the pods of this node, indexed by container id, joined to a process
//! through the container id the cgroup provider ([`super::cgroup`]) read from its cgroup path.
//!
//! Owns the shared index ([`Pods`]: container id -> the labels of its pod and container), the
//! join the labels stage calls once per process ([`join`]), what enabling the provider takes
//! ([`KubernetesSettings`]) and starting it ([`start`]). The index is filled by a watch on the
//! API server (`watch`, feature `kubernetes`: a background thread with its own tokio runtime);
//! the pure conversion of a v1 Pod into index entries lives in `pod`.
//!
//! Invariants:
//! - The labels stage never waits for the API: a lookup takes a short lock on the index and
//!   clones one `Arc`. While the API is down, the last known pods stay; a process whose
//!   container is not known gets the labels it has without Kubernetes ones, and the miss is
//!   counted ([`Pods::stats`]), logged by the watcher when the count changes.
//! - [`Pods::generation`] changes (after the index did) whenever what a lookup would return
//!   changes, and only then (a pod's status update that moves no container id changes nothing):
//!   the stage drops its per-process label cache on a new generation, so a process whose pod
//!   becomes known later gets its labels.
//! - Labels: `k8s.namespace.name`, `k8s.pod.name`, `k8s.pod.uid`, `k8s.container.name`,
//!   `k8s.node.name`, the owner (`k8s.deployment.name`, `k8s.replicaset.name`,
//!   `k8s.statefulset.name`, `k8s.daemonset.name`, `k8s.job.name`, `k8s.cronjob.name`), pod
//!   labels as `k8s.pod.label.<key>` and annotations as the meta labels
//!   `__meta_k8s_pod_annotation_<key>` (key sanitized as Prometheus does: every character
//!   outside `[A-Za-z0-9_]` becomes `_`), visible to relabel rules and removed after them.
//!   A process's `OTEL_RESOURCE_ATTRIBUTES` cannot set any `k8s.*` name (reserved: dropped and
//!   counted), and the join reads only the `container.id` observed in cgroup segments root
//!   named (never below a user's delegation point, [`super::cgroup`]); the operator's static
//!   tags win over it.

#[cfg(feature = "kubernetes")]
pub mod pod;
#[cfg(all(test, feature = "kubernetes"))]
mod tests;
#[cfg(feature = "kubernetes")]
pub mod watch;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, AtomicU8, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
};

use super::{
    keys,
    service::{service_name, ServiceNameSource, ServiceNameSources},
    Labels,
};

/// Attribute names of the Kubernetes provider (OpenTelemetry semantic conventions).
pub mod k8s_keys {
    pub const NAMESPACE: &str = "k8s.namespace.name";
    pub const POD_NAME: &str = "k8s.pod.name";
    pub const POD_UID: &str = "k8s.pod.uid";
    pub const CONTAINER_NAME: &str = "k8s.container.name";
    pub const NODE_NAME: &str = "k8s.node.name";
    pub const DEPLOYMENT: &str = "k8s.deployment.name";
    pub const REPLICASET: &str = "k8s.replicaset.name";
    pub const STATEFULSET: &str = "k8s.statefulset.name";
    pub const DAEMONSET: &str = "k8s.daemonset.name";
    pub const JOB: &str = "k8s.job.name";
    pub const CRONJOB: &str = "k8s.cronjob.name";
    /// Followed by the pod label's key, as it is (`k8s.pod.label.app.kubernetes.io/name`).
    pub const POD_LABEL_PREFIX: &str = "k8s.pod.label.";
    /// Followed by the annotation's key, sanitized; a meta label.
    pub const META_ANNOTATION_PREFIX: &str = "__meta_k8s_pod_annotation_";
}

/// What the provider knows of one container: its labels and its service-name candidates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerLabels {
    /// Every `k8s.*` label and the annotation meta labels.
    pub labels: Labels,
    /// The pod's `app.kubernetes.io/name` label.
    pub app_name: Option<String>,
    /// The owning workload's name (Deployment, StatefulSet, DaemonSet, CronJob, Job).
    pub owner_name: Option<String>,
    pub container_name: String,
}

/// The entries of one pod: (container id, labels), as [`pod::entries`] makes them.
pub type PodEntries = Vec<(String, Arc<ContainerLabels>)>;

/// Where the watch stands, for logs and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiState {
    /// No answer yet.
    Connecting = 0,
    /// The node's pods were listed; the watch follows changes.
    Synced = 1,
    /// The last request failed (unreachable, refused, forbidden); the watcher retries with
    /// backoff.
    Unreachable = 2,
}

/// Lookup counters since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodStats {
    /// Processes in a container whose pod was found.
    pub lookups_found: u64,
    /// Processes in a container no known pod holds (not synced yet, API down, or not a pod's).
    pub lookups_missed: u64,
}

#[derive(Debug, Default)]
struct Index {
    /// pod uid -> its entries.
    pods: HashMap<String, PodEntries>,
    /// container id -> labels.
    containers: HashMap<String, Arc<ContainerLabels>>,
}

impl Index {
    fn from_pods(pods: HashMap<String, PodEntries>) -> Self {
        let containers = pods
            .values()
            .flatten()
            .map(|(id, labels)| (id.clone(), Arc::clone(labels)))
            .collect();
        Self { pods, containers }
    }
}

#[derive(Debug, Default)]
struct Shared {
    index: Mutex<Index>,
    generation: AtomicU64,
    state: AtomicU8,
    found: AtomicU64,
    missed: AtomicU64,
}

/// The node's pods by container id, shared by the watcher (writes) and the labels stage
/// (reads). Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct Pods(Arc<Shared>);

impl Pods {
    pub fn new() -> Self {
        Self::default()
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        // A panic while holding the lock leaves a consistent map (every write is one insert
        // or remove): keep using it.
        self.0.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes whenever a lookup's answer may have changed.
    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.0.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The labels of the container `id`, counting a miss.
    pub fn lookup(&self, id: &str) -> Option<Arc<ContainerLabels>> {
        let found = self.index().containers.get(id).cloned();
        let counter = if found.is_some() {
            &self.0.found
        } else {
            &self.0.missed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    pub fn stats(&self) -> PodStats {
        PodStats {
            lookups_found: self.0.found.load(Ordering::Relaxed),
            lookups_missed: self.0.missed.load(Ordering::Relaxed),
        }
    }

    /// How many pods and containers are known.
    pub fn len(&self) -> (usize, usize) {
        let index = self.index();
        (index.pods.len(), index.containers.len())
    }

    pub fn api_state(&self) -> ApiState {
        match self.0.state.load(Ordering::Relaxed) {
            1 => ApiState::Synced,
            2 => ApiState::Unreachable,
            _ => ApiState::Connecting,
        }
    }

    /// Records the watch's state; true when it changed.
    pub fn set_api_state(&self, state: ApiState) -> bool {
        self.0.state.swap(state as u8, Ordering::Relaxed) != state as u8
    }

    /// A pod was added or changed: its entries replace the old ones.
    pub fn apply(&self, uid: &str, entries: PodEntries) {
        let mut index = self.index();
        if index.pods.get(uid) == Some(&entries) {
            return;
        }
        if let Some(old) = index.pods.remove(uid) {
            for (id, _) in old {
                index.containers.remove(&id);
            }
        }
        for (id, labels) in &entries {
            index.containers.insert(id.clone(), Arc::clone(labels));
        }
        index.pods.insert(uid.to_owned(), entries);
        // After the index changed, under the lock: a stage that sees the new generation reads
        // the new index.
        self.bump();
    }

    /// A pod was deleted.
    pub fn delete(&self, uid: &str) {
        let mut index = self.index();
        if let Some(old) = index.pods.remove(uid) {
            for (id, _) in old {
                index.containers.remove(&id);
            }
            self.bump();
        }
    }

    /// A full list (the watch's initial list, or a relist): replaces every pod.
    pub fn replace_all(&self, pods: HashMap<String, PodEntries>) {
        let mut index = self.index();
        if index.pods == pods {
            return;
        }
        *index = Index::from_pods(pods);
        self.bump();
    }
}

/// Adds the Kubernetes labels of the process's container (its `container.id` label) to
/// `labels`, and its Kubernetes service name when that outranks `named_by`, the source that
/// named it so far ([`super::service`]). The operator's `tags` keep their values.
pub fn join(pods: &Pods, labels: &mut Labels, named_by: ServiceNameSource, tags: &Labels) {
    let Some(id) = labels.get(keys::CONTAINER_ID) else {
        return;
    };
    let Some(found) = pods.lookup(id) else {
        return;
    };
    for (name, value) in found.labels.iter() {
        if !tags.contains(name) {
            labels.set(name, value);
        }
    }
    let (name, source) = service_name(&ServiceNameSources {
        k8s_app_name_label: found.app_name.as_deref(),
        k8s_owner_name: found.owner_name.as_deref(),
        k8s_container_name: Some(found.container_name.as_str()),
        ..ServiceNameSources::default()
    });
    if source < named_by {
        labels.set(keys::SERVICE_NAME, name);
    }
}

/// The config file's `kubernetes:` section.
///
/// ```yaml
/// kubernetes:
///   enabled: true             # absent: on when KUBERNETES_SERVICE_HOST is set (in a pod)
///   kubeconfig: /etc/ember/kubeconfig   # absent: in-cluster service account / KUBECONFIG
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// `true`: on, and an error if it cannot start; `false`: off, even in a pod; absent: on
    /// when `KUBERNETES_SERVICE_HOST` is set (a warning if it cannot start). `--kubernetes`
    /// turns it on whatever this says.
    pub enabled: Option<bool>,
    /// This node's name; `--node-name` and the `NODE_NAME` variable win (a DaemonSet sets
    /// `NODE_NAME` from the downward API: one ConfigMap cannot name every node).
    pub node_name: Option<String>,
    /// A kubeconfig file; `--kubeconfig` wins. Absent: `KUBECONFIG` / `~/.kube/config` when
    /// there is one, else the pod's service account (kube's inference).
    pub kubeconfig: Option<PathBuf>,
}

/// The `--kubernetes*` flags, as the command line parsed them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubernetesFlags {
    pub enabled: bool,
    /// `--node-name` or `NODE_NAME`.
    pub node_name: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub api_url: Option<String>,
}

/// The variable every pod has: the API server's address. Its presence turns the provider on
/// unless the config file says `enabled: false`.
pub const IN_CLUSTER_VARIABLE: &str = "KUBERNETES_SERVICE_HOST";

/// Whether and how the provider runs: flags > file; `env` looks a variable up. `None` when it
/// is off; an error when it was asked for and lacks the node's name.
pub fn resolve(
    flags: &KubernetesFlags,
    file: &KubernetesConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<KubernetesSettings>> {
    let explicit = flags.enabled || file.enabled == Some(true);
    let in_cluster = env(IN_CLUSTER_VARIABLE).is_some_and(|host| !host.trim().is_empty());
    if !explicit && (file.enabled == Some(false) || !in_cluster) {
        return Ok(None);
    }
    let node_name = flags
        .node_name
        .clone()
        .or_else(|| file.node_name.clone())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty());
    let Some(node_name) = node_name else {
        let fix = "Kubernetes labels need this node's name: pass --node-name or set NODE_NAME \
                   (in a DaemonSet: env NODE_NAME from the downward API, fieldRef \
                   spec.nodeName; see deploy/kubernetes/30-daemonset.yaml)";
        if explicit {
            anyhow::bail!("{fix}");
        }
        tracing::warn!(
            "{IN_CLUSTER_VARIABLE} is set but no node name is: profiles carry no k8s.* labels. \
             {fix}, or set `kubernetes: {{ enabled: false }}` in the config file"
        );
        return Ok(None);
    };
    let api = if let Some(url) = &flags.api_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            anyhow::bail!("--kubernetes-api-url {url:?}: give an http:// or https:// URL");
        }
        ApiSource::Url(url.clone())
    } else if let Some(path) = flags.kubeconfig.clone().or_else(|| file.kubeconfig.clone()) {
        ApiSource::Kubeconfig(path)
    } else {
        ApiSource::Infer
    };
    Ok(Some(KubernetesSettings {
        node_name,
        api,
        explicit,
    }))
}

/// Where the API server's address and credentials come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiSource {
    /// kube's inference: `KUBECONFIG` / `~/.kube/config`, else the pod's service account.
    Infer,
    /// `--kubeconfig FILE`.
    Kubeconfig(PathBuf),
    /// `--kubernetes-api-url`: this URL, no credentials (tests, `kubectl proxy`); plain http
    /// is accepted here only.
    Url(String),
}

/// What the provider runs with, resolved from the flags, the config file and the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubernetesSettings {
    /// This node's name: only its pods are watched (`spec.nodeName=<node>`).
    pub node_name: String,
    pub api: ApiSource,
    /// Asked for (`--kubernetes`, `kubernetes.enabled: true`) rather than guessed from
    /// `KUBERNETES_SERVICE_HOST`: a provider that cannot start is then an error, not a warning.
    pub explicit: bool,
}

/// Starts the provider: the returned [`Pods`] fill up in the background. An API that cannot
/// be configured is an error when the provider was asked for, else a warning and `None`.
pub fn start(settings: &KubernetesSettings) -> anyhow::Result<Option<Pods>> {
    #[cfg(feature = "kubernetes")]
    let started = watch::spawn(settings);
    #[cfg(not(feature = "kubernetes"))]
    let started: anyhow::Result<Pods> = Err(anyhow::anyhow!(
        "this ember-relay was built without Kubernetes support: rebuild it with \
         `--features kubernetes` (a default feature)"
    ));
    match started {
        Ok(pods) => Ok(Some(pods)),
        Err(err) if settings.explicit => Err(err.context(
            "starting the Kubernetes labels provider (asked for by --kubernetes or \
             kubernetes.enabled)",
        )),
        Err(err) => {
            tracing::warn!(
                error = format!("{err:#}"),
                "KUBERNETES_SERVICE_HOST is set but the Kubernetes labels provider cannot \
                 start: profiles carry no k8s.* labels (pass --kubernetes to make this an \
                 error)"
            );
            Ok(None)
        }
    }
}

#[cfg(test)]
mod index_tests {
    use super::*;

    fn entry(id: &str, pod: &str) -> (String, Arc<ContainerLabels>) {
        let labels = [(k8s_keys::POD_NAME, pod)].into_iter().collect();
        (
            id.to_owned(),
            Arc::new(ContainerLabels {
                labels,
                container_name: "app".into(),
                ..ContainerLabels::default()
            }),
        )
    }

    #[test]
    fn generation_moves_only_when_an_answer_changes() {
        let pods = Pods::new();
        let g0 = pods.generation();
        // Given a pod applied, When the same pod comes again (a status update), Then nothing
        // changed
        pods.apply("u1", vec![entry("c1", "p1")]);
        let g1 = pods.generation();
        pods.apply("u1", vec![entry("c1", "p1")]);
        assert_eq!((g1 > g0, pods.generation()), (true, g1));
        // When its container restarts under a new id, Then the old id is gone
        pods.apply("u1", vec![entry("c2", "p1")]);
        assert!(pods.generation() > g1);
        assert!(pods.lookup("c1").is_none() && pods.lookup("c2").is_some());
        // When a relist brings the same pods, Then nothing changed; when it lacks one, it goes
        let g2 = pods.generation();
        pods.replace_all([("u1".to_owned(), vec![entry("c2", "p1")])].into());
        assert_eq!(pods.generation(), g2);
        pods.replace_all(HashMap::new());
        assert!(pods.generation() > g2 && pods.lookup("c2").is_none());
        pods.delete("u1");
        assert_eq!(
            pods.stats(),
            PodStats {
                lookups_found: 1,
                lookups_missed: 2
            }
        );
    }

    #[test]
    fn enabling_needs_a_node_name() {
        let pod_env = |name: &str| (name == IN_CLUSTER_VARIABLE).then(|| "10.96.0.1".to_owned());
        let no_env = |_: &str| None;
        let file = KubernetesConfig::default();
        // Off outside a pod, and in a pod when the file says so
        let off = KubernetesConfig {
            enabled: Some(false),
            ..KubernetesConfig::default()
        };
        let node = KubernetesFlags {
            node_name: Some("node-a".into()),
            ..KubernetesFlags::default()
        };
        assert_eq!(resolve(&node, &file, &no_env).ok(), Some(None));
        assert_eq!(resolve(&node, &off, &pod_env).ok(), Some(None));
        // On in a pod (guessed), on when asked for
        let on = resolve(&node, &file, &pod_env).ok().flatten();
        assert_eq!(
            on,
            Some(KubernetesSettings {
                node_name: "node-a".into(),
                api: ApiSource::Infer,
                explicit: false
            })
        );
        // Asked for without a node name: an error naming the fix; guessed: off
        let asked = KubernetesFlags {
            enabled: true,
            ..KubernetesFlags::default()
        };
        let err = format!(
            "{:#}",
            resolve(&asked, &file, &no_env).expect_err("no node")
        );
        assert!(
            err.contains("--node-name") && err.contains("NODE_NAME"),
            "{err}"
        );
        assert_eq!(
            resolve(&KubernetesFlags::default(), &file, &pod_env).ok(),
            Some(None)
        );
        // The test URL wins over a kubeconfig
        let url = KubernetesFlags {
            api_url: Some("http://127.0.0.1:8001".into()),
            kubeconfig: Some("/k".into()),
            ..asked.clone()
        };
        let with_node = KubernetesConfig {
            node_name: Some("n".into()),
            ..KubernetesConfig::default()
        };
        let settings = resolve(&url, &with_node, &no_env).ok().flatten();
        assert_eq!(
            settings.map(|s| (s.api, s.explicit)),
            Some((ApiSource::Url("http://127.0.0.1:8001".into()), true))
        );
        // only http(s) URLs; else the flag's kubeconfig, else the file's
        let ftp = KubernetesFlags {
            api_url: Some("ftp://api".into()),
            ..url.clone()
        };
        assert!(resolve(&ftp, &with_node, &no_env).is_err());
        let file_kubeconfig = KubernetesConfig {
            enabled: Some(true),
            node_name: Some("n".into()),
            kubeconfig: Some("/etc/k".into()),
        };
        let api = |flags: &KubernetesFlags| {
            resolve(flags, &file_kubeconfig, &no_env)
                .ok()
                .flatten()
                .map(|s| s.api)
        };
        assert_eq!(
            api(&KubernetesFlags::default()),
            Some(ApiSource::Kubeconfig("/etc/k".into()))
        );
        let flag_kubeconfig = KubernetesFlags {
            kubeconfig: Some("/flag/k".into()),
            ..KubernetesFlags::default()
        };
        assert_eq!(
            api(&flag_kubeconfig),
            Some(ApiSource::Kubeconfig("/flag/k".into()))
        );
    }

    #[test]
    fn join_ranks_the_service_name_and_keeps_tags() {
        let pods = Pods::new();
        let mut found = ContainerLabels {
            labels: [(k8s_keys::POD_NAME, "web-1"), ("team", "k8s")]
                .into_iter()
                .collect(),
            owner_name: Some("web".into()),
            container_name: "nginx".into(),
            ..ContainerLabels::default()
        };
        found.app_name = None;
        pods.apply("u", vec![("c".into(), Arc::new(found))]);
        let tags: Labels = [("team", "ops")].into_iter().collect();
        let base = |name: &str| -> Labels {
            [
                (keys::CONTAINER_ID, "c"),
                (keys::SERVICE_NAME, name),
                ("team", "ops"),
            ]
            .into_iter()
            .collect()
        };
        // Given a process named by its executable, Then the owner's name wins over it
        let mut labels = base("nginx-bin");
        join(&pods, &mut labels, ServiceNameSource::Executable, &tags);
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("web"));
        assert_eq!(labels.get(k8s_keys::POD_NAME), Some("web-1"));
        assert_eq!(labels.get("team"), Some("ops"), "a tag keeps its value");
        // Given one named by OTEL_SERVICE_NAME, Then that stays
        let mut labels = base("checkout");
        join(
            &pods,
            &mut labels,
            ServiceNameSource::OtelServiceName,
            &tags,
        );
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("checkout"));
    }
}
