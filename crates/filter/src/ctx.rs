//! The per-request context filters see ([`FilterCtx`]): the request head, the shared
//! metadata map, where the request goes, a filter's own response, and in `post` the
//! response head.
//!
//! A context borrows the heads it shows: in `pre` and `route` the request line and fields
//! where the proxy stage keeps them, in `post` the response status and fields (the origin's
//! head possibly still in wire form). Nothing is moved in or out. What the filters of one
//! request share from the first `pre` filter to the last `post` or `error` one is owned by
//! a [`FilterState`], which the proxy stage keeps across the proxy stage; each stage makes
//! a context over it and the heads of the moment.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{HeaderMap, Method, StatusCode};
use std::cell::Cell;
use std::collections::HashMap;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::{Failure, FilterStage};
use keymaster_http::headers::{RawHead, RawRequestFields, WireHead};

mod state;
mod test_request;
pub use state::FilterState;
pub use test_request::TestRequest;

/// A response set by a filter (`pre`/`route` short-circuit, or an `error` filter).
pub struct LocalResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

/// What a [`FilterState`] holds.
///
/// The fields every request with filters uses are here; the ones few requests need (the
/// `meta` map, upstream path and Host overrides, a failure, the debug trace, buffered
/// bodies) are in [`Extras`], allocated on first use, so making and dropping a state
/// touches as little memory as possible.
pub struct State {
    pub stage: FilterStage,
    /// The request head may have changed in a field the proxy stage's head scan looks at
    /// (framing, hop-by-hop, Host, Expect): it scans again only then.
    head_touched: bool,
    /// A filter may have set the request id field (it set or appended a field whose name is
    /// as long as that field's, or changed the map through `request_headers_mut`): only
    /// then does the proxy stage look for it in the map before adding a generated id.
    /// Comparing lengths is a cheap over-approximation of comparing names.
    may_set_request_id: bool,
    /// The filter runs of this request are timed (sampled, or debug mode).
    pub timed: bool,
    /// The length of the listener's request id field name.
    request_id_len: usize,
    pub method: Method,
    client: SocketAddr,
    /// TLS listeners: the verified client certificate identity (mTLS), if any.
    tls: Option<Option<String>>,
    pub route: Arc<str>,
    cluster: Option<ClusterChoice>,
    pub local: Option<Box<LocalResponse>>,
    /// Past the proxy stage: what `post` and `error` filters see of the request (its target
    /// and fields as they were after the `route` stage), when a filter of those stages
    /// reads them (see the chain's `keep_request`).
    pub kept: Option<Box<KeptRequest>>,
    extras: Option<Box<Extras>>,
}

/// The request's target and fields kept for the `post` and `error` stages.
#[derive(Default)]
pub struct KeptRequest {
    pub target: Option<PathAndQuery>,
    pub map: HeaderMap,
    pub wire: Option<Box<WireHead>>,
}

/// The narrow per-request API filters see. Bodies are not part of it (they stream past).
///
/// It borrows what it shows for as long as a stage runs (`'r`): the request head where the
/// proxy stage keeps it (`pre`, `route`), the response head (`post`), and the request's
/// [`FilterState`].
pub struct FilterCtx<'r> {
    pub state: &'r mut State,
    request: RequestRef<'r>,
    /// A map built from wire-form request fields on the first whole read (boxed: few
    /// requests build one); dropped on a change.
    view: View,
    /// `post` (and then `error`): the response head.
    pub response: Option<ResponseRef<'r>>,
}

/// The request target and fields a context shows.
enum RequestRef<'r> {
    /// Where the proxy stage keeps them. `target`: the path and query as the client sent
    /// them (`None` for a target without a path: the authority form). The fields: the map,
    /// or the client's fields in wire form (keymaster's HTTP/1.1 server) while `wire` holds
    /// them (the map is empty then), changed in place through [`RawRequestFields`]' edits
    /// while no filter needs more.
    Lent {
        target: Option<&'r PathAndQuery>,
        map: &'r mut HeaderMap,
        wire: &'r mut Option<Box<WireHead>>,
    },
    /// What the state kept ([`KeptRequest`]; none kept: an empty path and map).
    Kept,
}

