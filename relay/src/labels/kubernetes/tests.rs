//! The provider against an API server in the test: a std TcpListener that answers the pod list
//! and the pod watch with recorded v1 JSON (testdata/: a PodList of node-a and a watch stream
//! ADDED -> MODIFIED -> DELETED, written after the Kubernetes API reference), through kube's real
//! client and watcher, into the real labels stage fed with sampler `ProcessInfo`s whose cgroup
//! paths carry those containers' ids. And against an API that refuses connections.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{TcpListener, TcpStream},
    sync::{
        mpsc::{self, Receiver, RecvTimeoutError},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use ember_protocol::ProcessInfo;

use super::{k8s_keys as k, ApiSource, ApiState, KubernetesSettings, Pods};
use crate::{
    labels::{
        keys,
        process::UserNames,
        stage::{LabelSettings, LabelStage, ProcessRecord},
        Labels,
    },
    relabel::{compile, RelabelConfig},
};

const POD_LIST: &str = include_str!("testdata/podlist-node-a.json");
/// The list after the watch expired: postgres-0 and the CronJob's pod are gone.
const POD_RELIST: &str = include_str!("testdata/podlist-node-a-relist.json");
const WATCH_EVENTS: &str = include_str!("testdata/watch-node-a.jsonl");

/// Container ids in the fixtures.
const CHECKOUT_APP: &str = "4f1c2b7d9e8a6b5c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c";
const CHECKOUT_MIGRATE: &str = "1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3";
const CHECKOUT_DEBUGGER: &str = "5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c";
const POSTGRES: &str = "c0ffee0d15ea5e5b0a7d00dfeedfacecafebabe0123456789abcdef012345678";
const REPORT: &str = "7b3e9d1c5a2f4e6d8c0b1a3f5e7d9c2b4a6f8e0d1c3b5a7f9e2d4c6b8a0f1e3d";

/// A fake API server: the list answers with `POD_LIST`; a watch streams what the test sends.
struct ApiServer {
    url: String,
    /// What a list returns.
    list: Arc<Mutex<&'static str>>,
    requests: Arc<Mutex<Vec<String>>>,
    events: mpsc::Sender<String>,
}

impl ApiServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let url = format!(
            "http://{}",
            listener
                .local_addr()
                .unwrap_or_else(|e| panic!("addr: {e}"))
        );
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (events, rx) = mpsc::channel();
        let rx = Arc::new(Mutex::new(rx));
        let seen = Arc::clone(&requests);
        let list = Arc::new(Mutex::new(POD_LIST));
        let served = Arc::clone(&list);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, rx, list) = (Arc::clone(&seen), Arc::clone(&rx), Arc::clone(&served));
                std::thread::spawn(move || serve(stream, &seen, &rx, &list));
            }
        });
        Self {
            url,
            list,
            requests,
            events,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(|e| panic!("lock: {e}"))
            .clone()
    }
}

/// One connection: requests answered in turn until the client closes it.
fn serve(
    stream: TcpStream,
    seen: &Mutex<Vec<String>>,
    events: &Mutex<Receiver<String>>,
    list: &Mutex<&'static str>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap_or_else(|e| panic!("clone: {e}")));
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                break;
            }
        }
        let target = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_owned();
        seen.lock()
            .unwrap_or_else(|e| panic!("lock: {e}"))
            .push(target.clone());
        if !target.starts_with("/api/v1/pods?") {
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
            continue;
        }
        if !target.contains("watch=true") {
            let body = *list.lock().unwrap_or_else(|e| panic!("lock: {e}"));
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
            continue;
        }
        // The watch: one chunk per event, as the API server streams them.
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        );
        loop {
            let next = events
                .lock()
                .unwrap_or_else(|e| panic!("lock: {e}"))
                .recv_timeout(Duration::from_millis(20));
            match next {
                Ok(line) => {
                    let chunk = format!("{:x}\r\n{line}\n\r\n", line.len() + 1);
                    if stream.write_all(chunk.as_bytes()).is_err() {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = stream.write_all(b"0\r\n\r\n");
                    return;
                }
            }
        }
    }
}

