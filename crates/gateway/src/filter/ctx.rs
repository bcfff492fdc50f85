//! The per-request context filters see ([`FilterCtx`]): the request head, the shared
//! metadata map, where the request goes, a filter's own response, and in `post` the
//! response head (kept in wire form while filters only append to it).

use http::header::{HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{HeaderMap, Method, Request, StatusCode};
use std::cell::Cell;
use std::collections::HashMap;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

#[cfg(doc)]
use super::FilterChain;
use super::{Failure, FilterStage};
use crate::headers::{RawHead, RawRequestFields, WireHead};

/// A response set by a filter (`pre`/`route` short-circuit, or an `error` filter).
pub(crate) struct LocalResponse {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: bytes::Bytes,
}

/// The narrow per-request API filters see. Bodies are not part of it (they stream past).
///
/// One pointer wide: the state lives in a box, so the request future that keeps the
/// context from the `pre` stage to the `post` stage stays small and moves 8 bytes. The box
/// is reused: a dropped context leaves its allocation (its state dropped) to the next
/// context made on the same thread ([`SPARE`]), which writes a whole new state into it.
pub struct FilterCtx(ManuallyDrop<Box<CtxState>>);

thread_local! {
    /// The allocation of the last context dropped on this thread, without a value: a worker
    /// makes a context per request with filters, one at a time or a few at once, so this
    /// saves an allocation and a free per request.
    static SPARE: Cell<Option<Box<MaybeUninit<CtxState>>>> = const { Cell::new(None) };
}

impl Drop for FilterCtx {
    fn drop(&mut self) {
        // SAFETY: the box is taken out of the `ManuallyDrop` once, here, and `self.0` is not
        // used again.
        let state = unsafe { ManuallyDrop::take(&mut self.0) };
        let raw = Box::into_raw(state);
        // SAFETY: `raw` comes from a `Box<CtxState>` holding a valid state, dropped exactly
        // once here. What is left is the box's allocation holding no value: a
        // `Box<MaybeUninit<CtxState>>` (same size and alignment) owns it from then on and
        // frees it without dropping anything when it is dropped.
        let spare = unsafe {
            std::ptr::drop_in_place(raw);
            Box::from_raw(raw.cast::<MaybeUninit<CtxState>>())
        };
        // Past the thread's destructors the spare is simply freed.
        let _ = SPARE.try_with(move |s| s.set(Some(spare)));
    }
}

impl std::ops::Deref for FilterCtx {
    type Target = CtxState;
    fn deref(&self) -> &CtxState {
        &self.0
    }
}

impl std::ops::DerefMut for FilterCtx {
    fn deref_mut(&mut self) -> &mut CtxState {
        &mut self.0
    }
}

/// What a [`FilterCtx`] holds; reached only through its methods.
///
/// The fields every request with filters uses are here; the ones few requests need (the
/// `meta` map, upstream path and Host overrides, a failure, the debug trace, buffered
/// bodies) are in [`Extras`], allocated on first use, so making and dropping a context
/// touches as little memory as possible.
#[doc(hidden)]
pub struct CtxState {
    pub(super) stage: FilterStage,
    /// The request head may have changed in a field the proxy stage's head scan looks at
    /// (framing, hop-by-hop, Host, Expect): it scans again only then.
    head_touched: bool,
    /// A filter may have set the request id field (it set or appended a field whose name is
    /// as long as that field's, or changed the map through `request_headers_mut`): only
    /// then does the proxy stage look for it in the map before adding a generated id.
    /// Comparing lengths is a cheap over-approximation of comparing names.
    may_set_request_id: bool,
    /// The length of the listener's request id field name.
    request_id_len: usize,
    /// The filter runs of this request are timed (sampled, or debug mode).
    pub(super) timed: bool,
    pub(super) method: Method,
    /// The request target's path and query, as the client sent them (`None` for a target
    /// without a path: the authority form). A copy of less than the whole URI.
    target: Option<PathAndQuery>,
    /// The request headers: moved in for `pre` and `route`; afterwards the copy kept for
    /// `post` and `error` filters that asked for it, else none (reads see an empty map).
    pub(super) headers: Option<RequestFields>,
    client: SocketAddr,
    /// TLS listeners: the verified client certificate identity (mTLS), if any.
    tls: Option<Option<String>>,
    pub(super) route: Arc<str>,
    cluster: Option<ClusterChoice>,
    pub(super) local: Option<Box<LocalResponse>>,
    /// `post`: the response head (`None` before the post stage).
    pub(super) response: Option<ResponseHead>,
    extras: Option<Box<Extras>>,
}

/// The response head the `post` (and then `error`) filters see.
pub(crate) struct ResponseHead {
    pub(super) status: StatusCode,
    pub(super) fields: ResponseFields,
}

/// A response head's fields as the context holds them.
pub(crate) enum ResponseFields {
    /// The origin's head kept in wire form ([`RawHead`]), moved in instead of a map; reads
    /// see `view`, a map built from it on the first read. Appending keeps it; any other
    /// change turns it into a `Map`.
    Wire(RawHead, View),
    /// A map (the head came as one, or a filter changed more than appending).
    Map(HeaderMap),
}

impl ResponseFields {
    /// As a map: the wire form turned into one (its `view` if built).
    fn map_mut(&mut self) -> &mut HeaderMap {
        if let ResponseFields::Wire(raw, view) = self {
            let map = view.take().map_or_else(|| raw.to_map(), |m| *m);
            *self = ResponseFields::Map(map);
        }
        match self {
            ResponseFields::Map(m) => m,
            ResponseFields::Wire(..) => unreachable!("turned into a map above"),
        }
    }
}

/// The request's fields as the context holds them.
pub(crate) enum RequestFields {
    /// A map (the request came as one, or a filter needed one to change it).
    Map(HeaderMap),
    /// The client's fields in wire form (keymaster's HTTP/1.1 server), in the server's box
    /// (moved in and out of the context as one word; its facts are spent), changed in place
    /// through [`RawRequestFields`]' edits while no filter needs more; `view`: the map
    /// [`FilterCtx::request_headers`] built for a filter that reads them whole, dropped on
    /// a change.
    Wire(Box<WireHead>, View),
}

/// A map built from a wire-form head on its first read; boxed, so that the context and the
/// request fields it moves in and out stay small (few requests build one).
pub(crate) type View = std::cell::OnceCell<Box<HeaderMap>>;

impl RequestFields {
    /// As a map: the wire form turned into one (its `view` if built).
    fn map_mut(&mut self) -> &mut HeaderMap {
        if let RequestFields::Wire(w, view) = self {
            let map = view.take().map_or_else(|| w.fields.to_map(), |m| *m);
            *self = RequestFields::Map(map);
        }
        match self {
            RequestFields::Map(m) => m,
            RequestFields::Wire(..) => unreachable!("turned into a map above"),
        }
    }

    /// The wire form, to change a field in place, if it is one and the field is not one the
    /// head scan looks at (`scanned`: [`crate::headers::affects_head_scan`] of its name, as
    /// [`RawRequestFields::may_edit`] requires).
    fn wire_for(&mut self, scanned: bool) -> Option<&mut RawRequestFields> {
        match self {
            RequestFields::Wire(w, view) if !scanned => {
                view.take();
                Some(&mut w.fields)
            }
            _ => None,
        }
    }

    /// A copy for the `post` and `error` filters (the wire form's block is shared).
    pub(super) fn copy(&self) -> RequestFields {
        match self {
            RequestFields::Map(m) => RequestFields::Map(m.clone()),
            RequestFields::Wire(w, _) => {
                let fields = w.fields.clone();
                let facts = Default::default();
                RequestFields::Wire(Box::new(WireHead { fields, facts }), Default::default())
            }
        }
    }
}

/// The cluster a filter chose: by name (the proxy stage looks it up in the request's config
/// version), or one the chain found when it was built (a `reroute` filter).
pub(crate) enum ClusterChoice {
    Named(Arc<str>),
    Resolved(Arc<crate::upstream::Cluster>),
}

/// The parts of a context few requests use (see [`CtxState`]).
#[derive(Default)]
pub(super) struct Extras {
    meta: HashMap<String, String>,
    path: Option<String>,
    host: Option<HeaderValue>,
    pub(super) failure: Option<Failure>,
    /// Debug mode: one entry per filter considered.
    pub(super) debug: Option<Vec<String>>,
    /// Bodies buffered for filters that declared they need them (`filter::body`).
    pub(super) request_body: Option<bytes::Bytes>,
    pub(super) response_body: Option<bytes::Bytes>,
}

/// What [`FilterCtx::meta`] reads before anything was put in the map.
static NO_META: std::sync::LazyLock<HashMap<String, String>> =
    std::sync::LazyLock::new(HashMap::new);

/// What [`FilterCtx::request_headers`] reads once the headers went upstream without a copy.
static NO_HEADERS: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);