/// The response head the `post` (and then `error`) filters see: the status and the fields
/// as a map, or the origin's head in wire form while `raw` holds it (`map` is empty then).
/// Appending keeps the wire form; any other change turns it into the map.
pub struct ResponseRef<'r> {
    pub status: &'r mut StatusCode,
    pub map: &'r mut HeaderMap,
    pub raw: &'r mut Option<RawHead>,
    /// A map built from `raw` on the first read.
    view: View,
}

impl ResponseRef<'_> {
    /// As a map: the wire form turned into one (its `view` if built).
    fn map_mut(&mut self) -> &mut HeaderMap {
        if let Some(raw) = self.raw.take() {
            let map = self.view.take().map_or_else(|| raw.to_map(), |m| *m);
            keymaster_http::headers::replace_map(self.map, map);
        }
        self.map
    }
}

/// A map built from a wire-form head on its first read; boxed, so that the context stays
/// small (few requests build one).
pub type View = std::cell::OnceCell<Box<HeaderMap>>;

/// A cluster as the gateway hands it to a filter that chooses one when the chain is built
/// (opaque here: the gateway downcasts it back).
pub trait ClusterHandle: std::any::Any + Send + Sync {
    /// The cluster's name.
    fn name(&self) -> &str;
}

/// The cluster a filter chose: by name (the proxy stage looks it up in the request's config
/// version), or one the chain found when it was built (a `reroute` filter).
pub enum ClusterChoice {
    Named(Arc<str>),
    /// The gateway's own cluster, found when the chain was built.
    Resolved(Arc<dyn ClusterHandle>),
}

/// The parts of a state few requests use (see [`State`]).
#[derive(Default)]
pub struct Extras {
    meta: HashMap<String, String>,
    extensions: http::Extensions,
    path: Option<String>,
    host: Option<HeaderValue>,
    pub failure: Option<Failure>,
    /// Debug mode: one entry per filter considered.
    pub debug: Option<Vec<String>>,
    /// A traced request: each filter considered, for its trace's events.
    pub steps: Option<Vec<FilterStep>>,
    /// Bodies buffered for filters that declared they need them (`filter::body`).
    pub request_body: Option<bytes::Bytes>,
    pub response_body: Option<bytes::Bytes>,
}

/// One filter considered for a traced request: which, when, for how long, how it went
/// (`"ran"`, `"skip"` or `"failed"`).
pub struct FilterStep {
    pub stage: &'static str,
    pub filter: Arc<str>,
    pub start: std::time::Instant,
    pub took: std::time::Duration,
    pub outcome: &'static str,
}

/// What [`FilterCtx::meta`] reads before anything was put in the map.
static NO_META: std::sync::LazyLock<HashMap<String, String>> =
    std::sync::LazyLock::new(HashMap::new);

/// What [`FilterCtx::request_headers`] reads once the headers went upstream without a copy.
static NO_HEADERS: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);

impl State {
    /// The rarely used parts, allocated on first use.
    pub fn extras(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Box::default)
    }

    /// The rarely used parts, if any was ever set.
    pub fn extras_ref(&self) -> Option<&Extras> {
        self.extras.as_deref()
    }

    /// The rarely used parts, if any was ever set, writable.
    pub fn extras_mut(&mut self) -> Option<&mut Extras> {
        self.extras.as_deref_mut()
    }

    /// A traced request: time every filter and keep its step (see [`FilterStep`]).
    pub fn record_steps(&mut self) {
        self.timed = true;
        self.extras().steps = Some(Vec::new());
    }

    /// A traced request: the steps to add to.
    pub fn steps(&mut self) -> Option<&mut Vec<FilterStep>> {
        self.extras_mut()?.steps.as_mut()
    }

    /// Debug mode: the trace to add entries to.
    pub fn debug_trace(&mut self) -> Option<&mut Vec<String>> {
        self.extras_mut()?.debug.as_mut()
    }

    /// Whether a filter may have set the request id field (see `may_set_request_id`).
    pub fn may_have_set_request_id(&self) -> bool {
        self.may_set_request_id
    }

    /// Whether a filter may have changed a field the proxy stage's head scan looks at.
    pub fn head_touched(&self) -> bool {
        self.head_touched
    }

    /// After the route stage: the cluster a filter chose, if any.
    pub fn take_cluster(&mut self) -> Option<ClusterChoice> {
        self.cluster.take()
    }

    /// After the route stage: the request body buffered for filters, and the upstream path
    /// and Host a filter set (`None`: nothing touched the rarely used parts of the state,
    /// so there is none of them).
    pub fn take_rare_choices(
        &mut self,
    ) -> Option<(Option<bytes::Bytes>, Option<String>, Option<HeaderValue>)> {
        let x = self.extras_mut()?;
        Some((x.request_body.take(), x.path.take(), x.host.take()))
    }
}