/// A sampler's `Process` message for a process in `cgroup`.
fn process(pid: u32, name: &str, cgroup: &str) -> ProcessRecord {
    ProcessRecord::from_info(&ProcessInfo {
        pid,
        start_time_unix_ns: 1_764_000_000_000_000_000 + u64::from(pid),
        executable_path: format!("/usr/bin/{name}"),
        executable_name: name.into(),
        cgroup: cgroup.into(),
        uid: Some(0),
        ..ProcessInfo::default()
    })
}

/// Cgroup paths as the kubelet's two cgroup drivers make them (cgroup v2).
fn systemd_driver_path(pod_uid: &str, id: &str) -> String {
    let uid = pod_uid.replace('-', "_");
    format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/\
         cri-containerd-{id}.scope"
    )
}

fn cgroupfs_driver_path(pod_uid: &str, id: &str) -> String {
    format!("0::/kubepods/burstable/pod{pod_uid}/{id}")
}

/// Waits for `done`, failing the test after a generous bound (the condition, not the time, is
/// what the test asserts).
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn stage(pods: &Pods, rules_yaml: &str) -> LabelStage {
    let configs: Vec<RelabelConfig> =
        serde_saphyr::from_str(rules_yaml).unwrap_or_else(|e| panic!("yaml: {e}"));
    let settings = LabelSettings {
        rules: compile(&configs).unwrap_or_else(|e| panic!("rules: {e}")),
        ..LabelSettings::default()
    };
    LabelStage::new(settings, UserNames::default(), None).with_kubernetes(pods.clone())
}

fn labels_of(stage: &mut LabelStage, record: &ProcessRecord) -> Labels {
    Labels::clone(
        &stage
            .resource("node-a", record)
            .unwrap_or_else(|| panic!("{record:?} dropped")),
    )
}

fn k8s_labels(labels: &Labels) -> Vec<(&str, &str)> {
    labels
        .iter()
        .filter(|(n, _)| n.starts_with("k8s."))
        .collect()
}

fn settings(url: &str) -> KubernetesSettings {
    KubernetesSettings {
        node_name: "node-a".into(),
        api: ApiSource::Url(url.into()),
        explicit: true,
    }
}

