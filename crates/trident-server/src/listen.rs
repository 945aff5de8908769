//! The connection layer under both HTTP services: an accept loop with a connection cap,
//! hyper's HTTP/1 server with read timeouts, and a bounded graceful drain.
//!
//! Written on hyper directly because `axum::serve` exposes none of this: it sets no
//! timer (so hyper's header timeout never fires), has no connection limit, and its
//! graceful shutdown waits for every connection however long a client stalls.
//!
//! * **Connection cap.** Each connection holds a permit; past the cap a connection is
//!   answered `503 {"error": ...}` and closed, so existing clients keep being served.
//! * **Header timeout.** A request head must arrive whole within `header_timeout` of its
//!   first byte (of the accept, for a connection's first request); else `408` and close.
//! * **Idle keep-alive.** A connection that waits `keepalive_timeout` for the first byte
//!   of its next request is closed.
//! * **Drain.** On shutdown the listener closes at once, each connection finishes the
//!   request it has and closes; after `drain_timeout` whatever is left is dropped.
//!
//! hyper answers unparseable heads (400, 414, 431) itself with an empty body. The
//! connection's I/O wrapper knows whether a request of ours is being answered, so any
//! response written while none is must be one of hyper's; it is replaced by the same
//! status with a `{"error": ...}` body, as every other error of the server has.

use crate::guard::{self, Limits};
use crate::ServerConfig;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Sleep;

/// Connections over the cap being answered at once, at most.
const REFUSALS_IN_FLIGHT: usize = 64;

/// What a listener serves besides plain HTTP/1.
#[derive(Default)]
pub(crate) struct Extras {
    /// HTTPS: the handshake before HTTP.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Single-port mode: HTTP/2 connections, gRPC calls to this router.
    pub grpc: Option<SinglePort>,
}

/// gRPC on the HTTP port: its routes and the HTTP/2 keepalive of `--grpc-keepalive-*`.
#[derive(Clone)]
pub(crate) struct SinglePort {
    pub router: Router,
    /// Ping interval.
    pub keepalive_time: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Option<Duration>,
}