impl<'r> FilterCtx<'r> {
    /// `pre` and `route`: a context over the request head where the proxy stage keeps it:
    /// the target of `uri`, and the fields in `wire` when it holds them, else in `map`.
    pub fn lent(
        state: &'r mut State,
        uri: &'r http::Uri,
        map: &'r mut HeaderMap,
        wire: &'r mut Option<Box<WireHead>>,
    ) -> Self {
        let target = uri.path_and_query();
        FilterCtx {
            state,
            request: RequestRef::Lent { target, map, wire },
            view: View::new(),
            response: None,
        }
    }

    /// Past the proxy stage (`post`, `error`): a context over what the state kept of the
    /// request.
    pub fn kept(state: &'r mut State) -> Self {
        FilterCtx {
            state,
            request: RequestRef::Kept,
            view: View::new(),
            response: None,
        }
    }

    /// The same context for a shorter while, without a response head.
    pub fn reborrow(&mut self) -> FilterCtx<'_> {
        let request = match &mut self.request {
            RequestRef::Lent { target, map, wire } => RequestRef::Lent {
                target: *target,
                map,
                wire,
            },
            RequestRef::Kept => RequestRef::Kept,
        };
        FilterCtx {
            state: self.state,
            request,
            view: std::mem::take(&mut self.view),
            response: None,
        }
    }

    /// `post`: the response head to show, its fields in `raw` when it holds them (the map
    /// is empty then), else in `map`.
    pub fn show_response(
        &mut self,
        status: &'r mut StatusCode,
        map: &'r mut HeaderMap,
        raw: &'r mut Option<RawHead>,
    ) {
        self.response = Some(ResponseRef {
            status,
            map,
            raw,
            view: View::new(),
        });
    }
}

