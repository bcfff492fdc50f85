//! The gateway's one error type.
//!
//! An [`Error`] says what went wrong ([`Error::category`]), which side caused it
//! ([`Side`]: the downstream client, the upstream origin, or keymaster itself) and whether
//! the request may be retried ([`Error::is_retry_safe`]). It is opaque: callers ask
//! `is_*` predicates (hyper's habit) instead of matching on a kind, so the set of kinds can
//! grow. Errors become HTTP responses in exactly one place: the gateway's `respond` module.

use http::StatusCode;
use std::fmt;

/// Boxed error used as a source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which side of the proxy caused an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The downstream client (bad request, went away).
    Client,
    /// The upstream origin server (refused, timed out, malformed response).
    Origin,
    /// keymaster itself (no route, limits, internal faults).
    Internal,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Origin => "origin",
            Side::Internal => "internal",
        }
    }
}

/// What went wrong. Private: the public surface is the predicates on [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The request is malformed or ambiguous (400).
    BadRequest,
    /// The request target is longer than the listener allows (414).
    UriTooLong,
    /// The request head is larger than the listener allows (431).
    HeadersTooLarge,
    /// The request body is larger than the route allows (413).
    BodyTooLarge,
    /// No route matches (404).
    NoRoute,
    /// The client went away or failed while sending its body.
    ClientGone,
    /// The client left its request body with nothing to read for the route's
    /// `client_body_timeout` (408).
    ClientBodyTimeout,
    /// Connecting to the origin failed (unreachable, reset during the connect) (502).
    Connect,
    /// The origin refused the connection: nothing listens on its port (502; category
    /// `origin_connectivity`, like [`Kind::Connect`]). Kept apart because it is the one
    /// connect failure that says the server itself is down (fast ejection).
    ConnectRefused,
    /// Connecting to the origin took longer than the connect timeout (502).
    ConnectTimeout,
    /// The TLS handshake with the origin failed: certificate not trusted, wrong name,
    /// no common version or cipher (502).
    OriginTls,
    /// The origin's pool is at its connection cap (503).
    PoolFull,
    /// The origin sent no response head in time, or nothing of a body a filter buffers for
    /// `read_timeout` (504; category `origin_read_timeout`).
    ResponseHeaderTimeout,
    /// The whole exchange exceeded the request deadline (504).
    RequestTimeout,
    /// The origin closed or reset the connection before a response head (502).
    OriginReset,
    /// The origin's response was malformed (502).
    OriginProtocol,
    /// A filter of the filter chain failed (500) and no error filter answered.
    FilterFailed,
    /// The cluster is at its request cap and its queue is full or timed out (503).
    ClusterFull,
    /// The gateway is overloaded and shed the request by its route's priority (503).
    Shed,
    /// No server of the cluster is healthy and it fails closed (503).
    NoHealthyOrigin,
    /// The origin's body is larger than a body-reading filter may buffer (502).
    ResponseBodyTooLarge,
    /// An active health check's answer says the server is unhealthy: an HTTP status other
    /// than 2xx or 3xx, or a gRPC health status other than `SERVING`. Only the health
    /// checker makes it; it never becomes a response (502 if it did).
    OriginUnhealthy,
    /// The process or the system is out of file descriptors (`EMFILE`, `ENFILE`), so no
    /// connection to the origin could be opened (503). Not the origin's fault.
    NoDescriptors,
}

/// Whether the request may be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Nothing reached the origin: always safe.
    Safe,
    /// The request may have been processed: never retry automatically.
    Unsafe,
    /// Safe only if it failed on a reused (possibly stale) connection and the request is replayable.
    ReusedOnly,
}

/// keymaster's error: kind, side, retryability and an optional cause.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: Kind,
    side: Side,
    retry: Retry,
    detail: &'static str,
    source: Option<BoxError>,
    /// Seconds for a `Retry-After` header.
    retry_after: Option<u32>,
}

