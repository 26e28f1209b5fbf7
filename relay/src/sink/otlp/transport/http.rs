//! OTLP over HTTP/protobuf: `POST` of the pre-encoded request (gzip when configured) with hyper
//! on the exporter's runtime, TLS through our rustls connector; the answer classified by status
//! ([`retry::http_retryable`]), with the server's `Retry-After`.

use std::io::Write as _;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use rustls::ClientConfig;

use super::{redact_userinfo, status, Outcome, TransportSettings};
use crate::sink::otlp::retry;

pub(crate) struct HttpTransport {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    settings: TransportSettings,
}

/// Largest response body read (a Status or an ExportProfilesServiceResponse is small).
const MAX_RESPONSE_BYTES: usize = 64 << 10;

/// What came back: status, the `Retry-After` delay, the (bounded) body.
type Answer = (StatusCode, Option<std::time::Duration>, Bytes);

impl HttpTransport {
    pub(crate) fn new(settings: &TransportSettings, tls: ClientConfig) -> Self {
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            settings: settings.clone(),
        }
    }

    /// The `POST` of `body` (already compressed if gzip is on).
    fn request(&self, body: Bytes) -> Result<Request<Full<Bytes>>, http::Error> {
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
        builder.body(Full::new(body))
    }

    pub(crate) async fn send(&self, body: Bytes) -> Outcome {
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
        let request = match self.request(body) {
            Ok(request) => request,
            Err(err) => {
                return Outcome::Permanent {
                    reason: format!("building the HTTP request: {err}"),
                }
            }
        };
        let (status, retry_after, body) = match self.exchange(request).await {
            Ok(answer) => answer,
            Err(outcome) => return outcome,
        };
        if status.is_success() {
            return status::delivered(&body, wire_bytes);
        }
        let reason = format!("HTTP {status}: {}", status::error_text(&body));
        if retry::http_retryable(status) {
            Outcome::Retry {
                reason,
                after: retry_after,
            }
        } else if retry::http_server_error(status) {
            Outcome::ServerError { reason }
        } else {
            Outcome::Permanent { reason }
        }
    }

    /// Sends `request` and reads the answer within the timeout; a failure to get one is
    /// retryable.
    async fn exchange(&self, request: Request<Full<Bytes>>) -> Result<Answer, Outcome> {
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
        match tokio::time::timeout(self.settings.timeout, exchange).await {
            Err(_) => Err(Outcome::Retry {
                reason: format!("no answer within {:?}", self.settings.timeout),
                after: None,
            }),
            Ok(Err(err)) => {
                let mut reason = format!(
                    "HTTP request to {} failed: {err}",
                    self.settings.display_url()
                );
                reason.push_str(&super::causes(&err, &reason));
                Err(Outcome::Retry {
                    reason: redact_userinfo(&reason),
                    after: None,
                })
            }
            Ok(Ok(answer)) => Ok(answer),
        }
    }
}

/// `Retry-After: <seconds>` (the HTTP-date form is not used by OTLP receivers we know).
fn parse_retry_after(value: &str) -> Option<std::time::Duration> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .map(std::time::Duration::from_secs)
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
    use std::time::Duration;

    use super::*;

    #[test]
    fn retry_after_is_read_in_seconds() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("soon"), None);
    }
}