impl FilterCtx<'_> {
    /// The request target: the lent one, or the one the state kept.
    fn target(&self) -> Option<&PathAndQuery> {
        match &self.request {
            RequestRef::Lent { target, .. } => *target,
            RequestRef::Kept => self.state.kept.as_deref()?.target.as_ref(),
        }
    }

    /// The request fields as a map and a wire form (`None`: past the proxy stage with none
    /// kept).
    fn request_fields(&self) -> Option<(&HeaderMap, Option<&WireHead>)> {
        match &self.request {
            RequestRef::Lent { map, wire, .. } => Some((map, wire.as_deref())),
            RequestRef::Kept => {
                let k = self.state.kept.as_deref()?;
                Some((&k.map, k.wire.as_deref()))
            }
        }
    }

    /// The request fields, writable (past the proxy stage with none kept, an empty set is
    /// made: a change there reaches no one).
    fn request_fields_mut(&mut self) -> (&mut HeaderMap, &mut Option<Box<WireHead>>) {
        match &mut self.request {
            RequestRef::Lent { map, wire, .. } => (map, wire),
            RequestRef::Kept => {
                let k = self.state.kept.get_or_insert_with(Box::default);
                (&mut k.map, &mut k.wire)
            }
        }
    }

    /// The wire-form request fields, to change a field in place, if they are in wire form
    /// and the field is not one the head scan looks at (`scanned`:
    /// [`keymaster_http::headers::affects_head_scan`] of its name, as [`RawRequestFields::may_edit`]
    /// requires).
    fn wire_to_change(&mut self, scanned: bool) -> Option<&mut RawRequestFields> {
        if scanned {
            return None;
        }
        self.view.take();
        let (_, wire) = self.request_fields_mut();
        Some(&mut wire.as_deref_mut()?.fields)
    }

    /// The request fields as a map: a wire form turned into one (its view if built).
    fn request_map_mut(&mut self) -> &mut HeaderMap {
        let view = self.view.take();
        let (map, wire) = self.request_fields_mut();
        if let Some(w) = wire.take() {
            keymaster_http::headers::replace_map(
                map,
                view.map_or_else(|| w.fields.to_map(), |m| *m),
            );
        }
        map
    }

    /// The stage now running.
    pub fn stage(&self) -> FilterStage {
        self.state.stage
    }
    pub fn method(&self) -> &Method {
        &self.state.method
    }
    /// The request path as the client sent it. In `post` and `error`, empty unless a filter
    /// of those stages reads the request line ([`super::Filter::reads_request_line`]).
    pub fn path(&self) -> &str {
        self.target().map_or("", PathAndQuery::path)
    }
    pub fn query(&self) -> Option<&str> {
        self.target()?.query()
    }
    /// Request headers. Changes take effect in `pre` and `route`. In `post` and `error` this
    /// is a copy as it was after the `route` stage when a filter of those stages declares
    /// [`super::Filter::needs_request_headers`] (or matches on headers), and empty
    /// otherwise.
    pub fn request_headers(&self) -> &HeaderMap {
        match self.request_fields() {
            None => &NO_HEADERS,
            Some((map, None)) => map,
            Some((_, Some(w))) => self.view.get_or_init(|| Box::new(w.fields.to_map())),
        }
    }
    /// The first value of the request field `name` (any case), without the whole map
    /// [`Self::request_headers`] may build.
    pub fn request_header(&self, name: &str) -> Option<&[u8]> {
        self.request_header_values(name).next()
    }
    /// Every value of the request field `name` (any case), in order.
    pub fn request_header_values<'a, 'n>(
        &'a self,
        name: &'n str,
    ) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        let (map, wire) = match self.request_fields() {
            Some((map, None)) => (Some(map), None),
            Some((_, Some(w))) => (None, Some(&w.fields)),
            None => (None, None),
        };
        let in_map = map.into_iter().flat_map(move |m| m.get_all(name));
        in_map
            .map(HeaderValue::as_bytes)
            .chain(wire.into_iter().flat_map(move |f| f.get_all(name)))
    }
    /// Any change through this handle makes the proxy stage re-scan the request head; the
    /// `set`/`append`/`remove_request_header` methods do so only for the fields it scans.
    pub fn request_headers_mut(&mut self) -> &mut HeaderMap {
        self.state.head_touched = true;
        self.state.may_set_request_id = true;
        self.request_map_mut()
    }
    pub fn set_request_header(&mut self, name: HeaderName, value: HeaderValue) {
        let scanned = self.note_change(&name);
        match self.wire_to_change(scanned) {
            Some(w) => w.set(name, value),
            None => {
                self.request_map_mut().insert(name, value);
            }
        }
    }
    pub fn append_request_header(&mut self, name: HeaderName, value: HeaderValue) {
        let scanned = self.note_change(&name);
        match self.wire_to_change(scanned) {
            Some(w) => w.append(name, value),
            None => {
                self.request_map_mut().append(name, value);
            }
        }
    }
    /// A change to the request field `name` is coming: noted for the proxy stage. Returns
    /// whether the head scan looks at that field.
    fn note_change(&mut self, name: &HeaderName) -> bool {
        let scanned = keymaster_http::headers::affects_head_scan(name);
        self.state.head_touched |= scanned;
        self.state.may_set_request_id |= name.as_str().len() == self.state.request_id_len;
        scanned
    }
    pub fn remove_request_header(&mut self, name: &HeaderName) {
        if self.request_fields().is_none() {
            return; // past the proxy stage with none kept: nothing to remove
        }
        let scanned = keymaster_http::headers::affects_head_scan(name);
        self.state.head_touched |= scanned;
        match self.wire_to_change(scanned) {
            Some(w) => w.remove(name),
            None => {
                self.request_map_mut().remove(name);
            }
        }
    }
    /// Apply compiled header edits to the request.
    pub fn edit_request_headers(&mut self, edits: &keymaster_http::headers::HeaderEdits) {
        let scanned = edits.affects_head_scan();
        self.state.head_touched |= scanned;
        self.state.may_set_request_id |= edits.sets_name_of_len(self.state.request_id_len);
        match self.wire_to_change(scanned) {
            Some(w) => edits.apply_wire(w),
            None => edits.apply(self.request_map_mut()),
        }
    }
    /// The TCP peer (not X-Forwarded-For).
    pub fn client_addr(&self) -> SocketAddr {
        self.state.client
    }
    pub fn client_ip(&self) -> IpAddr {
        self.state.client.ip()
    }
    /// Whether the request came over a TLS listener.
    pub fn is_tls(&self) -> bool {
        self.state.tls.is_some()
    }
    /// TLS listeners with client certificates: the verified client identity (subject CN,
    /// else the first DNS name).
    pub fn tls_client_identity(&self) -> Option<&str> {
        self.state.tls.as_ref().and_then(|i| i.as_deref())
    }
    /// The matched route's name.
    pub fn route(&self) -> &str {
        &self.state.route
    }
    /// Per-request values shared by the filters of one request.
    /// The request's string map, shared by every filter of the request from the first `pre`
    /// filter to the last `post` or `error` one (Lua filters see it as `ctx.meta`).
    pub fn meta(&self) -> &HashMap<String, String> {
        self.state.extras_ref().map_or(&NO_META, |x| &x.meta)
    }
    /// [`Self::meta`], writable.
    pub fn meta_mut(&mut self) -> &mut HashMap<String, String> {
        &mut self.state.extras().meta
    }
    /// The request's typed values, shared by every filter of the request like
    /// [`Self::meta`], keyed by type: a native `pre` filter puts what it found (a verified
    /// identity, a parsed token) and a later filter reads it without parsing a string.
    pub fn extensions(&self) -> Option<&http::Extensions> {
        self.state.extras_ref().map(|x| &x.extensions)
    }
    /// [`Self::extensions`], writable (made on first use).
    pub fn extensions_mut(&mut self) -> &mut http::Extensions {
        &mut self.state.extras().extensions
    }
    /// One typed value of [`Self::extensions`].
    pub fn extension<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.extensions()?.get::<T>()
    }

    /// Route stage (or pre): send to this cluster instead of the route's. An unknown name
    /// fails the request with 500.
    pub fn set_cluster(&mut self, name: impl Into<Arc<str>>) {
        self.state.cluster = Some(ClusterChoice::Named(name.into()));
    }
    /// [`Self::set_cluster`] with the cluster itself, found when the chain was built (it
    /// belongs to the same config version as the request).
    #[doc(hidden)]
    pub fn choose_cluster(&mut self, cluster: Arc<dyn ClusterHandle>) {
        self.state.cluster = Some(ClusterChoice::Resolved(cluster));
    }
    /// Route stage (or pre): the path and query sent upstream; replaces the route's rewrite.
    /// An invalid one (not an origin-form target) fails the request with 500.
    pub fn set_upstream_path(&mut self, path_and_query: impl Into<String>) {
        self.state.extras().path = Some(path_and_query.into());
    }
    /// Route stage (or pre): the Host sent upstream; replaces the route's host policy.
    pub fn set_upstream_host(&mut self, host: HeaderValue) {
        self.state.extras().host = Some(host);
    }
    /// The cluster chosen by a filter so far, if any.
    pub fn upstream_cluster(&self) -> Option<&str> {
        match self.state.cluster.as_ref()? {
            ClusterChoice::Named(name) => Some(name),
            ClusterChoice::Resolved(c) => Some(c.name()),
        }
    }

    /// `pre`/`route`: answer the request here (the proxy stage and later pre/route filters
    /// are skipped; post filters still run). `error`: the error response. Ignored in `post`
    /// (edit the response with [`FilterCtx::set_response_status`] and headers there). The
    /// status must be a final one: an answer with a 1xx status is replaced with a 500.
    pub fn respond(
        &mut self,
        status: StatusCode,
        headers: HeaderMap,
        body: impl Into<bytes::Bytes>,
    ) {
        self.state.local = Some(Box::new(LocalResponse {
            status,
            headers,
            body: body.into(),
        }));
    }
    /// Whether a filter has answered the request.
    pub fn responded(&self) -> bool {
        self.state.local.is_some()
    }

    /// `post`: the response status.
    pub fn response_status(&self) -> Option<StatusCode> {
        Some(*self.response.as_ref()?.status)
    }
    /// `post`: a final status (a 1xx one is ignored: it would tell the client that another
    /// response follows, or that the connection switched protocols).
    pub fn set_response_status(&mut self, status: StatusCode) {
        if status.is_informational() {
            return;
        }
        if let Some(r) = self.response.as_mut() {
            *r.status = status;
        }
    }
    /// `post`: the response headers.
    pub fn response_headers(&self) -> Option<&HeaderMap> {
        let r = self.response.as_ref()?;
        Some(match r.raw.as_ref() {
            Some(raw) => r.view.get_or_init(|| Box::new(raw.to_map())),
            None => r.map,
        })
    }
    pub fn response_headers_mut(&mut self) -> Option<&mut HeaderMap> {
        Some(self.response.as_mut()?.map_mut())
    }
    /// `post`: append a response field (cheaper than through [`Self::response_headers_mut`]
    /// while the origin's head is still in wire form).
    pub fn append_response_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.append_response_field(&name, &value);
    }
    /// [`Self::append_response_header`] for a field the caller keeps (cloned only if the
    /// head is a map).
    pub fn append_response_field(&mut self, name: &HeaderName, value: &HeaderValue) {
        let Some(r) = self.response.as_mut() else {
            return;
        };
        match r.raw.as_mut() {
            Some(raw) if RawHead::may_append(name) => {
                raw.push(name.as_str().as_bytes(), value.as_bytes());
                if let Some(view) = r.view.get_mut() {
                    view.append(name.clone(), value.clone());
                }
            }
            // A field hyper derives or acts on (the map path handles it), or a map already.
            _ => {
                r.map_mut().append(name.clone(), value.clone());
            }
        }
    }

    /// [`Self::append_response_field`] with the field's `name: value\r\n` line written ahead
    /// of time (a `headers` filter's compiled `add`), for a name [`RawHead::may_append`]
    /// allows: one copy into a wire-form head.
    pub fn append_response_line(&mut self, f: &keymaster_http::headers::CompiledField) {
        let Some(r) = self.response.as_mut() else {
            return;
        };
        match r.raw.as_mut() {
            Some(raw) => {
                raw.push_line(f.line());
                if let Some(view) = r.view.get_mut() {
                    view.append(f.name.clone(), f.value.clone());
                }
            }
            None => {
                r.map.append(f.name.clone(), f.value.clone());
            }
        }
    }

    /// `error` (and the `post` filters after it): what failed.
    pub fn failure(&self) -> Option<&Failure> {
        self.state.extras_ref()?.failure.as_ref()
    }
}

