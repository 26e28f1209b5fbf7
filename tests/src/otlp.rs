//! OTLP profiles receivers for the export tests, and decoders of what they received.
//!
//! - [`Receiver::grpc`]: a tonic server for the `ProfilesService/Export` method that keeps each
//!   message's bytes exactly as received (unframed, gunzipped), whatever its generation.
//! - [`Receiver::http`]: a hyper server for `POST /v1development/profiles` that keeps the raw
//!   body (gunzipped), whatever its generation.
//!
//! Both answer from a script of [`Reply`]s (then `Ok`), optionally after a delay, so tests can
//! make them fail, throttle or stall. Each runs on its own thread and runtime and stops when
//! dropped.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    io::Read as _,
    net::{SocketAddr, TcpListener as StdListener},
    sync::{Arc, Mutex, MutexGuard},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{body::Incoming, service::service_fn, Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message as _;
use serde_json::Value;
use tokio::sync::oneshot;

/// How the receiver answers one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Ok,
    /// Accepted, with `partial_success` reporting rejected profiles.
    Partial {
        rejected: i64,
        message: String,
    },
    /// gRPC UNAVAILABLE / HTTP 503 (retryable).
    Unavailable,
    /// gRPC INVALID_ARGUMENT / HTTP 400 with this message (permanent).
    Invalid(String),
    /// HTTP 429 with `Retry-After: secs` (gRPC: RESOURCE_EXHAUSTED).
    Throttle(u64),
    /// gRPC UNKNOWN / HTTP 500 with this message: how Pyroscope 1.18/1.19 reject ingestion
    /// over their limits.
    ServerError(String),
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    /// The protobuf message exactly as received (gunzipped; for gRPC without the frame header),
    /// never re-encoded.
    pub body: Vec<u8>,
    /// Body bytes on the wire (HTTP only; 0 for gRPC).
    pub wire_bytes: usize,
    pub gzip: bool,
    /// Lower-case header (metadata) names and values.
    pub headers: BTreeMap<String, String>,
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    script: VecDeque<Reply>,
    delay: Duration,
    attempts: u64,
    /// What was answered to each attempt, in order.
    answered: Vec<Reply>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    /// The next scripted reply; keeps the request if it is accepted.
    fn next(&mut self, received: Received) -> Reply {
        self.attempts += 1;
        let reply = self.script.pop_front().unwrap_or(Reply::Ok);
        if matches!(reply, Reply::Ok | Reply::Partial { .. }) {
            self.received.push(received);
        }
        self.answered.push(reply.clone());
        reply
    }
}

/// A running receiver.
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// A free loopback port (bound and released), for receivers started after the relay.
pub fn free_addr() -> SocketAddr {
    let listener = StdListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("local_addr")
}

fn bind(addr: Option<SocketAddr>) -> StdListener {
    let addr = addr.unwrap_or_else(|| "127.0.0.1:0".parse().expect("addr"));
    // The port may still be in TIME_WAIT from a previous owner: retry for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match StdListener::bind(addr) {
            Ok(listener) => {
                listener.set_nonblocking(true).expect("nonblocking");
                return listener;
            }
            Err(err) if Instant::now() < deadline => {
                eprintln!("binding {addr}: {err}; retrying");
                thread::sleep(Duration::from_millis(100));
            }
            Err(err) => panic!("binding {addr}: {err}"),
        }
    }
}

/// The scripted answer to a gRPC request, after the configured delay.
async fn grpc_answer(
    state: &Mutex<State>,
    received: Received,
) -> Result<ExportProfilesServiceResponse, tonic::Status> {
    let delay = lock(state).delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let reply = lock(state).next(received);
    match reply {
        Reply::Ok => Ok(ExportProfilesServiceResponse::default()),
        Reply::Partial { rejected, message } => Ok(ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: rejected,
                error_message: message,
            }),
        }),
        Reply::Unavailable => Err(tonic::Status::unavailable("test receiver: unavailable")),
        Reply::Invalid(message) => Err(tonic::Status::invalid_argument(message)),
        Reply::Throttle(_) => Err(tonic::Status::resource_exhausted(
            "test receiver: slow down",
        )),
        Reply::ServerError(message) => Err(tonic::Status::unknown(message)),
    }
}

