//! One v1 Pod -> the index entries of its containers ([`entries`]): pure, no I/O.
//!
//! Container ids come from `status.containerStatuses[].containerID`, and likewise from the
//! init and ephemeral containers' statuses, with the runtime's scheme removed
//! (`containerd://`, `docker://`, `cri-o://`: whatever precedes `://`), which leaves the id the
//! cgroup path carries. A container that has not started yet has no id and no entry: the pod's
//! next update brings it.
//!
//! The owner, from the pod's controller reference (`ownerReferences[]` with `controller:
//! true`, else the first one). A pod shows only its direct owner, so two of them are guessed
//! from names, the way Kubernetes' controllers make them:
//! - ReplicaSet -> `k8s.replicaset.name`, and `k8s.deployment.name` = the ReplicaSet's name
//!   without its `-<pod-template-hash>` suffix: the hash is the pod's `pod-template-hash`
//!   label when present (the Deployment controller sets it), else the last `-` segment when it
//!   looks like one (only the characters of Kubernetes' `SafeEncodeString`). A ReplicaSet
//!   without such a suffix was made by hand: no Deployment, the ReplicaSet names the service.
//! - Job -> `k8s.job.name`, and `k8s.cronjob.name` when the Job's name is `<name>-<digits>`
//!   with at least 8 digits (the CronJob controller names each Job after its scheduled time in
//!   minutes since the epoch, 8 digits since 1989; the Job's own owner is not visible here).
//! - StatefulSet, DaemonSet -> their names. Other owners (a Node for static pods, custom
//!   controllers) give no owner label and no owner service name.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use super::{k8s_keys as k, ContainerLabels, PodEntries};
use crate::labels::Labels;

/// The pod label that names the application (service.name rank 4).
pub const APP_NAME_LABEL: &str = "app.kubernetes.io/name";
/// The label the Deployment controller puts on its pods and in its ReplicaSets' names.
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// Fewest digits of a CronJob-made Job's name suffix.
const CRONJOB_SUFFIX_MIN_DIGITS: usize = 8;
/// The characters Kubernetes' `rand.SafeEncodeString` uses (no vowels, no look-alikes).
const SAFE_ENCODE_ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";

/// The pod's uid and its containers' entries; `None` for a pod without a uid.
pub fn entries(pod: &Pod) -> Option<(String, PodEntries)> {
    let meta = &pod.metadata;
    let uid = meta.uid.clone().filter(|u| !u.is_empty())?;
    let empty = BTreeMap::new();
    let pod_labels = meta.labels.as_ref().unwrap_or(&empty);
    let mut base = Labels::new();
    base.set(k::NAMESPACE, meta.namespace.clone().unwrap_or_default());
    base.set(k::POD_NAME, meta.name.clone().unwrap_or_default());
    base.set(k::POD_UID, uid.clone());
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    base.set(k::NODE_NAME, node.unwrap_or_default());
    let owner_name = owner_labels(pod, pod_labels, &mut base);
    for (key, value) in pod_labels {
        base.set(format!("{}{key}", k::POD_LABEL_PREFIX), value.as_str());
    }
    for (key, value) in meta.annotations.iter().flatten() {
        base.set(
            format!("{}{}", k::META_ANNOTATION_PREFIX, sanitize(key)),
            value.as_str(),
        );
    }
    let app_name = pod_labels.get(APP_NAME_LABEL).cloned();
    let status = pod.status.as_ref();
    let statuses = [
        status.and_then(|s| s.init_container_statuses.as_ref()),
        status.and_then(|s| s.container_statuses.as_ref()),
        status.and_then(|s| s.ephemeral_container_statuses.as_ref()),
    ];
    let entries = statuses
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|status| {
            let id = container_id(status)?;
            let mut labels = base.clone();
            labels.set(k::CONTAINER_NAME, status.name.as_str());
            let container = ContainerLabels {
                labels,
                app_name: app_name.clone(),
                owner_name: owner_name.clone(),
                container_name: status.name.clone(),
            };
            Some((id, Arc::new(container)))
        })
        .collect();
    Some((uid, entries))
}

