//! One process's resource labels, before relabeling: every provider merged in a fixed order, and
//! `service.name` chosen by [`super::service`]'s precedence (ranks 2-10) so rules can read it.
//!
//! Merge order, later wins: the process's own `OTEL_RESOURCE_ATTRIBUTES` (what the application
//! declares), then what the relay observes (host, process, cgroup: an application cannot
//! override its pid or container id through its environment), then the operator's static tags
//! (`--tags`, `labels:`), then `service.name`. The labels stage runs the rules on the result
//! (cached per process) and then [`restore_service_name`]. Pure: no I/O.

use super::{
    cgroup, keys,
    process::{self, ProcessFacts, UserNames},
    resource_env::{service_name_variable, MalformedAttributes, ResourceAttributes},
    service::{service_name, ServiceNameSource, ServiceNameSources},
    Labels,
};

/// The two variables the sampler's allowlist forwards from a process's environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessEnv {
    pub otel_service_name: Option<String>,
    pub otel_resource_attributes: Option<String>,
}

/// What is the same for every process: computed once, and again on reload.
#[derive(Clone, Debug, Default)]
pub struct Shared {
    /// [`host::labels`] of this machine.
    pub host: Labels,
    /// Static tags.
    pub tags: Labels,
    /// `--service-name`.
    pub default_service_name: Option<String>,
    pub users: UserNames,
}

/// What resolving one process found besides its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub service_name_source: ServiceNameSource,
    /// Why the process's `OTEL_RESOURCE_ATTRIBUTES` was discarded whole, if it was.
    pub discarded_attributes: Option<MalformedAttributes>,
}

/// The labels of a process before relabeling.
pub fn resource_labels(
    shared: &Shared,
    facts: &ProcessFacts,
    env: &ProcessEnv,
) -> (Labels, Report) {
    let (attributes, discarded_attributes) = match env
        .otel_resource_attributes
        .as_deref()
        .map(ResourceAttributes::parse)
    {
        Some(Ok(attributes)) => (attributes, None),
        Some(Err(malformed)) => (ResourceAttributes::default(), Some(malformed)),
        None => (ResourceAttributes::default(), None),
    };
    let mut labels = attributes.labels();
    labels.merge(&shared.host);
    labels.merge(&process::labels(facts, &shared.users));
    labels.merge(&shared.tags);
    let unit = cgroup::systemd_unit(&facts.cgroup);
    let (name, source) = service_name(&ServiceNameSources {
        otel_service_name: env
            .otel_service_name
            .as_deref()
            .and_then(service_name_variable),
        resource_attributes: attributes.service_name(),
        systemd_unit: unit.as_ref().map(|u| u.unit.as_str()),
        kernel_thread: facts.kernel_thread,
        default: shared.default_service_name.as_deref(),
        executable_name: Some(facts.executable_name.as_str()),
        ..ServiceNameSources::default()
    });
    labels.set(keys::SERVICE_NAME, name);
    let report = Report {
        service_name_source: source,
        discarded_attributes,
    };
    (labels, report)
}

