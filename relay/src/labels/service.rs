//! `service.name`: the one place its precedence lives.
//!
//! | rank | source |
//! |---|---|
//! | 1 | relabel result (the `service.name` label the rules left) |
//! | 2 | the process's `OTEL_SERVICE_NAME` |
//! | 3 | `service.name` in the process's `OTEL_RESOURCE_ATTRIBUTES` |
//! | 4 | Kubernetes: the pod's `app.kubernetes.io/name` label |
//! | 5 | Kubernetes: the owner's name (Deployment, StatefulSet, DaemonSet, CronJob, Job) |
//! | 6 | Kubernetes: the container's name |
//! | 7 | the systemd service (`nginx.service` -> `nginx`; scopes are not services) |
//! | 8 | a kernel thread: `kernel` (its thread name is a sample attribute, never a service) |
//! | 9 | `--service-name` |
//! | 10 | the executable's name (never a thread's name) |
//! | 11 | `unknown_service` (the OpenTelemetry SDK's default) |
//!
//! A source that is empty or only whitespace counts as absent. The labels stage evaluates ranks
//! 2-11 first and gives the result to the rules as the `service.name` label, so a rule can read
//! and rewrite it; what the rules leave is rank 1. Pure: no I/O.

/// Every input of the precedence; `None` = not known for this process.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServiceNameSources<'a> {
    pub relabeled: Option<&'a str>,
    pub otel_service_name: Option<&'a str>,
    pub resource_attributes: Option<&'a str>,
    pub k8s_app_name_label: Option<&'a str>,
    pub k8s_owner_name: Option<&'a str>,
    pub k8s_container_name: Option<&'a str>,
    /// The systemd unit, as [`super::cgroup::systemd_unit`] names it (`nginx.service`).
    pub systemd_unit: Option<&'a str>,
    /// Whether the process is a kernel thread.
    pub kernel_thread: bool,
    /// `--service-name`.
    pub default: Option<&'a str>,
    pub executable_name: Option<&'a str>,
}

/// Which source named the service. Declared in rank order: a smaller one wins (the
/// Kubernetes provider compares its source with the one that named a process before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ServiceNameSource {
    Relabel,
    OtelServiceName,
    ResourceAttributes,
    KubernetesAppLabel,
    KubernetesOwner,
    KubernetesContainer,
    Systemd,
    KernelThread,
    Default,
    Executable,
    Unknown,
}

/// What names a service when nothing else does.
pub const UNKNOWN_SERVICE: &str = "unknown_service";
/// The one service of every kernel thread.
pub const KERNEL_SERVICE: &str = "kernel";

/// The service name of a process and where it came from.
pub fn service_name<'a>(sources: &ServiceNameSources<'a>) -> (&'a str, ServiceNameSource) {
    use ServiceNameSource as S;
    let systemd = sources
        .systemd_unit
        .and_then(|unit| unit.strip_suffix(".service"));
    [
        (sources.relabeled, S::Relabel),
        (sources.otel_service_name, S::OtelServiceName),
        (sources.resource_attributes, S::ResourceAttributes),
        (sources.k8s_app_name_label, S::KubernetesAppLabel),
        (sources.k8s_owner_name, S::KubernetesOwner),
        (sources.k8s_container_name, S::KubernetesContainer),
        (systemd, S::Systemd),
        (
            sources.kernel_thread.then_some(KERNEL_SERVICE),
            S::KernelThread,
        ),
        (sources.default, S::Default),
        (sources.executable_name, S::Executable),
    ]
    .into_iter()
    .find_map(|(name, source)| {
        let name = name?.trim();
        (!name.is_empty()).then_some((name, source))
    })
    .unwrap_or((UNKNOWN_SERVICE, S::Unknown))
}

#[cfg(test)]
mod tests {
    use super::{ServiceNameSource as S, *};

    #[test]
    fn precedence_table() {
        let all = ServiceNameSources {
            relabeled: Some("relabeled"),
            otel_service_name: Some("env-name"),
            resource_attributes: Some("attr-name"),
            k8s_app_name_label: Some("app-label"),
            k8s_owner_name: Some("deploy"),
            k8s_container_name: Some("container"),
            systemd_unit: Some("nginx.service"),
            kernel_thread: true,
            default: Some("flag"),
            executable_name: Some("exe"),
        };
        // Given every source, When each higher one is taken away in turn, Then the next one names
        // the service.
        type TakeAway = fn(&mut ServiceNameSources);
        let table: [(TakeAway, &str, S); 10] = [
            (|_| {}, "relabeled", S::Relabel),
            (|s| s.relabeled = None, "env-name", S::OtelServiceName),
            (
                |s| s.otel_service_name = Some("  "),
                "attr-name",
                S::ResourceAttributes,
            ),
            (
                |s| s.resource_attributes = None,
                "app-label",
                S::KubernetesAppLabel,
            ),
            (
                |s| s.k8s_app_name_label = Some(""),
                "deploy",
                S::KubernetesOwner,
            ),
            (
                |s| s.k8s_owner_name = None,
                "container",
                S::KubernetesContainer,
            ),
            (|s| s.k8s_container_name = None, "nginx", S::Systemd),
            (
                |s| s.systemd_unit = Some("session-2.scope"),
                "kernel",
                S::KernelThread,
            ),
            (|s| s.kernel_thread = false, "flag", S::Default),
            (|s| s.default = None, "exe", S::Executable),
        ];
        // And the order of the enum is the rank (the Kubernetes provider compares them).
        assert!(table.windows(2).all(|w| w[0].2 < w[1].2));
        assert!(table[table.len() - 1].2 < S::Unknown);
        let mut sources = all;
        for (take_away, name, source) in table {
            take_away(&mut sources);
            assert_eq!(service_name(&sources), (name, source), "{sources:?}");
        }
        sources.executable_name = None;
        assert_eq!(service_name(&sources), (UNKNOWN_SERVICE, S::Unknown));
        assert_eq!(
            service_name(&ServiceNameSources::default()),
            (UNKNOWN_SERVICE, S::Unknown)
        );
        // Whitespace around a name is not part of it.
        let padded = ServiceNameSources {
            otel_service_name: Some(" api "),
            ..ServiceNameSources::default()
        };
        assert_eq!(service_name(&padded), ("api", S::OtelServiceName));
    }
}
