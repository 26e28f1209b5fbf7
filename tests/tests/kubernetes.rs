//! Kubernetes labels end to end: two copies of the `spinner` workload moved into
//! container-shaped cgroups (the kubelet's systemd-driver layout under cgroup v2, with
//! containerd's `cri-containerd-<id>.scope`), profiled by the real sampler, and
//! `ember-relay run --kubernetes` against an API server in this test that serves the recorded
//! pod list of node-a (relay/src/labels/kubernetes/testdata/) and an open watch, exporting to a
//! real OTLP receiver. One workload's container id is a container of that list; the other's is
//! no pod's. Root only (eBPF, cgroups); holds `ebpf_lock()`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    net::{TcpListener, TcpStream},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use ember_tests::{
    otlp::{self, Receiver},
    *,
};

const POD_LIST: &str =
    include_str!("../../relay/src/labels/kubernetes/testdata/podlist-node-a.json");
/// The `app` container of the pod checkout-7d9f8b6c5d-x2k4p in POD_LIST.
const CHECKOUT_APP: &str = "4f1c2b7d9e8a6b5c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c";
const CHECKOUT_POD_UID: &str = "3f6b2c1e-8a47-4d2b-9c5e-7a1d0e9f4b21";
/// A container id no pod of POD_LIST holds.
const STRAY: &str = "0badc0de0badc0de0badc0de0badc0de0badc0de0badc0de0badc0de0badc0de";
const STRAY_POD_UID: &str = "11111111-2222-4333-8444-555555555555";

const TIMEOUT: Duration = Duration::from_secs(90);

/// The API server: the list answers with POD_LIST, a watch stays open without events.
fn serve_api() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            thread::spawn(move || answer(stream));
        }
    });
    url
}

fn answer(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                break;
            }
        }
        let target = request.split_whitespace().nth(1).unwrap_or("").to_owned();
        eprintln!("api server: GET {target}");
        let node_a = target.starts_with("/api/v1/pods?")
            && target.contains("fieldSelector=spec.nodeName%3Dnode-a");
        if !node_a {
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        } else if target.contains("watch=true") {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                  transfer-encoding: chunked\r\n\r\n",
            );
            // Open until the relay goes away.
            while reader.read_line(&mut String::new()).unwrap_or(0) > 0 {}
            return;
        } else {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                POD_LIST.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(POD_LIST.as_bytes());
        }
    }
}

/// The cgroup v2 hierarchy's mount point (pure v2, or the hybrid layout's `unified`).
fn cgroup2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|root| root.join("cgroup.controllers").exists())
}

/// Container-shaped cgroups, each holding one process; on drop, the processes go back to the
/// root cgroup and every directory created is removed, innermost first.
struct ContainerCgroups {
    root: PathBuf,
    /// Created directories, in creation order.
    created: Vec<PathBuf>,
    pids: Vec<u32>,
}

impl ContainerCgroups {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            created: Vec::new(),
            pids: Vec::new(),
        }
    }

    /// Moves `pid` into `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
    /// cri-containerd-<id>.scope`, as the kubelet's systemd cgroup driver and containerd make it.
    fn enter(&mut self, pod_uid: &str, id: &str, pid: u32) {
        let uid = pod_uid.replace('-', "_");
        let parts = [
            "kubepods.slice".to_owned(),
            "kubepods-burstable.slice".to_owned(),
            format!("kubepods-burstable-pod{uid}.slice"),
            format!("cri-containerd-{id}.scope"),
        ];
        let mut dir = self.root.clone();
        for part in parts {
            dir.push(part);
            if !dir.exists() {
                fs::create_dir(&dir)
                    .unwrap_or_else(|e| panic!("creating the cgroup {}: {e}", dir.display()));
                self.created.push(dir.clone());
            }
        }
        fs::write(dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", dir.display()));
        self.pids.push(pid);
    }
}

impl Drop for ContainerCgroups {
    fn drop(&mut self) {
        for pid in &self.pids {
            let _ = fs::write(self.root.join("cgroup.procs"), pid.to_string());
        }
        for dir in self.created.iter().rev() {
            if let Err(err) = fs::remove_dir(dir) {
                eprintln!("removing the cgroup {}: {err}", dir.display());
            }
        }
    }
}