fn metadata_headers(metadata: &tonic::metadata::MetadataMap) -> BTreeMap<String, String> {
    metadata
        .clone()
        .into_headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Passes protobuf bytes through tonic undecoded, so a request of either generation is kept
/// exactly as sent.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
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

impl tonic::codec::Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put(dst, item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Bytes>, tonic::Status> {
        use bytes::Buf as _;
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The ProfilesService `Export` method over raw bytes (any generation), as a tonic service.
#[derive(Clone)]
struct RawProfilesService(Arc<Mutex<State>>);

impl tonic::server::NamedService for RawProfilesService {
    const NAME: &'static str =
        "opentelemetry.proto.collector.profiles.v1development.ProfilesService";
}

struct RawExport(Arc<Mutex<State>>);

impl tonic::server::UnaryService<Bytes> for RawExport {
    type Response = Bytes;
    type Future = tonic::codegen::BoxFuture<tonic::Response<Bytes>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let state = Arc::clone(&self.0);
        Box::pin(async move {
            let headers = metadata_headers(request.metadata());
            let gzip = headers
                .get("grpc-encoding")
                .is_some_and(|v| v.contains("gzip"));
            let received = Received {
                body: request.into_inner().to_vec(),
                wire_bytes: 0,
                gzip,
                headers,
            };
            grpc_answer(&state, received)
                .await
                .map(|r| tonic::Response::new(Bytes::from(r.encode_to_vec())))
        })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for RawProfilesService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let state = Arc::clone(&self.0);
        Box::pin(async move {
            if request.uri().path() != ember_relay::testing::sink::otlp::GRPC_PATH {
                let mut response = http::Response::new(tonic::body::Body::default());
                response.headers_mut().insert(
                    tonic::Status::GRPC_STATUS,
                    (tonic::Code::Unimplemented as i32).into(),
                );
                return Ok(response);
            }
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                .apply_max_message_size_config(Some(64 << 20), None);
            Ok(grpc.unary(RawExport(state), request).await)
        })
    }
}

async fn http_handler(
    state: Arc<Mutex<State>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let respond = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            "content-type",
            "application/x-protobuf".parse().expect("header"),
        );
        response
    };
    if request.method() != hyper::Method::POST || request.uri().path() != "/v1development/profiles"
    {
        return Ok(respond(StatusCode::NOT_FOUND, b"not found".to_vec()));
    }
    let headers: BTreeMap<String, String> = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let gzip = headers.get("content-encoding").is_some_and(|v| v == "gzip");
    let wire = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => {
            return Ok(respond(
                StatusCode::BAD_REQUEST,
                err.to_string().into_bytes(),
            ))
        }
    };
    let body = if gzip {
        let mut out = Vec::new();
        if let Err(err) = flate2::read::GzDecoder::new(&wire[..]).read_to_end(&mut out) {
            return Ok(respond(
                StatusCode::BAD_REQUEST,
                err.to_string().into_bytes(),
            ));
        }
        out
    } else {
        wire.to_vec()
    };
    let delay = lock(&state).delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let reply = lock(&state).next(Received {
        body,
        wire_bytes: wire.len(),
        gzip,
        headers,
    });
    let response = match reply {
        Reply::Ok => respond(
            StatusCode::OK,
            ExportProfilesServiceResponse::default().encode_to_vec(),
        ),
        Reply::Partial { rejected, message } => respond(
            StatusCode::OK,
            ExportProfilesServiceResponse {
                partial_success: Some(ExportProfilesPartialSuccess {
                    rejected_profiles: rejected,
                    error_message: message,
                }),
            }
            .encode_to_vec(),
        ),
        Reply::Unavailable => respond(StatusCode::SERVICE_UNAVAILABLE, b"unavailable".to_vec()),
        Reply::Invalid(message) => respond(StatusCode::BAD_REQUEST, message.into_bytes()),
        Reply::ServerError(message) => {
            respond(StatusCode::INTERNAL_SERVER_ERROR, message.into_bytes())
        }
        Reply::Throttle(secs) => {
            let mut r = respond(StatusCode::TOO_MANY_REQUESTS, b"slow down".to_vec());
            r.headers_mut()
                .insert("retry-after", secs.to_string().parse().expect("header"));
            r
        }
    };
    Ok(response)
}

