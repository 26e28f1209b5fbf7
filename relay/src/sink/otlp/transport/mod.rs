//! Sending one encoded request to the receiver and classifying the answer: delivered (with any
//! `partial_success`), retryable (with the delay the server asked for), or permanent.
//!
//! - [`grpc`]: tonic, h2c or TLS. [`http`]: hyper, `POST /v1development/profiles`.
//! - [`tls`]: the one rustls configuration both use, from material loaded at start-up.
//! - [`status`]: reading answers (`ExportProfilesServiceResponse`, `google.rpc.Status`).
//!
//! Both transports take the same pre-encoded protobuf bytes, so the wire generation is decided
//! once, by the encoder; the response message is the same in both generations. Which failures
//! are retried is [`crate::sink::otlp::retry`]'s call. Connection-level failures (refused,
//! reset, TLS handshake) are retryable, as the OpenTelemetry exporters treat them; they are
//! dropped once the retry budget is spent. Nothing here logs a URL's userinfo
//! ([`redact_userinfo`]).

mod grpc;
mod http;
mod status;
mod tls;

use std::time::Duration;

// `::http`: the crate, not the `http` transport module above.
use ::http::{HeaderName, HeaderValue, Uri};
use bytes::Bytes;

pub use self::tls::{client_config, TlsMaterial};
use self::{grpc::GrpcTransport, http::HttpTransport};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("reading TLS material `{what}`: {reason}")]
    Pem { what: &'static str, reason: String },
    #[error("building the TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("no CA certificates: no `ca_file` given and none found in the system store")]
    NoRoots,
    #[error("invalid endpoint `{endpoint}`: {reason}")]
    Endpoint { endpoint: String, reason: String },
}

/// Which OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
pub enum Protocol {
    #[serde(rename = "grpc")]
    Grpc,
    #[serde(rename = "http", alias = "http/protobuf")]
    Http,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::Http => "http/protobuf",
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "grpc" => Ok(Self::Grpc),
            "http" | "http/protobuf" => Ok(Self::Http),
            "http/json" => Err(
                "OTLP http/json is not supported for profiles; use grpc or http/protobuf".into(),
            ),
            other => Err(format!("unknown OTLP protocol `{other}`: use grpc or http")),
        }
    }
}

/// Everything a transport needs, resolved.
#[derive(Clone, Debug)]
pub struct TransportSettings {
    pub protocol: Protocol,
    /// gRPC: `scheme://host:port`; HTTP: the full URL of the profiles endpoint.
    pub url: Uri,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub gzip: bool,
    pub timeout: Duration,
    pub tls: TlsMaterial,
}

impl TransportSettings {
    /// The URL for logs and printed text: any userinfo (`user:password@`) shown as `***@`.
    pub fn display_url(&self) -> String {
        redact_userinfo(&self.url.to_string())
    }

    /// Whether the endpoint is plaintext (`http://`: HTTP/1.1 or gRPC over h2c).
    pub fn is_plaintext(&self) -> bool {
        self.url.scheme_str() != Some("https")
    }

    /// Whether the URL carries userinfo (`user:password@host`).
    pub fn has_userinfo(&self) -> bool {
        self.url
            .authority()
            .is_some_and(|a| a.as_str().contains('@'))
    }
}

/// `text` with the userinfo of every URL in it (`scheme://user:password@host`) replaced by
/// `***`, so credentials never reach a log line, an error or the terminal. Text without `://`
/// is taken as one endpoint written without a scheme (`user:password@host:port`).
pub fn redact_userinfo(text: &str) -> String {
    fn redact_authority(rest: &str, out: &mut String) -> usize {
        // The authority ends at the path, query, fragment or whitespace.
        let end = rest
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(rest.len());
        match rest[..end].rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&rest[at..end]);
            }
            None => out.push_str(&rest[..end]),
        }
        end
    }
    let mut out = String::with_capacity(text.len());
    if !text.contains("://") {
        let end = redact_authority(text, &mut out);
        out.push_str(&text[end..]);
        return out;
    }
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        let end = redact_authority(rest, &mut out);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// What became of one attempt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Accepted. `rejected` > 0 (or a message) when the receiver reported a partial success.
    Delivered {
        rejected: i64,
        message: String,
        wire_bytes: usize,
    },
    /// Try again later; `after` is the delay the receiver asked for, if any.
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    /// A server error (gRPC `UNKNOWN`, HTTP 500): permanent unless the exporter retries server
    /// errors ([`super::retry::RetrySettings::server_errors`]).
    ServerError { reason: String },
    /// Do not try again.
    Permanent { reason: String },
}

/// A connected (lazily) client for one endpoint.
#[expect(
    clippy::large_enum_variant,
    reason = "one per exporter, built once and never moved on a hot path"
)]
pub(crate) enum Transport {
    Grpc(GrpcTransport),
    Http(HttpTransport),
}

impl Transport {
    /// Builds the client. Connects lazily: a receiver that is down at start is not an error.
    pub fn new(settings: &TransportSettings) -> Result<Self, TransportError> {
        let tls = if settings.url.scheme_str() == Some("https") {
            client_config(&settings.tls)?
        } else {
            tls::unused_config()?
        };
        Ok(match settings.protocol {
            Protocol::Grpc => Self::Grpc(GrpcTransport::new(settings, tls)?),
            Protocol::Http => Self::Http(HttpTransport::new(settings, tls)),
        })
    }

    /// Sends one request body (uncompressed protobuf) and classifies the answer.
    pub async fn send(&self, body: Bytes) -> Outcome {
        match self {
            Self::Grpc(t) => t.send(body).await,
            Self::Http(t) => t.send(body).await,
        }
    }
}

/// `err`'s source chain as `: cause: cause`, leaving out causes `text` (or an earlier cause)
/// already says.
fn causes(err: &dyn std::error::Error, text: &str) -> String {
    let mut all = text.to_owned();
    let mut source = err.source();
    while let Some(e) = source {
        let cause = e.to_string();
        if !all.contains(&cause) {
            all.push_str(": ");
            all.push_str(&cause);
        }
        source = e.source();
    }
    all.split_off(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_redacted_wherever_a_url_appears() {
        assert_eq!(
            redact_userinfo("https://user:s3cret@collector:4317/"),
            "https://***@collector:4317/"
        );
        assert_eq!(
            redact_userinfo("http://tok@p:4040/v1development/profiles?a=b@c"),
            "http://***@p:4040/v1development/profiles?a=b@c"
        );
        // Several URLs in an error text, one without userinfo.
        assert_eq!(
            redact_userinfo("connecting to http://a:b@x:1/: redirected to https://y/ (c:d@z)"),
            "connecting to http://***@x:1/: redirected to https://y/ (c:d@z)"
        );
        // An endpoint written without a scheme.
        assert_eq!(redact_userinfo("u:p@collector:4317"), "***@collector:4317");
        assert_eq!(redact_userinfo("collector:4317"), "collector:4317");
        // A password containing '@' is redacted up to the last one.
        assert_eq!(redact_userinfo("http://u:p@ss@h/"), "http://***@h/");
        let settings = TransportSettings {
            protocol: Protocol::Grpc,
            url: "http://u:p@h:4317/".parse().unwrap(),
            headers: Vec::new(),
            gzip: true,
            timeout: Duration::from_secs(1),
            tls: TlsMaterial::default(),
        };
        assert_eq!(settings.display_url(), "http://***@h:4317/");
        assert!(settings.has_userinfo() && settings.is_plaintext());
    }
}