impl Error {
    /// Out of line and cold: every branch that makes an error is then laid out away from
    /// the request path's hot code (an error is the rare case, and this constructor's code,
    /// inlined, took room in the instruction cache on every request).
    #[cold]
    #[inline(never)]
    pub fn new(kind: Kind, detail: &'static str) -> Self {
        let (side, retry) = match kind {
            Kind::BadRequest
            | Kind::UriTooLong
            | Kind::HeadersTooLarge
            | Kind::BodyTooLarge
            | Kind::ClientGone
            | Kind::ClientBodyTimeout => (Side::Client, Retry::Unsafe),
            Kind::NoRoute | Kind::FilterFailed | Kind::Shed => (Side::Internal, Retry::Unsafe),
            Kind::ClusterFull => (Side::Internal, Retry::Unsafe),
            Kind::NoHealthyOrigin => (Side::Origin, Retry::Unsafe),
            Kind::PoolFull | Kind::NoDescriptors => (Side::Internal, Retry::Safe),
            Kind::Connect | Kind::ConnectRefused | Kind::ConnectTimeout | Kind::OriginTls => {
                (Side::Origin, Retry::Safe)
            }
            Kind::OriginReset => (Side::Origin, Retry::ReusedOnly),
            Kind::ResponseHeaderTimeout
            | Kind::RequestTimeout
            | Kind::OriginProtocol
            | Kind::ResponseBodyTooLarge
            | Kind::OriginUnhealthy => (Side::Origin, Retry::Unsafe),
        };
        Error {
            inner: Box::new(Inner {
                kind,
                side,
                retry,
                detail,
                source: None,
                retry_after: None,
            }),
        }
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// Ask the client to come back after `after` (rounded up to whole seconds, at least 1).
    pub fn with_retry_after(mut self, after: std::time::Duration) -> Self {
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        self.inner.retry_after = Some(secs.clamp(1, u64::from(u32::MAX)) as u32);
        self
    }

    /// Seconds the client should wait before trying again (`Retry-After`), if any.
    pub fn retry_after(&self) -> Option<u32> {
        self.inner.retry_after
    }

    /// The gateway refused the request to protect itself or the origin (a cluster cap or
    /// load shedding); nothing was sent upstream.
    pub fn is_overload(&self) -> bool {
        matches!(self.inner.kind, Kind::ClusterFull | Kind::Shed)
    }

    /// Which side caused this error.
    pub fn side(&self) -> Side {
        self.inner.side
    }
    pub fn is_client(&self) -> bool {
        self.inner.side == Side::Client
    }
    pub fn is_origin(&self) -> bool {
        self.inner.side == Side::Origin
    }
    pub fn is_internal(&self) -> bool {
        self.inner.side == Side::Internal
    }
    /// A timeout of any kind (connect, response head, request deadline).
    pub fn is_timeout(&self) -> bool {
        matches!(
            self.inner.kind,
            Kind::ConnectTimeout | Kind::ResponseHeaderTimeout | Kind::RequestTimeout
        )
    }
    /// Connecting to the origin failed (nothing was sent).
    pub fn is_connect(&self) -> bool {
        matches!(
            self.inner.kind,
            Kind::Connect | Kind::ConnectRefused | Kind::ConnectTimeout | Kind::OriginTls
        )
    }
    /// The origin refused the connection (nothing listens there): the server is down, not
    /// slow, and not keymaster's own shortage.
    pub fn is_refused(&self) -> bool {
        self.inner.kind == Kind::ConnectRefused
    }
    /// The TLS handshake with the origin failed.
    pub fn is_tls(&self) -> bool {
        self.inner.kind == Kind::OriginTls
    }
    /// The origin closed or reset the connection before a response head.
    pub fn is_reset(&self) -> bool {
        self.inner.kind == Kind::OriginReset
    }
    /// The request's whole deadline passed (not just one attempt's wait).
    pub fn is_request_deadline(&self) -> bool {
        self.inner.kind == Kind::RequestTimeout
    }
    /// The client went away.
    pub fn is_client_gone(&self) -> bool {
        self.inner.kind == Kind::ClientGone
    }
    /// The client's request body stalled past `client_body_timeout` (not one of
    /// [`Error::is_timeout`]'s: those are the origin's).
    pub fn is_client_body_timeout(&self) -> bool {
        self.inner.kind == Kind::ClientBodyTimeout
    }
    /// This process or the system is out of file descriptors: no fault of the origin's.
    pub fn is_out_of_descriptors(&self) -> bool {
        self.inner.kind == Kind::NoDescriptors
    }
    /// Retrying is safe whatever the connection was.
    pub fn is_retry_safe(&self) -> bool {
        self.inner.retry == Retry::Safe
    }
    /// Retrying is safe if the failure happened on a reused connection.
    pub fn is_retry_safe_if_reused(&self) -> bool {
        matches!(self.inner.retry, Retry::Safe | Retry::ReusedOnly)
    }

    /// The status a client receives for this error.
    pub fn status(&self) -> StatusCode {
        match self.inner.kind {
            Kind::BadRequest => StatusCode::BAD_REQUEST,
            Kind::UriTooLong => StatusCode::URI_TOO_LONG,
            Kind::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Kind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::NoRoute => StatusCode::NOT_FOUND,
            // Nobody reads it, but the access log records 499 as nginx does.
            Kind::ClientGone => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Kind::ClientBodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Kind::Connect
            | Kind::ConnectRefused
            | Kind::ConnectTimeout
            | Kind::OriginTls
            | Kind::OriginReset
            | Kind::OriginProtocol
            | Kind::ResponseBodyTooLarge
            | Kind::OriginUnhealthy => StatusCode::BAD_GATEWAY,
            Kind::PoolFull
            | Kind::ClusterFull
            | Kind::Shed
            | Kind::NoHealthyOrigin
            | Kind::NoDescriptors => StatusCode::SERVICE_UNAVAILABLE,
            Kind::ResponseHeaderTimeout | Kind::RequestTimeout => StatusCode::GATEWAY_TIMEOUT,
            Kind::FilterFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A Zuul-style status category for logs and metrics.
    pub fn category(&self) -> &'static str {
        match self.inner.kind {
            Kind::BadRequest | Kind::UriTooLong | Kind::HeadersTooLarge => "client_bad_request",
            Kind::BodyTooLarge => "client_body_too_large",
            Kind::NoRoute => "local_no_route",
            Kind::ClientGone => "client_cancelled",
            Kind::ClientBodyTimeout => "client_body_timeout",
            Kind::Connect | Kind::ConnectRefused => "origin_connectivity",
            Kind::ConnectTimeout => "origin_connect_timeout",
            Kind::OriginTls => "origin_tls",
            Kind::PoolFull => "origin_throttled",
            Kind::ResponseHeaderTimeout => "origin_read_timeout",
            Kind::RequestTimeout => "origin_request_timeout",
            Kind::OriginReset => "origin_reset",
            Kind::OriginProtocol => "origin_bad_response",
            Kind::FilterFailed => "local_filter_error",
            Kind::ClusterFull => "origin_concurrency_exceeded",
            Kind::Shed => "local_overloaded",
            Kind::NoHealthyOrigin => "origin_no_servers",
            Kind::ResponseBodyTooLarge => "origin_body_too_large",
            Kind::OriginUnhealthy => "origin_unhealthy",
            Kind::NoDescriptors => "local_descriptors_exhausted",
        }
    }

    /// The gRPC status code for a call the gateway itself failed (the grpc-status of a
    /// gRPC-shaped error response): 14 UNAVAILABLE when the origin could not be reached or
    /// reset, or the gateway is at a cap, shedding or without a healthy origin, 4 DEADLINE_EXCEEDED for timeouts (the client's body included), 12 UNIMPLEMENTED for no route, 1 CANCELLED
    /// when the client went away, 8 RESOURCE_EXHAUSTED for limits, 3 INVALID_ARGUMENT for a
    /// bad request, 13 INTERNAL otherwise.
    pub fn grpc_status(&self) -> u8 {
        match self.inner.kind {
            Kind::Connect
            | Kind::ConnectRefused
            | Kind::ConnectTimeout
            | Kind::OriginTls
            | Kind::OriginReset
            | Kind::PoolFull
            | Kind::ClusterFull
            | Kind::Shed
            | Kind::NoHealthyOrigin
            | Kind::OriginUnhealthy
            | Kind::NoDescriptors => 14,
            Kind::ResponseHeaderTimeout | Kind::RequestTimeout | Kind::ClientBodyTimeout => 4,
            Kind::NoRoute => 12,
            Kind::ClientGone => 1,
            Kind::BodyTooLarge | Kind::HeadersTooLarge | Kind::UriTooLong => 8,
            Kind::BadRequest => 3,
            Kind::OriginProtocol | Kind::FilterFailed | Kind::ResponseBodyTooLarge => 13,
        }
    }

    /// A short human description (stable enough for logs, not an API).
    pub fn detail(&self) -> &'static str {
        self.inner.detail
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.inner.kind)
            .field("side", &self.inner.side)
            .field("retry", &self.inner.retry)
            .field("detail", &self.inner.detail)
            .field("source", &self.inner.source)
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.inner.detail, self.category())?;
        if let Some(src) = &self.inner.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_ref()
            .map(|e| &**e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_statuses_and_retry() {
        let e = Error::new(Kind::Connect, "unreachable");
        assert!(e.is_origin() && e.is_connect() && e.is_retry_safe() && !e.is_refused());
        assert_eq!(e.status(), StatusCode::BAD_GATEWAY);
        let e = Error::new(Kind::ConnectRefused, "connection refused");
        assert!(e.is_origin() && e.is_connect() && e.is_retry_safe() && e.is_refused());
        assert_eq!(
            (e.status(), e.category()),
            (StatusCode::BAD_GATEWAY, "origin_connectivity")
        );
        assert!(!Error::new(Kind::ConnectTimeout, "slow").is_refused());
        assert!(!Error::new(Kind::OriginReset, "reset").is_refused());
        let e = Error::new(Kind::ResponseHeaderTimeout, "no response head");
        assert!(e.is_timeout() && !e.is_retry_safe() && !e.is_retry_safe_if_reused());
        assert_eq!(e.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(e.category(), "origin_read_timeout");
        let e = Error::new(Kind::OriginReset, "reset");
        assert!(!e.is_retry_safe() && e.is_retry_safe_if_reused());
        let e = Error::new(Kind::BodyTooLarge, "too big");
        assert!(e.is_client());
        assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let e = Error::new(Kind::OriginTls, "tls");
        assert!(e.is_origin() && e.is_connect() && e.is_tls() && e.is_retry_safe());
        assert_eq!(e.status(), StatusCode::BAD_GATEWAY);
        assert_eq!((e.category(), e.grpc_status()), ("origin_tls", 14));
        let e = Error::new(Kind::RequestTimeout, "deadline");
        assert_eq!(e.grpc_status(), 4);
        let e = Error::new(Kind::ClientBodyTimeout, "stalled body");
        assert!(e.is_client() && e.is_client_body_timeout() && !e.is_timeout());
        assert!(!e.is_retry_safe_if_reused());
        assert_eq!(e.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!((e.category(), e.grpc_status()), ("client_body_timeout", 4));
        let e = Error::new(Kind::NoRoute, "no route");
        assert!(e.is_internal());
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn overload_errors_carry_retry_after() {
        let e = Error::new(Kind::ClusterFull, "full")
            .with_retry_after(std::time::Duration::from_millis(1200));
        assert!(e.is_overload() && e.is_internal() && !e.is_retry_safe());
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after(), Some(2));
        let e = Error::new(Kind::Shed, "shed").with_retry_after(std::time::Duration::ZERO);
        assert_eq!(
            (e.category(), e.retry_after()),
            ("local_overloaded", Some(1))
        );
        let e = Error::new(Kind::NoHealthyOrigin, "none");
        assert!(e.is_origin() && e.retry_after().is_none());
    }

    #[test]
    fn display_includes_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::new(Kind::Connect, "connect to origin failed").with_source(io);
        assert_eq!(
            e.to_string(),
            "connect to origin failed (origin_connectivity): refused"
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
