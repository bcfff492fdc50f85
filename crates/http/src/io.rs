//! The byte stream under an HTTP/1.1 connection, on either side of the proxy: plain TCP or
//! TLS (a client's session on a TLS listener, or keymaster's session with an origin), and
//! what a `101 Switching Protocols` leaves of it for a tunnel.

use bytes::{Buf, Bytes};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

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
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
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
