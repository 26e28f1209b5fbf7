//! Container and systemd labels from a process's cgroup: `container.id` + `container.runtime`
//! for Docker, containerd (CRI and plain), CRI-O and Podman, under cgroup v1 and v2 and both
//! cgroup drivers (cgroupfs, systemd), and `systemd.unit` + `systemd.slice`.
//!
//! Input is the whole `/proc/PID/cgroup` text the sampler forwards unparsed (one
//! `hierarchy:controllers:path` line per hierarchy: a single `0::` line on cgroup v2, a dozen on
//! v1, both kinds on a hybrid host), or one bare path (what samplers before it sent: the `0::`
//! line's path). The container id and runtime come from any line's path (v1 controllers may
//! place a process deeper than `name=systemd`); the systemd unit and slice from the unified
//! line, `0::` (v2) or `name=systemd` (v1): the `0::` line wins unless it is the root while a
//! `name=systemd` line is not (a hybrid host whose unified hierarchy systemd does not use).
//!
//! Delegation: systemd gives every user's manager a cgroup subtree of her own,
//! `user@UID.service` (rootless Podman and Docker live there too), and she may create any
//! directory under it with any name. So a path is split at its first `user@UID.service`
//! segment: the segments up to and including it were named by root (systemd chose that name),
//! the ones below it by the user. `container.id`, `container.runtime`, `systemd.unit` and
//! `systemd.slice` come only from root's segments; a unit and slice below the delegation point
//! are the user's own names, `systemd.user_unit` and `systemd.user_slice`, and a container id
//! there is none (hers could copy another pod's and join its Kubernetes labels). The relay may
//! not see the host's cgroupfs (a sidecar in Kubernetes), so the rule reads the path alone; a
//! subtree delegated otherwise (a system unit with `Delegate=yes` and a non-root `User=`) is
//! not recognised (SECURITY.md states this limit).
//!
//! Pure string work, no I/O. Invariants: a container id is exactly 64 lowercase hex digits (what
//! every runtime here generates), so session scopes, user slices and pod slices never pass for
//! one; the `conmon` monitor scopes of CRI-O and Podman are not containers.

use super::{keys, Labels};

/// The container runtime a cgroup path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Runtime {
    Docker,
    Containerd,
    CriO,
    Podman,
}

impl Runtime {
    /// The `container.runtime` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Containerd => "containerd",
            Self::CriO => "cri-o",
            Self::Podman => "podman",
        }
    }
}

/// A container found in a cgroup path. The runtime is unknown for the bare-id layouts that more
/// than one runtime uses (`/kubepods/<qos>/pod<uid>/<id>` under the cgroupfs driver).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub runtime: Option<Runtime>,
}

/// A systemd unit (`nginx.service`, `session-2.scope`) and the slice that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemdUnit {
    pub unit: String,
    pub slice: Option<String>,
}

/// The labels of a cgroup: container id and runtime, systemd unit and slice (root's segments
/// only), the user's own unit and slice (below a delegation point), and the path itself as the
/// meta label `__meta_process_cgroup`.
pub fn labels(cgroup: &str) -> Labels {
    let mut labels = Labels::new();
    labels.set(
        keys::META_PROCESS_CGROUP,
        preferred_path(cgroup).unwrap_or(""),
    );
    if let Some(container) = container(cgroup) {
        labels.set(keys::CONTAINER_ID, container.id);
        if let Some(runtime) = container.runtime {
            labels.set(keys::CONTAINER_RUNTIME, runtime.as_str());
        }
    }
    if let Some(unit) = systemd_unit(cgroup) {
        labels.set(keys::SYSTEMD_UNIT, unit.unit);
        labels.set(keys::SYSTEMD_SLICE, unit.slice.unwrap_or_default());
    }
    if let Some(unit) = user_unit(cgroup) {
        labels.set(keys::SYSTEMD_USER_UNIT, unit.unit);
        labels.set(keys::SYSTEMD_USER_SLICE, unit.slice.unwrap_or_default());
    }
    labels
}

