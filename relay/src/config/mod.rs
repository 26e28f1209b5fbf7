//! The relay's YAML config file (`--config FILE`), shaped like an OpenTelemetry Collector
//! config: the schema's root, which gathers the sections their owners define and resolve.
//!
//! ```yaml
//! exporters:
//!   otlp:
//!     endpoint: http://pyroscope:4040
//!     protocol: grpc          # grpc | http
//!     proto_version: "1.9"    # "1.9" (Pyroscope 1.18/1.19, Collector <= 0.147) | "1.10"
//!     headers: { X-Scope-OrgID: team-a }
//!   debug:
//!     verbosity: detailed
//! labels: { env: prod }       # static tags on every profile (crate::labels::tags)
//! process_filter: "nginx|api" # only these executables (anchored regex)
//! relabel_configs:            # Prometheus relabeling (crate::relabel::config)
//!   - source_labels: [systemd.unit]
//!     regex: (.+)\.service
//!     target_label: service.name
//! kubernetes:                 # k8s.* labels (crate::labels::kubernetes); on by default in a pod
//!   enabled: true
//! metrics:                    # /metrics, /healthz, /readyz (crate::metrics)
//!   address: 0.0.0.0:17471    # HOST:PORT or off
//! off_cpu:                    # off-CPU time as a second sample type (docs/offcpu.md)
//!   enabled: true
//!   min: 1ms                  # waits shorter than this are sampled, weighed to stay unbiased
//! ```
//!
//! The label sections are resolved with the label flags in [`labels`]; `run` reloads them on
//! SIGHUP and when the file changes ([`reload`]).
//!
//! Each sink owns its section's type and resolution: `exporters:` is
//! [`crate::sink::exporters`], over [`crate::sink::otlp::config`] and
//! [`crate::sink::debug::config`]; [`crate::layers`] holds what every section shares (errors,
//! durations, the precedence flag > file > environment > default). The command layer (`cli`)
//! hands each owner its section.

pub mod labels;
pub mod reload;

use std::path::Path;

use serde::Deserialize;

use crate::{layers::ConfigError, sink::exporters::ExportersConfig};

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Where profiles go besides the local files.
    #[serde(default)]
    pub exporters: ExportersConfig,
    /// Static tags added to every profile (`--tags` wins on a shared key).
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Export only processes whose executable name matches (anchored regex).
    pub process_filter: Option<String>,
    /// Prometheus relabel rules, run once per process on its labels.
    #[serde(default)]
    pub relabel_configs: Vec<crate::relabel::RelabelConfig>,
    /// Kubernetes labels (crate::labels::kubernetes::KubernetesConfig).
    #[serde(default)]
    pub kubernetes: crate::labels::kubernetes::KubernetesConfig,
    /// The relay's own metrics and health endpoint (`address: HOST:PORT | off`).
    #[serde(default)]
    pub metrics: crate::metrics::MetricsConfig,
    /// Off-CPU time (`--off-cpu`, `--off-cpu-min` win over it).
    #[serde(default)]
    pub off_cpu: OffCpuConfig,
}

/// `off_cpu:`: whether off-CPU time is recorded, and the minimum wait kept whole.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffCpuConfig {
    /// Record off-CPU time (`--off-cpu`).
    #[serde(default)]
    pub enabled: bool,
    /// Waits at least this long are kept whole, shorter ones sampled (`--off-cpu-min`), e.g.
    /// `1ms`, `200us`.
    #[serde(default, deserialize_with = "off_cpu_min")]
    pub min: Option<std::time::Duration>,
}

/// `--off-cpu-min`'s default: 1 ms. A thread blocked all the time then costs at most about a
/// thousand stack walks a second however short its waits, while any wait of 1 ms or more (a
/// lock held across I/O, a sleep, a full pool) is kept whole with its own stack.
pub const DEFAULT_OFF_CPU_MIN: std::time::Duration = std::time::Duration::from_millis(1);

fn off_cpu_min<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<std::time::Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    ember_common::parse_off_cpu_min(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// Alias of [`RelayConfig`] for callers outside the file's own sections.
pub type Config = RelayConfig;

impl RelayConfig {
    /// [`load`] as a method: the file at `path`, parsed and checked.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load(path)
    }
}

/// Parses a config file's text; `path` names it in errors.
/// The label sections are checked here too (tags, filter, every relabel rule with its index and
/// reason), so `validate`, `run` and `record` refuse a bad file alike.
pub fn parse(text: &str, path: &str) -> Result<RelayConfig, ConfigError> {
    let config: RelayConfig = serde_saphyr::from_str(text).map_err(|err| ConfigError::Parse {
        path: path.to_owned(),
        message: err.to_string(),
    })?;
    crate::labels::stage::LabelSettings::from_file(
        &config.labels,
        config.process_filter.as_deref(),
        &config.relabel_configs,
    )
    .map_err(|err| ConfigError::Parse {
        path: path.to_owned(),
        message: format!("{err:#}"),
    })?;
    Ok(config)
}

