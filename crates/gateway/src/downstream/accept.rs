//! From a client's accept to HTTP: the accept loop (the listener's connection cap, the
//! descriptor budget, back-off when accepting fails), the slot each connection holds
//! ([`OpenGuard`]), and what a connection waits for before HTTP (a PROXY header, the TLS
//! handshake, h2c's preface). A cleartext connection with nothing to wait for goes straight
//! to [`serve_io`](super::serve_io), its task HTTP's future itself (decision record 0037).

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

use super::{discard_unread, h2_preface, serve_io, ListenerCtx, WorkerListener};
use crate::descriptors::Descriptor;
use crate::worker::Worker;
use keymaster_config::ListenerProtocol;
use keymaster_http::headers::{ClientFacts, TlsFacts};
use keymaster_http::io::Io;

/// Accept clients on one socket until shutdown.
pub(crate) async fn accept_loop(worker: Rc<Worker>, listener: WorkerListener, socket: TcpListener) {
    let mut backoff = Duration::from_millis(5);
    let budget = crate::descriptors::budget();
    // The worker's drain signal (set when shutdown begins), one wait for the loop's life:
    // polled on every accept, it costs a flag read (a `watch` channel's wait would take
    // its waiter list's lock each time).
    let mut stop = std::pin::pin!(worker.drain.wait());
    loop {
        if !budget.client_room() {
            // Clients fill their share of the descriptors: the rest is their origin
            // connections'. New clients wait in the backlog until a connection closes.
            listener.metrics.descriptor_waits.inc();
            tokio::select! {
                biased;
                _ = stop.as_mut() => break,
                _ = budget.wait_client_room() => continue,
            }
        }
        // `poll_accept`, not `accept()`: the latter's readiness future joins and leaves the
        // socket's waiter list (under its lock) on every accept that has to wait; this one
        // leaves the task's waker in the socket's reader slot.
        let accepted = tokio::select! {
            biased;
            _ = stop.as_mut() => break,
            r = std::future::poll_fn(|task| socket.poll_accept(task)) => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::from_millis(5);
                let open = listener.open.fetch_add(1, Ordering::AcqRel);
                if open >= listener.max_connections {
                    listener.open.fetch_sub(1, Ordering::AcqRel);
                    listener.metrics.rejected.inc();
                    drop(stream);
                    continue;
                }
                listener.metrics.accepted.inc();
                listener.metrics.open.inc();
                let guard = OpenGuard {
                    listener: listener.clone(),
                    worker: worker.clone(),
                    descriptor: Cell::new(Some(budget.client())),
                };
                worker
                    .active_connections
                    .set(worker.active_connections.get() + 1);
                // Boxed: tokio moves a task's future by value when it spawns it and when
                // it stores the task's output, and this one is the size of its largest
                // state (a request in the proxy stage). The box is made first and the future
                // written into it, so that only its arguments are written, not a copy of
                // the whole future's size from the stack.
                let place = Box::new_uninit();
                let conn = Box::write(place, connection(listener.clone(), stream, peer, guard));
                tokio::task::spawn_local(Box::into_pin(conn));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the client waits in
                // the backlog until a descriptor is free.
                if crate::descriptors::exhausted(&e) {
                    listener.metrics.descriptors_exhausted.inc();
                }
                tracing::warn!(listener = %listener.name, error = %e, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Releases a connection's slot in the listener and the worker's drain count, and its
/// place in the descriptor budget unless [`OpenGuard::take_descriptor`] moved it on.
pub(crate) struct OpenGuard {
    pub(super) listener: WorkerListener,
    pub(super) worker: Rc<Worker>,
    descriptor: Cell<Option<Descriptor>>,
}

impl OpenGuard {
    /// The connection's place in the descriptor budget, for a holder that keeps the
    /// socket after the slot is given back (a lingering close).
    pub(crate) fn take_descriptor(&self) -> Option<Descriptor> {
        self.descriptor.take()
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.listener.open.fetch_sub(1, Ordering::AcqRel);
        self.listener.metrics.open.dec();
        let n = self.worker.active_connections.get().saturating_sub(1);
        self.worker.active_connections.set(n);
        if n == 0 {
            self.worker.drained.notify_waiters();
        }
    }
}

/// Is this an HTTP/2 prior-knowledge connection? Peeks without consuming.
async fn starts_with_h2_preface(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 24];
    loop {
        match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => match h2_preface(&buf[..n]) {
                Some(whole) => return whole,
                // A partial match: wait for more bytes. Peeking leaves the socket readable,
                // so `readable()` would return at once and spin; poll again shortly instead.
                None => tokio::time::sleep(Duration::from_millis(5)).await,
            },
        }
    }
}

/// Close a connection we refuse: send FIN, then read and discard what the client still sends
/// (at most 64 KiB, within `wait`) so the kernel does not answer unread bytes with a reset.
async fn lingering_close(mut stream: TcpStream, wait: Duration) {
    use tokio::io::AsyncWriteExt;
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(
        wait.min(Duration::from_secs(2)),
        discard_unread(&mut stream),
    )
    .await;
}

/// A client connection's task, from its accept to its close. A cleartext listener without
/// PROXY headers and without h2c's preface check (the common case) has nothing to wait for
/// before HTTP: its task is HTTP's future itself (`serve_io`). The others wait first (the
/// PROXY header, the TLS handshake, the preface), in [`serve_connection`], boxed: an
/// `async` block that waits before HTTP keeps room for its arguments (socket, addresses,
/// guard: 104 bytes) beside HTTP's state for the connection's life, and in front of it:
/// HTTP's hot fields then begin 200 bytes into the task's future, a cache line further on.
fn connection(
    listener: WorkerListener,
    stream: TcpStream,
    peer: SocketAddr,
    guard: OpenGuard,
) -> impl std::future::Future<Output = ()> {
    use futures_util::future::Either;
    if cfg!(not(target_os = "linux")) {
        let _ = stream.set_nodelay(true); // elsewhere not inherited from the listening socket
    }
    let local = match listener.bound {
        Some(addr) => addr,
        None => stream.local_addr().unwrap_or(peer),
    };
    let waits = listener.proxy.enabled()
        || listener.tls.is_some()
        || listener.protocol == ListenerProtocol::H2c;
    if waits {
        return Either::Right(Box::pin(serve_connection(
            listener,
            stream,
            (peer, local),
            guard,
        )));
    }
    let client = client_facts(&listener, peer, None);
    let http = serve_io(guard, Io::Tcp(stream), false, client, (peer, local));
    Either::Left(http)
}

/// A connection that waits before HTTP: for the PROXY header, the TLS handshake, or h2c's
/// preface. `local`: the address the client connected to, until a PROXY header says
/// otherwise.
///
/// (An `async` block, not an `async fn`: an `async fn` copies its arguments into locals of
/// their own when first polled.)
#[allow(clippy::manual_async_fn)]
fn serve_connection(
    listener: WorkerListener,
    mut stream: TcpStream,
    (peer, local): (SocketAddr, SocketAddr),
    guard: OpenGuard,
) -> impl std::future::Future<Output = ()> {
    async move {
        // Behind an L4 load balancer: the PROXY header names the client and the address it
        // connected to (or the peer is refused). Boxed like TLS below, so connections without it
        // do not carry its state.
        let (peer, local) = if listener.proxy.enabled() {
            let read = Box::pin(crate::proxy_protocol::accept(
                &listener.proxy,
                &mut stream,
                peer,
                listener.header_read_timeout,
                &listener.metrics,
            ));
            match read.await {
                Ok(Some(carried)) => (carried.client, carried.destination),
                Ok(None) => (peer, local),
                Err(why) => {
                    tracing::debug!(listener = %listener.name, %peer, ?why, "PROXY header refused");
                    return;
                }
            }
        } else {
            (peer, local)
        };
        if listener.tls.is_some() {
            // Boxed, like HTTP/2 in `serve_io`: a task's size is its largest state, and a
            // cleartext HTTP/1 connection should not carry the TLS session's.
            Box::pin(serve_tls(guard, stream, (peer, local))).await;
            return;
        }
        // `auto` listeners start in HTTP/1.1, whose first read looks for the HTTP/2 preface
        // (`h1::serve` hands such a connection over): no peek, no timer of its own.
        let h2 = match listener.protocol {
            ListenerProtocol::Http1 | ListenerProtocol::Auto => false,
            ListenerProtocol::H2c => {
                // Boxed: the peek's timeout and sleep would otherwise size every
                // connection's task (408 bytes, more than an HTTP/1.1 connection's state).
                let preface = Box::pin(tokio::time::timeout(
                    listener.header_read_timeout,
                    starts_with_h2_preface(&stream),
                ));
                match preface.await {
                    Ok(true) => true,
                    Ok(false) => {
                        // Not HTTP/2: RFC 9113 §3.4 says terminate the connection. Close it
                        // cleanly (FIN, not a reset from unread bytes) so the client sees why.
                        // Boxed: its 4 KiB drain buffer would otherwise size every
                        // connection's task.
                        Box::pin(lingering_close(stream, listener.header_read_timeout)).await;
                        return;
                    }
                    Err(_) => return, // said nothing within the header timeout
                }
            }
        };
        let client = client_facts(&listener, peer, None);
        serve_io(guard, Io::Tcp(stream), h2, client, (peer, local)).await;
    }
}

/// The TLS handshake, then HTTP on the session.
async fn serve_tls(guard: OpenGuard, stream: TcpStream, (peer, local): (SocketAddr, SocketAddr)) {
    let (listener, worker) = (guard.listener.clone(), guard.worker.clone());
    let Some(tls) = &listener.tls else { return };
    // The handshake shares the header-read budget; the request clock starts after it.
    let settings = tls.current.load_full();
    let acceptor = tokio_rustls::TlsAcceptor::from(settings.server_config.clone());
    let handshake = tokio::time::timeout(listener.header_read_timeout, acceptor.accept(stream));
    let handshake = tokio::select! {
        r = handshake => r,
        _ = worker.drain.wait() => return, // draining: no new sessions
    };
    let stream = match handshake {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            listener.metrics.tls_handshake_failures.inc();
            tracing::debug!(listener = %listener.name, %peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            listener.metrics.tls_handshake_failures.inc();
            tracing::debug!(listener = %listener.name, %peer, "TLS handshake timed out");
            return;
        }
    };
    let conn = stream.get_ref().1;
    let h2 = conn.alpn_protocol() == Some(b"h2");
    let facts = TlsFacts {
        client_identity: conn
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(crate::tls::client_identity),
        identity_header: settings.identity_header.clone(),
    };
    let client = client_facts(&listener, peer, Some(Box::new(facts)));
    let stream = Io::Tls(Box::new(tokio_rustls::TlsStream::Server(stream)));
    serve_io(guard, stream, h2, client, (peer, local)).await;
}

/// The client's facts: `tls` for a TLS connection (its scheme is then "https").
fn client_facts(
    listener: &ListenerCtx,
    peer: SocketAddr,
    tls: Option<Box<TlsFacts>>,
) -> ClientFacts {
    let ip = peer.ip();
    ClientFacts {
        ip_value: keymaster_http::headers::client_address(ip),
        tls,
        trusted: listener.trusted.iter().any(|n| n.contains(&ip)),
    }
}