/// Whether a segment is a user manager's delegated cgroup, `user@UID.service`.
fn is_user_manager(segment: &str) -> bool {
    segment
        .strip_prefix("user@")
        .and_then(|rest| rest.strip_suffix(".service"))
        .is_some_and(|uid| !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()))
}

/// A path's segments, split after its first `user@UID.service`: root's segments (the delegation
/// point included), and the user's below it (`None`: nothing of the path is delegated).
fn split_delegated(path: &str) -> (Vec<&str>, Option<Vec<&str>>) {
    let mut segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.iter().position(|s| is_user_manager(s)) {
        Some(at) => {
            let user = segments.split_off(at + 1);
            (segments, Some(user))
        }
        None => (segments, None),
    }
}

/// The paths in `cgroup`: each line's path (after `hierarchy:controllers:` when present).
fn paths(cgroup: &str) -> impl Iterator<Item = (Option<&str>, &str)> {
    cgroup.lines().filter(|l| !l.trim().is_empty()).map(|line| {
        let mut parts = line.splitn(3, ':');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(hierarchy), Some(controllers), Some(path))
                if hierarchy.bytes().all(|b| b.is_ascii_digit()) && !hierarchy.is_empty() =>
            {
                (Some(controllers), path)
            }
            _ => (None, line),
        }
    })
}

/// The one path that places the process in systemd's tree: a lone path, else the cgroup v2
/// line (`0::`) unless it is the root and the v1 `name=systemd` line is not, else that line.
fn preferred_path(cgroup: &str) -> Option<&str> {
    let (mut unified, mut systemd) = (None, None);
    for (controllers, path) in paths(cgroup) {
        match controllers {
            None => return Some(path),
            Some("") => unified = unified.or(Some(path)),
            Some("name=systemd") => systemd = systemd.or(Some(path)),
            Some(_) => {}
        }
    }
    match (unified, systemd) {
        (Some("/"), Some(v1)) if v1 != "/" => Some(v1),
        (Some(v2), _) => Some(v2),
        (None, v1) => v1,
    }
}

/// The container a cgroup names, searching every hierarchy's path from the leaf up, in the
/// segments root named only (never below a delegation point).
pub fn container(cgroup: &str) -> Option<Container> {
    paths(cgroup).find_map(|(_, path)| container_in(&split_delegated(path).0))
}

fn container_in(segments: &[&str]) -> Option<Container> {
    segments.iter().enumerate().rev().find_map(|(i, segment)| {
        let segment = segment.strip_suffix(".scope").unwrap_or(segment);
        if is_container_id(segment) {
            // A bare id: only the cgroupfs Docker layout (`/docker/<id>`) says which runtime.
            let parent = i.checked_sub(1).and_then(|p| segments.get(p)).copied();
            let runtime = (parent == Some("docker")).then_some(Runtime::Docker);
            return Some(Container {
                id: segment.to_owned(),
                runtime,
            });
        }
        let (prefix, id) = segment.rsplit_once('-')?;
        let runtime = match prefix {
            "docker" => Runtime::Docker,
            "cri-containerd" | "containerd" | "nerdctl" => Runtime::Containerd,
            "crio" => Runtime::CriO,
            "libpod" => Runtime::Podman,
            // `crio-conmon-<id>`, `libpod-conmon-<id>`: the monitor beside the container.
            _ => return None,
        };
        is_container_id(id).then(|| Container {
            id: id.to_owned(),
            runtime: Some(runtime),
        })
    })
}