/// Reads and parses a config file.
pub fn load(path: &Path) -> Result<RelayConfig, ConfigError> {
    // As the `sudo` user, when root runs for one: a sudo rule for `record` must not read
    // root's files (a file that does not parse is quoted in the error).
    let invoker = crate::invoker_files::invoker();
    let text = crate::invoker_files::read_to_string(path, invoker).map_err(|source| {
        ConfigError::Read {
            path: path.display().to_string(),
            source,
        }
    })?;
    parse(&text, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        layers::Env,
        sink::{
            debug::Verbosity,
            exporters::{self, describe, warnings, Exporters},
            otlp::{config::OtlpFlags, transport::Protocol, ProtoVersion},
        },
    };

    /// The file's exporters resolved, as the command line does it.
    fn resolve(
        config: &RelayConfig,
        flags: &OtlpFlags,
        env: Env<'_>,
    ) -> Result<Exporters, ConfigError> {
        exporters::resolve(&config.exporters, flags, env)
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |key| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_off_cpu_section_reads_its_switch_and_minimum_and_refuses_the_rest() {
        // Given files with and without the section
        let on = parse("off_cpu:\n  enabled: true\n  min: 200us\n", "c.yaml").unwrap();
        let off = parse("labels: { env: prod }\n", "c.yaml").unwrap();
        // Then the switch and the minimum are read, and absent means off
        assert!(on.off_cpu.enabled);
        assert_eq!(on.off_cpu.min, Some(Duration::from_micros(200)));
        assert!(!off.off_cpu.enabled);
        assert_eq!(off.off_cpu.min, None);
        // And an unknown key or a minimum over 1s is refused with the file named
        for bad in ["off_cpu:\n  threshold: 1ms\n", "off_cpu:\n  min: 2s\n"] {
            let err = parse(bad, "c.yaml").unwrap_err().to_string();
            assert!(err.contains("c.yaml"), "{bad}: {err}");
        }
    }

    #[test]
    fn full_file_parses() {
        let config = parse(
            r#"
exporters:
  otlp:
    endpoint: http://pyroscope:4040
    protocol: grpc
    proto_version: "1.9"
    headers:
      X-Scope-OrgID: team-a
    compression: none
    timeout: 5s
    tls: { insecure: true }
    max_request_bytes: 1048576
    sending_queue: { queue_size_bytes: 8388608 }
    retry_on_failure: { initial_interval: 100ms, max_interval: 2s, max_elapsed_time: 1m }
    sample_attributes: { thread_name: false, tid: true }
    stats_interval: 10s
  debug:
    verbosity: detailed
"#,
            "test.yaml",
        )
        .unwrap();
        let resolved = resolve(&config, &OtlpFlags::default(), &env(&[])).unwrap();
        let otlp = resolved.otlp.unwrap();
        assert_eq!(otlp.transport.protocol, Protocol::Grpc);
        assert_eq!(otlp.transport.url.to_string(), "http://pyroscope:4040/");
        assert_eq!(otlp.encoding.version, ProtoVersion::V1_9);
        assert!(!otlp.transport.gzip);
        assert_eq!(otlp.transport.timeout, Duration::from_secs(5));
        assert_eq!(otlp.transport.headers[0].0.as_str(), "x-scope-orgid");
        assert_eq!(otlp.queue_bytes, 8 << 20);
        assert_eq!(otlp.retry.initial_interval, Duration::from_millis(100));
        assert!(!otlp.encoding.attributes.thread_name && otlp.encoding.attributes.tid);
        assert_eq!(resolved.debug.unwrap().verbosity, Verbosity::Detailed);
    }

    #[test]
    fn unknown_fields_and_bad_versions_are_refused_with_a_location() {
        let err = parse("exporters:\n  otlp:\n    endpont: x\n", "c.yaml").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("endpont"), "{text}");
        assert!(text.contains('3'), "no line number in: {text}");
        assert!(parse(
            "exporters:\n  otlp:\n    proto_version: \"2.0\"\n",
            "c.yaml"
        )
        .is_err());
        // Unquoted 1.10 is a YAML float; it must not silently become 1.1.
        let unquoted = parse("exporters:\n  otlp:\n    proto_version: 1.10\n", "c.yaml");
        if let Ok(config) = unquoted {
            assert_eq!(
                config.exporters.otlp.unwrap().proto_version,
                Some(ProtoVersion::V1_10)
            );
        }
    }

    #[test]
    fn environment_precedence_follows_the_spec() {
        let none = RelayConfig::default();
        // Nothing set: no exporter.
        assert!(resolve(&none, &OtlpFlags::default(), &env(&[]))
            .unwrap()
            .otlp
            .is_none());
        // The generic endpoint is a base URL: the signal path is appended.
        let generic = resolve(
            &none,
            &OtlpFlags::default(),
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/base/"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,b=x%20y"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ]),
        )
        .unwrap()
        .otlp
        .unwrap();
        assert_eq!(
            generic.transport.url.to_string(),
            "http://collector:4318/base/v1development/profiles"
        );
        assert_eq!(generic.transport.timeout, Duration::from_millis(2500));
        let b = &generic.transport.headers[1];
        assert_eq!((b.0.as_str(), b.1.to_str().unwrap()), ("b", "x y"));
        // The signal-specific endpoint wins and is used as is; the signal-specific protocol too.
        let specific = resolve(
            &none,
            &OtlpFlags::default(),
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4318"),
                (
                    "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                    "http://profiles:9999/custom",
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/protobuf"),
            ]),
        )
        .unwrap()
        .otlp
        .unwrap();
        assert_eq!(
            specific.transport.url.to_string(),
            "http://profiles:9999/custom"
        );
        assert_eq!(specific.transport.protocol, Protocol::Http);
        // Flags beat the file, which beats the environment.
        let file = parse(
            "exporters:\n  otlp:\n    endpoint: http://file:4040\n    headers: { a: file }\n",
            "c.yaml",
        )
        .unwrap();
        let flags = OtlpFlags {
            endpoint: Some("flag:4317".into()),
            protocol: Some(Protocol::Grpc),
            proto_version: Some(ProtoVersion::V1_9),
            headers: vec![("b".into(), "flag".into())],
            insecure: true,
        };
        let both = resolve(
            &file,
            &flags,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "a=env,c=env"),
            ]),
        )
        .unwrap()
        .otlp
        .unwrap();
        assert_eq!(both.transport.url.to_string(), "http://flag:4317/");
        assert_eq!(both.encoding.version, ProtoVersion::V1_9);
        let headers: Vec<(String, String)> = both
            .transport
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        assert_eq!(
            headers,
            vec![
                ("a".into(), "file".into()),
                ("b".into(), "flag".into()),
                ("c".into(), "env".into())
            ]
        );
        // http/json is refused, not silently replaced.
        assert!(resolve(
            &none,
            &OtlpFlags::default(),
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:1"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
            ])
        )
        .is_err());
    }

    #[test]
    fn credentials_over_plaintext_are_warned_about_and_userinfo_never_shown() {
        let with = |endpoint: &str, protocol: Protocol, headers: Vec<(String, String)>| {
            resolve(
                &RelayConfig::default(),
                &OtlpFlags {
                    endpoint: Some(endpoint.into()),
                    protocol: Some(protocol),
                    headers,
                    ..OtlpFlags::default()
                },
                &env(&[]),
            )
            .unwrap()
        };
        let secret = vec![("Authorization".to_owned(), "Bearer s3cret".to_owned())];
        // Headers over plain HTTP and over h2c: one warning naming the header and the fix.
        for protocol in [Protocol::Http, Protocol::Grpc] {
            let exporters = with("http://collector:4318", protocol, secret.clone());
            let warnings = warnings(&exporters);
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            assert!(warnings[0].contains("authorization"), "{}", warnings[0]);
            assert!(warnings[0].contains("https://"), "{}", warnings[0]);
            assert!(!warnings[0].contains("s3cret"), "{}", warnings[0]);
        }
        // Userinfo over plaintext, no headers: warned, and redacted everywhere it is shown.
        let exporters = with("http://user:pw@collector:4317", Protocol::Grpc, Vec::new());
        let warnings = warnings(&exporters);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("user:password"), "{}", warnings[0]);
        let described = describe(&exporters).join("\n");
        for text in [&warnings[0], &described] {
            assert!(!text.contains("pw@"), "{text}");
            assert!(text.contains("http://***@collector:4317"), "{text}");
        }
        // TLS, or nothing secret: no warning.
        assert!(exporters::warnings(&with("https://c:4317", Protocol::Grpc, secret)).is_empty());
        assert!(exporters::warnings(&with("http://c:4317", Protocol::Grpc, Vec::new())).is_empty());
        // A bad endpoint's error does not echo its userinfo.
        let err = resolve(
            &RelayConfig::default(),
            &OtlpFlags {
                endpoint: Some("ftp://user:pw@host".into()),
                ..OtlpFlags::default()
            },
            &env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(!err.contains("pw@") && err.contains("***@host"), "{err}");
    }
}
