//! The HTTP endpoint of [`Metrics`]: `GET /metrics`, `/healthz`, `/readyz`, nothing else. One
//! thread of its own running a single-threaded tokio runtime and hyper's HTTP/1 server, so a
//! scrape never runs on (or waits for) the driver's thread.
//!
//! Bounded, since anyone who can reach the address can connect: at most
//! [`Limits::max_connections`] connections at once (more are closed on accept), one request per
//! connection, the request head within [`Limits::max_head_bytes`] (hyper answers 431 beyond) and
//! [`Limits::head_timeout`], the whole exchange within [`Limits::connection_timeout`], and no
//! request bodies (413). Only GET and HEAD.

use std::{
    convert::Infallible,
    net::{SocketAddr, TcpListener},
    sync::Arc,
    thread,
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use super::{encode, health, Metrics};
use crate::source::Refusal;

/// The server's bounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub max_connections: usize,
    /// Request line and headers; hyper's own floor is 8 KiB.
    pub max_head_bytes: usize,
    pub head_timeout: Duration,
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 16,
            max_head_bytes: 8 << 10,
            head_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(10),
        }
    }
}

/// hyper refuses a smaller read buffer (it panics).
const HYPER_MIN_BUF: usize = 8192;

/// Binds `address` (errors come back here) and serves it on a thread of its own; returns the
/// bound address (the port chosen when `address` asked for port 0).
pub(crate) fn spawn(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    limits: Limits,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || runtime.block_on(accept_loop(listener, metrics, limits)))?;
    Ok(bound)
}

async fn accept_loop(listener: TcpListener, metrics: Arc<Metrics>, limits: Limits) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(%err, "metrics server: cannot use its socket; not serving");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                // E.g. EMFILE: wait rather than spin; the relay's work goes on meanwhile.
                tracing::warn!(%err, "metrics server: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(
                max = limits.max_connections,
                "metrics server: too many connections; closing a new one"
            );
            continue;
        };
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let response = respond(&metrics, &request);
                async move { Ok::<_, Infallible>(response) }
            });
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(limits.head_timeout)
                .max_buf_size(limits.max_head_bytes.max(HYPER_MIN_BUF))
                .keep_alive(false);
            let connection = http.serve_connection(TokioIo::new(stream), service);
            // Either way the connection is closed when this task ends.
            let _ = tokio::time::timeout(limits.connection_timeout, connection).await;
            drop(slot);
        });
    }
}

fn respond(metrics: &Metrics, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    if has_body(request) {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "no request body accepted\n".into(),
        );
    }
    match request.uri().path() {
        "/metrics" => match encode::render(metrics) {
            Ok(body) => {
                let mut response = text(StatusCode::OK, body);
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(encode::CONTENT_TYPE),
                );
                response
            }
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding failed\n".into(),
            ),
        },
        "/healthz" => verdict(health::liveness(metrics.heartbeat_age())),
        "/readyz" => {
            let refused = Refusal::ALL.iter().map(|r| r.total()).sum();
            let relay = metrics.published().relay;
            verdict(health::readiness(
                &relay,
                refused,
                std::time::Instant::now(),
            ))
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics, /healthz, /readyz\n".into(),
        ),
    }
}

fn has_body(request: &Request<Incoming>) -> bool {
    let headers = request.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|length| length.as_bytes() != b"0")
}