// Bodies, for filters that declared they need them (the gateway buffers them).
impl FilterCtx<'_> {
    /// The request body, when a filter of this chain declared
    /// [`crate::Filter::needs_request_body`] and matched this request (`None` otherwise:
    /// the body streams past).
    pub fn request_body(&self) -> Option<&Bytes> {
        self.state.extras_ref()?.request_body.as_ref()
    }
    /// Replace the buffered request body (`pre`/`route`); Content-Length follows. Ignored
    /// when the body was not buffered.
    pub fn set_request_body(&mut self, body: impl Into<Bytes>) {
        if self.request_body().is_some() {
            self.state.extras().request_body = Some(body.into());
        }
    }
    /// `post`: the origin's response body, when a post filter declared
    /// [`crate::Filter::needs_response_body`] and matched this request.
    pub fn response_body(&self) -> Option<&Bytes> {
        self.state.extras_ref()?.response_body.as_ref()
    }
    /// `post`: replace the buffered response body; Content-Length follows. Ignored when the
    /// body was not buffered.
    pub fn set_response_body(&mut self, body: impl Into<Bytes>) {
        if self.response_body().is_some() {
            self.state.extras().response_body = Some(body.into());
        }
    }
    #[doc(hidden)]
    pub fn put_request_body(&mut self, b: Bytes) {
        self.state.extras().request_body = Some(b);
    }
}