fn is_container_id(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The innermost systemd unit (`.service`, or a `.scope` that is not a container's) of the
/// unified path that root named (a user's manager, `user@UID.service`, at the deepest), with
/// the slice it sits in.
pub fn systemd_unit(cgroup: &str) -> Option<SystemdUnit> {
    unit_in(&split_delegated(preferred_path(cgroup)?).0)
}

/// The innermost unit, with its slice, that a user made below her delegation point
/// (`user@UID.service/app.slice/nginx.service` -> `nginx.service` in `app.slice`).
pub fn user_unit(cgroup: &str) -> Option<SystemdUnit> {
    unit_in(&split_delegated(preferred_path(cgroup)?).1?)
}

/// The unit that names the process's service: below a delegation point the user's own unit
/// (a name she chose, like her `OTEL_SERVICE_NAME`), never her manager's; else root's.
pub fn naming_unit(cgroup: &str) -> Option<SystemdUnit> {
    let (host, user) = split_delegated(preferred_path(cgroup)?);
    unit_in(user.as_deref().unwrap_or(&host))
}

fn unit_in(segments: &[&str]) -> Option<SystemdUnit> {
    let (at, unit) = segments.iter().enumerate().rev().find(|(_, s)| {
        s.ends_with(".service") || (s.ends_with(".scope") && container_in(&[s]).is_none())
    })?;
    let slice = segments
        .get(..at)
        .and_then(|before| before.iter().rev().find(|s| s.ends_with(".slice")));
    Some(SystemdUnit {
        unit: (*unit).to_owned(),
        slice: slice.map(|s| (*s).to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4b7a1c9e2d8f6a0b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";

    fn found(path: &str) -> Option<(String, Option<&'static str>)> {
        container(path).map(|c| (c.id, c.runtime.map(Runtime::as_str)))
    }

    #[test]
    fn docker_paths_v1_and_v2_both_drivers() {
        for path in [
            // cgroup v2, systemd driver (the default on current distributions).
            format!("0::/system.slice/docker-{ID}.scope"),
            // cgroup v1, cgroupfs driver: one line per hierarchy.
            format!("12:pids:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}"),
            // cgroup v2, cgroupfs driver.
            format!("/docker/{ID}"),
            // Kubernetes with dockershim and the systemd driver.
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8695_a4b3c2d1e0f9.slice/docker-{ID}.scope"),
        ] {
            assert_eq!(found(&path), Some((ID.to_owned(), Some("docker"))), "{path}");
        }
    }

    #[test]
    fn containerd_paths() {
        for path in [
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod7c3b1f2e_9a8d_4c6b_b5e4_1d2c3b4a5f6e.slice/cri-containerd-{ID}.scope"),
            format!("0::/kubepods.slice/kubepods-pod7c3b1f2e_9a8d_4c6b_b5e4_1d2c3b4a5f6e.slice/cri-containerd-{ID}.scope"),
            // Plain containerd (nerdctl, systemd driver).
            format!("/nerdctl.slice/nerdctl-{ID}.scope"),
        ] {
            assert_eq!(found(&path), Some((ID.to_owned(), Some("containerd"))), "{path}");
        }
        // cgroupfs driver (k3s, kind): a bare id under the pod; several runtimes use it.
        for path in [
            format!("/kubepods/besteffort/pod7c3b1f2e-9a8d-4c6b-b5e4-1d2c3b4a5f6e/{ID}"),
            format!("11:memory:/kubepods/burstable/pod7c3b1f2e-9a8d-4c6b-b5e4-1d2c3b4a5f6e/{ID}"),
        ] {
            assert_eq!(found(&path), Some((ID.to_owned(), None)), "{path}");
        }
    }

    #[test]
    fn cri_o_paths_and_its_conmon_is_no_container() {
        for path in [
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c3b1f2e_9a8d_4c6b_b5e4_1d2c3b4a5f6e.slice/crio-{ID}.scope"),
            format!("0::/kubepods.slice/kubepods-pod7c3b1f2e_9a8d_4c6b_b5e4_1d2c3b4a5f6e.slice/crio-{ID}.scope/container"),
            format!("4:pids:/kubepods/burstable/pod7c3b1f2e-9a8d-4c6b-b5e4-1d2c3b4a5f6e/crio-{ID}"),
        ] {
            assert_eq!(found(&path), Some((ID.to_owned(), Some("cri-o"))), "{path}");
        }
        let conmon = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c3b1f2e_9a8d_4c6b_b5e4_1d2c3b4a5f6e.slice/crio-conmon-{ID}.scope");
        assert_eq!(found(&conmon), None);
    }

    #[test]
    fn podman_paths_rootful_rootless_v1() {
        for path in [
            format!("0::/machine.slice/libpod-{ID}.scope"),
            // A container with its own cgroup namespace / systemd inside: one level deeper.
            format!("/machine.slice/libpod-{ID}.scope/container"),
            format!("3:cpu,cpuacct:/libpod_parent/libpod-{ID}"),
        ] {
            assert_eq!(
                found(&path),
                Some((ID.to_owned(), Some("podman"))),
                "{path}"
            );
        }
        assert_eq!(
            found(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            None
        );
    }

    #[test]
    fn no_container_on_host_paths() {
        for path in [
            "",
            "/",
            "0::/init.scope",
            "/user.slice/user-1000.slice/session-2.scope",
            "/system.slice/docker.service",
            "/system.slice/nginx.service",
            // A hybrid v1/v2 host (this project's build sandbox): a 32-hex job id is no container.
            "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/f5e88c6bcc80acacde0e02b51740c084\n1:cpu:/\n0::/",
            // Too short, upper case: not an id.
            "/docker/3f4b7a1c9e2d",
            "/docker/3F4B7A1C9E2D8F6A0B5C4D3E2F1A0B9C8D7E6F5A4B3C2D1E0F9A8B7C6D5E4F3A",
        ] {
            assert_eq!(found(path), None, "{path}");
        }
    }

    #[test]
    fn a_users_delegated_subtree_names_no_container_and_no_system_unit() {
        // Given paths below a user's manager, where she names every directory: rootless Docker
        // and Podman, and a forged unit holding a forged container scope (cgroup v2, and v1's
        // systemd and controller lines, relative to a sampler's cgroup namespace too)
        for text in [
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{ID}.scope"),
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
            format!("0::/user.slice/user-1001.slice/user@1001.service/nginx.service/docker-{ID}.scope"),
            format!("0::/../../user.slice/user-1001.slice/user@1001.service/nginx.service/{ID}"),
            format!("4:memory:/user.slice/user-1001.slice/user@1001.service/docker/{ID}\n\
                     1:name=systemd:/user.slice/user-1001.slice/user@1001.service/nginx.service/docker-{ID}.scope"),
        ] {
            // Then no container id, no system unit of hers: her manager's unit and slice
            assert_eq!(found(&text), None, "{text}");
            let labels = labels(&text);
            assert_eq!(labels.get(keys::CONTAINER_ID), None, "{text}");
            assert_eq!(labels.get(keys::CONTAINER_RUNTIME), None, "{text}");
            let unit = labels.get(keys::SYSTEMD_UNIT).unwrap_or_default();
            assert!(
                unit.starts_with("user@") && unit.ends_with(".service"),
                "{text}: {labels}"
            );
            assert!(
                labels
                    .get(keys::SYSTEMD_SLICE)
                    .is_some_and(|s| s.starts_with("user-")),
                "{text}: {labels}"
            );
        }
        // And the unit she made is hers, by its user-scoped name, naming her service
        let forged = format!(
            "0::/user.slice/user-1001.slice/user@1001.service/nginx.service/docker-{ID}.scope"
        );
        let labels = labels(&forged);
        assert_eq!(labels.get(keys::SYSTEMD_UNIT), Some("user@1001.service"));
        assert_eq!(labels.get(keys::SYSTEMD_USER_UNIT), Some("nginx.service"));
        assert_eq!(labels.get(keys::SYSTEMD_USER_SLICE), None);
        assert_eq!(
            naming_unit(&forged).map(|u| u.unit).as_deref(),
            Some("nginx.service")
        );
        // Her manager itself (init.scope) names no service; a system unit still does
        let manager = "0::/user.slice/user-1001.slice/user@1001.service/init.scope";
        assert_eq!(
            naming_unit(manager).map(|u| u.unit).as_deref(),
            Some("init.scope")
        );
        assert_eq!(
            naming_unit("0::/system.slice/nginx.service")
                .map(|u| u.unit)
                .as_deref(),
            Some("nginx.service")
        );
        // Only `user@<digits>.service` delegates: look-alikes are ordinary segments
        for path in [
            format!("/system.slice/user@.service/docker-{ID}.scope"),
            format!("/system.slice/user@x1.service/docker-{ID}.scope"),
            format!("/system.slice/xuser@1.service/docker-{ID}.scope"),
        ] {
            assert_eq!(
                found(&path),
                Some((ID.to_owned(), Some("docker"))),
                "{path}"
            );
        }
    }

    #[test]
    fn systemd_units_and_slices() {
        let unit = |path: &str| systemd_unit(path).map(|u| (u.unit, u.slice));
        let some = |u: &str, s: &str| Some((u.to_owned(), Some(s.to_owned())));
        assert_eq!(
            unit("/system.slice/nginx.service"),
            some("nginx.service", "system.slice")
        );
        assert_eq!(
            unit("0::/system.slice/getty@tty1.service"),
            some("getty@tty1.service", "system.slice")
        );
        assert_eq!(
            unit("/user.slice/user-1000.slice/session-2.scope"),
            some("session-2.scope", "user-1000.slice")
        );
        // Below a user's manager: the manager is the system unit, what she made is hers
        let user = |path: &str| user_unit(path).map(|u| (u.unit, u.slice));
        let terminal = "/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal.slice/vte-spawn-1b2c.scope";
        assert_eq!(unit(terminal), some("user@1000.service", "user-1000.slice"));
        assert_eq!(
            user(terminal),
            some("vte-spawn-1b2c.scope", "app-org.gnome.Terminal.slice")
        );
        let syncthing = "/user.slice/user-1000.slice/user@1000.service/app.slice/syncthing.service";
        assert_eq!(
            unit(syncthing),
            some("user@1000.service", "user-1000.slice")
        );
        assert_eq!(user(syncthing), some("syncthing.service", "app.slice"));
        assert_eq!(user("/system.slice/nginx.service"), None);
        // A service's own delegated sub-cgroup still belongs to the service.
        assert_eq!(
            unit("/system.slice/buildkitd.service/worker"),
            some("buildkitd.service", "system.slice")
        );
        assert_eq!(
            unit("0::/init.scope").map(|u| u.0),
            Some("init.scope".to_owned())
        );
        // cgroup v1: the name=systemd hierarchy places the process; the v2 line wins when both are there.
        assert_eq!(
            unit("12:pids:/user.slice\n1:name=systemd:/system.slice/cron.service"),
            some("cron.service", "system.slice")
        );
        assert_eq!(
            unit("1:name=systemd:/system.slice/cron.service\n0::/system.slice/nginx.service"),
            some("nginx.service", "system.slice")
        );
        // Containers and pods are not units of their own here.
        assert_eq!(unit(&format!("/system.slice/docker-{ID}.scope")), None);
        assert_eq!(
            unit(&format!(
                "/kubepods.slice/kubepods-besteffort.slice/cri-containerd-{ID}.scope"
            )),
            None
        );
        assert_eq!(unit("/"), None);
        assert_eq!(unit(""), None);
    }

    /// Whole `/proc/PID/cgroup` files of cgroup v1 hosts, as the sampler forwards them.
    mod v1_files {
        /// A CentOS 7 host (systemd 219), a process of nginx.service.
        pub const SYSTEMD_SERVICE: &str = "11:hugetlb:/\n10:memory:/system.slice/nginx.service\n\
            9:devices:/system.slice/nginx.service\n8:pids:/system.slice/nginx.service\n\
            7:perf_event:/\n6:cpuset:/\n5:net_prio,net_cls:/\n4:freezer:/\n\
            3:blkio:/system.slice/nginx.service\n2:cpuacct,cpu:/system.slice/nginx.service\n\
            1:name=systemd:/system.slice/nginx.service\n";

        /// A login session's shell on the same host.
        pub const SESSION: &str = "10:memory:/user.slice\n8:pids:/user.slice/user-1000.slice\n\
            2:cpuacct,cpu:/user.slice\n1:name=systemd:/user.slice/user-1000.slice/session-3.scope\n";

        /// Docker with the systemd cgroup driver (`ID` substituted).
        pub const DOCKER_SYSTEMD: &str = "12:pids:/system.slice/docker-ID.scope\n\
            11:memory:/system.slice/docker-ID.scope\n4:cpuset:/\n\
            2:cpu,cpuacct:/system.slice/docker-ID.scope\n1:name=systemd:/system.slice/docker-ID.scope\n";

        /// Kubernetes (kubelet with the systemd driver) under containerd's CRI plugin.
        pub const CRI_CONTAINERD: &str = "11:perf_event:/kubepods.slice/kubepods-burstable.slice/\
            kubepods-burstable-pod5f3c6f1e_8a0b_4c7d_9e2f_1a2b3c4d5e6f.slice/cri-containerd-ID.scope\n\
            10:memory:/kubepods.slice/kubepods-burstable.slice/\
            kubepods-burstable-pod5f3c6f1e_8a0b_4c7d_9e2f_1a2b3c4d5e6f.slice/cri-containerd-ID.scope\n\
            1:name=systemd:/kubepods.slice/kubepods-burstable.slice/\
            kubepods-burstable-pod5f3c6f1e_8a0b_4c7d_9e2f_1a2b3c4d5e6f.slice/cri-containerd-ID.scope\n";

        /// OpenShift 3 (CRI-O, systemd driver).
        pub const CRI_O: &str = "11:pids:/kubepods.slice/kubepods-besteffort.slice/\
            kubepods-besteffort-pod0a1b2c3d_4e5f_6a7b_8c9d_0e1f2a3b4c5d.slice/crio-ID.scope\n\
            3:cpuacct,cpu:/kubepods.slice/kubepods-besteffort.slice/\
            kubepods-besteffort-pod0a1b2c3d_4e5f_6a7b_8c9d_0e1f2a3b4c5d.slice/crio-ID.scope\n\
            1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/\
            kubepods-besteffort-pod0a1b2c3d_4e5f_6a7b_8c9d_0e1f2a3b4c5d.slice/crio-ID.scope\n";

        /// Rootful Podman on a v1 host (systemd cgroup manager).
        pub const PODMAN: &str = "10:memory:/machine.slice/libpod-ID.scope\n\
            5:pids:/machine.slice/libpod-ID.scope\n1:name=systemd:/machine.slice/libpod-ID.scope\n";

        /// Kubernetes with the cgroupfs driver (kubeadm on CentOS 7, Docker): a bare id in every
        /// hierarchy but the ones no controller of the pod uses.
        pub const CGROUPFS_POD: &str =
            "11:memory:/kubepods/burstable/pod7c3b1f2e-9a8d-4c6b-b5e4-1d2c3b4a5f6e/ID\n\
            7:perf_event:/\n\
            2:cpu,cpuacct:/kubepods/burstable/pod7c3b1f2e-9a8d-4c6b-b5e4-1d2c3b4a5f6e/ID\n\
            1:name=systemd:/kubepods/burstable/pod7c3b1f2e-9a8d-4c6b-b5e4-1d2c3b4a5f6e/ID\n";

        /// The same container seen from a host where only a controller's line names it (a
        /// runtime that skips `name=systemd`).
        pub const CONTROLLER_ONLY: &str = "4:memory:/docker/ID\n3:cpuset:/\n1:name=systemd:/\n";

        /// A hybrid host (Ubuntu 20.04) whose unified hierarchy mirrors the systemd tree.
        pub const HYBRID: &str = "12:pids:/system.slice/cron.service\n\
            1:name=systemd:/system.slice/cron.service\n0::/system.slice/cron.service\n";

        /// A hybrid host whose unified hierarchy is mounted but unused (this project's CI
        /// sandbox): the `0::` line is the root.
        pub const HYBRID_UNUSED_UNIFIED: &str =
            "9:name=systemd:/ember-test.slice/ember-test-42.service\n\
            8:pids:/\n4:memory:/process_api/f5e88c6bcc80acacde0e02b51740c084\n1:cpu:/\n0::/\n";
    }

    #[test]
    fn whole_v1_files_give_containers_from_any_line() {
        let with_id = |text: &str| text.replace("ID", ID);
        for (text, runtime) in [
            (v1_files::DOCKER_SYSTEMD, Some("docker")),
            (v1_files::CRI_CONTAINERD, Some("containerd")),
            (v1_files::CRI_O, Some("cri-o")),
            (v1_files::PODMAN, Some("podman")),
            (v1_files::CGROUPFS_POD, None),
            (v1_files::CONTROLLER_ONLY, Some("docker")),
        ] {
            let text = with_id(text);
            assert_eq!(found(&text), Some((ID.to_owned(), runtime)), "{text}");
            let labels = labels(&text);
            assert_eq!(labels.get(keys::CONTAINER_ID), Some(ID), "{text}");
            assert_eq!(labels.get(keys::CONTAINER_RUNTIME), runtime, "{text}");
        }
        for text in [
            v1_files::SYSTEMD_SERVICE,
            v1_files::SESSION,
            v1_files::HYBRID,
            v1_files::HYBRID_UNUSED_UNIFIED,
        ] {
            assert_eq!(found(text), None, "{text}");
        }
    }

    #[test]
    fn whole_v1_files_give_the_unit_of_the_systemd_line() {
        let unit = |text: &str| {
            let labels = labels(text);
            (
                labels.get(keys::SYSTEMD_UNIT).map(str::to_owned),
                labels.get(keys::SYSTEMD_SLICE).map(str::to_owned),
            )
        };
        let some = |u: &str, s: &str| (Some(u.to_owned()), Some(s.to_owned()));
        assert_eq!(
            unit(v1_files::SYSTEMD_SERVICE),
            some("nginx.service", "system.slice")
        );
        assert_eq!(
            unit(v1_files::SESSION),
            some("session-3.scope", "user-1000.slice")
        );
        assert_eq!(unit(v1_files::HYBRID), some("cron.service", "system.slice"));
        assert_eq!(
            unit(v1_files::HYBRID_UNUSED_UNIFIED),
            some("ember-test-42.service", "ember-test.slice")
        );
        assert_eq!(
            labels(v1_files::HYBRID_UNUSED_UNIFIED).get(keys::META_PROCESS_CGROUP),
            Some("/ember-test.slice/ember-test-42.service")
        );
        // A container's own scope is no unit, nor is a pod's bare path
        for text in [
            v1_files::DOCKER_SYSTEMD,
            v1_files::CRI_O,
            v1_files::PODMAN,
            v1_files::CGROUPFS_POD,
            v1_files::CONTROLLER_ONLY,
        ] {
            assert_eq!(unit(&text.replace("ID", ID)), (None, None), "{text}");
        }
        // A root unified line with a root systemd line: nothing
        assert_eq!(unit("1:name=systemd:/\n0::/\n"), (None, None));
    }

    #[test]
    fn labels_of_a_cgroup() {
        let labels = labels(&format!("0::/system.slice/docker-{ID}.scope"));
        assert_eq!(labels.get(keys::CONTAINER_ID), Some(ID));
        assert_eq!(labels.get(keys::CONTAINER_RUNTIME), Some("docker"));
        assert_eq!(labels.get(keys::SYSTEMD_UNIT), None);
        assert_eq!(
            labels.get(keys::META_PROCESS_CGROUP),
            Some(format!("/system.slice/docker-{ID}.scope").as_str())
        );
        let labels = super::labels("/system.slice/nginx.service");
        assert_eq!(labels.get(keys::SYSTEMD_UNIT), Some("nginx.service"));
        assert_eq!(labels.get(keys::SYSTEMD_SLICE), Some("system.slice"));
        assert_eq!(labels.get(keys::CONTAINER_ID), None);
    }
}
