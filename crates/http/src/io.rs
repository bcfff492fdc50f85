//! The byte stream under an HTTP/1.1 connection, on either side of the proxy: plain TCP or
//! TLS (a client's session on a TLS listener, or keymaster's session with an origin), and
//! what a `101 Switching Protocols` leaves of it for a tunnel.

use bytes::{Buf, Bytes, BytesMut};
use socket2::SockRef;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;
use tokio_util::io::poll_read_buf;

/// A write to a peer that went away fails with `EPIPE` instead of raising `SIGPIPE`, as
/// the standard library's socket writes do.
const NO_SIGNAL: libc::c_int = libc::MSG_NOSIGNAL;

/// The largest read into a connection's buffer.
pub const MAX_READ: usize = 64 * 1024;

/// A connection's transport.
pub enum Io {
    Tcp(TcpStream),
    /// Boxed: a TLS session is large, and most connections are plain.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Io {
    /// The TCP socket under the transport.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Io::Tcp(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }

    /// Read what the peer sent into `buf`'s spare room: `Ok(0)` when it closed its side.
    ///
    /// The buffer grows (by `want`, at least `least` and at most [`MAX_READ`] bytes) when
    /// its room is under 512 bytes or under `want` (up to 4 KiB). On a plain socket it
    /// grows only once the socket is readable, so a connection waiting on a slow peer
    /// holds no more buffer than it had; TLS reads straight away (the session may hold
    /// decrypted bytes).
    ///
    /// A plain socket's read is one readiness poll (where the task's cooperative budget is
    /// spent) and one `recv`; a readiness poll and then tokio's `poll_read` made two.
    pub fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
        want: usize,
        least: usize,
    ) -> Poll<io::Result<usize>> {
        let make_room = |buf: &mut BytesMut| {
            let spare = buf.capacity() - buf.len();
            if spare < 512 || spare < want.min(4096) {
                buf.reserve(want.clamp(least, MAX_READ));
            }
        };
        match self {
            Io::Tcp(tcp) => loop {
                std::task::ready!(tcp.poll_read_ready(cx))?;
                make_room(buf);
                let room = buf.capacity() - buf.len();
                match try_transfer(tcp, Interest::READABLE, room, || recv_into(tcp, buf)) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    done => return Poll::Ready(done),
                }
            },
            Io::Tls(_) => {
                make_room(buf);
                poll_read_buf(Pin::new(self), cx, buf)
            }
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => poll_write_tcp(s, cx, buf.len(), |s| s.send_with_flags(buf, NO_SIGNAL)),
            Io::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => {
                // One call writes from at most IOV_MAX slices (1,024 on Linux): a write is
                // short only against what those hold.
                let bufs = &bufs[..bufs.len().min(1024)];
                let len = bufs.iter().map(|b| b.len()).sum();
                poll_write_tcp(s, cx, len, |s| s.send_vectored_with_flags(bufs, NO_SIGNAL))
            }
            Io::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Tcp(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// A write on a plain socket: straight away while tokio holds the socket writable (no
/// readiness poll, no cooperative budget: a writer that fills the socket waits on its
/// readiness like any other), through its readiness once a write would block.
fn poll_write_tcp(
    s: &TcpStream,
    cx: &mut Context<'_>,
    len: usize,
    mut write: impl FnMut(SockRef<'_>) -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        match try_transfer(s, Interest::WRITABLE, len, || write(SockRef::from(s))) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::task::ready!(s.poll_write_ready(cx))?
            }
            done => return Poll::Ready(done),
        }
    }
}

/// `op`, a read or write of up to `len` bytes on a plain socket, if tokio holds the socket
/// ready for it; `WouldBlock` if not. `op` makes the system call itself, not through
/// tokio's `TcpStream`, whose methods would check and clear the readiness again.
///
/// A short transfer also clears tokio's readiness, as its own `poll_read` and `poll_write`
/// do (not its `poll_write_vectored`): with edge-triggered epoll it shows the socket
/// drained (or full), and trying again would be a system call answering `EAGAIN`. The
/// closure reports it as `WouldBlock`, which is how `try_io` is told to clear.
fn try_transfer(
    tcp: &TcpStream,
    interest: Interest,
    len: usize,
    op: impl FnOnce() -> io::Result<usize>,
) -> io::Result<usize> {
    let mut short = None;
    let done = tcp.try_io(interest, || match op()? {
        n if 0 < n && n < len => {
            short = Some(n);
            Err(io::ErrorKind::WouldBlock.into()) // try_io clears the readiness
        }
        n => Ok(n),
    });
    short.map_or(done, Ok)
}

/// `recv` into `buf`'s spare room.
fn recv_into(tcp: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let n = SockRef::from(tcp).recv(buf.spare_capacity_mut())?;
    // SAFETY: `recv` wrote the first `n` bytes of the spare room (it returns at most the
    // length it was given), so `len + n` bytes are initialized and within the capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// A connection after `101 Switching Protocols`: the bytes the peer sent after the head that
/// were already read, then the socket. `H` is held until the tunnel ends (an origin
/// connection's slot under its cluster's cap).
pub struct Upgraded<H = ()> {
    pub read_ahead: Bytes,
    pub io: Io,
    pub _held: H,
}

impl<H: Unpin> AsyncRead for Upgraded<H> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read_ahead.has_remaining() {
            let n = this.read_ahead.len().min(buf.remaining());
            buf.put_slice(&this.read_ahead[..n]);
            this.read_ahead.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<H: Unpin> AsyncWrite for Upgraded<H> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
