//! keymaster's filter API: what a filter author depends on, and nothing of the gateway
//! that runs it (no sockets, no pools, no TLS).
//!
//! It owns the [`Filter`] trait and what a filter sees of a request ([`FilterCtx`]), the
//! value a run returns ([`FilterFuture`], [`done`]), a failure ([`FilterError`]), how a
//! filter is registered ([`FilterSpec`]), filter sets built outside the gateway
//! ([`FilterSource`], [`Reloader`]) and a request for unit tests ([`TestRequest`]). The
//! gateway (`keymaster-gateway`) runs the chain; the Lua host (`keymaster-lua`) is one
//! [`FilterSource`] built on this crate alone.
//!
//! Items marked hidden in the docs (the [`host`] module and a few methods) are the
//! interface the gateway drives the chain through; filters do not use them.

mod ctx;
mod source;

pub use ctx::{FilterCtx, TestRequest};
pub use http;
pub use keymaster_config::{FilterMatch, FilterStage};
pub use source::{FilterSource, Reload, Reloader};

/// What the gateway that runs filters uses of a request's filter state: not part of the
/// API filters are written against.
#[doc(hidden)]
pub mod host {
    pub use crate::ctx::{
        ClusterChoice, ClusterHandle, Extras, FilterState, FilterStep, KeptRequest, LocalResponse,
        ResponseRef, State,
    };
    pub use crate::TIMING_SAMPLE;
}

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a filter's `run` returns: a future polled on the worker thread (not `Send`).
/// [`done`] makes a finished one without allocating (synchronous filters, the common case);
/// [`FilterFuture::new`] boxes an `async` block.
pub struct FilterFuture<'a>(Run<'a>);

enum Run<'a> {
    Ready(Option<Result<(), FilterError>>),
    Boxed(Pin<Box<dyn Future<Output = Result<(), FilterError>> + 'a>>),
}

impl<'a> FilterFuture<'a> {
    /// The result of a finished run (made by [`done`]) without polling, else the future
    /// (`None` in `Ok`: it was already taken). For the chain's synchronous path.
    #[doc(hidden)]
    #[inline(always)]
    pub fn try_ready(self) -> Result<Option<Result<(), FilterError>>, FilterFuture<'a>> {
        match self.0 {
            Run::Ready(r) => Ok(r),
            boxed => Err(FilterFuture(boxed)),
        }
    }

    /// An asynchronous filter run (boxed).
    pub fn new(f: impl Future<Output = Result<(), FilterError>> + 'a) -> Self {
        FilterFuture(Run::Boxed(Box::pin(f)))
    }
}

