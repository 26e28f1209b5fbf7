//! OTLP over gRPC: tonic on a lazily connected channel (h2c, or TLS through our rustls
//! connector), the pre-encoded request passed through unchanged by a raw codec, the answer
//! classified by status code ([`retry::grpc_retryable`]).
//!
//! tonic must stay built without its own TLS features (`tls-ring`, ...): with them its connector
//! refuses an `https` URI for which it has no TLS config of its own, before ours can do TLS.

use bytes::{Buf as _, Bytes};
use hyper_rustls::HttpsConnectorBuilder;
use rustls::ClientConfig;
use tonic::{
    codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder},
    metadata::{MetadataKey, MetadataValue},
    transport::{Channel, Endpoint},
    Status,
};

use super::{redact_userinfo, status, Outcome, TransportError, TransportSettings};
use crate::sink::otlp::{retry, GRPC_PATH};

pub(crate) struct GrpcTransport {
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

impl GrpcTransport {
    /// A lazily connecting channel to `settings.url` with `tls` for `https`.
    pub(crate) fn new(
        settings: &TransportSettings,
        tls: ClientConfig,
    ) -> Result<Self, TransportError> {
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
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
        Ok(Self {
            channel: endpoint.connect_with_connector_lazy(connector),
            settings: settings.clone(),
        })
    }

    /// The unary call with the configured compression, headers (as metadata) and timeout.
    fn request(&self, body: Bytes) -> (tonic::client::Grpc<Channel>, tonic::Request<Bytes>) {
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
        (grpc, request)
    }

    pub(crate) async fn send(&self, body: Bytes) -> Outcome {
        let wire_bytes = body.len();
        let (mut grpc, request) = self.request(body);
        let call = async {
            grpc.ready().await.map_err(|e| {
                Status::unavailable(redact_userinfo(&format!(
                    "connecting to {}: {e}",
                    self.settings.display_url()
                )))
            })?;
            grpc.unary(
                request,
                http::uri::PathAndQuery::from_static(GRPC_PATH),
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
            Ok(response) => status::delivered(&response.into_inner(), wire_bytes),
            Err(status) if retry::grpc_retryable(status.code()) => Outcome::Retry {
                reason: describe(&status),
                after: status::retry_delay(status.details()),
            },
            Err(status) if retry::grpc_server_error(status.code()) => Outcome::ServerError {
                reason: describe(&status),
            },
            Err(status) => Outcome::Permanent {
                reason: describe(&status),
            },
        }
    }
}

/// The status with its source chain (transport failures carry their cause there, not in the
/// message), userinfo redacted.
fn describe(status: &Status) -> String {
    let mut text = format!("gRPC {:?}: {}", status.code(), status.message());
    text.push_str(&super::causes(status, &text));
    redact_userinfo(&text)
}