/// A status's container id without the runtime's scheme; `None` before the container started.
fn container_id(status: &ContainerStatus) -> Option<String> {
    let raw = status.container_id.as_deref()?.trim();
    let id = raw.split_once("://").map_or(raw, |(_, id)| id);
    (!id.is_empty()).then(|| id.to_ascii_lowercase())
}

/// Sets the owner's labels; returns the owner's name for `service.name`.
fn owner_labels(
    pod: &Pod,
    pod_labels: &BTreeMap<String, String>,
    labels: &mut Labels,
) -> Option<String> {
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let owner = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or_else(|| owners.first())?;
    let name = owner.name.as_str();
    match owner.kind.as_str() {
        "ReplicaSet" => {
            labels.set(k::REPLICASET, name);
            let hash = pod_labels.get(POD_TEMPLATE_HASH_LABEL).map(String::as_str);
            match deployment_name(name, hash) {
                Some(deployment) => {
                    labels.set(k::DEPLOYMENT, deployment);
                    Some(deployment.to_owned())
                }
                None => Some(name.to_owned()),
            }
        }
        "StatefulSet" => {
            labels.set(k::STATEFULSET, name);
            Some(name.to_owned())
        }
        "DaemonSet" => {
            labels.set(k::DAEMONSET, name);
            Some(name.to_owned())
        }
        "Job" => {
            labels.set(k::JOB, name);
            match cronjob_name(name) {
                Some(cronjob) => {
                    labels.set(k::CRONJOB, cronjob);
                    Some(cronjob.to_owned())
                }
                None => Some(name.to_owned()),
            }
        }
        _ => None,
    }
}

/// The Deployment that made the ReplicaSet `replicaset`, by its name (see the module doc).
pub fn deployment_name<'a>(replicaset: &'a str, template_hash: Option<&str>) -> Option<&'a str> {
    let (deployment, suffix) = replicaset.rsplit_once('-')?;
    let matches = match template_hash {
        Some(hash) => suffix == hash,
        None => {
            (5..=10).contains(&suffix.len())
                && suffix.chars().all(|c| SAFE_ENCODE_ALPHABET.contains(c))
        }
    };
    (matches && !deployment.is_empty()).then_some(deployment)
}

/// The CronJob that made the Job `job`, by its name (see the module doc).
pub fn cronjob_name(job: &str) -> Option<&str> {
    let (cronjob, suffix) = job.rsplit_once('-')?;
    let matches =
        suffix.len() >= CRONJOB_SUFFIX_MIN_DIGITS && suffix.bytes().all(|b| b.is_ascii_digit());
    (matches && !cronjob.is_empty()).then_some(cronjob)
}

