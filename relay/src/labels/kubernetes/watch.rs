//! The pod watch: a background thread (`ember-k8s`) with its own one-thread tokio runtime that
//! lists and watches the pods of this node (`fieldSelector=spec.nodeName=<node>`) and keeps
//! [`Pods`] up to date.
//!
//! kube's runtime watcher does the protocol: the initial list (paged), the watch from its
//! resourceVersion, a relist when the server says the version is gone (410), and an exponential
//! backoff (0.8 s to 30 s) between failed attempts. Here each list replaces the index as a
//! whole when it is complete (a pod deleted while the API was unreachable goes away then),
//! and each event updates one pod. Nothing here blocks the labels stage; a failed request
//! leaves the last known pods in place.
//!
//! Logged on change only, never per sample: the watch's state (synced with how many pods,
//! failing with the error (unreachable, forbidden, ...), recovered) and, at most once per [`MISSES_LOG_PERIOD`], the
//! count of `k8s lookups missed` when it grew.

use std::{
    collections::HashMap,
    pin::pin,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        watcher::{self, Event},
        WatchStreamExt as _,
    },
    Api, Client, Config,
};

use super::{pod, ApiSource, ApiState, KubernetesSettings, PodEntries, Pods};

/// How often the count of missed lookups may be logged (the first miss is logged at once).
pub const MISSES_LOG_PERIOD: Duration = Duration::from_secs(60);
/// How often the count is looked at.
const MISSES_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// Starts the watch thread; returns once the client is configured (an unusable kubeconfig,
/// URL or in-cluster environment is an error here, before any request).
pub fn spawn(settings: &KubernetesSettings) -> anyhow::Result<Pods> {
    let pods = Pods::new();
    let (ready_tx, ready_rx) = mpsc::sync_channel::<anyhow::Result<()>>(1);
    let (api, node) = (settings.api.clone(), settings.node_name.clone());
    let shared = pods.clone();
    std::thread::Builder::new()
        .name("ember-k8s".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = ready_tx.send(Err(err).context("starting the Kubernetes runtime"));
                    return;
                }
            };
            runtime.block_on(async move {
                let client = match client(&api).await {
                    Ok(client) => client,
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                follow(client, &node, &shared).await;
            });
        })
        .context("spawning the Kubernetes watch thread")?;
    ready_rx
        .recv()
        .context("the Kubernetes watch thread ended before it started")??;
    tracing::info!(
        node = %settings.node_name,
        api = ?settings.api,
        "Kubernetes labels: watching this node's pods"
    );
    Ok(pods)
}

/// The API client for `source`.
async fn client(source: &ApiSource) -> anyhow::Result<Client> {
    let config = match source {
        ApiSource::Infer => Config::infer().await.context(
            "no Kubernetes API configuration: run in a pod with a service account token \
             mounted, or pass --kubeconfig FILE",
        )?,
        ApiSource::Kubeconfig(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("using the kubeconfig {}", path.display()))?
        }
        ApiSource::Url(url) => {
            let uri: http::Uri = url
                .parse()
                .with_context(|| format!("--kubernetes-api-url {url:?} is not a URL"))?;
            Config::new(uri)
        }
    };
    Client::try_from(config).context("building the Kubernetes API client")
}

/// Follows the node's pods into `pods`, forever (the thread ends with the process).
async fn follow(client: Client, node: &str, pods: &Pods) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = pin!(watcher::watcher(api, config).default_backoff());
    let mut listing: Option<HashMap<String, PodEntries>> = None;
    let mut misses = tokio::time::interval(MISSES_CHECK_PERIOD);
    let mut misses_logged = MissesLogged::default();
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => apply(event, pods, &mut listing),
                // The watch's resourceVersion is too old (etcd compacted): the watcher relists,
                // and that list replaces the index. Not a failure.
                Some(Err(watcher::Error::WatchError(status))) if status.code == 410 => {
                    tracing::debug!(message = %status.message, "Kubernetes pod watch expired: relisting");
                }
                Some(Err(err)) => failing(pods, &err),
                None => {
                    tracing::error!("the Kubernetes pod watch ended; k8s.* labels stop following pods");
                    return;
                }
            },
            _ = misses.tick() => log_misses(pods, &mut misses_logged),
        }
    }
}

/// One watch event into the index (a list is applied when complete).
fn apply(event: Event<Pod>, pods: &Pods, listing: &mut Option<HashMap<String, PodEntries>>) {
    match event {
        Event::Init => *listing = Some(HashMap::new()),
        Event::InitApply(pod) => {
            if let (Some(listing), Some((uid, entries))) = (listing.as_mut(), pod::entries(&pod)) {
                listing.insert(uid, entries);
            }
        }
        Event::InitDone => {
            pods.replace_all(listing.take().unwrap_or_default());
            let (pod_count, containers) = pods.len();
            let was = pods.api_state();
            if pods.set_api_state(ApiState::Synced) {
                tracing::info!(
                    pods = pod_count,
                    containers,
                    recovered = was == ApiState::Unreachable,
                    "Kubernetes pod list synced"
                );
            }
        }
        Event::Apply(pod) => {
            if let Some((uid, entries)) = pod::entries(&pod) {
                pods.apply(&uid, entries);
            }
            recovered(pods);
        }
        Event::Delete(pod) => {
            if let Some(uid) = pod.metadata.uid.as_deref() {
                pods.delete(uid);
            }
            recovered(pods);
        }
    }
}

/// An event after a failure: the watch works again.
fn recovered(pods: &Pods) {
    if pods.api_state() == ApiState::Unreachable && pods.set_api_state(ApiState::Synced) {
        tracing::info!("Kubernetes API reachable again");
    }
}

fn failing(pods: &Pods, err: &watcher::Error) {
    if pods.set_api_state(ApiState::Unreachable) {
        let (pod_count, containers) = pods.len();
        tracing::warn!(
            error = %err,
            pods_kept = pod_count,
            containers_kept = containers,
            "Kubernetes API requests failing: keeping the last known pods, retrying with backoff"
        );
    }
}

/// The count last logged, and when.
#[derive(Default)]
struct MissesLogged {
    count: u64,
    at: Option<Instant>,
}

fn log_misses(pods: &Pods, logged: &mut MissesLogged) {
    let stats = pods.stats();
    let due = logged.at.is_none_or(|at| at.elapsed() >= MISSES_LOG_PERIOD);
    if stats.lookups_missed != logged.count && due {
        *logged = MissesLogged {
            count: stats.lookups_missed,
            at: Some(Instant::now()),
        };
        tracing::info!(
            missed = stats.lookups_missed,
            found = stats.lookups_found,
            state = ?pods.api_state(),
            "k8s lookups missed: processes in a container no known pod of this node holds"
        );
    }
}
