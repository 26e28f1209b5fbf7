//! Sending one encoded request to the receiver, over gRPC (tonic; h2c or TLS) or HTTP/protobuf
//! (hyper; `POST /v1development/profiles`), and classifying the answer: delivered (with any
//! `partial_success`), retryable (with the delay the server asked for), or permanent.
//!
//! Both transports take the same pre-encoded protobuf bytes, so the wire generation is decided
//! once, by the encoder; the response message (`ExportProfilesServiceResponse`) is the same in
//! both generations. TLS for both goes through one rustls [`ClientConfig`] built by
//! [`client_config`] from material loaded at start-up, in hyper-rustls's connector.
//!
//! tonic must stay built without its own TLS features (`tls-ring`, ...): with them its connector
//! refuses an `https` URI for which it has no TLS config of its own, before ours can do TLS.
//! Connection-level failures (refused, reset, TLS handshake) are treated as retryable, as the
//! OpenTelemetry exporters do; they are dropped once the retry budget is spent.

use std::{io::Write as _, sync::Arc, time::Duration};

use bytes::{Buf as _, Bytes};
use http::{header, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioExecutor};
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceResponse;
use prost::Message as _;
use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tonic::{
    codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder},
    metadata::{MetadataKey, MetadataValue},
    transport::{Channel, Endpoint},
    Code, Status,
};

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

/// TLS inputs, read from files while the relay may still be privileged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsMaterial {
    /// PEM CA certificates; `None`: the system store.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate chain and key, for mutual TLS.
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
    /// Accept any server certificate. Off by default; for tests and emergencies only.
    pub insecure_skip_verify: bool,
}

/// The rustls client configuration for `material` (ring provider, TLS 1.2 and 1.3).
pub fn client_config(material: &TlsMaterial) -> Result<ClientConfig, TransportError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    match &material.ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| TransportError::Pem {
                    what: "ca_file",
                    reason: e.to_string(),
                })?;
                roots.add(cert)?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 && !material.insecure_skip_verify {
                // Only an error once TLS is actually used: callers build this lazily for https.
                return Err(TransportError::NoRoots);
            }
        }
    }
    if roots.is_empty() && !material.insecure_skip_verify {
        return Err(TransportError::Pem {
            what: "ca_file",
            reason: "no certificate in the file".into(),
        });
    }
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match (&material.client_cert_pem, &material.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TransportError::Pem {
                    what: "cert_file",
                    reason: e.to_string(),
                })?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TransportError::Pem {
                what: "key_file",
                reason: e.to_string(),
            })?;
            builder.with_client_auth_cert(chain, key)?
        }
        _ => builder.with_no_client_auth(),
    };
    if material.insecure_skip_verify {
        config
            .dangerous()
            .set_certificate_verifier(Arc::new(SkipVerify(provider)));
    }
    Ok(config)
}

/// Accepts any server certificate (still checks handshake signatures). `insecure_skip_verify`.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
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
pub enum Outcome {
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
    /// Do not try again.
    Permanent { reason: String },
}

/// A connected (lazily) client for one endpoint.
#[expect(
    clippy::large_enum_variant,
    reason = "one per exporter, built once and never moved on a hot path"
)]
pub enum Transport {
    Grpc(GrpcTransport),
    Http(HttpTransport),
}

impl Transport {
    /// Builds the client. Connects lazily: a receiver that is down at start is not an error.
    pub fn new(settings: &TransportSettings) -> Result<Self, TransportError> {
        let tls = || -> Result<ClientConfig, TransportError> {
            if settings.url.scheme_str() == Some("https") {
                client_config(&settings.tls)
            } else {
                // Plain h2c/http: the TLS config is never used; skip loading the system store.
                Ok(ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth())
            }
        };
        match settings.protocol {
            Protocol::Grpc => {
                let connector = HttpsConnectorBuilder::new()
                    .with_tls_config(tls()?)
                    .https_or_http()
                    .enable_http2()
                    .build();
                let endpoint = Endpoint::from_shared(settings.url.to_string())
                    .map_err(|e| TransportError::Endpoint {
                        endpoint: settings.display_url(),
                        reason: redact_userinfo(&e.to_string()),
                    })?
                    .timeout(settings.timeout)
                    .connect_timeout(settings.timeout);
                let channel = endpoint.connect_with_connector_lazy(connector);
                Ok(Self::Grpc(GrpcTransport {
                    channel,
                    settings: settings.clone(),
                }))
            }
            Protocol::Http => {
                let connector = HttpsConnectorBuilder::new()
                    .with_tls_config(tls()?)
                    .https_or_http()
                    .enable_http1()
                    .build();
                let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                    .build(connector);
                Ok(Self::Http(HttpTransport {
                    client,
                    settings: settings.clone(),
                }))
            }
        }
    }