/// Which server a [`Receiver`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Grpc,
    Http,
}

/// Serves a gRPC `service` on `listener` (through TLS when given) until `shutdown`.
async fn serve_grpc<S>(
    service: S,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()>,
) where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let server = tonic::transport::Server::builder();
    let _ = match tls {
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            server
                .serve_with_incoming_shutdown(service, incoming, shutdown)
                .await
        }
        Some(tls) => {
            server
                .serve_with_incoming_shutdown(service, tls_incoming(listener, tls), shutdown)
                .await
        }
    };
}

impl Receiver {
    /// A gRPC receiver on `addr` (a free loopback port when `None`). It serves the
    /// `ProfilesService/Export` path but does not decode: it keeps each message's bytes exactly as
    /// sent (after the 5-byte frame header and gzip), whatever their generation, so the checks
    /// decode what ember put on the wire, not a re-encoding.
    pub fn grpc(addr: Option<SocketAddr>) -> Self {
        Self::start_with(addr, Kind::Grpc, None)
    }

    /// An HTTP receiver on `addr` (a free loopback port when `None`).
    pub fn http(addr: Option<SocketAddr>) -> Self {
        Self::start_with(addr, Kind::Http, None)
    }

    /// A gRPC receiver behind TLS (`tls` should offer ALPN `h2`).
    pub fn grpc_tls(tls: Arc<rustls::ServerConfig>) -> Self {
        Self::start_with(None, Kind::Grpc, Some(tls))
    }

    /// An HTTP receiver behind TLS.
    pub fn http_tls(tls: Arc<rustls::ServerConfig>) -> Self {
        Self::start_with(None, Kind::Http, Some(tls))
    }

    fn start_with(
        addr: Option<SocketAddr>,
        kind: Kind,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        let listener = bind(addr);
        let addr = listener.local_addr().expect("local_addr");
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, stopped) = oneshot::channel::<()>();
        let thread_state = Arc::clone(&state);
        let thread = thread::Builder::new()
            .name(format!("{kind:?}-receiver").to_lowercase())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("receiver runtime");
                runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    let shutdown = async {
                        let _ = stopped.await;
                    };
                    if kind == Kind::Grpc {
                        serve_grpc(RawProfilesService(thread_state), listener, tls, shutdown)
                            .await;
                    } else {
                        tokio::pin!(shutdown);
                        loop {
                            tokio::select! {
                                _ = &mut shutdown => break,
                                accepted = listener.accept() => {
                                    let Ok((stream, _)) = accepted else { continue };
                                    let state = Arc::clone(&thread_state);
                                    let tls = tls.clone();
                                    tokio::spawn(async move {
                                        let service = service_fn(move |r| http_handler(Arc::clone(&state), r));
                                        let http = hyper::server::conn::http1::Builder::new();
                                        match tls {
                                            None => {
                                                let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
                                            }
                                            Some(tls) => {
                                                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                                                    return;
                                                };
                                                let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
                                            }
                                        }
                                    });
                                }
                            }
                        }
                    }
                });
            })
            .expect("starting the receiver thread");
        Self {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replies for the next requests (then `Ok` again).
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.state).script.extend(replies);
    }

    /// Answers every request only after `delay`.
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.state).delay = delay;
    }

    /// Accepted requests so far.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.state).received.clone()
    }

    /// Requests answered so far, accepted or not.
    pub fn attempts(&self) -> u64 {
        lock(&self.state).attempts
    }

    pub fn answered(&self) -> Vec<Reply> {
        lock(&self.state).answered.clone()
    }

    /// Polls until `condition` holds on the accepted requests, up to `timeout`.
    pub fn wait_for(&self, timeout: Duration, condition: impl Fn(&[Received]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if condition(&lock(&self.state).received) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A TLS server stream that tonic can serve (tonic's own TLS support is not compiled in).
pub struct TlsConn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl tokio::io::AsyncRead for TlsConn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TlsConn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepted TCP connections after their TLS handshake (failed handshakes are skipped).
fn tls_incoming(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
) -> impl futures_util::Stream<Item = Result<TlsConn, std::io::Error>> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    futures_util::stream::unfold(listener, move |listener| {
        let acceptor = acceptor.clone();
        async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                if let Ok(tls) = acceptor.accept(stream).await {
                    return Some((Ok(TlsConn(tls)), listener));
                }
            }
        }
    })
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// A sample as decoded: its count, its frames (leaf first; inlined functions expanded), its
/// frames' `profile.frame.type`, and its attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedSample {
    pub count: i64,
    pub stack: Vec<String>,
    pub frame_types: Vec<String>,
    pub attributes: BTreeMap<String, String>,
    /// Keys of `attributes` whose value is an integer.
    pub int_attributes: BTreeSet<String>,
    /// The function names of the stack's lines only, leaf first: a location without lines
    /// contributes nothing (what Pyroscope builds its frames from).
    pub line_names: Vec<String>,
}