impl FilterCtx {
    /// A context for the request head `parts` with its fields moved in: `wire`'s when it
    /// holds them in wire form, else the map, an empty one left in its place (they go back
    /// with [`super::FilterChain::put_back_request_headers`]). `request_id`: the listener's
    /// request id field name.
    pub(crate) fn new(
        parts: &mut http::request::Parts,
        wire: &mut Option<Box<WireHead>>,
        client: SocketAddr,
        tls: Option<&crate::tls::TlsFacts>,
        route: Arc<str>,
        request_id: &HeaderName,
    ) -> FilterCtx {
        // Every value that takes a call is made first, so that the state is then written
        // straight into its allocation (the spare, else a new one), not built on the stack
        // and copied in.
        let timed = super::stage::sample_timing();
        let method = parts.method.clone();
        let target = parts.uri.path_and_query().cloned();
        let headers = Some(match wire.take() {
            Some(fields) => RequestFields::Wire(fields, Default::default()),
            None => RequestFields::Map(std::mem::take(&mut parts.headers)),
        });
        let tls = tls.map(|t| t.client_identity.clone());
        let state = (SPARE.try_with(Cell::take).ok().flatten()).unwrap_or_else(Box::new_uninit);
        FilterCtx(ManuallyDrop::new(Box::write(
            state,
            CtxState {
                stage: FilterStage::Pre,
                head_touched: false,
                may_set_request_id: false,
                request_id_len: request_id.as_str().len(),
                timed,
                method,
                target,
                headers,
                client,
                tls,
                route,
                cluster: None,
                local: None,
                response: None,
                extras: None,
            },
        )))
    }