/// An annotation key as a label name suffix: `[^A-Za-z0-9_]` -> `_` (Prometheus' rule).
fn sanitize(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_names_from_controller_naming() {
        // Deployment: the pod's pod-template-hash label decides
        assert_eq!(
            deployment_name("checkout-7d9f8b6c5d", Some("7d9f8b6c5d")),
            Some("checkout")
        );
        assert_eq!(
            deployment_name("api-v2-6b7c9d8f4", Some("6b7c9d8f4")),
            Some("api-v2")
        );
        assert_eq!(deployment_name("checkout-7d9f8b6c5d", Some("other")), None);
        // without the label, a suffix of SafeEncodeString's characters only
        assert_eq!(deployment_name("web-5c8f9d7b64", None), Some("web"));
        assert_eq!(deployment_name("web-manual", None), None);
        assert_eq!(deployment_name("standalone", None), None);
        // CronJob: 8 or more digits (minutes since the epoch)
        assert_eq!(cronjob_name("backup-29412345"), Some("backup"));
        assert_eq!(cronjob_name("db-backup-29412345"), Some("db-backup"));
        assert_eq!(cronjob_name("migrate-2"), None);
        assert_eq!(cronjob_name("migrate"), None);
        assert_eq!(cronjob_name("-29412345"), None);
        assert_eq!(sanitize("prometheus.io/scrape"), "prometheus_io_scrape");
        // the bounds: a 5-character hash is one, 4 is not; 7 digits are no CronJob's
        assert_eq!(deployment_name("web-5c8f9", None), Some("web"));
        assert_eq!(deployment_name("web-bcdf", None), None);
        assert_eq!(deployment_name("-7d9f8b6c5d", Some("7d9f8b6c5d")), None);
        assert_eq!(cronjob_name("backup-2941234"), None);
    }

    fn pod(json: &str) -> Pod {
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
    }

    #[test]
    fn the_controller_owner_wins_and_static_pods_have_none() {
        // Given a pod with a non-controller owner listed before its controller
        let owned = pod(
            r#"{"metadata": {"name": "w-0", "namespace": "ns", "uid": "u1",
            "ownerReferences": [
              {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "c"},
              {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d",
               "controller": true}]},
            "status": {"containerStatuses": [{"name": "agent", "image": "a", "imageID": "",
              "ready": true, "restartCount": 0,
              "containerID": "CRI-O://ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789"},
              {"name": "pending", "image": "p", "imageID": "", "ready": false,
               "restartCount": 0, "containerID": "containerd://"}]}}"#,
        );
        // When converted
        let (uid, owned_entries) = entries(&owned).expect("a uid");
        // Then the DaemonSet owns it, the id is lowercase without its scheme, and a container
        // without an id has no entry
        assert_eq!(uid, "u1");
        let [(id, labels)] = &owned_entries[..] else {
            panic!("one entry: {owned_entries:?}")
        };
        assert_eq!(
            id,
            "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
        );
        assert_eq!(labels.labels.get(k::DAEMONSET), Some("agent"));
        assert_eq!(labels.owner_name.as_deref(), Some("agent"));
        // Given a static pod (its mirror pod is owned by the Node), Then no owner at all
        let mirror = pod(
            r#"{"metadata": {"name": "etcd-node-a", "namespace": "kube-system",
            "uid": "u2", "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
              "name": "node-a", "uid": "n", "controller": true}]},
            "status": {"containerStatuses": [{"name": "etcd", "image": "e", "imageID": "",
              "ready": true, "restartCount": 0, "containerID": "containerd://0a"}]}}"#,
        );
        let (_, mirror_entries) = entries(&mirror).expect("a uid");
        let labels = &mirror_entries[0].1;
        assert_eq!(labels.owner_name, None);
        assert!(
            !labels.labels.iter().any(|(n, _)| n.ends_with("set.name")
                || n.ends_with("job.name")
                || n == k::DEPLOYMENT),
            "{}",
            labels.labels
        );
        // And a pod without a uid gives nothing
        assert!(entries(&pod(r#"{"metadata": {"name": "x"}}"#)).is_none());
    }

    #[test]
    fn container_ids_lose_the_runtime_scheme() {
        let id = "8d3c0bb1a2f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0";
        for raw in [
            format!("containerd://{id}"),
            format!("docker://{id}"),
            format!("cri-o://{id}"),
            id.to_owned(),
        ] {
            let status = ContainerStatus {
                container_id: Some(raw.clone()),
                ..ContainerStatus::default()
            };
            assert_eq!(container_id(&status).as_deref(), Some(id), "{raw}");
        }
        let pending = ContainerStatus::default();
        assert_eq!(container_id(&pending), None);
        let scheme_only = ContainerStatus {
            container_id: Some("docker://".into()),
            ..ContainerStatus::default()
        };
        assert_eq!(container_id(&scheme_only), None);
    }
}