#[test]
fn pods_of_the_node_label_their_processes_and_follow_the_watch() {
    // Given the API server with node-a's pods, and a rule reading an annotation (a meta label)
    let server = ApiServer::start();
    let pods = super::watch::spawn(&settings(&server.url)).unwrap_or_else(|e| panic!("{e:#}"));
    let mut stage = stage(
        &pods,
        "- source_labels: [__meta_k8s_pod_annotation_team_example_com_owner]\n  \
         target_label: team\n",
    );
    let checkout_uid = "3f6b2c1e-8a47-4d2b-9c5e-7a1d0e9f4b21";
    let checkout = process(
        101,
        "checkout",
        &systemd_driver_path(checkout_uid, CHECKOUT_APP),
    );
    let migrate = process(
        102,
        "migrate",
        &cgroupfs_driver_path(checkout_uid, CHECKOUT_MIGRATE),
    );
    let debugger = process(
        105,
        "sh",
        &systemd_driver_path(checkout_uid, CHECKOUT_DEBUGGER),
    );
    let postgres = process(
        103,
        "postgres",
        &systemd_driver_path("8c2d4e6f-1a3b-4c5d-9e7f-2b4d6f8a0c1e", POSTGRES),
    );
    let report_path = systemd_driver_path("6a7b8c9d-0e1f-4a2b-8c3d-4e5f6a7b8c9d", REPORT);
    let report = process(104, "report-gen", &report_path);
    let kubelet = process(1, "kubelet", "/system.slice/kubelet.service");

    // When the list has been read
    wait_for("the pod list", || pods.api_state() == ApiState::Synced);
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.contains("fieldSelector=spec.nodeName%3Dnode-a") && !r.contains("watch")),
        "a list of node-a's pods only: {requests:?}"
    );

    // Then a Deployment's container: its pod, owner, labels, and the app label names it
    let labels = labels_of(&mut stage, &checkout);
    assert_eq!(
        k8s_labels(&labels),
        [
            (k::CONTAINER_NAME, "app"),
            (k::DEPLOYMENT, "checkout"),
            (k::NAMESPACE, "shop"),
            (k::NODE_NAME, "node-a"),
            ("k8s.pod.label.app.kubernetes.io/name", "checkout-api"),
            ("k8s.pod.label.app.kubernetes.io/part-of", "shop"),
            ("k8s.pod.label.pod-template-hash", "7d9f8b6c5d"),
            (k::POD_NAME, "checkout-7d9f8b6c5d-x2k4p"),
            (k::POD_UID, checkout_uid),
            (k::REPLICASET, "checkout-7d9f8b6c5d"),
        ],
        "{labels}"
    );
    assert_eq!(labels.get(keys::SERVICE_NAME), Some("checkout-api"));
    assert_eq!(labels.get(keys::CONTAINER_ID), Some(CHECKOUT_APP));
    // the annotation reached the rule, and no meta label is exported
    assert_eq!(labels.get("team"), Some("payments"), "{labels}");
    assert!(!labels.iter().any(|(n, _)| n.starts_with("__")), "{labels}");
    // an init container of the same pod (cgroupfs driver path)
    let labels = labels_of(&mut stage, &migrate);
    assert_eq!(labels.get(k::CONTAINER_NAME), Some("migrate"));
    assert_eq!(labels.get(k::POD_NAME), Some("checkout-7d9f8b6c5d-x2k4p"));
    // and an ephemeral one (kubectl debug)
    let labels = labels_of(&mut stage, &debugger);
    assert_eq!(
        labels.get(k::CONTAINER_NAME),
        Some("debugger-7xq2d"),
        "{labels}"
    );
    assert_eq!(labels.get(k::DEPLOYMENT), Some("checkout"));
    // a StatefulSet's container without the app label: the owner names it
    let labels = labels_of(&mut stage, &postgres);
    assert_eq!(labels.get(k::STATEFULSET), Some("postgres"), "{labels}");
    assert_eq!(labels.get(keys::SERVICE_NAME), Some("postgres"));
    assert_eq!(
        labels.get("k8s.pod.label.statefulset.kubernetes.io/pod-name"),
        Some("postgres-0")
    );
    // a container no pod holds yet: labelled without k8s.*, counted as a miss
    let labels = labels_of(&mut stage, &report);
    assert_eq!(k8s_labels(&labels), [], "{labels}");
    assert_eq!(labels.get(keys::SERVICE_NAME), Some("report-gen"));
    assert_eq!(pods.stats().lookups_missed, 1);
    // a host process: no container, no lookup
    let labels = labels_of(&mut stage, &kubelet);
    assert_eq!(k8s_labels(&labels), [], "{labels}");
    assert_eq!(labels.get(keys::SERVICE_NAME), Some("kubelet"));
    assert_eq!(pods.stats().lookups_missed, 1);

    // When the watch brings the CronJob's pod, still without a container id (ADDED)
    let events: Vec<&str> = WATCH_EVENTS.lines().collect();
    let [bookmark, added, modified, deleted, expired] = events[..] else {
        panic!("five watch events in the fixture")
    };
    let before = pods.generation();
    for event in [bookmark, added] {
        server
            .events
            .send(event.into())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    wait_for("the ADDED pod", || pods.generation() != before);
    assert!(
        server.requests().iter().any(|r| r.contains("watch=true")
            && r.contains("fieldSelector=spec.nodeName%3Dnode-a")
            && r.contains("resourceVersion=48213")),
        "the watch resumes from the list's version: {:?}",
        server.requests()
    );
    // Then its process still has no k8s labels
    assert_eq!(k8s_labels(&labels_of(&mut stage, &report)), []);

    // When its container starts (MODIFIED with a containerID)
    let before = pods.generation();
    server
        .events
        .send(modified.into())
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for("the MODIFIED pod", || pods.generation() != before);
    // Then the same process (same pid and start time, labels cached) gets its pod's labels:
    // the Job, the CronJob guessed from the Job's name, which names the service
    let labels = labels_of(&mut stage, &report);
    assert_eq!(labels.get(k::JOB), Some("report-29412345"), "{labels}");
    assert_eq!(labels.get(k::CRONJOB), Some("report"));
    assert_eq!(labels.get(k::NAMESPACE), Some("batch"));
    assert_eq!(labels.get(k::CONTAINER_NAME), Some("report"));
    assert_eq!(labels.get(keys::SERVICE_NAME), Some("report"));

    // When postgres-0 is deleted
    let before = pods.generation();
    server
        .events
        .send(deleted.into())
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for("the DELETED pod", || pods.generation() != before);
    // Then its process loses the pod's labels; the others keep theirs
    let labels = labels_of(&mut stage, &postgres);
    assert_eq!(k8s_labels(&labels), [], "{labels}");
    assert_eq!(labels.get(keys::SERVICE_NAME), Some("postgres"));
    assert_eq!(
        labels_of(&mut stage, &checkout).get(k::DEPLOYMENT),
        Some("checkout")
    );
    assert_eq!(pods.len(), (2, 5), "checkout (4 containers) and report");

    // When the watch expires (410 Gone) and the relist lacks the CronJob's pod (deleted while
    // the watch was down)
    *server.list.lock().unwrap_or_else(|e| panic!("lock: {e}")) = POD_RELIST;
    let before = pods.generation();
    server
        .events
        .send(expired.into())
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for("the relist", || pods.generation() != before);
    // Then the relist replaced the index: the pod's process loses its labels, the others stay
    assert_eq!(k8s_labels(&labels_of(&mut stage, &report)), []);
    assert_eq!(
        labels_of(&mut stage, &checkout).get(k::POD_NAME),
        Some("checkout-7d9f8b6c5d-x2k4p")
    );
    assert_eq!(pods.len(), (1, 4));
}

