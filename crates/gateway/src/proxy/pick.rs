//! Where a request goes beyond its route, read from its head: the cluster of a route with
//! weighted clusters (a tester's `cluster_override`, else the weights), and the key of a
//! hash cluster (a header, a cookie, the client IP or the path; or a cookie made here).
//! A route with one cluster, and a cluster that does not hash, read nothing.

use http::header::{self, HeaderName};
use http::{HeaderMap, Uri};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::snapshot::{ClusterRef, RouteRef};
use crate::upstream::ring;
use crate::upstream::Cluster;
use keymaster_config::HashOn;
use keymaster_http::headers::{RawRequestFields, WireHead};

/// The request's fields where they are: in wire form, or in the map.
#[derive(Clone, Copy)]
pub(super) struct Fields<'a> {
    map: &'a HeaderMap,
    wire: Option<&'a RawRequestFields>,
}

impl<'a> Fields<'a> {
    pub(super) fn new(map: &'a HeaderMap, wire: Option<&'a WireHead>) -> Self {
        Fields {
            map,
            wire: wire.map(|w| &w.fields),
        }
    }

    /// The value of the first field called `name`.
    fn get(self, name: &HeaderName) -> Option<&'a [u8]> {
        match self.wire {
            Some(w) => w.get(name.as_str()),
            None => self.map.get(name).map(|v| v.as_bytes()),
        }
    }

    /// The value of the cookie `name` (of every `Cookie` field: an HTTP/2 client may split
    /// them).
    fn cookie(self, name: &str) -> Option<&'a [u8]> {
        match self.wire {
            Some(w) => w.get_all("cookie").find_map(|v| cookie_in(v, name)),
            None => (self.map.get_all(header::COOKIE).iter())
                .find_map(|v| cookie_in(v.as_bytes(), name)),
        }
    }
}

/// The value of the cookie `name` in one `Cookie` field (`a=1; b=2`).
fn cookie_in<'v>(field: &'v [u8], name: &str) -> Option<&'v [u8]> {
    field.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|&b| b == b'=')?;
        (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
    })
}

/// The request's cluster: one a route filter chose, else the route's own, else (weighted
/// clusters) the one its override names or the weights draw.
#[inline(always)]
pub(super) fn cluster(route: &RouteRef, chosen: Option<Arc<Cluster>>, f: Fields<'_>) -> ClusterRef {
    if let Some(c) = chosen {
        return ClusterRef::Other(c);
    }
    let Some(split) = route.split.as_deref() else {
        return ClusterRef::OfRoute(route.clone());
    };
    let header = split.header().and_then(|h| f.get(h));
    let cookie = split.cookie().and_then(|c| f.cookie(c));
    ClusterRef::Other(split.pick(header.into_iter().chain(cookie)).clone())
}

/// A hash cluster's key for the request, and the token of a cookie generated for it (set
/// on the response). `(None, None)` when the cluster does not hash, or the request has no
/// key and none is generated.
#[inline(always)]
pub(super) fn hash_key(
    cluster: &Cluster,
    f: Fields<'_>,
    uri: &Uri,
    client: &SocketAddr,
) -> (Option<u64>, Option<u64>) {
    let Some(h) = cluster.hashing.as_deref() else {
        return (None, None);
    };
    let p = &h.policy;
    let found = match p.on {
        HashOn::Header => p.header.as_ref().and_then(|n| f.get(n)),
        HashOn::Cookie => p.cookie.as_deref().and_then(|n| f.cookie(n)),
        HashOn::ClientIp => return (Some(ring::ip_key(client.ip())), None),
        HashOn::Path => Some(uri.path().as_bytes()),
    };
    match found {
        Some(v) => (Some(ring::key_of(v)), None),
        None if p.generates() => {
            let token = fastrand::u64(..);
            (Some(ring::key_of(&ring::hex16(token))), Some(token))
        }
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::cookie_in;

    #[test]
    fn cookies_are_found_by_exact_name() {
        let field = b"a=1; km=xyz ;b= 2;flag; kmx=no";
        assert_eq!(cookie_in(field, "km"), Some(&b"xyz"[..]));
        assert_eq!(cookie_in(field, "b"), Some(&b"2"[..]));
        assert_eq!(cookie_in(field, "a"), Some(&b"1"[..]));
        assert_eq!(cookie_in(field, "k"), None);
        assert_eq!(cookie_in(field, "flag"), None);
        assert_eq!(cookie_in(b"", "a"), None);
    }
}