/// Serves `router` on `listener` until `stop` turns true, then drains.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    config: ServerConfig,
    what: &'static str,
    extras: Extras,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let Extras { tls, grpc } = extras;
    let permits = Arc::new(Semaphore::new(config.max_connections));
    // Refusals are answered by tasks that live up to two seconds; past this many at once
    // (a flood), a connection over the cap is simply closed.
    let refusals = Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT));
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The read deadlines are the I/O wrapper's (`Guarded`): hyper's own header timer
    // would arm a timer for every request, so it gets no timer and no timeout.
    builder.header_read_timeout(None);
    let builder = Arc::new(builder);
    let mut refused = Refused::default();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("{what}: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused.note(what, peer, config.max_connections);
            if let Ok(refusal) = refusals.clone().try_acquire_owned() {
                let cap = config.max_connections;
                tokio::spawn(async move {
                    refuse(stream, cap).await;
                    drop(refusal);
                });
            }
            continue;
        };
        let connection = Connection {
            builder: builder.clone(),
            router: router.clone(),
            limits: limits.clone(),
            timeouts: Timeouts {
                header: config.header_timeout,
                keepalive: config.keepalive_timeout,
            },
            stop: stop.clone(),
        };
        let tls = tls.clone();
        let grpc = grpc.clone();
        tokio::spawn(async move {
            match tls {
                // Single-port mode: a connection that opens with HTTP/2's preface is gRPC
                // (h2c with prior knowledge, as gRPC clients connect).
                // The first bytes get the header timeout, as a request head would.
                None if grpc.is_some() => {
                    match tokio::time::timeout(connection.timeouts.header, is_http2(&stream)).await {
                        Ok(true) => connection.run_http2(stream, grpc.expect("checked")).await,
                        Ok(false) => connection.run(stream).await,
                        Err(_) => tracing::debug!(%peer, "no request within the header timeout"),
                    }
                }
                None => connection.run(stream).await,
                // The handshake gets the header timeout, as a request head would.
                Some(acceptor) => {
                    match tokio::time::timeout(connection.timeouts.header, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => connection.run(stream).await,
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    let open = config.max_connections - permits.available_permits();
    if open > 0 {
        tracing::info!("{what}: draining {open} open connections");
    }
    let all = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
    match tokio::time::timeout(config.drain_timeout, permits.acquire_many(all)).await {
        Ok(_) => {}
        Err(_) => tracing::warn!(
            "{what}: {} connections still open after the {:?} drain time (--exit-timeout-secs): dropped",
            config.max_connections - permits.available_permits(),
            config.drain_timeout
        ),
    }
    Ok(())
}

/// Logs refused connections at most once a second, with how many there were.
#[derive(Default)]
struct Refused {
    last_log: Option<std::time::Instant>,
    unlogged: u64,
}

impl Refused {
    fn note(&mut self, what: &str, peer: std::net::SocketAddr, cap: usize) {
        self.unlogged += 1;
        if self
            .last_log
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        tracing::warn!(
            %peer,
            "{what}: {} connection(s) refused: {cap} connections open (--http-max-connections)",
            self.unlogged
        );
        self.last_log = Some(std::time::Instant::now());
        self.unlogged = 0;
    }
}

/// Resolves once shutdown has begun.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|&s| s).await;
}

/// Everything a connection task needs.
struct Connection {
    builder: Arc<hyper::server::conn::http1::Builder>,
    router: Router,
    limits: Limits,
    timeouts: Timeouts,
    stop: watch::Receiver<bool>,
}

/// A connection's byte stream: plain TCP, or TLS over TCP.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Writes what fits now without waiting, best effort (a last word before closing).
    fn try_write_now(&mut self, buf: &[u8]);
}

impl Stream for TcpStream {
    fn try_write_now(&mut self, buf: &[u8]) {
        let _ = self.try_write(buf);
    }
}

impl Stream for tokio_rustls::server::TlsStream<TcpStream> {
    /// Encrypted bytes cannot be written synchronously: the connection just closes.
    fn try_write_now(&mut self, _: &[u8]) {}
}

impl Connection {
    async fn run<S: Stream>(mut self, stream: S) {
        let state = Arc::new(ConnState::new());
        let io = Guarded::new(stream, state.clone(), self.timeouts);
        let (router, limits) = (self.router, self.limits);
        let progress = state.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let guard = InFlight::start(state.clone());
            let response = guard::handle(router.clone(), limits.clone(), request.map(axum::body::Body::new));
            async move {
                let response = response.await;
                Ok::<_, std::convert::Infallible>(response.map(|body| Tracked { body, _guard: guard }))
            }
        });
        let conn = self.builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(conn);
        let result = tokio::select! {
            result = conn.as_mut() => result,
            () = stopped(&mut self.stop) => {
                // A request being answered finishes; a connection that is idle or still
                // sending its request holds nothing in flight and is closed now.
                if progress.progress().1 {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                } else {
                    Ok(())
                }
            }
        };
        if let Err(e) = result {
            tracing::debug!("connection closed: {e}");
        }
    }
}