    /// Sends one request body (uncompressed protobuf) and classifies the answer.
    pub async fn send(&self, body: Bytes) -> Outcome {
        match self {
            Self::Grpc(t) => t.send(body).await,
            Self::Http(t) => t.send(body).await,
        }
    }
}

pub struct GrpcTransport {
    channel: Channel,
    settings: TransportSettings,
}

/// Passes pre-encoded protobuf bytes through tonic unchanged (both ways).
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        bytes::BufMut::put(dst, item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// gRPC codes the OTLP specification says to retry.
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unavailable
            | Code::DataLoss
    )
}

impl GrpcTransport {
    async fn send(&self, body: Bytes) -> Outcome {
        let wire_bytes = body.len();
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        if self.settings.gzip {
            grpc = grpc.send_compressed(CompressionEncoding::Gzip);
        }
        grpc = grpc
            .accept_compressed(CompressionEncoding::Gzip)
            .max_encoding_message_size(usize::MAX);
        let mut request = tonic::Request::new(body);
        request.set_timeout(self.settings.timeout);
        for (name, value) in &self.settings.headers {
            if let (Ok(key), Ok(value)) = (
                MetadataKey::from_bytes(name.as_str().as_bytes()),
                MetadataValue::try_from(value.as_bytes()),
            ) {
                request.metadata_mut().insert(key, value);
            }
        }
        let call = async {
            grpc.ready().await.map_err(|e| {
                Status::unavailable(redact_userinfo(&format!(
                    "connecting to {}: {e}",
                    self.settings.display_url()
                )))
            })?;
            grpc.unary(
                request,
                http::uri::PathAndQuery::from_static(super::GRPC_PATH),
                RawCodec,
            )
            .await
        };
        let result = match tokio::time::timeout(self.settings.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer within {:?}",
                self.settings.timeout
            ))),
        };
        match result {
            Ok(response) => delivered(&response.into_inner(), wire_bytes),
            Err(status) if retryable(status.code()) => Outcome::Retry {
                reason: describe(&status),
                after: retry_delay(status.details()),
            },
            Err(status) => Outcome::Permanent {
                reason: describe(&status),
            },
        }
    }
}

fn describe(status: &Status) -> String {
    redact_userinfo(&describe_unredacted(status))
}

fn describe_unredacted(status: &Status) -> String {
    let mut text = format!("gRPC {:?}: {}", status.code(), status.message());
    // Transport failures carry their cause in the source chain, not in the message.
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        let cause = err.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = err.source();
    }
    text
}

fn delivered(body: &[u8], wire_bytes: usize) -> Outcome {
    let partial = ExportProfilesServiceResponse::decode(body)
        .ok()
        .and_then(|r| r.partial_success)
        .unwrap_or_default();
    Outcome::Delivered {
        rejected: partial.rejected_profiles,
        message: partial.error_message,
        wire_bytes,
    }
}

/// `google.rpc.Status`, the error detail format of gRPC and of OTLP/HTTP error bodies.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<ProtoAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProtoAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.RetryInfo`: how long the server wants us to wait (OTLP throttling).
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// The `RetryInfo` delay in gRPC status details, if the server sent one.
fn retry_delay(details: &[u8]) -> Option<Duration> {
    let status = RpcStatus::decode(details).ok()?;
    status
        .details
        .iter()
        .filter(|d| d.type_url.ends_with("google.rpc.RetryInfo"))
        .find_map(|d| RetryInfo::decode(d.value.as_slice()).ok()?.retry_delay)
        .map(|d| {
            Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0))
                + Duration::from_nanos(u64::try_from(d.nanos).unwrap_or(0))
        })
}

