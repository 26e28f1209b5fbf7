//! The OTLP exporter's configuration: the `exporters.otlp` section of the relay's config file,
//! the `--otlp-*` flags and the standard `OTEL_EXPORTER_OTLP_*` environment variables, resolved
//! into exporter [`Settings`]. Adding an option touches this file and the option's user only.
//!
//! Precedence, per setting: command-line flag > config file > `OTEL_EXPORTER_OTLP_PROFILES_*` >
//! `OTEL_EXPORTER_OTLP_*` > default. Headers are merged by name in the same order (a later
//! source overrides one name, not the whole set). The exporter is enabled by an `exporters.otlp`
//! section, by an `--otlp-*` flag, or by `OTEL_EXPORTER_OTLP_[PROFILES_]ENDPOINT`.
//!
//! Resolution reads the TLS files named here, so it runs before the relay drops privileges.

use std::{collections::BTreeMap, time::Duration};

use http::{HeaderName, HeaderValue, Uri};
use serde::Deserialize;

use super::{
    exporter::Settings,
    retry::RetrySettings,
    transport::{self, Protocol, TlsMaterial, TransportSettings},
    EncodeSettings, ProtoVersion, SampleAttributes, DEFAULT_MAX_REQUEST_BYTES, HTTP_PATH,
};
use crate::layers::{invalid, pick, read_file, ConfigError, DurationText, Env};

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
    /// Retry retryable failures (gRPC UNAVAILABLE etc., HTTP 429/502/503/504; server errors
    /// too with `retry_server_errors`). Default: true.
    pub enabled: Option<bool>,
    /// First delay, doubled per attempt (with +-50% jitter). Default: 1s.
    pub initial_interval: Option<DurationText>,
    /// Longest delay between attempts. Default: 30s.
    pub max_interval: Option<DurationText>,
    /// Give a request up after retrying it this long. Default: 300s.
    pub max_elapsed_time: Option<DurationText>,
    /// Also retry server errors (gRPC UNKNOWN, HTTP 500), within the same budget: Pyroscope
    /// 1.18 and 1.19 answer their ingestion (rate) limits so, where later versions and the
    /// Collector answer RESOURCE_EXHAUSTED / 429. Default: true with `proto_version: "1.9"`
    /// (the generation Pyroscope 1.18/1.19 speak), false with "1.10".
    pub retry_server_errors: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleAttributesConfig {
    /// `thread.name` on each sample. Default: true.
    pub thread_name: Option<bool>,
    /// `process.pid` on each sample (never on the resource). Each process is then a series of
    /// its own in Pyroscope >= 1.20, which makes integer attributes labels. Default: false.
    pub pid: Option<bool>,
    /// `thread.id` on each sample (high cardinality). Default: false.
    pub tid: Option<bool>,
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

const DEFAULT_QUEUE_BYTES: usize = 64 << 20;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(60);

/// The OTLP variables: `OTEL_EXPORTER_OTLP_PROFILES_X`, else `OTEL_EXPORTER_OTLP_X` (empty
/// counts as unset).
struct OtlpEnv<'a>(Env<'a>);

/// A variable's value, and whether it came from the signal-specific (`PROFILES_`) name.
struct EnvValue {
    text: String,
    specific: bool,
}

impl OtlpEnv<'_> {
    fn get(&self, name: &str) -> Option<EnvValue> {
        let get = |key: String| (self.0)(&key).filter(|v| !v.trim().is_empty());
        get(format!("OTEL_EXPORTER_OTLP_PROFILES_{name}"))
            .map(|text| EnvValue {
                text,
                specific: true,
            })
            .or_else(|| {
                get(format!("OTEL_EXPORTER_OTLP_{name}")).map(|text| EnvValue {
                    text,
                    specific: false,
                })
            })
    }

    fn text(&self, name: &str) -> Option<String> {
        self.get(name).map(|v| v.text)
    }
}