    /// The rarely used parts, allocated on first use.
    pub(super) fn extras(&mut self) -> &mut Extras {
        self.0.extras.get_or_insert_with(Box::default)
    }

    /// The rarely used parts, if any was ever set.
    pub(super) fn extras_ref(&self) -> Option<&Extras> {
        self.0.extras.as_deref()
    }

    /// The rarely used parts, if any was ever set, writable.
    pub(super) fn extras_mut(&mut self) -> Option<&mut Extras> {
        self.0.extras.as_deref_mut()
    }

    /// A context for unit tests of filters (no request behind it).
    pub fn for_test(method: Method, uri: &str, headers: HeaderMap, client: SocketAddr) -> Self {
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri.parse().expect("valid uri");
        let (mut parts, ()) = req.into_parts();
        parts.headers = headers;
        let request_id = HeaderName::from_static("x-request-id");
        FilterCtx::new(
            &mut parts,
            &mut None,
            client,
            None,
            "test".into(),
            &request_id,
        )
    }

    /// The stage now running.
    pub fn stage(&self) -> FilterStage {
        self.stage
    }
    pub fn method(&self) -> &Method {
        &self.method
    }
    /// The request path as the client sent it.
    pub fn path(&self) -> &str {
        self.target.as_ref().map_or("", PathAndQuery::path)
    }
    pub fn query(&self) -> Option<&str> {
        self.target.as_ref()?.query()
    }
    /// Request headers. Changes take effect in `pre` and `route`. In `post` and `error` this
    /// is a copy as it was after the `route` stage when a filter of those stages declares
    /// [`Filter::needs_request_headers`] (or matches on headers), and empty otherwise.
    pub fn request_headers(&self) -> &HeaderMap {
        match &self.headers {
            None => &NO_HEADERS,
            Some(RequestFields::Map(m)) => m,
            Some(RequestFields::Wire(w, view)) => view.get_or_init(|| Box::new(w.fields.to_map())),
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
        let (map, wire) = match &self.headers {
            Some(RequestFields::Map(m)) => (Some(m), None),
            Some(RequestFields::Wire(w, _)) => (None, Some(&w.fields)),
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
        self.head_touched = true;
        self.may_set_request_id = true;
        self.fields().map_mut()
    }
    /// The request's fields, writable (an empty map if they went upstream without a copy).
    fn fields(&mut self) -> &mut RequestFields {
        self.headers
            .get_or_insert_with(|| RequestFields::Map(HeaderMap::new()))
    }
    pub fn set_request_header(&mut self, name: HeaderName, value: HeaderValue) {
        let scanned = crate::headers::affects_head_scan(&name);
        self.head_touched |= scanned;
        self.may_set_request_id |= name.as_str().len() == self.request_id_len;
        let fields = self.fields();
        match fields.wire_for(scanned) {
            Some(w) => w.set(name, value),
            None => {
                fields.map_mut().insert(name, value);
            }
        }
    }
    pub fn append_request_header(&mut self, name: HeaderName, value: HeaderValue) {
        let scanned = crate::headers::affects_head_scan(&name);
        self.head_touched |= scanned;
        self.may_set_request_id |= name.as_str().len() == self.request_id_len;
        let fields = self.fields();
        match fields.wire_for(scanned) {
            Some(w) => w.append(name, value),
            None => {
                fields.map_mut().append(name, value);
            }
        }
    }
    pub fn remove_request_header(&mut self, name: &HeaderName) {
        let scanned = crate::headers::affects_head_scan(name);
        self.head_touched |= scanned;
        if let Some(fields) = self.headers.as_mut() {
            match fields.wire_for(scanned) {
                Some(w) => w.remove(name),
                None => {
                    fields.map_mut().remove(name);
                }
            }
        }
    }
    /// Apply compiled header edits to the request.
    pub(crate) fn edit_request_headers(&mut self, edits: &crate::headers::HeaderEdits) {
        self.head_touched |= edits.affects_head_scan();
        self.may_set_request_id |= edits.sets_name_of_len(self.request_id_len);
        let fields = self.fields();
        match fields {
            RequestFields::Wire(w, view) if !edits.affects_head_scan() => {
                view.take();
                edits.apply_wire(&mut w.fields);
            }
            _ => edits.apply(fields.map_mut()),
        }
    }
    /// Whether a filter may have set the request id field (see `may_set_request_id`).
    pub(crate) fn may_have_set_request_id(&self) -> bool {
        self.may_set_request_id
    }
    /// Whether a filter may have changed a field the proxy stage's head scan looks at.
    pub(crate) fn head_touched(&self) -> bool {
        self.head_touched
    }
    /// The TCP peer (not X-Forwarded-For).
    pub fn client_addr(&self) -> SocketAddr {
        self.client
    }
    pub fn client_ip(&self) -> IpAddr {
        self.client.ip()
    }
    /// Whether the request came over a TLS listener.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
    /// TLS listeners with client certificates: the verified client identity (subject CN,
    /// else the first DNS name).
    pub fn tls_client_identity(&self) -> Option<&str> {
        self.tls.as_ref().and_then(|i| i.as_deref())
    }
    /// The matched route's name.
    pub fn route(&self) -> &str {
        &self.route
    }
    /// Per-request values shared by the filters of one request.
    pub fn meta(&self) -> &HashMap<String, String> {
        self.extras_ref().map_or(&NO_META, |x| &x.meta)
    }
    pub fn meta_mut(&mut self) -> &mut HashMap<String, String> {
        &mut self.extras().meta
    }

    /// Route stage (or pre): send to this cluster instead of the route's. An unknown name
    /// fails the request with 500.
    pub fn set_cluster(&mut self, name: impl Into<Arc<str>>) {
        self.cluster = Some(ClusterChoice::Named(name.into()));
    }
    /// [`Self::set_cluster`] with the cluster itself, found when the chain was built (it
    /// belongs to the same config version as the request).
    pub(crate) fn choose_cluster(&mut self, cluster: Arc<crate::upstream::Cluster>) {
        self.cluster = Some(ClusterChoice::Resolved(cluster));
    }
    /// After the route stage: the cluster a filter chose, if any.
    pub(crate) fn take_cluster(&mut self) -> Option<ClusterChoice> {
        self.cluster.take()
    }
    /// Route stage (or pre): the path and query sent upstream; replaces the route's rewrite.
    /// An invalid one (not an origin-form target) fails the request with 500.
    pub fn set_upstream_path(&mut self, path_and_query: impl Into<String>) {
        self.extras().path = Some(path_and_query.into());
    }
    /// Route stage (or pre): the Host sent upstream; replaces the route's host policy.
    pub fn set_upstream_host(&mut self, host: HeaderValue) {
        self.extras().host = Some(host);
    }
    /// The cluster chosen by a filter so far, if any.
    pub fn upstream_cluster(&self) -> Option<&str> {
        match self.cluster.as_ref()? {
            ClusterChoice::Named(name) => Some(name),
            ClusterChoice::Resolved(c) => Some(&c.config.name),
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
        self.local = Some(Box::new(LocalResponse {
            status,
            headers,
            body: body.into(),
        }));
    }
    /// Whether a filter has answered the request.
    pub fn responded(&self) -> bool {
        self.local.is_some()
    }

    /// `post`: the response status.
    pub fn response_status(&self) -> Option<StatusCode> {
        Some(self.response.as_ref()?.status)
    }
    /// `post`: a final status (a 1xx one is ignored: it would tell the client that another
    /// response follows, or that the connection switched protocols).
    pub fn set_response_status(&mut self, status: StatusCode) {
        if status.is_informational() {
            return;
        }
        if let Some(r) = self.response.as_mut() {
            r.status = status;
        }
    }
    /// `post`: the response headers.
    pub fn response_headers(&self) -> Option<&HeaderMap> {
        Some(match &self.response.as_ref()?.fields {
            ResponseFields::Wire(raw, view) => view.get_or_init(|| Box::new(raw.to_map())),
            ResponseFields::Map(m) => m,
        })
    }
    pub fn response_headers_mut(&mut self) -> Option<&mut HeaderMap> {
        Some(self.response.as_mut()?.fields.map_mut())
    }
    /// `post`: append a response field (cheaper than through [`Self::response_headers_mut`]
    /// while the origin's head is still in wire form).
    pub fn append_response_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.append_response_field(&name, &value);
    }
    /// [`Self::append_response_header`] for a field the caller keeps (cloned only if the
    /// head is a map).
    pub(crate) fn append_response_field(&mut self, name: &HeaderName, value: &HeaderValue) {
        let Some(r) = self.response.as_mut() else {
            return;
        };
        match &mut r.fields {
            ResponseFields::Wire(raw, view) if RawHead::may_append(name) => {
                raw.push(name.as_str().as_bytes(), value.as_bytes());
                if let Some(view) = view.get_mut() {
                    view.append(name.clone(), value.clone());
                }
            }
            // A field hyper derives or acts on (the map path handles it), or a map already.
            fields => {
                fields.map_mut().append(name.clone(), value.clone());
            }
        }
    }

    /// [`Self::append_response_field`] with the field's `name: value\r\n` line written ahead
    /// of time (a `headers` filter's compiled `add`), for a name [`RawHead::may_append`]
    /// allows: one copy into a wire-form head.
    pub(crate) fn append_response_line(&mut self, f: &crate::headers::CompiledField) {
        let Some(r) = self.response.as_mut() else {
            return;
        };
        match &mut r.fields {
            ResponseFields::Wire(raw, view) => {
                raw.push_line(f.line());
                if let Some(view) = view.get_mut() {
                    view.append(f.name.clone(), f.value.clone());
                }
            }
            ResponseFields::Map(map) => {
                map.append(f.name.clone(), f.value.clone());
            }
        }
    }

    /// `error` (and the `post` filters after it): what failed.
    pub fn failure(&self) -> Option<&Failure> {
        self.extras_ref()?.failure.as_ref()
    }

    /// Debug mode: the trace to add entries to.
    pub(super) fn debug_trace(&mut self) -> Option<&mut Vec<String>> {
        self.extras_mut()?.debug.as_mut()
    }

    /// After the route stage: the request body buffered for filters, and the upstream path
    /// and Host a filter set (`None`: nothing touched the rarely used parts of the context,
    /// so there is none of them).
    pub(crate) fn take_rare_choices(
        &mut self,
    ) -> Option<(Option<bytes::Bytes>, Option<String>, Option<HeaderValue>)> {
        let x = self.extras_mut()?;
        Some((x.request_body.take(), x.path.take(), x.host.take()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_query_read_as_from_the_uri() {
        let client = SocketAddr::from(([127, 0, 0, 1], 1));
        for target in [
            "/a/b?x=1",
            "/",
            "*",
            "http://h.example/p?q",
            "http://h.example",
            "h.example:443",
        ] {
            let uri: http::Uri = target.parse().unwrap();
            let ctx = FilterCtx::for_test(Method::GET, target, HeaderMap::new(), client);
            assert_eq!(ctx.path(), uri.path(), "{target}");
            assert_eq!(ctx.query(), uri.query(), "{target}");
        }
    }

    /// A context made after another one was dropped on the same thread reuses its
    /// allocation, and nothing of the earlier request: every part starts fresh.
    #[test]
    fn a_reused_context_allocation_keeps_nothing_of_the_earlier_request() {
        let client = SocketAddr::from(([127, 0, 0, 1], 1));
        let mut headers = HeaderMap::new();
        headers.insert("x-old", HeaderValue::from_static("1"));
        let mut first = FilterCtx::for_test(Method::POST, "/old?q=1", headers, client);
        first.meta_mut().insert("k".into(), "v".into());
        first.set_request_header(
            HeaderName::from_static("x-set"),
            HeaderValue::from_static("1"),
        );
        first.set_cluster("elsewhere");
        first.set_upstream_path("/there");
        first.respond(StatusCode::FORBIDDEN, HeaderMap::new(), "no");
        first.response = Some(ResponseHead {
            status: StatusCode::OK,
            fields: ResponseFields::Map(HeaderMap::new()),
        });
        first.stage = FilterStage::Post;
        let old = &**first.0 as *const CtxState;
        drop(first);

        let mut second = FilterCtx::for_test(Method::GET, "/new", HeaderMap::new(), client);
        assert_eq!(
            &**second.0 as *const CtxState, old,
            "the allocation is reused"
        );
        assert_eq!(second.stage(), FilterStage::Pre);
        assert_eq!(second.method(), Method::GET);
        assert_eq!((second.path(), second.query()), ("/new", None));
        assert!(second.request_headers().is_empty());
        assert_eq!(second.request_header("x-old"), None);
        assert_eq!(second.request_header("x-set"), None);
        assert!(second.meta().is_empty());
        assert_eq!(second.upstream_cluster(), None);
        assert!(second.take_rare_choices().is_none());
        assert!(!second.responded());
        assert!(second.failure().is_none());
        assert_eq!(second.response_status(), None);
        assert!(second.response_headers().is_none());
        assert!(!second.head_touched() && !second.may_have_set_request_id());
        // Two live contexts: the second one gets an allocation of its own.
        let third = FilterCtx::for_test(Method::GET, "/", HeaderMap::new(), client);
        assert_ne!(
            &**third.0 as *const CtxState,
            &**second.0 as *const CtxState
        );
    }

    #[test]
    fn put_back_headers_replaces_placeholders_and_maps() {
        let map = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("x-a", HeaderValue::from_static(v));
            h
        };
        // A placeholder left by `mem::take` (forgotten: it owns nothing).
        let mut dst = map("1");
        let taken = std::mem::take(&mut dst);
        assert_eq!(dst.capacity(), 0);
        crate::headers::replace_map(&mut dst, taken);
        assert_eq!(dst["x-a"], "1");
        // A map with contents in `dst` is replaced (and dropped) all the same.
        crate::headers::replace_map(&mut dst, map("2"));
        assert_eq!(dst["x-a"], "2");
        assert_eq!(dst.len(), 1);
    }
}
