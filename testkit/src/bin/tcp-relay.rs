//! `tcp-relay`: the proxy benchmark's floors (driven by `bench/proxy/compare.sh`, targets
//! `relay`, `relay-http` and `relay-axum`). It forwards bytes between each client connection
//! and a connection of its own to `--to`, and does nothing else: no HTTP parsing, no routing, no
//! records. With `--http` it is instead the least an HTTP proxy on hyper does: each request
//! parsed by hyper's HTTP/1 server and sent on through hyper's pooled client (one per serving
//! thread), the answer's body streamed back as it comes; still no routing, no body inspection,
//! no records. With `--axum` the same pass-through is an axum handler served by `axum::serve`,
//! the gateway's framework (its per-connection service, router and body type), still doing
//! nothing of its own. Every mode serves the way the gateway does (one single-threaded tokio
//! runtime per serving thread, each accepting on a duplicate of one listener, TCP_NODELAY on its
//! sockets), so its CPU per request and its added latency are what a proxy on this runtime (and
//! this HTTP stack, and this framework) pays before doing any work of its own. It prints
//! `listening on http://ADDR` once it accepts.

use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

const USAGE: &str = "usage: tcp-relay --to ADDR [--listen ADDR] [--threads N] [--http | --axum]";

/// What a serving thread does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Bytes both ways.
    Bytes,
    /// Hyper's HTTP/1 server and pooled client.
    Http,
    /// The same pass-through as an axum handler under `axum::serve`.
    Axum,
}

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcp-relay: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let mut to: Option<SocketAddr> = None;
    let mut listen: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut threads = std::thread::available_parallelism().map_or(1, usize::from);
    let mut mode = Mode::Bytes;
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let chosen = match flag.as_str() {
            "--http" => Some(Mode::Http),
            "--axum" => Some(Mode::Axum),
            _ => None,
        };
        if let Some(m) = chosen {
            if mode != Mode::Bytes && mode != m {
                return Err("--http and --axum are exclusive".into());
            }
            mode = m;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--to" => to = Some(value.parse().map_err(|e| bad(&e))?),
            "--listen" => listen = value.parse().map_err(|e| bad(&e))?,
            "--threads" => threads = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let to = to.ok_or("--to is required")?;
    let listener =
        std::net::TcpListener::bind(listen).map_err(|e| format!("bind {listen}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut serving = Vec::new();
    for i in 0..threads.max(1) {
        let accepting = listener.try_clone().map_err(|e| e.to_string())?;
        serving.push(
            std::thread::Builder::new()
                .name(format!("relay-{i}"))
                .spawn(move || serve(accepting, to, mode))
                .map_err(|e| e.to_string())?,
        );
    }
    println!("listening on http://{addr}");
    for t in serving {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a serving thread panicked".into()),
        }
    }
    Ok(())
}

/// One serving thread: accept on `listener` and relay each connection to `to` (as bytes, or as
/// HTTP requests), forever.
fn serve(listener: std::net::TcpListener, to: SocketAddr, mode: Mode) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        if mode == Mode::Axum {
            return serve_axum(listener, to).await;
        }
        // the HTTP mode's pooled client; the byte mode has none
        let upstream: Option<Upstream<Incoming>> = (mode == Mode::Http).then(client);
        loop {
            let (client, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // out of descriptors, say: pause rather than spin on the error
                    eprintln!("tcp-relay: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = client.set_nodelay(true);
            match &upstream {
                Some(upstream) => tokio::spawn(http_connection(client, upstream.clone(), to)),
                None => tokio::spawn(byte_connection(client, to)),
            };
        }
    })
}

/// Bytes both ways between `client` and a new connection to `to`, until either side closes.
async fn byte_connection(mut client: tokio::net::TcpStream, to: SocketAddr) {
    let mut upstream = match tokio::net::TcpStream::connect(to).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tcp-relay: connect {to}: {e}");
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    // either side closing ends the pair; the error says only which one went first
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// The pooled HTTP client of one serving thread; request bodies stream through as they came.
type Upstream<B> = Client<HttpConnector, B>;

/// A pooled client whose connections have TCP_NODELAY, as the gateway's have.
fn client<B>() -> Upstream<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// `req` sent on to `to` (same method, path, headers and body) through `upstream`: the answer,
/// or the status to answer instead (400 for a path that makes no URI, 502 when `to` cannot be
/// reached).
async fn pass<B>(
    upstream: &Upstream<B>,
    mut req: Request<B>,
    to: SocketAddr,
) -> Result<Response<Incoming>, StatusCode>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri = format!("http://{to}{path}")
        .parse()
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    *req.uri_mut() = uri;
    upstream.request(req).await.map_err(|e| {
        eprintln!("tcp-relay: upstream {to}: {e}");
        StatusCode::BAD_GATEWAY
    })
}

/// Serves HTTP/1 on `client`, each request sent on to `to` (same method, path, headers and
/// body) and its answer returned as it streams; 502 with no body when `to` cannot be reached.
async fn http_connection(
    client: tokio::net::TcpStream,
    upstream: Upstream<Incoming>,
    to: SocketAddr,
) {
    let service = service_fn(move |req: Request<Incoming>| {
        let upstream = upstream.clone();
        async move {
            Ok::<_, std::convert::Infallible>(match pass(&upstream, req, to).await {
                Ok(resp) => resp.map(Either::Left),
                Err(code) => status(code),
            })
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .await;
}

/// An answer of `code` with no body.
fn status(code: StatusCode) -> Response<Either<Incoming, Empty<Bytes>>> {
    let mut resp = Response::new(Either::Right(Empty::new()));
    *resp.status_mut() = code;
    resp
}

/// The `--axum` mode of one serving thread: every path goes to one handler that sends the
/// request on to `to` through the thread's pooled client and streams the answer back, served
/// by `axum::serve` as the gateway's routes are (the router made once, TCP_NODELAY on each
/// accepted socket).
async fn serve_axum(listener: tokio::net::TcpListener, to: SocketAddr) -> Result<(), String> {
    use axum::serve::ListenerExt;
    let upstream: Upstream<axum::body::Body> = client();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let upstream = upstream.clone();
        async move {
            match pass(&upstream, req, to).await {
                Ok(resp) => resp.map(axum::body::Body::new),
                Err(code) => status(code).map(axum::body::Body::new),
            }
        }
    });
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    // the router made once and shared by every connection, as the gateway's serving threads do
    axum::serve(listener, app.with_state(()).into_make_service())
        .await
        .map_err(|e| e.to_string())
}
