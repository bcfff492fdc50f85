//! The load generator's HTTP/2 connections (hyper's client): prior knowledge (h2c) on
//! `http://` targets, ALPN `h2` on `https://` ones. A connection slot owns one HTTP/2
//! connection and sends one request at a time on it, like the HTTP/1.1 slots, so runs with the
//! same number of connections compare HTTP/2's per-request cost (framing, HPACK, flow control)
//! with HTTP/1.1's.

use std::io;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::client::{ClientError, ResponseInfo};
use super::tls::{Stream, TlsClient};

/// One HTTP/2 connection of the generator.
#[derive(Debug)]
pub struct H2Conn {
    sender: SendRequest<Empty<Bytes>>,
    /// Body bytes received so far (HTTP/2 framing is not counted).
    pub bytes_read: u64,
}

/// What every request of a run looks like.
#[derive(Debug, Clone)]
pub struct H2Request {
    pub method: http::Method,
    pub uri: http::Uri,
    pub headers: http::HeaderMap,
}

impl H2Conn {
    /// TCP (and TLS with `tls`), then the HTTP/2 handshake.
    pub async fn connect(addr: SocketAddr, tls: Option<&TlsClient>) -> io::Result<H2Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let stream = match tls {
            None => Stream::Plain(tcp),
            Some(t) => Stream::Tls(Box::new(t.connect(tcp).await?)),
        };
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(io::Error::other)?;
        tokio::spawn(conn);
        Ok(H2Conn {
            sender,
            bytes_read: 0,
        })
    }

    /// Sends the request and reads the whole response body (counted, not stored).
    pub async fn request(&mut self, r: &H2Request) -> Result<ResponseInfo, ClientError> {
        let mut req = http::Request::new(Empty::new());
        *req.method_mut() = r.method.clone();
        *req.uri_mut() = r.uri.clone();
        *req.headers_mut() = r.headers.clone();
        self.sender
            .ready()
            .await
            .map_err(|e| ClientError::Write(io::Error::other(e)))?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Read(io::Error::other(e)))?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut body_bytes = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ClientError::Read(io::Error::other(e)))?;
            if let Some(d) = frame.data_ref() {
                body_bytes += d.len() as u64;
            }
        }
        self.bytes_read += body_bytes;
        Ok(ResponseInfo {
            status,
            body_bytes,
            keep_alive: !self.sender.is_closed(),
        })
    }
}