impl Future for FilterFuture<'_> {
    type Output = Result<(), FilterError>;
    fn poll(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Run::Ready(r) => std::task::Poll::Ready(
                r.take()
                    .unwrap_or_else(|| Err("filter future polled after completion".into())),
            ),
            Run::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

/// A filter failed: the chain runs the `error` stage, then answers 500 unless an error
/// filter set a response. The message (and its source, if any) goes to the log and to
/// `error` filters ([`Failure`]), never to the client.
#[derive(Debug)]
pub struct FilterError {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl FilterError {
    /// A failure described by `message`.
    pub fn new(message: impl Into<String>) -> FilterError {
        FilterError {
            message: message.into(),
            source: None,
        }
    }

    /// A failure caused by `source` (an I/O error, a parse error...), described by `message`.
    pub fn with_source(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> FilterError {
        FilterError {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// What went wrong, without the source.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for FilterError {
    /// The message, then each source in the chain: `message: source: its source`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

impl std::error::Error for FilterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl<T: Into<String>> From<T> for FilterError {
    fn from(s: T) -> Self {
        FilterError::new(s)
    }
}

/// What a filter needs from the chain, declared in one value ([`Filter::needs`]). The chain
/// reads it once, when a config version is built, and keeps or skips work for the whole
/// chain accordingly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Needs(u8);

impl Needs {
    /// Nothing: a filter that reads only the method, the route, the client and `meta`.
    pub const NONE: Needs = Needs(0);
    /// `run` always finishes without awaiting anything: it returns [`done`]. The chain runs
    /// such filters in a plain loop, without an async frame; a future one returns anyway
    /// is polled once and the filter fails if it is not finished then.
    pub const SYNCHRONOUS: Needs = Needs(1);
    /// The filter reads the request's path or query ([`FilterCtx::path`],
    /// [`FilterCtx::query`]). Without it in any `post` or `error` filter (and no path match
    /// there), no copy of the target is kept past the proxy stage: they read as empty there.
    pub const REQUEST_LINE: Needs = Needs(1 << 1);
    /// The filter reads the request headers ([`FilterCtx::request_headers`], also in
    /// `should_filter`). Without it in any filter (and no header match), a request id the
    /// gateway generates goes in on the way to the origin rather than into the map.
    pub const REQUEST_HEADERS: Needs = Needs(1 << 2);
    /// A `post` or `error` filter reads the request headers: the chain keeps a copy past
    /// the proxy stage (it costs about as much as a small filter). Pass facts from `pre`
    /// to `post` in [`FilterCtx::extensions_mut`] or `meta` instead where you can.
    pub const REQUEST_HEADERS_AFTER_PROXY: Needs = Needs(1 << 3);
    /// A `pre` or `route` filter reads or replaces the request body: for requests it
    /// matches (declaratively) the body is buffered before the `pre` stage, up to
    /// `[filter_body] max_request` (413 past it). See [`FilterCtx::request_body`].
    pub const REQUEST_BODY: Needs = Needs(1 << 4);
    /// A `post` filter reads or replaces the response body: for requests it matches, the
    /// origin's body is buffered before the `post` stage, up to `[filter_body]
    /// max_response` (502 past it). See [`FilterCtx::response_body`].
    pub const RESPONSE_BODY: Needs = Needs(1 << 5);
    /// What a filter that declares nothing gets: it may read the request line and headers.
    pub const DEFAULT: Needs = Needs(Self::REQUEST_LINE.0 | Self::REQUEST_HEADERS.0);

    /// Whether every need of `other` is in `self`.
    pub const fn contains(self, other: Needs) -> bool {
        self.0 & other.0 == other.0
    }
    /// `self` without the needs of `other`.
    pub const fn without(self, other: Needs) -> Needs {
        Needs(self.0 & !other.0)
    }
    /// `other` added when `on`.
    pub const fn with_if(self, other: Needs, on: bool) -> Needs {
        if on {
            Needs(self.0 | other.0)
        } else {
            self
        }
    }
}

impl std::ops::BitOr for Needs {
    type Output = Needs;
    fn bitor(self, other: Needs) -> Needs {
        Needs(self.0 | other.0)
    }
}

impl Default for Needs {
    fn default() -> Needs {
        Needs::DEFAULT
    }
}

/// A filter: native (Rust), or one of a scripted set (the Lua host).
///
/// The chain runs a request's filters in this order (the gateway's proxy stage is built in;
/// filters decide, the proxy stage moves bytes):
///
/// ```text
///            request head read, route matched, path made canonical
///                                  │
///                                  ▼
///       ┌──────────── pre filters (order, then name) ─────────────┐
///       │  authenticate, rate-limit, rewrite headers; may answer  │
///       └──────────────────────────┬──────────────────────────────┘
///                                  ▼
///       ┌──────────── route filters ──────────────────────────────┐
///       │  choose the cluster, upstream path and Host; may answer │
///       └──────────────────────────┬──────────────────────────────┘
///             answered? ──yes──────┼──────────────┐
///                                  ▼ no           │
///       ┌──────────── proxy stage (built in) ─────┼───────────────┐
///       │  pick a server, pooled connection, send, │ retry, stream │
///       └──────────────────────────┬──────────────┼───────────────┘
///                                  ▼              ▼
///       ┌──────────── post filters ───────────────────────────────┐
///       │  edit the response status and headers (bodies opt-in)   │
///       └──────────────────────────┬──────────────────────────────┘
///                                  ▼
///                    response streamed to the client
///
///   a filter that fails (Err or panic) in any stage ──► error filters ──► their
///   response, else 500; post filters still run after pre/route failures
/// ```
///
/// Per filter: the declarative match of its [`FilterSpec`] first, then
/// [`should_filter`](Filter::should_filter), then [`run`](Filter::run). Both may panic: the
/// chain catches it and treats it as a failure. What the filter needs from the chain is
/// one value, [`needs`](Filter::needs). The stages are described in `docs/filters.md`.
pub trait Filter: Send + Sync + 'static {
    /// Whether to run for this request (default: always). Called after the declarative
    /// match, on every request that passes it: keep it cheap.
    fn should_filter(&self, _ctx: &FilterCtx<'_>) -> bool {
        true
    }
    /// Do the filter's work. Synchronous filters return [`done`].
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a>;
    /// What the filter needs from the chain ([`Needs`]); asked once per config version.
    /// The default, [`Needs::DEFAULT`], is right for any filter that reads no body and is
    /// not a `post` filter reading request headers.
    fn needs(&self) -> Needs {
        Needs::DEFAULT
    }
}

/// A finished [`FilterFuture`] for filters that do not await anything (no allocation).
pub fn done<'a>(result: Result<(), FilterError>) -> FilterFuture<'a> {
    FilterFuture(Run::Ready(Some(result)))
}

/// A filter registered in code, added to every config version's chain (see
/// `Gateway::start_with_filters` in `keymaster-gateway`).
#[derive(Clone)]
pub struct FilterSpec {
    /// Unique among all filters (config ones included); the metrics label.
    pub name: String,
    pub stage: FilterStage,
    /// Lower first; ties broken by name.
    pub order: i32,
    /// Declarative match, checked before `should_filter`.
    pub matches: FilterMatch,
    pub filter: Arc<dyn Filter>,
}

impl FilterSpec {
    pub fn new(
        name: impl Into<String>,
        stage: FilterStage,
        order: i32,
        filter: impl Filter,
    ) -> FilterSpec {
        FilterSpec {
            name: name.into(),
            stage,
            order,
            matches: FilterMatch::default(),
            filter: Arc::new(filter),
        }
    }
    /// With a declarative match.
    pub fn with_match(mut self, m: FilterMatch) -> FilterSpec {
        self.matches = m;
        self
    }
}

/// Which filter failed, in which stage, and why (seen by `error` filters).
#[derive(Debug, Clone)]
pub struct Failure {
    pub filter: Arc<str>,
    pub stage: FilterStage,
    pub message: String,
}

/// The filter runs of one request in this many are timed for
/// `keymaster_filter_duration_seconds`.
pub const TIMING_SAMPLE: u32 = 16;

thread_local! {
    static TIMING_TICK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether to time the filter runs of a new request: one request in [`TIMING_SAMPLE`],
/// counted per worker thread (every request in debug mode). Two clock reads and a histogram
/// update per run would cost more than a small filter itself; a sampled request has all its
/// runs timed, so each filter's runs are sampled one in 16 all the same.
pub(crate) fn sample_timing() -> bool {
    TIMING_TICK.with(|t| {
        let n = t.get().wrapping_add(1);
        t.set(n);
        n % TIMING_SAMPLE == 0
    })
}

/// A native filter type's parameters: the `params` table of its `[[filters]]` table, with
/// every `{ env = "NAME" }` replaced by that environment variable's value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params(toml::Table);

impl Params {
    /// The table as the config gave it, environment references resolved (an unset
    /// variable is an error naming the key).
    pub fn resolve(table: &toml::Table) -> Result<Params, String> {
        keymaster_config::env_table(table).map(Params)
    }

    /// The parameters as `T` (a `#[derive(Deserialize)]` struct; add
    /// `#[serde(deny_unknown_fields)]` to refuse unknown keys).
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        T::deserialize(toml::Value::Table(self.0.clone())).map_err(|e| e.to_string())
    }

    /// The table itself.
    pub fn table(&self) -> &toml::Table {
        &self.0
    }
}

/// Builds a native filter from its parameters when a config version is built: at start, on
/// each reload and by `keymaster validate`. An `Err` rejects the config (with the filter's
/// name); it runs off the request path.
pub type NativeFactory = Arc<dyn Fn(&Params) -> Result<Arc<dyn Filter>, String> + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_error_shows_its_source_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "keys.txt missing");
        let e = FilterError::with_source("cannot load the keys", io);
        assert_eq!(e.message(), "cannot load the keys");
        assert_eq!(e.to_string(), "cannot load the keys: keys.txt missing");
        let src = std::error::Error::source(&e).expect("a source");
        assert_eq!(src.to_string(), "keys.txt missing");
        let plain: FilterError = "no".into();
        assert!(std::error::Error::source(&plain).is_none());
        assert_eq!(plain.to_string(), "no");
    }

    #[test]
    fn needs_combine_and_default_to_the_request_line_and_headers() {
        let n = Needs::SYNCHRONOUS | Needs::REQUEST_BODY;
        assert!(n.contains(Needs::SYNCHRONOUS) && n.contains(Needs::REQUEST_BODY));
        assert!(!n.contains(Needs::REQUEST_HEADERS));
        assert!(Needs::DEFAULT.contains(Needs::REQUEST_LINE | Needs::REQUEST_HEADERS));
        assert_eq!(Needs::default(), Needs::DEFAULT);
        assert_eq!(
            Needs::NONE.with_if(Needs::RESPONSE_BODY, false),
            Needs::NONE
        );
        assert_eq!(
            Needs::NONE.with_if(Needs::RESPONSE_BODY, true),
            Needs::RESPONSE_BODY
        );
        assert_eq!(n.without(Needs::SYNCHRONOUS), Needs::REQUEST_BODY);
    }

    #[test]
    fn params_parse_into_a_struct_and_read_the_environment() {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            key: String,
            limit: u32,
        }
        // SAFETY of set_var: this test's own variable, read only here.
        std::env::set_var("KEYMASTER_FILTER_PARAMS_TEST", "s3cret");
        let t: toml::Table = r#"key = { env = "KEYMASTER_FILTER_PARAMS_TEST" }
limit = 5"#
            .parse()
            .expect("toml");
        let p: P = Params::resolve(&t)
            .expect("resolved")
            .parse()
            .expect("parsed");
        assert_eq!((p.key.as_str(), p.limit), ("s3cret", 5));
        let t: toml::Table = "key = \"k\"\nlimit = 5\nextra = 1".parse().expect("toml");
        let e = Params::resolve(&t)
            .expect("resolved")
            .parse::<P>()
            .err()
            .expect("refused");
        assert!(e.contains("extra"), "{e}");
        let t: toml::Table = r#"key = { env = "KEYMASTER_SURELY_UNSET_X" }"#
            .parse()
            .expect("toml");
        let e = Params::resolve(&t).expect_err("unset");
        assert!(
            e.contains("key") && e.contains("KEYMASTER_SURELY_UNSET_X"),
            "{e}"
        );
    }
}
