//! The HTTP endpoint of [`Metrics`]: `GET /metrics`, `/healthz`, `/readyz`, nothing else. One
//! thread of its own running a single-threaded tokio runtime and hyper's HTTP/1 server, so a
//! scrape never runs on (or waits for) the driver's thread.
//!
//! Bounded, since anyone who can reach the address can connect (the bounds and who is closed
//! when they are reached: [`admission`](super::admission)): a connection is never queued nor
//! refused on accept; each is served on its own task at once, one request per connection, the
//! request head within [`Limits::max_head_bytes`] (hyper answers 431 beyond) and
//! [`Limits::head_timeout`] of the accept, the whole exchange within
//! [`Limits::connection_timeout`], and no request bodies (413). Only GET and HEAD. Every answer,
//! a scrape's too, is computed on this thread without waiting for anything (health and readiness
//! read two atomics and a snapshot; a scrape encodes a snapshot), so a probe waits for no slot
//! and for no other client.

use std::{
    convert::Infallible,
    future,
    net::{SocketAddr, TcpListener},
    sync::{atomic::Ordering::Relaxed, Arc},
    thread,
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;

pub(crate) use super::admission::Limits;
use super::{
    admission::{Admission, Closed, Ticket},
    encode, health, Metrics,
};

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
    let admission = Admission::new(limits, metrics.connection_stats());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // E.g. EMFILE: wait rather than spin; the relay's work goes on meanwhile.
                tracing::warn!(%err, "metrics server: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ticket = admission.admit(peer.ip());
        tokio::spawn(serve(stream, ticket, Arc::clone(&metrics), limits));
        // Let the connection just accepted read the request it most likely already holds
        // before accepting the next: a burst of connections cannot push a probe out (it would
        // have to be the oldest) before it was even read.
        tokio::task::yield_now().await;
    }
}

/// One connection, until its exchange ends, a bound closes it or the table makes room with it.
async fn serve(
    stream: tokio::net::TcpStream,
    mut ticket: Ticket,
    metrics: Arc<Metrics>,
    limits: Limits,
) {
    let head_read = Arc::clone(&ticket.head_read);
    let service = service_fn(move |request| {
        head_read.store(true, Relaxed);
        let response = respond(&metrics, &request);
        async move { Ok::<_, Infallible>(response) }
    });
    let mut http = http1::Builder::new();
    // The head's deadline is ours (below, from the accept, counted); hyper's would only start
    // at its first read and go uncounted.
    http.header_read_timeout(None)
        .max_buf_size(limits.max_head_bytes.max(HYPER_MIN_BUF))
        .keep_alive(false);
    let connection = http.serve_connection(TokioIo::new(stream), service);
    let head_read = Arc::clone(&ticket.head_read);
    let head_deadline = async move {
        tokio::time::sleep(limits.head_timeout).await;
        if head_read.load(Relaxed) {
            future::pending::<()>().await;
        }
    };
    // Either way the connection is closed when this task ends (the stream is dropped).
    let timed_out = tokio::select! {
        _ = connection => None,
        // Closed to make room, already counted.
        _ = &mut ticket.closed => None,
        () = head_deadline => Some(Closed::HeadTimeout),
        () = tokio::time::sleep(limits.connection_timeout) => Some(Closed::ExchangeTimeout),
    };
    if let Some(reason) = timed_out {
        ticket.close(reason);
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
            let refused = metrics.refusals().sum();
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
        start_with(&Arc::new(Metrics::default()), limits)
    }

    fn start_with(metrics: &Arc<Metrics>, limits: Limits) -> SocketAddr {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        spawn(any, Arc::clone(metrics), limits).expect("serve on an ephemeral port")
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
    fn a_slow_client_is_closed_and_counted_after_the_head_timeout() {
        // Given a server that waits 300 ms for a request head
        let metrics = Arc::new(Metrics::default());
        let limits = Limits {
            head_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let address = start_with(&metrics, limits);
        // When a client sends a few bytes of its head, one at a time, and keeps going
        let mut slow = TcpStream::connect(address).expect("connect");
        let mut sent = 0;
        let started = Instant::now();
        let kept = (0..50).all(|_| {
            thread::sleep(Duration::from_millis(50));
            sent += 1;
            slow.write_all(b"G").is_ok()
        });
        // Then the server closed it (writes fail once the reset came back) and counted it
        let stats = metrics.connection_stats();
        eprintln!(
            "slow client: {sent} bytes sent in {:?}; head timeouts {}",
            started.elapsed(),
            stats.closed(Closed::HeadTimeout)
        );
        assert!(
            !kept,
            "the server kept a client that never finished its head"
        );
        assert_eq!(stats.closed(Closed::HeadTimeout), 1);
        assert_eq!(stats.open(), 0);
    }

    #[test]
    fn health_is_answered_while_slow_clients_hold_every_connection() {
        // Given a server of 4 connections, at most 3 per peer, that would wait a minute for a
        // head (so only the connection bounds are tested)
        let metrics = Arc::new(Metrics::default());
        let limits = Limits {
            max_connections: 4,
            max_per_peer: 3,
            head_timeout: Duration::from_secs(60),
            connection_timeout: Duration::from_secs(60),
            ..Limits::default()
        };
        let address = start_with(&metrics, limits);
        // And 20 clients that each sent half a request line and wait
        let slow: Vec<TcpStream> = (0..20)
            .map(|_| {
                let mut stream = TcpStream::connect(address).expect("connect");
                stream.write_all(b"GET /hea").expect("write");
                stream
            })
            .collect();
        // When probes come from the same address, each allowed 1 s for its answer
        for _ in 0..10 {
            let answer = exchange(
                address,
                b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                Duration::from_secs(1),
            );
            // Then each is answered
            let answer = answer.expect("a probe answered within 1 s");
            assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        }
        let scrape = get(address, "/metrics");
        assert!(scrape.starts_with("HTTP/1.1 200 "), "{scrape}");
        // And the slow ones made room, counted
        let stats = metrics.connection_stats();
        let peer_limit = stats.closed(Closed::PeerLimit);
        eprintln!(
            "accepted {}, closed for the peer limit {peer_limit}, open {}",
            stats.accepted(),
            stats.open()
        );
        assert!(peer_limit >= 17, "{peer_limit}");
        assert!(
            scrape.contains("ember_relay_metrics_connections_closed_total{reason=\"peer_limit\"}"),
            "{scrape}"
        );
        drop(slow);
    }
}
