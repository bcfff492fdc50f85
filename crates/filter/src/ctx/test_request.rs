//! [`TestRequest`]: what a filter's unit test runs it on, without a gateway.

use super::*;

/// A request for unit tests of filters: it owns what a [`FilterCtx`] borrows, and a
/// response head for the `post` stage ([`TestRequest::with_response`]).
pub struct TestRequest {
    parts: http::request::Parts,
    wire: Option<Box<WireHead>>,
    pub(super) state: FilterState,
    status: StatusCode,
    response: HeaderMap,
    raw: Option<RawHead>,
}

impl TestRequest {
    pub fn new(method: Method, uri: &str, headers: HeaderMap, client: SocketAddr) -> Self {
        let mut req = http::Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri.parse().expect("valid uri");
        let (mut parts, ()) = req.into_parts();
        parts.headers = headers;
        let request_id = HeaderName::from_static("x-request-id");
        let state = FilterState::new(&parts.method, client, None, "test".into(), &request_id);
        TestRequest {
            parts,
            wire: None,
            state,
            status: StatusCode::OK,
            response: HeaderMap::new(),
            raw: None,
        }
    }

    /// The origin's response head that [`TestRequest::post_ctx`] shows (default: 200, no
    /// fields).
    pub fn with_response(mut self, status: StatusCode, headers: HeaderMap) -> Self {
        (self.status, self.response) = (status, headers);
        self
    }

    /// A context over the request, as the `pre` stage sees it.
    pub fn ctx(&mut self) -> FilterCtx<'_> {
        let p = &mut self.parts;
        FilterCtx::lent(&mut self.state, &p.uri, &mut p.headers, &mut self.wire)
    }

    /// A context over the request and the response head, as the `post` stage sees it
    /// (what `pre` filters put in `meta` or the extensions is there).
    pub fn post_ctx(&mut self) -> FilterCtx<'_> {
        self.state.stage = FilterStage::Post;
        let p = &mut self.parts;
        let mut ctx = FilterCtx::lent(&mut self.state, &p.uri, &mut p.headers, &mut self.wire);
        ctx.show_response(&mut self.status, &mut self.response, &mut self.raw);
        ctx
    }

    /// Run `filter` as the `pre` stage does: its `should_filter`, then `run` (`Ok(false)`:
    /// it chose not to run). For filters whose run finishes at once; one that suspends
    /// panics here: await `filter.run(&mut req.ctx())` on a runtime of your own instead.
    pub fn run_pre(&mut self, filter: &dyn crate::Filter) -> Result<bool, crate::FilterError> {
        run_at_once(filter, &mut self.ctx())
    }

    /// [`TestRequest::run_pre`] as the `post` stage does (over [`TestRequest::post_ctx`]).
    pub fn run_post(&mut self, filter: &dyn crate::Filter) -> Result<bool, crate::FilterError> {
        run_at_once(filter, &mut self.post_ctx())
    }

    /// The status of the response a filter answered with ([`FilterCtx::respond`]), if any.
    pub fn answered(&self) -> Option<StatusCode> {
        self.state.local.as_ref().map(|l| l.status)
    }

    /// The response head after `post` filters ran on [`TestRequest::post_ctx`].
    pub fn response(&self) -> (StatusCode, HeaderMap) {
        let map = match &self.raw {
            Some(raw) => raw.to_map(),
            None => self.response.clone(),
        };
        (self.status, map)
    }
}

/// `should_filter`, then `run` polled once: it must be finished then.
fn run_at_once(
    filter: &dyn crate::Filter,
    ctx: &mut FilterCtx<'_>,
) -> Result<bool, crate::FilterError> {
    if !filter.should_filter(ctx) {
        return Ok(false);
    }
    let mut run = std::pin::pin!(filter.run(ctx));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::future::Future::poll(run.as_mut(), &mut cx) {
        std::task::Poll::Ready(r) => r.map(|()| true),
        std::task::Poll::Pending => panic!("the filter's run suspended: await it on a runtime"),
    }
}