#[test]
fn an_unreachable_api_leaves_labels_without_kubernetes_and_counts_misses() {
    // Given an API address nothing listens on (connection refused)
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    let pods = super::watch::spawn(&settings(&format!("http://127.0.0.1:{port}")))
        .unwrap_or_else(|e| panic!("a URL needs no connection to configure: {e:#}"));
    let mut stage = stage(&pods, "[]");
    let app = process(
        7,
        "app",
        &systemd_driver_path("3f6b2c1e-8a47-4d2b-9c5e-7a1d0e9f4b21", CHECKOUT_APP),
    );
    // When the watcher has failed and a process in a container is labelled
    wait_for("the watcher's failure", || {
        pods.api_state() == ApiState::Unreachable
    });
    let labels = labels_of(&mut stage, &app);
    // Then it has every label but k8s.*, and the miss is counted, once per process
    assert_eq!(k8s_labels(&labels), [], "{labels}");
    assert_eq!(labels.get(keys::CONTAINER_ID), Some(CHECKOUT_APP));
    assert_eq!(labels.get(keys::SERVICE_NAME), Some("app"));
    assert_eq!(labels_of(&mut stage, &app), labels);
    assert_eq!(pods.stats().lookups_missed, 1);
    assert_eq!(pods.len(), (0, 0));
}