pub struct HttpTransport {
    client: hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    settings: TransportSettings,
}

/// Largest response body read (a Status or an ExportProfilesServiceResponse is small).
const MAX_RESPONSE_BYTES: usize = 64 << 10;

impl HttpTransport {
    async fn send(&self, body: Bytes) -> Outcome {
        let body = if self.settings.gzip {
            match gzip(&body) {
                Ok(compressed) => compressed,
                Err(err) => {
                    return Outcome::Permanent {
                        reason: format!("gzip failed: {err}"),
                    }
                }
            }
        } else {
            body
        };
        let wire_bytes = body.len();
        let mut builder = Request::post(self.settings.url.clone())
            .header(header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                header::USER_AGENT,
                concat!("ember-relay/", env!("CARGO_PKG_VERSION")),
            );
        if self.settings.gzip {
            builder = builder.header(header::CONTENT_ENCODING, "gzip");
        }
        for (name, value) in &self.settings.headers {
            builder = builder.header(name, value);
        }
        let request = match builder.body(Full::new(body)) {
            Ok(request) => request,
            Err(err) => {
                return Outcome::Permanent {
                    reason: format!("building the HTTP request: {err}"),
                }
            }
        };
        let exchange = async {
            let response = self.client.request(request).await?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_retry_after);
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Ok::<_, hyper_util::client::legacy::Error>((status, retry_after, body))
        };
        let (status, retry_after, body) =
            match tokio::time::timeout(self.settings.timeout, exchange).await {
                Err(_) => {
                    return Outcome::Retry {
                        reason: format!("no answer within {:?}", self.settings.timeout),
                        after: None,
                    }
                }
                Ok(Err(err)) => {
                    let mut reason = format!(
                        "HTTP request to {} failed: {err}",
                        self.settings.display_url()
                    );
                    let mut source = std::error::Error::source(&err);
                    while let Some(e) = source {
                        let cause = e.to_string();
                        if !reason.contains(&cause) {
                            reason.push_str(": ");
                            reason.push_str(&cause);
                        }
                        source = e.source();
                    }
                    return Outcome::Retry {
                        reason: redact_userinfo(&reason),
                        after: None,
                    };
                }
                Ok(Ok(answer)) => answer,
            };
        if status.is_success() {
            return delivered(&body, wire_bytes);
        }
        let reason = format!("HTTP {status}: {}", error_text(&body));
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::BAD_GATEWAY
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::GATEWAY_TIMEOUT
        ) {
            Outcome::Retry {
                reason,
                after: retry_after,
            }
        } else {
            Outcome::Permanent { reason }
        }
    }
}

/// The server's message: a `google.rpc.Status` body (as OTLP/HTTP specifies), else its text.
fn error_text(body: &[u8]) -> String {
    if let Ok(status) = RpcStatus::decode(body) {
        if !status.message.is_empty() {
            return status.message;
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut end = text.len().min(512);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// `Retry-After: <seconds>` (the HTTP-date form is not used by OTLP receivers we know).
fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

fn gzip(data: &[u8]) -> std::io::Result<Bytes> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 4),
        flate2::Compression::default(),
    );
    encoder.write_all(data)?;
    Ok(encoder.finish()?.into())
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

    #[test]
    fn retry_after_and_error_bodies() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("soon"), None);
        let status = RpcStatus {
            code: 3,
            message: "bad tenant".into(),
            details: Vec::new(),
        };
        assert_eq!(error_text(&status.encode_to_vec()), "bad tenant");
        assert_eq!(error_text(b"plain text"), "plain text");
    }

    #[test]
    fn retry_info_is_read_from_status_details() {
        let info = RetryInfo {
            retry_delay: Some(ProtoDuration {
                seconds: 2,
                nanos: 500_000_000,
            }),
        };
        let status = RpcStatus {
            code: 14,
            message: "slow down".into(),
            details: vec![ProtoAny {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: info.encode_to_vec(),
            }],
        };
        assert_eq!(
            retry_delay(&status.encode_to_vec()),
            Some(Duration::from_millis(2500))
        );
        assert!(retryable(Code::Unavailable));
        assert!(!retryable(Code::InvalidArgument));
    }
}
