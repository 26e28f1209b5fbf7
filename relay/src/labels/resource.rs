//! One process's resource labels, before relabeling: every provider merged in a fixed order, and
//! `service.name` chosen by [`super::service`]'s precedence (ranks 2-10) so rules can read it.
//!
//! Trust, highest first: the operator (static tags, rules), what the kernel and the cluster
//! observe (host, process, cgroups root named, Kubernetes), and last what the process controls
//! (its `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`, the cgroups delegated to its user).
//! Merge order, later wins: the process's own attributes, minus every reserved name
//! ([`super::is_reserved`]: `k8s.*`, `container.*`, `host.*`, `process.*`, ... are dropped and
//! reported as claims, so they can neither override nor stand in for an observed attribute nor
//! join another pod's labels), then what the relay observes, then the operator's static tags
//! (`--tags`, `labels:`), then `service.name`. The names whose values the process chose are
//! reported ([`Report::supplied`]) so that Pyroscope's label cap drops them first. A process
//! whose uid is unknown (`process.owner` = `unknown`) claims nothing: its environment is not
//! read. The labels stage runs the rules on the result (cached per process) and then
//! [`restore_service_name`]. Pure: no I/O.

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
    /// Reserved names the process claimed in `OTEL_RESOURCE_ATTRIBUTES`, dropped (sorted).
    pub claims_dropped: Vec<String>,
    /// Labels whose value the process chose: its own attributes the operator's tags did not
    /// replace, and the unit and slice it made in a delegated cgroup.
    pub supplied: Vec<String>,
}

/// The labels of a process before relabeling.
pub fn resource_labels(
    shared: &Shared,
    facts: &ProcessFacts,
    env: &ProcessEnv,
) -> (Labels, Report) {
    let no_env = ProcessEnv::default();
    let env = if facts.uid.is_some() { env } else { &no_env };
    let (attributes, discarded_attributes) = match env
        .otel_resource_attributes
        .as_deref()
        .map(ResourceAttributes::parse)
    {
        Some(Ok(attributes)) => (attributes, None),
        Some(Err(malformed)) => (ResourceAttributes::default(), Some(malformed)),
        None => (ResourceAttributes::default(), None),
    };
    let (mut labels, claims_dropped) = attributes.labels();
    let mut supplied: Vec<String> = labels
        .iter()
        .filter(|(name, _)| !shared.tags.contains(name))
        .map(|(name, _)| name.to_owned())
        .collect();
    labels.merge(&shared.host);
    labels.merge(&process::labels(facts, &shared.users));
    labels.merge(&shared.tags);
    for name in [keys::SYSTEMD_USER_UNIT, keys::SYSTEMD_USER_SLICE] {
        if labels.contains(name) && !shared.tags.contains(name) {
            supplied.push(name.to_owned());
        }
    }
    let unit = cgroup::naming_unit(&facts.cgroup);
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
        claims_dropped,
        supplied,
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
    fn a_process_cannot_claim_what_the_relay_or_the_cluster_observes() {
        // Given a process claiming another pod, a container id, another host and owner, with
        // an attribute of its own
        let env = ProcessEnv {
            otel_service_name: Some("nginx".into()),
            otel_resource_attributes: Some(
                "k8s.namespace.name=kube-system,k8s.pod.name=coredns-0,container.id=abc,\
                 host.id=0000,process.owner=root,process_owner=root,team=web"
                    .into(),
            ),
        };
        let facts = ProcessFacts {
            uid: Some(4242),
            ..facts("worker", "/user.slice/user-4242.slice/session-3.scope")
        };
        // When its labels are resolved
        let (labels, report) = resource_labels(&shared(), &facts, &env);
        // Then no claim stands, each is reported, and what is observed is there
        for name in [
            "k8s.namespace.name",
            "k8s.pod.name",
            "container.id",
            "process_owner",
        ] {
            assert_eq!(labels.get(name), None, "{name}: {labels}");
        }
        assert_eq!(
            report.claims_dropped,
            [
                "container.id",
                "host.id",
                "k8s.namespace.name",
                "k8s.pod.name",
                "process.owner",
                "process_owner"
            ]
        );
        assert_eq!(labels.get(keys::PROCESS_OWNER), Some("4242"));
        assert_eq!(
            labels.get(keys::HOST_ID),
            None,
            "no machine id in this test"
        );
        assert_eq!(
            labels.get(keys::SERVICE_NAME),
            Some("nginx"),
            "it may name itself"
        );
        // And only its own attribute counts as supplied (the tag replaced `team`)
        assert_eq!(labels.get("team"), Some("platform"));
        assert!(report.supplied.is_empty(), "{:?}", report.supplied);
    }

    #[test]
    fn a_process_whose_uid_is_unknown_claims_nothing() {
        let env = ProcessEnv {
            otel_service_name: Some("nginx".into()),
            otel_resource_attributes: Some("tier=web".into()),
        };
        let facts = ProcessFacts {
            uid: None,
            ..facts("worker", "")
        };
        let (labels, report) = resource_labels(&shared(), &facts, &env);
        assert_eq!(
            labels.get(keys::PROCESS_OWNER),
            Some(process::UNKNOWN_OWNER)
        );
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("worker"));
        assert_eq!(labels.get("tier"), None);
        assert_eq!(report.service_name_source, ServiceNameSource::Executable);
    }

    #[test]
    fn a_delegated_cgroup_gives_user_scoped_labels_only() {
        // Given a process in a unit and container scope its user made under her manager
        let id = "3f4b7a1c9e2d8f6a0b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";
        let cgroup = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/nginx.service/docker-{id}.scope"
        );
        let env = ProcessEnv {
            otel_service_name: None,
            otel_resource_attributes: Some("tier=web".into()),
        };
        // When its labels are resolved
        let (labels, report) = resource_labels(&shared(), &facts("worker", &cgroup), &env);
        // Then no container, her manager as the system unit, her unit as hers
        assert_eq!(labels.get(keys::CONTAINER_ID), None, "{labels}");
        assert_eq!(labels.get(keys::SYSTEMD_UNIT), Some("user@1000.service"));
        assert_eq!(labels.get(keys::SYSTEMD_USER_UNIT), Some("nginx.service"));
        // And her unit names her service, as her OTEL_SERVICE_NAME could; both are supplied
        assert_eq!(labels.get(keys::SERVICE_NAME), Some("nginx"));
        assert_eq!(report.supplied, ["tier", keys::SYSTEMD_USER_UNIT]);
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