/// How profiles become requests (wire generation, sample attributes, size limit). Resolved
/// whether or not the exporter is on: the debug exporter shows the same requests.
pub fn encode_settings(
    file: Option<&OtlpConfig>,
    flags: &OtlpFlags,
) -> Result<EncodeSettings, ConfigError> {
    let default_file = OtlpConfig::default();
    let file = file.unwrap_or(&default_file);
    let a = &file.sample_attributes;
    let max_request_bytes = file.max_request_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BYTES);
    if max_request_bytes < 1024 {
        return Err(invalid(
            "exporters.otlp.max_request_bytes",
            "must be at least 1024",
        ));
    }
    Ok(EncodeSettings {
        version: flags
            .proto_version
            .or(file.proto_version)
            .unwrap_or(ProtoVersion::DEFAULT),
        attributes: SampleAttributes {
            thread_name: a.thread_name.unwrap_or(true),
            pid: a.pid.unwrap_or(false),
            tid: a.tid.unwrap_or(false),
        },
        max_request_bytes,
    })
}

/// Resolves the exporter's settings from its file section, the flags and the environment
/// (`env` looks a variable up), reading the TLS files it names. `None`: the exporter is off.
pub fn resolve(
    file: Option<&OtlpConfig>,
    flags: &OtlpFlags,
    env: Env<'_>,
    encoding: EncodeSettings,
) -> Result<Option<Settings>, ConfigError> {
    let env = OtlpEnv(env);
    if !(flags.any() || file.is_some() || env.get("ENDPOINT").is_some()) {
        return Ok(None);
    }
    let default_file = OtlpConfig::default();
    let file = file.unwrap_or(&default_file);
    let transport = transport_settings(file, flags, &env)?;
    let queue_bytes = file
        .sending_queue
        .queue_size_bytes
        .unwrap_or(DEFAULT_QUEUE_BYTES.max(encoding.max_request_bytes));
    if queue_bytes < encoding.max_request_bytes {
        return Err(invalid(
            "exporters.otlp.sending_queue.queue_size_bytes",
            format!(
                "{queue_bytes} is smaller than max_request_bytes ({})",
                encoding.max_request_bytes
            ),
        ));
    }
    Ok(Some(Settings {
        transport,
        encoding,
        queue_bytes,
        retry: retry_settings(&file.retry_on_failure, encoding.version),
        stats_interval: file.stats_interval.map_or(DEFAULT_STATS_INTERVAL, |d| d.0),
    }))
}

fn transport_settings(
    file: &OtlpConfig,
    flags: &OtlpFlags,
    env: &OtlpEnv<'_>,
) -> Result<TransportSettings, ConfigError> {
    let protocol = pick(
        flags.protocol,
        file.protocol,
        || {
            env.text("PROTOCOL")
                .map(|text| {
                    text.parse()
                        .map_err(|e| invalid("OTEL_EXPORTER_OTLP_PROTOCOL", e))
                })
                .transpose()
        },
        Protocol::Http,
    )?;
    let insecure = flags.insecure
        || file.tls.insecure
        || env
            .text("INSECURE")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let url = endpoint(file, flags, env, protocol, insecure)?;
    let headers = headers(file, flags, env)?;
    let gzip = pick(
        None,
        file.compression,
        || compression(env),
        Compression::Gzip,
    )?;
    let timeout = timeout(file, env)?;
    let tls = tls_material(&file.tls, env)?;
    if url.scheme_str() == Some("https") {
        // Surface bad TLS material now, not at the first export.
        transport::client_config(&tls).map_err(|e| ConfigError::Tls(Box::new(e)))?;
    }
    Ok(TransportSettings {
        protocol,
        url,
        headers,
        gzip: gzip == Compression::Gzip,
        timeout,
        tls,
    })
}