/// A resource with its profile's samples.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedResource {
    pub attributes: BTreeMap<String, String>,
    /// Keys of `attributes` whose value is an integer.
    pub int_attributes: BTreeSet<String>,
    pub samples: Vec<DecodedSample>,
}

/// The facts of one request, whichever generation it was decoded with.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub resources: Vec<DecodedResource>,
    pub period: i64,
    pub sample_type: (String, String),
    pub period_type: (String, String),
    pub time_unix_nano: u64,
    pub duration_nano: u64,
    /// Whether index 0 of every dictionary table is the empty element.
    pub empty_first: bool,
    /// Mapping file names with their `process.executable.build_id.gnu`.
    pub build_ids: BTreeMap<String, String>,
    pub strings: usize,
}

impl Decoded {
    pub fn samples(&self) -> impl Iterator<Item = (&DecodedResource, &DecodedSample)> {
        self.resources
            .iter()
            .flat_map(|r| r.samples.iter().map(move |s| (r, s)))
    }

    pub fn total(&self) -> i64 {
        self.samples().map(|(_, s)| s.count).sum()
    }
}

/// Extracts [`Decoded`] from a decoded request of either generation (the field names are the
/// same; only `AnyValue`'s module differs).
macro_rules! decode_facts {
    ($message:expr, $any:path) => {{
        use $any as any;
        let message = $message;
        let dictionary = message.dictionary.clone().unwrap_or_default();
        let strings = &dictionary.string_table;
        let string = |i: i32| -> String {
            usize::try_from(i)
                .ok()
                .and_then(|i| strings.get(i))
                .cloned()
                .unwrap_or_else(|| format!("<bad string index {i}>"))
        };
        let value = |v: &Option<_>| -> String {
            match v {
                Some(any::AnyValue {
                    value: Some(any::any_value::Value::StringValue(s)),
                    ..
                }) => s.clone(),
                Some(any::AnyValue {
                    value: Some(any::any_value::Value::IntValue(i)),
                    ..
                }) => i.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            }
        };
        let is_int = |v: &Option<_>| {
            matches!(
                v,
                Some(any::AnyValue {
                    value: Some(any::any_value::Value::IntValue(_)),
                    ..
                })
            )
        };
        let int_attribute = |i: &i32| -> Option<String> {
            usize::try_from(*i)
                .ok()
                .and_then(|i| dictionary.attribute_table.get(i))
                .filter(|a| is_int(&a.value))
                .map(|a| string(a.key_strindex))
        };
        let attribute = |i: &i32| -> (String, String) {
            match usize::try_from(*i)
                .ok()
                .and_then(|i| dictionary.attribute_table.get(i))
            {
                Some(a) => (string(a.key_strindex), value(&a.value)),
                None => (format!("<bad attribute index {i}>"), String::new()),
            }
        };
        let empty_first = strings.first().is_some_and(String::is_empty)
            && dictionary
                .function_table
                .first()
                .is_some_and(|f| f.name_strindex == 0 && f.filename_strindex == 0)
            && dictionary
                .location_table
                .first()
                .is_some_and(|l| l.lines.is_empty() && l.address == 0)
            && dictionary
                .mapping_table
                .first()
                .is_some_and(|m| m.filename_strindex == 0 && m.memory_limit == 0)
            && dictionary
                .stack_table
                .first()
                .is_some_and(|s| s.location_indices.is_empty())
            && dictionary
                .attribute_table
                .first()
                .is_some_and(|a| a.key_strindex == 0 && a.value.is_none());
        let build_ids = dictionary
            .mapping_table
            .iter()
            .filter_map(|m| {
                m.attribute_indices
                    .iter()
                    .map(attribute)
                    .find(|(k, _)| k == "process.executable.build_id.gnu")
                    .map(|(_, v)| (string(m.filename_strindex), v))
            })
            .collect();
        let mut decoded = Decoded {
            resources: Vec::new(),
            period: 0,
            sample_type: Default::default(),
            period_type: Default::default(),
            time_unix_nano: 0,
            duration_nano: 0,
            empty_first,
            build_ids,
            strings: strings.len(),
        };
        for rp in &message.resource_profiles {
            let attributes = rp
                .resource
                .as_ref()
                .map(|r| {
                    r.attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), value(&kv.value)))
                        .collect()
                })
                .unwrap_or_default();
            let resource_ints = rp
                .resource
                .as_ref()
                .map(|r| {
                    r.attributes
                        .iter()
                        .filter(|kv| is_int(&kv.value))
                        .map(|kv| kv.key.clone())
                        .collect()
                })
                .unwrap_or_default();
            let mut samples = Vec::new();
            for sp in &rp.scope_profiles {
                for p in &sp.profiles {
                    decoded.period = p.period;
                    decoded.time_unix_nano = p.time_unix_nano;
                    decoded.duration_nano = p.duration_nano;
                    if let Some(t) = &p.sample_type {
                        decoded.sample_type = (string(t.type_strindex), string(t.unit_strindex));
                    }
                    if let Some(t) = &p.period_type {
                        decoded.period_type = (string(t.type_strindex), string(t.unit_strindex));
                    }
                    for s in &p.samples {
                        let mut stack = Vec::new();
                        let mut frame_types = Vec::new();
                        let mut line_names = Vec::new();
                        let locations = usize::try_from(s.stack_index)
                            .ok()
                            .and_then(|i| dictionary.stack_table.get(i))
                            .map(|st| st.location_indices.clone())
                            .unwrap_or_default();
                        for li in locations {
                            let Some(location) = usize::try_from(li)
                                .ok()
                                .and_then(|i| dictionary.location_table.get(i))
                            else {
                                stack.push(format!("<bad location {li}>"));
                                continue;
                            };
                            let kind = location
                                .attribute_indices
                                .iter()
                                .map(attribute)
                                .find(|(k, _)| k == "profile.frame.type")
                                .map(|(_, v)| v)
                                .unwrap_or_default();
                            if location.lines.is_empty() {
                                stack.push("[unknown]".to_owned());
                                frame_types.push(kind.clone());
                            }
                            for line in &location.lines {
                                let name = usize::try_from(line.function_index)
                                    .ok()
                                    .and_then(|i| dictionary.function_table.get(i))
                                    .map(|f| string(f.name_strindex))
                                    .unwrap_or_else(|| "<bad function>".to_owned());
                                stack.push(name.clone());
                                line_names.push(name);
                                frame_types.push(kind.clone());
                            }
                        }
                        samples.push(DecodedSample {
                            count: s.values.iter().sum(),
                            stack,
                            frame_types,
                            attributes: s.attribute_indices.iter().map(attribute).collect(),
                            int_attributes: s
                                .attribute_indices
                                .iter()
                                .filter_map(int_attribute)
                                .collect(),
                            line_names,
                        });
                    }
                }
            }
            decoded.resources.push(DecodedResource {
                attributes,
                int_attributes: resource_ints,
                samples,
            });
        }
        decoded
    }};
}

