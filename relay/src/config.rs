//! The relay's YAML config file (`--config FILE`), shaped like an OpenTelemetry Collector
//! config, and its resolution with the standard `OTEL_EXPORTER_OTLP_*` environment variables and
//! the command-line flags into exporter [`Settings`].
//!
//! ```yaml
//! exporters:
//!   otlp:
//!     endpoint: http://pyroscope:4040
//!     protocol: grpc          # grpc | http
//!     proto_version: "1.9"    # "1.9" (Pyroscope 1.18, Collector <= 0.147) | "1.10"
//!     headers: { X-Scope-OrgID: team-a }
//!   debug:
//!     verbosity: detailed
//! ```
//!
//! Precedence, per setting: command-line flag > config file > `OTEL_EXPORTER_OTLP_PROFILES_*` >
//! `OTEL_EXPORTER_OTLP_*` > default. Headers are merged by name in the same order (a later
//! source overrides one name, not the whole set). The exporter is enabled by an `exporters.otlp`
//! section, by an `--otlp-*` flag, or by `OTEL_EXPORTER_OTLP_[PROFILES_]ENDPOINT`.
//!
//! Resolution reads the TLS files named here, so it runs before the relay drops privileges.

use std::{collections::BTreeMap, fmt, path::Path, time::Duration};

use http::{HeaderName, HeaderValue, Uri};
use serde::{Deserialize, Deserializer};

use crate::sink::{
    debug::{DebugSettings, Verbosity},
    otlp::{
        exporter::{RetrySettings, Settings},
        transport::{self, Protocol, TlsMaterial, TransportSettings},
        ProtoVersion, SampleAttributes, DEFAULT_MAX_REQUEST_BYTES, HTTP_PATH,
    },
};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{setting}: {reason}")]
    Invalid { setting: String, reason: String },
    #[error("TLS settings: {0}")]
    Tls(#[from] transport::TransportError),
}

fn invalid(setting: &str, reason: impl fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        setting: setting.to_owned(),
        reason: reason.to_string(),
    }
}

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Where profiles go besides the local files.
    #[serde(default)]
    pub exporters: ExportersConfig,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportersConfig {
    /// OTLP profiles exporter (Pyroscope, OpenTelemetry Collector). Present = enabled.
    pub otlp: Option<OtlpConfig>,
    /// Prints what the OTLP exporter would send. Present = enabled.
    pub debug: Option<DebugConfig>,
}

/// `exporters.otlp`. Every field is optional; see the module docs for precedence.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// Base URL of the receiver, e.g. `http://pyroscope:4040` or `https://collector:4317`. For
    /// HTTP, `/v1development/profiles` is appended unless the path already ends with it. Without
    /// a scheme, TLS is used unless `tls.insecure` is set. Default: `http://localhost:4317`
    /// (grpc) or `http://localhost:4318` (http).
    pub endpoint: Option<String>,
    /// `grpc` or `http` (`http/protobuf`). Default: `http/protobuf`, as the OTLP spec says.
    pub protocol: Option<Protocol>,
    /// OTLP profiles wire generation: `"1.9"` or `"1.10"` (quote it: YAML reads 1.10 as 1.1).
    /// Default: "1.10".
    pub proto_version: Option<ProtoVersion>,
    /// Extra request headers (gRPC metadata), e.g. `Authorization: Bearer ...`,
    /// `X-Scope-OrgID: tenant`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `gzip` or `none`. Default: gzip.
    pub compression: Option<Compression>,
    /// Per-attempt timeout, e.g. `10s`. Default: 10s.
    pub timeout: Option<DurationText>,
    /// TLS client settings.
    #[serde(default)]
    pub tls: TlsConfig,
    /// Largest request (uncompressed protobuf bytes); bigger ones are split. Default: 4 MiB,
    /// Pyroscope's limit.
    pub max_request_bytes: Option<usize>,
    /// The send queue.
    #[serde(default)]
    pub sending_queue: QueueConfig,
    /// Retries of failed requests.
    #[serde(default)]
    pub retry_on_failure: RetryConfig,
    /// Per-sample attributes. Each distinct set is a series in Pyroscope: keep them few.
    #[serde(default)]
    pub sample_attributes: SampleAttributesConfig,
    /// How often the export counters are logged, e.g. `60s`. Default: 60s.
    pub stats_interval: Option<DurationText>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Gzip,
    None,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Plaintext (h2c / http) for an endpoint without a scheme. An `https://` endpoint always
    /// uses TLS, an `http://` one never does.
    #[serde(default)]
    pub insecure: bool,
    /// Accept any server certificate. Off by default; never use it in production.
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// PEM file of the CA certificates to trust (default: the system store).
    pub ca_file: Option<String>,
    /// PEM client certificate (chain) for mutual TLS; needs `key_file`.
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// Most bytes of encoded requests held while the receiver is slow or down; past it the
    /// oldest are dropped (and counted). Default: 64 MiB. At least `max_request_bytes`.
    pub queue_size_bytes: Option<usize>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Retry retryable failures (gRPC UNAVAILABLE etc., HTTP 429/502/503/504). Default: true.
    pub enabled: Option<bool>,
    /// First delay, doubled per attempt (with +-50% jitter). Default: 1s.
    pub initial_interval: Option<DurationText>,
    /// Longest delay between attempts. Default: 30s.
    pub max_interval: Option<DurationText>,
    /// Give a request up after retrying it this long. Default: 300s.
    pub max_elapsed_time: Option<DurationText>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleAttributesConfig {
    /// `thread.name` on each sample. Default: true.
    pub thread_name: Option<bool>,
    /// `process.pid` on each sample (it is on the resource anyway). Default: false.
    pub pid: Option<bool>,
    /// `thread.id` on each sample (high cardinality). Default: false.
    pub tid: Option<bool>,
}