/// The endpoint: flags and file give a base URL, the signal-specific variable a full URL.
fn endpoint(
    file: &OtlpConfig,
    flags: &OtlpFlags,
    env: &OtlpEnv<'_>,
    protocol: Protocol,
    insecure: bool,
) -> Result<Uri, ConfigError> {
    let (endpoint, full_url, setting) = if let Some(e) = &flags.endpoint {
        (e.clone(), false, "--otlp-endpoint")
    } else if let Some(e) = &file.endpoint {
        (e.clone(), false, "exporters.otlp.endpoint")
    } else if let Some(EnvValue { text, specific }) = env.get("ENDPOINT") {
        let name = if specific {
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"
        } else {
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        };
        (text, specific, name)
    } else {
        let default = match protocol {
            Protocol::Grpc => "http://localhost:4317",
            Protocol::Http => "http://localhost:4318",
        };
        (default.to_owned(), false, "default endpoint")
    };
    endpoint_url(&endpoint, protocol, full_url, insecure).map_err(|e| invalid(setting, e))
}

/// Request headers, merged by lowercase name: generic variable, specific variable, file, flags.
fn headers(
    file: &OtlpConfig,
    flags: &OtlpFlags,
    env: &OtlpEnv<'_>,
) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for name in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
    ] {
        if let Some(text) = (env.0)(name) {
            for (k, v) in parse_env_headers(&text).map_err(|e| invalid(name, e))? {
                headers.insert(k.to_ascii_lowercase(), v);
            }
        }
    }
    for (k, v) in file
        .headers
        .iter()
        .chain(flags.headers.iter().map(|(k, v)| (k, v)))
    {
        headers.insert(k.to_ascii_lowercase(), v.clone());
    }
    headers
        .into_iter()
        .map(|(k, v)| {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| invalid(&format!("header `{k}`"), e))?;
            let value =
                HeaderValue::from_str(&v).map_err(|e| invalid(&format!("header `{k}`"), e))?;
            Ok((name, value))
        })
        .collect()
}

fn compression(env: &OtlpEnv<'_>) -> Result<Option<Compression>, ConfigError> {
    env.text("COMPRESSION")
        .map(|v| match v.trim() {
            "gzip" => Ok(Compression::Gzip),
            "none" => Ok(Compression::None),
            other => Err(invalid(
                "OTEL_EXPORTER_OTLP_COMPRESSION",
                format!("`{other}`: use gzip or none"),
            )),
        })
        .transpose()
}

/// Per-attempt timeout: the file's duration, else the variable's milliseconds; never zero.
fn timeout(file: &OtlpConfig, env: &OtlpEnv<'_>) -> Result<Duration, ConfigError> {
    let from_env = || {
        env.text("TIMEOUT")
            .map(|v| {
                v.trim().parse().map(Duration::from_millis).map_err(|_| {
                    invalid(
                        "OTEL_EXPORTER_OTLP_TIMEOUT",
                        format!("`{v}` is not a number of milliseconds"),
                    )
                })
            })
            .transpose()
    };
    let timeout = pick(None, file.timeout.map(|t| t.0), from_env, DEFAULT_TIMEOUT)?;
    if timeout.is_zero() {
        return Err(invalid("timeout", "must be more than zero"));
    }
    Ok(timeout)
}

/// The TLS files (file settings, else the variables), read now, while privileged.
fn tls_material(tls: &TlsConfig, env: &OtlpEnv<'_>) -> Result<TlsMaterial, ConfigError> {
    let material = TlsMaterial {
        ca_pem: read_file(
            "tls.ca_file",
            tls.ca_file.clone().or_else(|| env.text("CERTIFICATE")),
        )?,
        client_cert_pem: read_file(
            "tls.cert_file",
            tls.cert_file
                .clone()
                .or_else(|| env.text("CLIENT_CERTIFICATE")),
        )?,
        client_key_pem: read_file(
            "tls.key_file",
            tls.key_file.clone().or_else(|| env.text("CLIENT_KEY")),
        )?,
        insecure_skip_verify: tls.insecure_skip_verify,
    };
    if material.client_cert_pem.is_some() != material.client_key_pem.is_some() {
        return Err(invalid(
            "exporters.otlp.tls",
            "cert_file and key_file go together",
        ));
    }
    Ok(material)
}