/// After the rules: a process the rules kept always has a `service.name` (Pyroscope requires
/// one); if the rules removed it, the name chosen before them comes back.
pub fn restore_service_name(labels: &mut Labels, before_rules: &str) {
    labels.set_default(keys::SERVICE_NAME, before_rules);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        Shared {
            host: [("host.name", "node-1"), ("os.type", "linux")]
                .into_iter()
                .collect(),
            tags: [("env", "prod"), ("team", "platform")]
                .into_iter()
                .collect(),
            default_service_name: None,
            users: UserNames::parse("app:x:1000:1000::/:/bin/sh\n"),
        }
    }

    fn facts(name: &str, cgroup: &str) -> ProcessFacts {
        ProcessFacts {
            pid: 42,
            start_time_unix_ns: 7,
            executable_path: format!("/usr/bin/{name}"),
            executable_name: name.into(),
            uid: Some(1000),
            cgroup: cgroup.into(),
            command_line: None,
            kernel_thread: false,
        }
    }

    #[test]
    fn four_processes_four_service_names() {
        let shared = shared();
        let env = |name: Option<&str>, attrs: Option<&str>| ProcessEnv {
            otel_service_name: name.map(Into::into),
            otel_resource_attributes: attrs.map(Into::into),
        };
        let cases = [
            (
                facts("worker", ""),
                env(Some("billing"), None),
                "billing",
                ServiceNameSource::OtelServiceName,
            ),
            (
                facts("worker", ""),
                env(None, Some("service.name=ledger,team=finance")),
                "ledger",
                ServiceNameSource::ResourceAttributes,
            ),
            (
                facts("nginx", "/system.slice/nginx.service"),
                env(None, None),
                "nginx",
                ServiceNameSource::Systemd,
            ),
            (
                facts("worker", "/user.slice"),
                env(None, None),
                "worker",
                ServiceNameSource::Executable,
            ),
        ];
        for (facts, env, name, source) in cases {
            let (labels, report) = resource_labels(&shared, &facts, &env);
            assert_eq!(labels.get(keys::SERVICE_NAME), Some(name), "{labels}");
            assert_eq!(report.service_name_source, source);
            assert_eq!(labels.get("host.name"), Some("node-1"));
            assert_eq!(labels.get(keys::PROCESS_OWNER), Some("app"));
        }
        let (labels, report) = resource_labels(
            &shared,
            &facts("worker", ""),
            &env(None, Some("service.name=ledger,team=finance")),
        );
        assert_eq!(report.discarded_attributes, None);
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("ledger"));
        // The operator's tag wins over the application's own attribute.
        assert_eq!(labels.get("team"), Some("platform"));
        // A malformed value is discarded whole (its service.name too); OTEL_SERVICE_NAME stays
        let (labels, report) = resource_labels(
            &shared,
            &facts("worker", ""),
            &env(
                Some("from-env"),
                Some("service.name=ledger,cost.center=42,bad"),
            ),
        );
        assert_eq!(report.discarded_attributes.map(|m| m.position), Some(3));
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("from-env"));
        assert_eq!(labels.get("cost.center"), None);
        let (labels, _) = resource_labels(
            &shared,
            &facts("worker", ""),
            &env(None, Some("service.name=ledger,bad")),
        );
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("worker"));
    }

    #[test]
    fn observed_facts_win_over_the_environment() {
        let env = ProcessEnv {
            otel_service_name: None,
            otel_resource_attributes: Some(
                "process.pid=1,host.name=spoofed,deployment.environment.name=qa".into(),
            ),
        };
        let (labels, _) = resource_labels(&shared(), &facts("app", ""), &env);
        assert_eq!(labels.get(keys::PROCESS_PID), Some("42"));
        assert_eq!(labels.get(keys::HOST_NAME), Some("node-1"));
        assert_eq!(labels.get("deployment.environment.name"), Some("qa"));
    }

    #[test]
    fn a_process_cannot_plant_meta_labels() {
        let env = ProcessEnv {
            otel_service_name: None,
            otel_resource_attributes: Some("__meta_process_cgroup=/fake.slice,ok=1".into()),
        };
        let (labels, _) = resource_labels(&shared(), &facts("app", ""), &env);
        assert_eq!(labels.get(keys::META_PROCESS_CGROUP), None, "{labels}");
        assert_eq!(labels.get("ok"), Some("1"));
    }

    #[test]
    fn service_name_survives_rules_that_remove_it() {
        let mut labels: Labels = [("a", "1")].into_iter().collect();
        restore_service_name(&mut labels, "before");
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("before"));
        restore_service_name(&mut labels, "other");
        assert_eq!(
            labels.get(keys::SERVICE_NAME),
            Some("before"),
            "a rule's name stays"
        );
    }
}