/// 200 `ok`, or 503 with the reason on one line.
fn verdict(result: Result<(), String>) -> Response<Full<Bytes>> {
    match result {
        Ok(()) => text(StatusCode::OK, "ok\n".into()),
        Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::{
        io::{ErrorKind, Read as _, Write as _},
        net::TcpStream,
        time::Instant,
    };

    use super::*;

    fn start(limits: Limits) -> SocketAddr {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        spawn(any, Arc::new(Metrics::default()), limits).expect("serve on an ephemeral port")
    }

    /// Sends `request` and reads until the server closes; the client gives up after `patience`.
    fn exchange(
        address: SocketAddr,
        request: &[u8],
        patience: Duration,
    ) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(address)?;
        stream.set_read_timeout(Some(patience))?;
        stream.write_all(request)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }

    fn get(address: SocketAddr, path: &str) -> String {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        exchange(address, request.as_bytes(), Duration::from_secs(10)).expect("an answer")
    }

    #[test]
    fn serves_metrics_and_health_and_nothing_else() {
        let address = start(Limits::default());
        let metrics = get(address, "/metrics");
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(
            metrics.contains("content-type: text/plain; version=0.0.4"),
            "{metrics}"
        );
        assert!(
            metrics.contains("\r\n\r\n# HELP ember_relay_build_info "),
            "{metrics}"
        );
        let healthz = get(address, "/healthz");
        assert!(healthz.starts_with("HTTP/1.1 200 OK\r\n") && healthz.ends_with("\r\n\r\nok\n"));
        let readyz = get(address, "/readyz");
        assert!(readyz.starts_with("HTTP/1.1 503 "), "{readyz}");
        assert!(
            readyz.ends_with("\r\n\r\nno sampler connected\n"),
            "{readyz}"
        );
        assert!(get(address, "/").starts_with("HTTP/1.1 404 "));
        let post = exchange(
            address,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            Duration::from_secs(10),
        )
        .expect("an answer");
        assert!(
            post.starts_with("HTTP/1.1 405 ") && post.contains("allow: GET, HEAD"),
            "{post}"
        );
    }

    #[test]
    fn an_oversized_request_is_refused() {
        let address = start(Limits::default());
        // A request head past the 8 KiB bound: refused by hyper before any handler runs.
        let head = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(16 << 10)
        );
        let answer =
            exchange(address, head.as_bytes(), Duration::from_secs(10)).expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        // A request with a body: refused without reading it.
        let body = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nxxxx";
        let answer = exchange(address, body, Duration::from_secs(10)).expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    }

    #[test]
    fn a_slow_client_is_dropped() {
        // Given a server that waits 300 ms for a request head (and a minute for the whole
        // exchange, so only the head's bound is tested)
        let limits = Limits {
            head_timeout: Duration::from_millis(300),
            connection_timeout: Duration::from_secs(60),
            ..Limits::default()
        };
        let address = start(limits);
        // When a client sends half a request line and waits (far longer than that)
        let patience = Duration::from_secs(5);
        let started = Instant::now();
        let answer = exchange(address, b"GET /metr", patience);
        // Then the server closed the connection: the client's read ended (EOF or reset)
        // before its own timeout fired
        match answer {
            Ok(text) => assert!(!text.contains(" 200 "), "{text}"),
            Err(err) => assert!(
                !matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
                "the server kept a slow client: {err}"
            ),
        }
        assert!(
            started.elapsed() < patience,
            "closed by the client's timeout"
        );
    }

    #[test]
    fn connections_beyond_the_cap_are_closed_at_once() {
        // Given a server of 2 connections, both held by idle clients
        let limits = Limits {
            max_connections: 2,
            ..Limits::default()
        };
        let address = start(limits);
        let held: Vec<TcpStream> = (0..2)
            .map(|_| TcpStream::connect(address).expect("connect"))
            .collect();
        // When a third client asks for metrics, then it gets no answer: closed on accept
        let refused = exchange(
            address,
            b"GET /healthz HTTP/1.1\r\n\r\n",
            Duration::from_secs(30),
        );
        assert!(
            refused.as_ref().map_or_else(
                |e| !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
                String::is_empty
            ),
            "{refused:?}"
        );
        // And once the idle clients leave, the next one is served
        drop(held);
        let served = (0..50).find_map(|_| {
            // Until the server has seen them go, a new client may still be closed (reset).
            let request = b"GET /healthz HTTP/1.1\r\n\r\n";
            let answer = exchange(address, request, Duration::from_secs(10));
            if answer
                .as_ref()
                .is_ok_and(|a| a.starts_with("HTTP/1.1 200 "))
            {
                return Some(());
            }
            thread::sleep(Duration::from_millis(20));
            None
        });
        assert!(
            served.is_some(),
            "no connection served after the others closed"
        );
    }
}