fn retry_settings(r: &RetryConfig, version: ProtoVersion) -> RetrySettings {
    let defaults = RetrySettings::default();
    RetrySettings {
        enabled: r.enabled.unwrap_or(defaults.enabled),
        initial_interval: r
            .initial_interval
            .map_or(defaults.initial_interval, |d| d.0),
        max_interval: r.max_interval.map_or(defaults.max_interval, |d| d.0),
        max_elapsed_time: r
            .max_elapsed_time
            .map_or(defaults.max_elapsed_time, |d| d.0),
        server_errors: r
            .retry_server_errors
            .unwrap_or(version == ProtoVersion::V1_9),
    }
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

/// One line describing resolved settings, for logs and `validate` (header names, never values;
/// the URL without userinfo).
pub fn describe(s: &Settings) -> String {
    let retry = if s.retry.enabled {
        format!(
            "{:?}..{:?} for up to {:?}",
            s.retry.initial_interval, s.retry.max_interval, s.retry.max_elapsed_time
        )
    } else {
        "off".to_owned()
    };
    let headers: Vec<&str> = s
        .transport
        .headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect();
    format!(
        "otlp: {} {} (profiles proto v{}), compression {}, timeout {:?}, headers [{}], \
         max request {} B, queue {} B, retry {retry}",
        s.transport.protocol.as_str(),
        s.transport.display_url(),
        s.encoding.version,
        if s.transport.gzip { "gzip" } else { "none" },
        s.transport.timeout,
        headers.join(", "),
        s.encoding.max_request_bytes,
        s.queue_bytes,
    )
}

/// Warnings about resolved settings, for logs and `validate`: credentials (request headers, URL
/// userinfo) that would cross the network in plaintext. Names headers, never their values.
pub fn warnings(settings: &Settings) -> Vec<String> {
    let t = &settings.transport;
    if !t.is_plaintext() {
        return Vec::new();
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
        return Vec::new();
    }
    let transport = match t.protocol {
        Protocol::Grpc => "gRPC without TLS (h2c)",
        Protocol::Http => "plain HTTP",
    };
    vec![format!(
        "OTLP {} would be sent over {transport} to {}: anyone on the path can read them. Use an \
         https:// endpoint (with tls.ca_file for a private CA, tls.cert_file/key_file for mutual \
         TLS), or give the endpoint without a scheme and without tls.insecure/--otlp-insecure",
        secrets.join(" and "),
        t.display_url()
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_request_shape_is_resolved_even_with_the_exporter_off() {
        // Given a file section that sets only how requests are built, and no flags
        let file = OtlpConfig {
            max_request_bytes: Some(2048),
            proto_version: Some(ProtoVersion::V1_9),
            ..OtlpConfig::default()
        };
        // When resolved without the section (exporter off), and with it
        let off = encode_settings(None, &OtlpFlags::default()).unwrap();
        let on = encode_settings(Some(&file), &OtlpFlags::default()).unwrap();
        // Then the defaults, and the file's values; a limit under 1 KiB is refused
        assert_eq!(off.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
        assert_eq!(off.version, ProtoVersion::DEFAULT);
        assert_eq!(
            (on.max_request_bytes, on.version),
            (2048, ProtoVersion::V1_9)
        );
        let tiny = OtlpConfig {
            max_request_bytes: Some(1000),
            ..OtlpConfig::default()
        };
        assert!(encode_settings(Some(&tiny), &OtlpFlags::default()).is_err());
        assert!(resolve(None, &OtlpFlags::default(), &|_| None, on)
            .unwrap()
            .is_none());
    }
}