#[test]
fn pod_labels_reach_the_receiver_for_a_process_in_a_pods_container() {
    if !privileged() {
        return;
    }
    let Some(cgroup_root) = cgroup2_root() else {
        skip("no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified");
        return;
    };
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // Given a workload in a container of a known pod and one in a container no pod holds
    let mut children = Vec::new();
    // Declared after the children: dropped first (even on a panic), so the processes leave the
    // cgroups before they are removed and killed.
    let mut cgroups = ContainerCgroups::new(&cgroup_root);
    for (name, pod_uid, id) in [
        ("k8s-app", CHECKOUT_POD_UID, CHECKOUT_APP),
        ("k8s-stray", STRAY_POD_UID, STRAY),
    ] {
        let path = dir.path().join(name);
        fs::copy(&workloads().spinner, &path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let mut command = Command::new(&path);
        command
            .arg("120")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let child = ChildGuard::spawn(name, &mut command);
        cgroups.enter(pod_uid, id, child.pid());
        children.push(child);
    }
    // And the relay asked for Kubernetes labels from the API server of this test
    let api = serve_api();
    let receiver = Receiver::grpc(None);
    let socket = dir.path().join("ember.sock");
    let relay = spawn_relay_run(
        "relay",
        &socket,
        &[
            "--kubernetes",
            "--node-name",
            "node-a",
            "--kubernetes-api-url",
            &api,
            "--process-filter",
            "k8s-app|k8s-stray",
            "--otlp-endpoint",
            &receiver.url(),
            "--otlp-protocol",
            "grpc",
            "--otlp-proto-version",
            "1.10",
        ],
    );
    relay.log.expect(0, TIMEOUT, "the pod list synced", |v| {
        message(v) == "Kubernetes pod list synced" && field_u64(v, "pods") == Some(2)
    });
    // When the sampler profiles the machine
    let (_sampler, _sampler_log) = spawn_sampler("sampler", &socket, &["--frequency", "99"]);
    let has = |received: &[otlp::Received], executable: &str| {
        received
            .iter()
            .flat_map(|r| otlp::decode_v1_10(&r.body).unwrap().resources)
            .any(|r| {
                r.attributes
                    .get("process.executable.name")
                    .map(String::as_str)
                    == Some(executable)
            })
    };
    assert!(
        receiver.wait_for(TIMEOUT, |r| has(r, "k8s-app") && has(r, "k8s-stray")),
        "both workloads did not arrive:\n{}",
        relay.log.text()
    );
    // Then the workload in checkout's `app` container carries its pod's labels, and the pod's
    // app.kubernetes.io/name names its service
    let resources: Vec<_> = receiver
        .received()
        .iter()
        .flat_map(|r| otlp::decode_v1_10(&r.body).unwrap().resources)
        .collect();
    let of = |executable: &str| {
        resources
            .iter()
            .find(|r| {
                r.attributes
                    .get("process.executable.name")
                    .map(String::as_str)
                    == Some(executable)
            })
            .map(|r| r.attributes.clone())
            .unwrap()
    };
    let app = of("k8s-app");
    for (name, value) in [
        ("service.name", "checkout-api"),
        ("container.id", CHECKOUT_APP),
        ("k8s.namespace.name", "shop"),
        ("k8s.pod.name", "checkout-7d9f8b6c5d-x2k4p"),
        ("k8s.pod.uid", CHECKOUT_POD_UID),
        ("k8s.container.name", "app"),
        ("k8s.node.name", "node-a"),
        ("k8s.deployment.name", "checkout"),
        ("k8s.pod.label.app.kubernetes.io/part-of", "shop"),
    ] {
        assert_eq!(
            app.get(name).map(String::as_str),
            Some(value),
            "{name} of k8s-app: {app:?}"
        );
    }
    assert!(!app.keys().any(|k| k.starts_with("__")), "{app:?}");
    // And the other has its container id but no k8s.* labels, and was counted as a miss
    let stray = of("k8s-stray");
    assert_eq!(
        stray.get("container.id").map(String::as_str),
        Some(STRAY),
        "{stray:?}"
    );
    assert!(!stray.keys().any(|k| k.starts_with("k8s.")), "{stray:?}");
    assert_eq!(
        stray.get("service.name").map(String::as_str),
        Some("k8s-stray")
    );
    relay
        .log
        .expect(0, TIMEOUT, "the missed lookup logged", |v| {
            message(v).starts_with("k8s lookups missed") && field_u64(v, "missed") >= Some(1)
        });
    drop(cgroups);
    drop(children);
}
