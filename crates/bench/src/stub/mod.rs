//! The stub origin: the slow, cheap HTTP server the 2013 bake-off proxied to, and the origin
//! keymaster's own integration tests use.
//!
//! [`spawn_stub`] runs it on its own threads (its own multi-threaded tokio runtime), so it can be
//! started from sync code, from tests on any runtime, or inside the gateway process; the
//! [`StubHandle`] stops it on [`StubHandle::shutdown`] or on drop. [`stub_main`] is the
//! `keymaster stub` subcommand. Connections are HTTP/1.1 with keep-alive, or HTTP/2 with prior
//! knowledge (h2c), detected from the connection preface.
//!
//! # Query parameters (on any path)
//!
//! | parameter | effect |
//! |---|---|
//! | `length=N` | body of exactly N bytes of HTML/JSON-like text ([`stub_body`]); default [`DEFAULT_LENGTH`] |
//! | `gzip=1` | gzip the body ([`stub_body_gzip`], byte-identical every time), `Content-Encoding: gzip`; also when `Accept-Encoding` accepts gzip, unless `gzip=0` |
//! | `chunked=1` | chunked transfer coding (4 KiB chunks) instead of Content-Length |
//! | `delay=MS` | fixed delay before the response head |
//! | `dither=MS` | extra uniform random delay in `[0, MS]` (the 2013 runs used `dither=50`) |
//! | `status=CODE` | that status (200..=999); 204 and 304 have no body |
//! | `echo=1` | status 200, the request body streamed back (chunked) |
//!
//! HEAD gets the GET headers (including Content-Length) and no body. A bad value gets a 400
//! with a one-line reason.
//!
//! # Test helpers
//!
//! - `GET /__inspect` (any method, query parameters such as `delay` still apply) answers JSON
//!   `{"method", "uri", "version", "headers": [[name, value], ...], "body_len"}`. `uri` is the
//!   request target as hyper parsed it (origin-form `"/p?q"` or absolute-form), `version` is like
//!   `"HTTP/1.1"`, header names are lower-case and listed in `http::HeaderMap` order: names in
//!   order of first appearance, repeated fields of one name together in received order.
//! - [`stub_body`] and [`stub_body_gzip`] give the exact bytes the stub sends, for byte-for-byte
//!   pass-through checks.
//!
//! ```no_run
//! let stub = keymaster_bench::stub::spawn_stub("127.0.0.1:0".parse().unwrap(), 2).unwrap();
//! let origin = stub.local_addr(); // e.g. http://{origin}/?length=1000&gzip=1
//! # let _ = origin;
//! stub.shutdown();
//! ```

pub mod content;
pub mod params;
pub mod service;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub use content::{stub_body, stub_body_gzip};
pub use params::{StubParams, DEFAULT_LENGTH};

/// Listen backlog of the stub's socket.
const BACKLOG: i32 = 4096;

/// Arguments of `keymaster stub`.
#[derive(Debug, Clone, clap::Args)]
pub struct StubArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// Worker threads (0 = number of cores).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub workers: usize,
}

/// A running stub origin. Stops (and joins its threads) on [`StubHandle::shutdown`] or drop.
#[derive(Debug)]
pub struct StubHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl StubHandle {
    /// The address the stub listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every connection and joins the stub's threads.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for StubHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Number of worker threads for `workers` (0 = number of cores).
fn worker_count(workers: usize) -> usize {
    if workers > 0 {
        workers
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// Starts a stub origin on `addr` (port 0 picks a free port) with `workers` threads (0 = number
/// of cores) on its own tokio runtime. Returns once the socket is listening.
pub fn spawn_stub(addr: SocketAddr, workers: usize) -> io::Result<StubHandle> {
    let workers = worker_count(workers);
    let listener = bind(addr)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("stub-worker")
        .enable_all()
        .build()?;
    let listener = {
        let _guard = runtime.enter();
        Arc::new(TcpListener::from_std(listener)?)
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("stub".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder.http1().timer(TokioTimer::new()).keep_alive(true);
                builder.http2().timer(TokioTimer::new());
                let builder = Arc::new(builder);
                // One accept loop per worker on the shared socket.
                for _ in 0..workers {
                    tokio::spawn(accept_loop(listener.clone(), builder.clone()));
                }
                let _ = stopped.await;
            });
            // Dropping the tasks closes every connection; don't wait long on blocking gzip jobs.
            runtime.shutdown_timeout(Duration::from_secs(1));
        })?;
    Ok(StubHandle {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    })
}

async fn accept_loop(listener: Arc<TcpListener>, builder: Arc<auto::Builder<TokioExecutor>>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::debug!("stub accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(stream);
            if let Err(e) = builder
                .serve_connection(io, service_fn(service::handle))
                .await
            {
                tracing::trace!("stub connection: {e}");
            }
        });
    }
}

/// `keymaster stub`: runs a stub origin until SIGINT or SIGTERM.
pub fn stub_main(args: StubArgs) -> io::Result<()> {
    let stub = spawn_stub(args.listen, args.workers)?;
    println!(
        "keymaster stub listening on http://{} ({} workers)",
        stub.local_addr(),
        worker_count(args.workers)
    );
    let signals = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    signals.block_on(wait_for_signal())?;
    stub.shutdown();
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn wait_for_signal() -> io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