impl State {
    #[doc(hidden)]
    pub fn put_response_body(&mut self, b: Bytes) {
        self.extras().response_body = Some(b);
    }
    #[doc(hidden)]
    pub fn take_response_body(&mut self) -> Option<Bytes> {
        self.extras_mut()?.response_body.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 1))
    }

    #[test]
    fn path_and_query_read_as_from_the_uri() {
        for target in [
            "/a/b?x=1",
            "/",
            "*",
            "http://h.example/p?q",
            "http://h.example",
            "h.example:443",
        ] {
            let uri: http::Uri = target.parse().unwrap();
            let mut req = TestRequest::new(Method::GET, target, HeaderMap::new(), client());
            let ctx = req.ctx();
            assert_eq!(ctx.path(), uri.path(), "{target}");
            assert_eq!(ctx.query(), uri.query(), "{target}");
        }
    }

    /// A state made after another one was dropped on the same thread reuses its allocation,
    /// and nothing of the earlier request: every part starts fresh.
    #[test]
    fn a_reused_state_allocation_keeps_nothing_of_the_earlier_request() {
        let mut headers = HeaderMap::new();
        headers.insert("x-old", HeaderValue::from_static("1"));
        let mut first = TestRequest::new(Method::POST, "/old?q=1", headers, client());
        let mut ctx = first.ctx();
        ctx.meta_mut().insert("k".into(), "v".into());
        ctx.set_request_header(
            HeaderName::from_static("x-set"),
            HeaderValue::from_static("1"),
        );
        ctx.set_cluster("elsewhere");
        ctx.set_upstream_path("/there");
        ctx.respond(StatusCode::FORBIDDEN, HeaderMap::new(), "no");
        first.state.stage = FilterStage::Post;
        first.state.kept = Some(Box::default());
        let old = &**first.state.0 as *const State;
        drop(first);

        let mut second = TestRequest::new(Method::GET, "/new", HeaderMap::new(), client());
        assert_eq!(
            &**second.state.0 as *const State, old,
            "the allocation is reused"
        );
        assert!(second.state.kept.is_none());
        let ctx = second.ctx();
        assert_eq!(ctx.stage(), FilterStage::Pre);
        assert_eq!(ctx.method(), Method::GET);
        assert_eq!((ctx.path(), ctx.query()), ("/new", None));
        assert!(ctx.request_headers().is_empty());
        assert_eq!(ctx.request_header("x-old"), None);
        assert_eq!(ctx.request_header("x-set"), None);
        assert!(ctx.meta().is_empty());
        assert_eq!(ctx.upstream_cluster(), None);
        assert!(!ctx.responded());
        assert!(ctx.failure().is_none());
        assert_eq!(ctx.response_status(), None);
        assert!(ctx.response_headers().is_none());
        assert!(second.state.take_rare_choices().is_none());
        assert!(!second.state.head_touched() && !second.state.may_have_set_request_id());
        // Two live states: the second one gets an allocation of its own.
        let third = TestRequest::new(Method::GET, "/", HeaderMap::new(), client());
        assert_ne!(
            &**third.state.0 as *const State,
            &**second.state.0 as *const State
        );
    }

    /// Past the proxy stage a context shows what the state kept of the request, or an empty
    /// path and map; the response head it borrows is changed where it lies: appending keeps
    /// the wire form, any other change turns it into the map.
    #[test]
    fn a_post_context_shows_the_kept_request_and_changes_the_response_in_place() {
        let mut req = TestRequest::new(Method::GET, "/p?q=1", HeaderMap::new(), client());
        let state = &mut *req.state;
        let ctx = FilterCtx::kept(state);
        assert_eq!((ctx.path(), ctx.query()), ("", None));
        assert!(ctx.request_headers().is_empty());
        let mut map = HeaderMap::new();
        map.insert("x-kept", HeaderValue::from_static("1"));
        state.kept = Some(Box::new(KeptRequest {
            target: Some(PathAndQuery::from_static("/p?q=1")),
            map,
            wire: None,
        }));

        let (mut status, mut map) = (StatusCode::OK, HeaderMap::new());
        let mut raw = Some(RawHead {
            block: bytes::BytesMut::from(&b"x-origin: 1\r\n"[..]),
            has_date: false,
            has_request_id: false,
            content_length: None,
        });
        let mut ctx = FilterCtx::kept(state);
        ctx.show_response(&mut status, &mut map, &mut raw);
        assert_eq!((ctx.path(), ctx.query()), ("/p", Some("q=1")));
        assert_eq!(ctx.request_header("x-kept"), Some(&b"1"[..]));
        assert_eq!(ctx.response_headers().unwrap()["x-origin"], "1");
        ctx.append_response_header(
            HeaderName::from_static("x-added"),
            HeaderValue::from_static("2"),
        );
        // The view built by the read above follows the append.
        assert_eq!(ctx.response_headers().unwrap()["x-added"], "2");
        ctx.set_response_status(StatusCode::CONTINUE); // ignored: not a final status
        ctx.set_response_status(StatusCode::ACCEPTED);
        drop(ctx);
        assert_eq!(status, StatusCode::ACCEPTED);
        assert!(map.is_empty(), "appending keeps the wire form");
        assert!(raw.is_some());

        let mut ctx = FilterCtx::kept(state);
        ctx.show_response(&mut status, &mut map, &mut raw);
        ctx.response_headers_mut()
            .unwrap()
            .remove(HeaderName::from_static("x-origin"));
        drop(ctx);
        assert!(raw.is_none(), "a removal turns the head into the map");
        assert_eq!(map.len(), 1);
        assert_eq!(map["x-added"], "2");
    }
}