/// The join's cost, printed: `cargo test -p ember-relay --lib kubernetes_join_cost --
/// --ignored --nocapture`. 1,000 processes, each in a container of one of 1,000 known pods
/// (10 pod labels each): labels computed cold without and with the provider, and the cost of a
/// pod change (the stage recomputes every process once).
#[test]
#[ignore = "a measurement, not a check: run it by name"]
fn kubernetes_join_cost() {
    use super::{ContainerLabels, PodEntries};
    let pods = Pods::new();
    let id = |i: u32| format!("{i:064x}");
    for i in 0..1000u32 {
        let mut labels: Labels = [
            (k::NAMESPACE, "shop".to_owned()),
            (k::POD_NAME, format!("web-{i}")),
            (k::POD_UID, format!("uid-{i}")),
            (k::CONTAINER_NAME, "app".to_owned()),
            (k::DEPLOYMENT, "web".to_owned()),
        ]
        .into_iter()
        .collect();
        for l in 0..10 {
            labels.set(format!("k8s.pod.label.key-{l}"), format!("value-{l}"));
        }
        let entries: PodEntries = vec![(
            id(i),
            Arc::new(ContainerLabels {
                labels,
                owner_name: Some("web".into()),
                container_name: "app".into(),
                ..ContainerLabels::default()
            }),
        )];
        pods.apply(&format!("uid-{i}"), entries);
    }
    let records: Vec<ProcessRecord> = (0..1000u32)
        .map(|i| {
            process(
                i + 10,
                "web",
                &systemd_driver_path(&format!("uid-{i}"), &id(i)),
            )
        })
        .collect();
    let run = |stage: &mut LabelStage| {
        let started = Instant::now();
        for r in &records {
            std::hint::black_box(stage.resource("node-a", r));
        }
        started.elapsed()
    };
    let mut plain = LabelStage::new(LabelSettings::default(), UserNames::default(), None);
    let without = run(&mut plain);
    let mut joined = stage(&pods, "[]");
    let with = run(&mut joined);
    let warm = run(&mut joined);
    pods.delete("uid-0");
    let after_change = run(&mut joined);
    assert_eq!(pods.stats().lookups_found, 2 * 1000 - 1);
    eprintln!(
        "k8s join, 1,000 processes x 1,000 pods ({} build): cold without {without:?}, cold with \
         {with:?} ({:?}/process more), warm {warm:?}, after a pod change {after_change:?}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        with.saturating_sub(without) / 1000
    );
}

#[test]
fn a_forged_container_id_joins_no_pod() {
    // Given the index holding the checkout pod's app container
    let pods = Pods::new();
    let found = Arc::new(super::ContainerLabels {
        labels: [(k::NAMESPACE, "shop"), (k::POD_NAME, "checkout-0")]
            .into_iter()
            .collect(),
        container_name: "app".into(),
        ..super::ContainerLabels::default()
    });
    pods.apply("pod-uid", vec![(CHECKOUT_APP.to_owned(), found)]);
    let mut stage = stage(&pods, "[]");
    // When a user's process claims that container: by the cgroup she made in her delegated
    // subtree, and by her environment
    let delegated = process(
        10,
        "eve",
        &format!("0::/user.slice/user-1001.slice/user@1001.service/app.slice/cri-containerd-{CHECKOUT_APP}.scope"),
    );
    let mut claimed = process(11, "eve", "0::/user.slice/user-1001.slice/session-2.scope");
    claimed.env.otel_resource_attributes = Some(format!("container.id={CHECKOUT_APP}"));
    // Then neither gets the pod's labels, nor the container id
    for record in [&delegated, &claimed] {
        let labels = labels_of(&mut stage, record);
        assert_eq!(k8s_labels(&labels), [], "{labels}");
        assert_eq!(labels.get(keys::CONTAINER_ID), None, "{labels}");
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("eve"), "{labels}");
    }
    // While the container's own process, in root's cgroup, does
    let real = process(12, "app", &systemd_driver_path("pod-uid", CHECKOUT_APP));
    let labels = labels_of(&mut stage, &real);
    assert_eq!(labels.get(k::POD_NAME), Some("checkout-0"), "{labels}");
}