/// HTTP/2's connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the connection's first bytes are HTTP/2's preface (HTTP/1 clients send a
/// request line, which differs in its first byte). The caller bounds the wait.
async fn is_http2(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 24];
    loop {
        match stream.peek(&mut buf).await {
            Ok(n) if n >= H2_PREFACE.len() => return buf == H2_PREFACE,
            Ok(n) if n > 0 && buf[..n] != H2_PREFACE[..n] => return false,
            Ok(0) | Err(_) => return false,
            // A prefix of the preface so far: peek returns at once, so wait a little.
            Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
}

impl Connection {
    /// An HTTP/2 connection in single-port mode: gRPC calls go to `grpc`'s router
    /// (tonic's message limits), anything else through the guard to the REST routes; the
    /// connection keeps `--grpc-keepalive-*`'s pings. No HTTP/1 read deadlines: an HTTP/2
    /// connection idles between calls by design.
    async fn run_http2(mut self, stream: TcpStream, single: SinglePort) {
        let grpc = single.router;
        let (router, limits) = (self.router, self.limits);
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let is_grpc = request
                .headers()
                .get(axum::http::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
            let (mut grpc, router, limits) = (grpc.clone(), router.clone(), limits.clone());
            async move {
                let request = request.map(axum::body::Body::new);
                let response = if is_grpc {
                    use tower_service::Service;
                    let Ok(response) = grpc.call(request).await;
                    response
                } else {
                    guard::handle(router, limits, request).await
                };
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let mut builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(single.keepalive_time);
        if let Some(timeout) = single.keepalive_timeout {
            builder.keep_alive_timeout(timeout);
        }
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(conn);
        let result = tokio::select! {
            result = conn.as_mut() => result,
            () = stopped(&mut self.stop) => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = result {
            tracing::debug!("HTTP/2 connection closed: {e}");
        }
    }
}

/// Answers a connection over the cap and closes it (bounded: a client that does not
/// read is dropped).
async fn refuse(mut stream: TcpStream, cap: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = format!(
        "{{\"error\":\"the server has {cap} connections open, its limit: retry later or reuse a connection\"}}"
    );
    let response = json_response(503, "Service Unavailable", &body);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(&response).await?;
        stream.shutdown().await?;
        // Read what the client sent so closing does not reset the connection before it
        // has read the answer.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

fn json_response(status: u16, reason: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Per-connection bookkeeping shared by the I/O wrapper and the service.
struct ConnState {
    /// When the connection was accepted.
    accepted: Instant,
    /// Requests handed to the service so far.
    started: AtomicU64,
    /// Responses whose body has been sent (or dropped).
    finished: AtomicU64,
    /// When the last response ended, in nanoseconds after `accepted`: the idle time runs
    /// from there.
    idle_since_ns: AtomicU64,
}

impl ConnState {
    fn new() -> Self {
        ConnState {
            accepted: Instant::now(),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            idle_since_ns: AtomicU64::new(0),
        }
    }

    /// When the connection last became idle.
    fn idle_since(&self) -> Instant {
        self.accepted + Duration::from_nanos(self.idle_since_ns.load(Ordering::Acquire))
    }

    /// The number of requests started, and whether one is being answered.
    fn progress(&self) -> (u64, bool) {
        let started = self.started.load(Ordering::Acquire);
        (started, self.finished.load(Ordering::Acquire) < started)
    }
}

/// Marks a request as being answered until the response body is done.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn start(state: Arc<ConnState>) -> Self {
        state.started.fetch_add(1, Ordering::AcqRel);
        InFlight(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let since = self.0.accepted.elapsed().as_nanos();
        self.0
            .idle_since_ns
            .store(since.min(u64::MAX as u128) as u64, Ordering::Release);
        self.0.finished.fetch_add(1, Ordering::AcqRel);
    }
}

/// A response body that ends the request's [`InFlight`] when hyper drops it.
struct Tracked {
    body: axum::body::Body,
    _guard: InFlight,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The connection's socket, with its read deadlines and the rewriting of hyper's own
/// error responses (see the module documentation).
///
/// Deadlines are plain instants, checked only when a read would block: a request whose
/// head arrives in one read (nearly all of them) costs no timer at all.
struct Guarded<S> {
    io: S,
    state: Arc<ConnState>,
    timeouts: Timeouts,
    /// What the connection is waiting for, by when, and the request count at that moment
    /// (a deadline set before a request reached the service is void after it).
    waiting: Option<(Wait, Instant, u64)>,
    /// The timer, made the first time a read blocks with a deadline, then reset.
    sleep: Option<Pin<Box<Sleep>>>,
    /// A replacement response still being written; hyper's bytes are swallowed.
    replacement: Option<(Vec<u8>, usize)>,
}

/// The read timeouts of a connection.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    header: Duration,
    keepalive: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The rest of a request head (since its first byte, or since the accept).
    Head,
    /// The first byte of the next request.
    Idle,
}

impl<S: Stream> Guarded<S> {
    fn new(io: S, state: Arc<ConnState>, timeouts: Timeouts) -> Self {
        Guarded {
            io,
            state,
            timeouts,
            // A new connection's first head is due within the header timeout.
            waiting: Some((Wait::Head, Instant::now() + timeouts.header, 0)),
            sleep: None,
            replacement: None,
        }
    }

    /// Whether `deadline` has passed; if not, the timer will wake the task by then. The
    /// timer is re-registered only when the deadline moves earlier (or when it fires
    /// early and is re-armed), not each time a later deadline replaces it: the idle
    /// deadline moves with every request, and costs nothing for it.
    fn expired(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        let deadline = tokio::time::Instant::from_std(deadline);
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        while sleep.as_mut().poll(cx).is_ready() {
            if tokio::time::Instant::now() >= deadline {
                return true;
            }
            sleep.as_mut().reset(deadline);
        }
        false
    }

    /// Writes what is left of the replacement response.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some((data, written)) = &mut self.replacement {
            while *written < data.len() {
                let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &data[*written..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                *written += n;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Whether `first` (the start of a write) is a response hyper makes on its own, and
    /// if so, starts writing its JSON replacement.
    fn intercept(&mut self, first: &[u8]) -> bool {
        if self.replacement.is_some() {
            return true;
        }
        let Some((code, reason, message)) = hyper_error(first) else {
            return false;
        };
        let body = format!("{{\"error\":\"{message}\"}}");
        self.replacement = Some((json_response(code, reason, &body), 0));
        true
    }
}

/// The status of one of hyper's automatic answers to an unparseable head: a 400, 414 or
/// 431 with `content-length: 0`. The server's own error answers always have a JSON
/// body (the guard sees to that), so they never look like this.
fn hyper_error(head: &[u8]) -> Option<(u16, &'static str, &'static str)> {
    let rest = head.strip_prefix(b"HTTP/1.1 ")?;
    let answer = match rest.get(..4)? {
        b"400 " => (400, "Bad Request", "malformed HTTP request"),
        b"414 " => (414, "URI Too Long", "the request URI is too long"),
        b"431 " => (
            431,
            "Request Header Fields Too Large",
            "the request header fields are too large",
        ),
        _ => return None,
    };
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let fields = head[..end + 2].to_ascii_lowercase();
    fields
        .windows(21)
        .any(|w| w == b"\r\ncontent-length: 0\r\n")
        .then_some(answer)
}

impl<S: Stream> AsyncRead for Guarded<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let (started, answering) = this.state.progress();
        if answering || this.waiting.is_some_and(|(_, _, at)| at != started) {
            this.waiting = None;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let got = buf.filled().len() > before;
                if got && !answering && !matches!(this.waiting, Some((Wait::Head, ..))) {
                    this.waiting = Some((Wait::Head, Instant::now() + this.timeouts.header, started));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if answering {
                    // No deadline while a response is under way; a wake-up a keep-alive
                    // time from now looks again (the response may be done by then, its
                    // end not having woken this read).
                    let _ = this.expired(cx, Instant::now() + this.timeouts.keepalive);
                    return Poll::Pending;
                }
                let (_, deadline, _) = *this.waiting.get_or_insert_with(|| {
                    let idle_until = this.state.idle_since() + this.timeouts.keepalive;
                    (Wait::Idle, idle_until, started)
                });
                if !this.expired(cx, deadline) {
                    return Poll::Pending;
                }
                match this.waiting.take().map(|(wait, ..)| wait) {
                    Some(Wait::Idle) => {
                        // An idle keep-alive connection ends as if the client had closed it.
                        Poll::Ready(Ok(()))
                    }
                    _ => {
                        let body = format!(
                            "{{\"error\":\"the request header was not received within {:?}\"}}",
                            this.timeouts.header
                        );
                        // Best effort: the client is told why before the connection closes.
                        this.io
                            .try_write_now(&json_response(408, "Request Timeout", &body));
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "request header timeout",
                        )))
                    }
                }
            }
            ready => ready,
        }
    }
}

impl<S: Stream> AsyncWrite for Guarded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.intercept(buf) {
            std::task::ready!(this.poll_replacement(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
        if !first.is_empty() && this.intercept(first) {
            std::task::ready!(this.poll_replacement(cx))?;
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_empty_parse_error_answers_are_replaced() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(hyper_error(hyper).map(|a| a.0), Some(431));
        let last = b"HTTP/1.1 400 Bad Request\r\ndate: x\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hyper_error(last).map(|a| a.0), Some(400));
        let ours =
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 20\r\n\r\n{}";
        assert_eq!(hyper_error(ours), None);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hyper_error(ok), None);
        assert_eq!(hyper_error(b"{\"model_name\":"), None);
        let long = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 05\r\n\r\n";
        assert_eq!(hyper_error(long), None);
    }
}
