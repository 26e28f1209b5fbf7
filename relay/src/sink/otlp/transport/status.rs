//! Reading a receiver's answer: the `ExportProfilesServiceResponse` of a success (with any
//! `partial_success`), and the `google.rpc.Status` of a failure: its message, and the
//! `RetryInfo` delay a throttling receiver asks for. The same messages in gRPC trailers and in
//! OTLP/HTTP bodies. Pure parsing: no I/O.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceResponse;
use prost::Message as _;

use super::Outcome;

/// A success answer `body` as an [`Outcome::Delivered`] of `wire_bytes`.
pub(crate) fn delivered(body: &[u8], wire_bytes: usize) -> Outcome {
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
pub(super) struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<ProtoAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ProtoAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.rpc.RetryInfo`: how long the server wants us to wait (OTLP throttling).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// The `RetryInfo` delay in gRPC status details, if the server sent one.
pub(crate) fn retry_delay(details: &[u8]) -> Option<Duration> {
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

/// The server's message: a `google.rpc.Status` body (as OTLP/HTTP specifies), else its text
/// (at most 512 bytes of it).
pub(crate) fn error_text(body: &[u8]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies() {
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
    }
}