/// Decodes `body` with the official v1.10 definitions (`opentelemetry-proto` crate).
pub fn decode_v1_10(body: &[u8]) -> Result<Decoded, prost::DecodeError> {
    let message = ExportProfilesServiceRequest::decode(body)?;
    Ok(decode_facts!(
        &message,
        opentelemetry_proto::tonic::common::v1
    ))
}

/// Decodes `body` with the v1.9 definitions (the relay's hand-written ones).
pub fn decode_v1_9(body: &[u8]) -> Result<Decoded, prost::DecodeError> {
    use ember_relay::testing::sink::otlp::v1_9;
    let message = v1_9::ExportProfilesServiceRequest::decode(body)?;
    Ok(decode_facts!(&message, v1_9))
}

/// Decodes `body` with the generation `version` names ("1.9" or "1.10").
pub fn decode(version: &str, body: &[u8]) -> Result<Decoded, prost::DecodeError> {
    match version {
        "1.9" => decode_v1_9(body),
        _ => decode_v1_10(body),
    }
}

// ---------------------------------------------------------------------------------------------
// The independent decoder (Python `opentelemetry-proto` from PyPI)

/// The venv scripts/setup.sh made for generation `version` ("1.9" or "1.10"), if present.
pub fn python_decoder(version: &str) -> Option<std::path::PathBuf> {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(".tools")
        .join(format!("py-otlp-{version}"))
        .join("bin")
        .join("python");
    python.is_file().then_some(python)
}