/// `exporters.debug`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebugConfig {
    /// `basic` (one line per request), `normal` (resources and sample counts) or `detailed`
    /// (every sample with its attributes and frames). Default: normal.
    pub verbosity: Option<Verbosity>,
}

/// A duration written as `10s`, `500ms`, `2m` (or a bare number of seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationText(pub Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = DurationText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 10s, 500ms or 2m")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DurationText, E> {
                crate::cli::parse_duration(v)
                    .map(DurationText)
                    .map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DurationText, E> {
                Ok(DurationText(Duration::from_secs(v)))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DurationText, E> {
                u64::try_from(v)
                    .map(|v| DurationText(Duration::from_secs(v)))
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Parses a config file's text; `path` names it in errors.
pub fn parse(text: &str, path: &str) -> Result<RelayConfig, ConfigError> {
    serde_saphyr::from_str(text).map_err(|err| ConfigError::Parse {
        path: path.to_owned(),
        message: err.to_string(),
    })
}

/// Reads and parses a config file.
pub fn load(path: &Path) -> Result<RelayConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// The `--otlp-*` command-line flags (of `run` and `record`).
#[derive(Clone, Debug, Default)]
pub struct OtlpFlags {
    pub endpoint: Option<String>,
    pub protocol: Option<Protocol>,
    pub proto_version: Option<ProtoVersion>,
    pub headers: Vec<(String, String)>,
    pub insecure: bool,
}

impl OtlpFlags {
    fn any(&self) -> bool {
        self.endpoint.is_some()
            || self.protocol.is_some()
            || self.proto_version.is_some()
            || !self.headers.is_empty()
            || self.insecure
    }
}

/// What the relay exports to, resolved.
#[derive(Clone, Debug, Default)]
pub struct Exporters {
    pub otlp: Option<Settings>,
    pub debug: Option<DebugSettings>,
}

const DEFAULT_QUEUE_BYTES: usize = 64 << 20;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(60);

/// Resolves `config`, `flags` and the environment (`env` looks a variable up) into exporter
/// settings, reading the TLS files it names.
pub fn resolve(
    config: &RelayConfig,
    flags: &OtlpFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Exporters, ConfigError> {
    let file = config.exporters.otlp.as_ref();
    // OTEL_EXPORTER_OTLP_PROFILES_X, else OTEL_EXPORTER_OTLP_X (empty counts as unset).
    let var = |name: &str| -> Option<(String, bool)> {
        let get = |key: String| env(&key).filter(|v| !v.trim().is_empty());
        get(format!("OTEL_EXPORTER_OTLP_PROFILES_{name}"))
            .map(|v| (v, true))
            .or_else(|| get(format!("OTEL_EXPORTER_OTLP_{name}")).map(|v| (v, false)))
    };
    let env_endpoint = var("ENDPOINT");
    let enabled = flags.any() || file.is_some() || env_endpoint.is_some();
    let default_file = OtlpConfig::default();
    let file_or_default = file.unwrap_or(&default_file);
    let sample_attributes = SampleAttributes {
        thread_name: file_or_default
            .sample_attributes
            .thread_name
            .unwrap_or(true),
        pid: file_or_default.sample_attributes.pid.unwrap_or(false),
        tid: file_or_default.sample_attributes.tid.unwrap_or(false),
    };
    let max_request_bytes = file_or_default
        .max_request_bytes
        .unwrap_or(DEFAULT_MAX_REQUEST_BYTES);
    if max_request_bytes < 1024 {
        return Err(invalid(
            "exporters.otlp.max_request_bytes",
            "must be at least 1024",
        ));
    }
    let debug = config.exporters.debug.as_ref().map(|d| DebugSettings {
        verbosity: d.verbosity.unwrap_or(Verbosity::Normal),
        attributes: sample_attributes,
        max_request_bytes,
    });
    if !enabled {
        return Ok(Exporters { otlp: None, debug });
    }

    let protocol = match (flags.protocol, file_or_default.protocol) {
        (Some(p), _) | (None, Some(p)) => p,
        (None, None) => match var("PROTOCOL") {
            Some((text, _)) => text
                .parse()
                .map_err(|e| invalid("OTEL_EXPORTER_OTLP_PROTOCOL", e))?,
            None => Protocol::Http,
        },
    };
    let version = flags
        .proto_version
        .or(file_or_default.proto_version)
        .unwrap_or(ProtoVersion::DEFAULT);
    let insecure = flags.insecure
        || file_or_default.tls.insecure
        || var("INSECURE").is_some_and(|(v, _)| v.trim().eq_ignore_ascii_case("true"));

    // Endpoint: flags and file give a base URL; the signal-specific variable a full URL.
    let (endpoint, full_url, setting) = if let Some(e) = &flags.endpoint {
        (e.clone(), false, "--otlp-endpoint")
    } else if let Some(e) = &file_or_default.endpoint {
        (e.clone(), false, "exporters.otlp.endpoint")
    } else if let Some((e, specific)) = env_endpoint {
        let name = if specific {
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"
        } else {
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        };
        (e, specific, name)
    } else {
        let default = match protocol {
            Protocol::Grpc => "http://localhost:4317",
            Protocol::Http => "http://localhost:4318",
        };
        (default.to_owned(), false, "default endpoint")
    };
    let url =
        endpoint_url(&endpoint, protocol, full_url, insecure).map_err(|e| invalid(setting, e))?;

    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for name in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
    ] {
        if let Some(text) = env(name) {
            for (k, v) in parse_env_headers(&text).map_err(|e| invalid(name, e))? {
                headers.insert(k.to_ascii_lowercase(), v);
            }
        }
    }
    for (k, v) in &file_or_default.headers {
        headers.insert(k.to_ascii_lowercase(), v.clone());
    }
    for (k, v) in &flags.headers {
        headers.insert(k.to_ascii_lowercase(), v.clone());
    }
    let headers = headers
        .into_iter()
        .map(|(k, v)| {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| invalid(&format!("header `{k}`"), e))?;
            let value =
                HeaderValue::from_str(&v).map_err(|e| invalid(&format!("header `{k}`"), e))?;
            Ok((name, value))
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;

    let gzip = match file_or_default.compression {
        Some(c) => c == Compression::Gzip,
        None => match var("COMPRESSION") {
            Some((v, _)) => match v.trim() {
                "gzip" => true,
                "none" => false,
                other => {
                    return Err(invalid(
                        "OTEL_EXPORTER_OTLP_COMPRESSION",
                        format!("`{other}`: use gzip or none"),
                    ))
                }
            },
            None => true,
        },
    };
    let timeout = match file_or_default.timeout {
        Some(t) => t.0,
        None => match var("TIMEOUT") {
            Some((v, _)) => Duration::from_millis(v.trim().parse().map_err(|_| {
                invalid(
                    "OTEL_EXPORTER_OTLP_TIMEOUT",
                    format!("`{v}` is not a number of milliseconds"),
                )
            })?),
            None => DEFAULT_TIMEOUT,
        },
    };
    if timeout.is_zero() {
        return Err(invalid("timeout", "must be more than zero"));
    }

    let read = |setting: &str, path: Option<String>| -> Result<Option<Vec<u8>>, ConfigError> {
        path.map(|p| {
            std::fs::read(&p).map_err(|source| ConfigError::Read {
                path: format!("{p} ({setting})"),
                source,
            })
        })
        .transpose()
    };
    let tls_file = &file_or_default.tls;
    let tls = TlsMaterial {
        ca_pem: read(
            "tls.ca_file",
            tls_file
                .ca_file
                .clone()
                .or_else(|| var("CERTIFICATE").map(|v| v.0)),
        )?,
        client_cert_pem: read(
            "tls.cert_file",
            tls_file
                .cert_file
                .clone()
                .or_else(|| var("CLIENT_CERTIFICATE").map(|v| v.0)),
        )?,
        client_key_pem: read(
            "tls.key_file",
            tls_file
                .key_file
                .clone()
                .or_else(|| var("CLIENT_KEY").map(|v| v.0)),
        )?,
        insecure_skip_verify: tls_file.insecure_skip_verify,
    };
    if tls.client_cert_pem.is_some() != tls.client_key_pem.is_some() {
        return Err(invalid(
            "exporters.otlp.tls",
            "cert_file and key_file go together",
        ));
    }
    if url.scheme_str() == Some("https") {
        // Surface bad TLS material now, not at the first export.
        transport::client_config(&tls)?;
    }

    let queue_bytes = file_or_default
        .sending_queue
        .queue_size_bytes
        .unwrap_or(DEFAULT_QUEUE_BYTES.max(max_request_bytes));
    if queue_bytes < max_request_bytes {
        return Err(invalid(
            "exporters.otlp.sending_queue.queue_size_bytes",
            format!("{queue_bytes} is smaller than max_request_bytes ({max_request_bytes})"),
        ));
    }
    let defaults = RetrySettings::default();
    let r = &file_or_default.retry_on_failure;
    let retry = RetrySettings {
        enabled: r.enabled.unwrap_or(defaults.enabled),
        initial_interval: r
            .initial_interval
            .map_or(defaults.initial_interval, |d| d.0),
        max_interval: r.max_interval.map_or(defaults.max_interval, |d| d.0),
        max_elapsed_time: r
            .max_elapsed_time
            .map_or(defaults.max_elapsed_time, |d| d.0),
    };
    Ok(Exporters {
        otlp: Some(Settings {
            transport: TransportSettings {
                protocol,
                url,
                headers,
                gzip,
                timeout,
                tls,
            },
            version,
            attributes: sample_attributes,
            max_request_bytes,
            queue_bytes,
            retry,
            stats_interval: file_or_default
                .stats_interval
                .map_or(DEFAULT_STATS_INTERVAL, |d| d.0),
        }),
        debug,
    })
}

/// The URL requests go to. No scheme: https, or http when `insecure`. HTTP: the profiles path is
/// appended to a base URL (unless it is already there, or `full` says the URL is complete). gRPC:
/// only scheme and authority count.
fn endpoint_url(
    endpoint: &str,
    protocol: Protocol,
    full: bool,
    insecure: bool,
) -> Result<Uri, String> {
    let endpoint = endpoint.trim();
    // Errors name the endpoint without its userinfo.
    let shown = transport::redact_userinfo(endpoint);
    let with_scheme = if endpoint.contains("://") {
        endpoint.to_owned()
    } else if insecure {
        format!("http://{endpoint}")
    } else {
        format!("https://{endpoint}")
    };
    let uri: Uri = with_scheme.parse().map_err(|e: http::uri::InvalidUri| {
        format!(
            "`{shown}` is not a URL: {}",
            transport::redact_userinfo(&e.to_string())
        )
    })?;
    let scheme = uri.scheme_str().unwrap_or("");
    if scheme != "http" && scheme != "https" {
        return Err(format!("`{shown}`: the scheme must be http or https"));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("`{shown}` has no host"))?
        .clone();
    let path = match protocol {
        Protocol::Grpc => "/".to_owned(),
        Protocol::Http => {
            let path = uri.path();
            if full || path.ends_with(HTTP_PATH) {
                path.to_owned()
            } else {
                format!("{}{HTTP_PATH}", path.trim_end_matches('/'))
            }
        }
    };
    Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|e| format!("`{shown}`: {e}"))
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key1=value1,key2=value2`, values percent-encoded.
fn parse_env_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not key=value"))?;
            Ok((percent_decode(k.trim())?, percent_decode(v.trim())?))
        })
        .collect()
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in `{text}`"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{text}` is not UTF-8 once decoded"))
}

/// `K=V` of `--otlp-header`.
pub fn parse_header_flag(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not KEY=VALUE"))?;
    if k.trim().is_empty() {
        return Err(format!("`{text}` has an empty header name"));
    }
    Ok((k.trim().to_owned(), v.trim().to_owned()))
}

/// A one-line description of resolved exporters, for logs and `validate`.
pub fn describe(exporters: &Exporters) -> Vec<String> {
    let mut lines = Vec::new();
    match &exporters.otlp {
        Some(s) => lines.push(format!(
            "otlp: {} {} (profiles proto v{}), compression {}, timeout {:?}, headers [{}], \
             max request {} B, queue {} B, retry {}",
            s.transport.protocol.as_str(),
            s.transport.display_url(),
            s.version,
            if s.transport.gzip { "gzip" } else { "none" },
            s.transport.timeout,
            s.transport
                .headers
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            s.max_request_bytes,
            s.queue_bytes,
            if s.retry.enabled {
                format!(
                    "{:?}..{:?} for up to {:?}",
                    s.retry.initial_interval, s.retry.max_interval, s.retry.max_elapsed_time
                )
            } else {
                "off".to_owned()
            },
        )),
        None => lines.push("otlp: off".to_owned()),
    }
    match &exporters.debug {
        Some(d) => lines.push(format!("debug: verbosity {:?}", d.verbosity)),
        None => lines.push("debug: off".to_owned()),
    }
    lines
}

/// Warnings about resolved exporters, for logs and `validate`: credentials (request headers,
/// URL userinfo) that would cross the network in plaintext. Names headers, never their values.
pub fn warnings(exporters: &Exporters) -> Vec<String> {
    let mut warnings = Vec::new();
    let Some(otlp) = &exporters.otlp else {
        return warnings;
    };
    let t = &otlp.transport;
    if !t.is_plaintext() {
        return warnings;
    }
    let mut secrets = Vec::new();
    if !t.headers.is_empty() {
        let names: Vec<&str> = t.headers.iter().map(|(k, _)| k.as_str()).collect();
        secrets.push(format!("headers [{}]", names.join(", ")));
    }
    if t.has_userinfo() {
        secrets.push("the URL's user:password".to_owned());
    }
    if secrets.is_empty() {
        return warnings;
    }
    let transport = match t.protocol {
        Protocol::Grpc => "gRPC without TLS (h2c)",
        Protocol::Http => "plain HTTP",
    };
    warnings.push(format!(
        "OTLP {} would be sent over {transport} to {}: anyone on the path can read them. Use an \
         https:// endpoint (with tls.ca_file for a private CA, tls.cert_file/key_file for mutual \
         TLS), or give the endpoint without a scheme and without tls.insecure/--otlp-insecure",
        secrets.join(" and "),
        t.display_url()
    ));
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |key| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
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
        assert_eq!(otlp.version, ProtoVersion::V1_9);
        assert!(!otlp.transport.gzip);
        assert_eq!(otlp.transport.timeout, Duration::from_secs(5));
        assert_eq!(otlp.transport.headers[0].0.as_str(), "x-scope-orgid");
        assert_eq!(otlp.queue_bytes, 8 << 20);
        assert_eq!(otlp.retry.initial_interval, Duration::from_millis(100));
        assert!(!otlp.attributes.thread_name && otlp.attributes.tid);
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
        assert_eq!(both.version, ProtoVersion::V1_9);
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
        assert!(super::warnings(&with("https://c:4317", Protocol::Grpc, secret)).is_empty());
        assert!(super::warnings(&with("http://c:4317", Protocol::Grpc, Vec::new())).is_empty());
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

    #[test]
    fn endpoints_without_scheme_use_tls_unless_insecure() {
        assert_eq!(
            endpoint_url("pyroscope:4040", Protocol::Grpc, false, true)
                .unwrap()
                .to_string(),
            "http://pyroscope:4040/"
        );
        assert_eq!(
            endpoint_url("collector:4318", Protocol::Http, false, false)
                .unwrap()
                .to_string(),
            "https://collector:4318/v1development/profiles"
        );
        assert_eq!(
            endpoint_url(
                "http://p:4040/v1development/profiles",
                Protocol::Http,
                false,
                false
            )
            .unwrap()
            .to_string(),
            "http://p:4040/v1development/profiles"
        );
        assert!(endpoint_url("ftp://x", Protocol::Http, false, false).is_err());
    }
}
