//! The proxy stage's side of the filter chain (docs/filters.md): after the `pre` and `route`
//! stages let a request through, what later stages may read of the request is kept, and
//! what the filters chose (a cluster, an upstream path or Host, a buffered body, edits
//! that need the head scanned again) is handed over as one [`Chosen`].

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use std::sync::Arc;

use crate::filter::{ClusterChoice, State};
use crate::snapshot::Snapshot;
use crate::upstream::Cluster;
use keymaster_http::error::{Error, Kind};
use keymaster_http::headers::WireHead;

/// What the `pre` and `route` filters chose for the proxy stage (nothing, without filters).
#[derive(Default)]
pub(super) struct Chosen {
    /// Instead of the route's cluster.
    pub(super) cluster: Option<Arc<Cluster>>,
    /// The path and query sent upstream, instead of the route's rewrite.
    pub(super) upstream_path: Option<String>,
    /// The Host sent upstream, instead of the route's policy.
    pub(super) upstream_host: Option<HeaderValue>,
    /// The request body a filter read: sent whole, framed by its own length like any body
    /// (`upstream::h1::encode`); the head is a map then, so that the client's Content-Length
    /// line in the wire form does not go with it.
    pub(super) body: Option<Bytes>,
    /// A filter may have changed a field the proxy stage's scan looks at: scan the head
    /// again (it is a map then).
    pub(super) head_touched: bool,
    /// A filter set the request id field: a generated id is not added.
    pub(super) request_id_set: bool,
}

/// After the `pre` and `route` stages let the request through: what the `post` and `error`
/// filters may read of the request kept in `state`, and what the filters chose into
/// `chosen`. `Err`: a filter chose a cluster this config version lacks.
pub(super) fn handoff(
    snapshot: &Snapshot,
    state: &mut State,
    parts: &mut http::request::Parts,
    wire: &mut Option<Box<WireHead>>,
    request_id: &HeaderName,
    chosen: &mut Chosen,
) -> Result<(), Error> {
    snapshot
        .filters
        .keep_request(state, &parts.uri, &parts.headers, wire.as_deref());
    if state.may_have_set_request_id() {
        chosen.request_id_set = match wire {
            Some(w) => w.fields.get(request_id.as_str()).is_some(),
            None => parts.headers.contains_key(request_id),
        };
    }
    // The body, a path and a Host are in the context's rarely used parts.
    if let Some((body, path, host)) = state.take_rare_choices() {
        if let Some(b) = body {
            super::to_map(&mut parts.headers, wire);
            chosen.body = Some(b);
        }
        (chosen.upstream_path, chosen.upstream_host) = (path, host);
    }
    chosen.head_touched = state.head_touched();
    match state.take_cluster() {
        None => {}
        Some(ClusterChoice::Resolved(c)) => {
            // Put there by `reroute` (filter::builtin): always one of ours.
            let c: Arc<dyn std::any::Any + Send + Sync> = c;
            let c = c.downcast::<Cluster>().map_err(|_| {
                Error::new(
                    Kind::FilterFailed,
                    "a filter chose a cluster of another kind",
                )
            })?;
            chosen.cluster = Some(c);
        }
        Some(ClusterChoice::Named(name)) => {
            let c = snapshot.clusters.get(&*name).ok_or_else(|| {
                Error::new(Kind::FilterFailed, "a filter chose an unknown cluster")
            })?;
            chosen.cluster = Some(c.clone());
        }
    }
    Ok(())
}