/// Decodes every one of `bodies` (the exact bytes received) with the official Python package
/// behind `python`, in one run; returns its JSON facts (see tests/python/otlp_decode.py), one
/// entry of `requests` per body. Unless `lenient`, a field unknown to that generation anywhere
/// in any request fails the decoder, and this panics with what it found.
pub fn python_decode(python: &std::path::Path, bodies: &[&[u8]], lenient: bool) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let files: Vec<std::path::PathBuf> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let file = dir.path().join(format!("request-{i:04}.pb"));
            std::fs::write(&file, body).expect("writing the request");
            file
        })
        .collect();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join("otlp_decode.py");
    let output = std::process::Command::new(python)
        .arg(&script)
        .args(lenient.then_some("--lenient"))
        .args(&files)
        .output()
        .expect("running the Python decoder");
    assert!(
        output.status.success(),
        "the official Python decoder ({}) refused the requests:\n{}",
        python.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let facts: Value =
        serde_json::from_slice(&output.stdout).expect("the Python decoder printed no JSON");
    assert_eq!(
        facts["requests"].as_array().map(Vec::len),
        Some(bodies.len()),
        "the Python decoder did not report every request"
    );
    facts
}

// ---------------------------------------------------------------------------------------------
// Test certificates (made with the openssl command at test time; nothing committed)

/// A throwaway CA, a server certificate for localhost / 127.0.0.1 and a client certificate, as
/// PEM files in `dir`.
pub struct TestPki {
    pub ca: std::path::PathBuf,
    pub server_cert: std::path::PathBuf,
    pub server_key: std::path::PathBuf,
    pub client_cert: std::path::PathBuf,
    pub client_key: std::path::PathBuf,
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let output = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("running openssl (scripts/setup.sh installs it)");
    assert!(
        output.status.success(),
        "openssl {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl TestPki {
    pub fn create(dir: &std::path::Path) -> Self {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-days",
            "2",
            "-subj",
            "/CN=ember test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        openssl(dir, &ca);
        for (name, ext) in [
            (
                "server",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
            ),
            (
                "client",
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
            ),
        ] {
            std::fs::write(dir.join(format!("{name}.ext")), ext).expect("writing ext");
            let key = format!("{name}.key");
            let csr = format!("{name}.csr");
            let subject = format!("/CN=ember-test-{name}");
            let mut req = vec!["req"];
            req.extend(ec);
            req.extend(["-subj", &subject, "-keyout", &key, "-out", &csr]);
            openssl(dir, &req);
            let ext_file = format!("{name}.ext");
            let pem = format!("{name}.pem");
            openssl(
                dir,
                &[
                    "x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-days", "2", "-out", &pem, "-extfile", &ext_file,
                ],
            );
        }
        Self {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        }
    }

    /// A rustls server config with the server certificate, offering `alpn`, optionally requiring
    /// a client certificate signed by the CA.
    pub fn server_config(
        &self,
        alpn: &[&[u8]],
        require_client_cert: bool,
    ) -> Arc<rustls::ServerConfig> {
        use rustls::pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.server_cert)
            .expect("server cert")
            .collect::<Result<_, _>>()
            .expect("server cert");
        let key = PrivateKeyDer::from_pem_file(&self.server_key).expect("server key");
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("protocol versions");
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(&self.ca).expect("ca") {
                roots.add(cert.expect("ca cert")).expect("adding the CA");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .expect("server certificate");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}
