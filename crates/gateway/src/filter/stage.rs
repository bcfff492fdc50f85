//! Running the chain's stages: the rules of `docs/filters.md` ("Rules") in code.
//!
//! A stage is a loop over its filters in run order: the declarative match, then
//! `should_filter`, then `run`, each guarded against panics, with the counters, the sampled
//! timing and the debug trace. Filters that declare themselves synchronous ([`keymaster_filter::Needs::SYNCHRONOUS`]) (the
//! built-ins, Lua files that cannot suspend) run in [`FilterChain::run_sync`], a plain loop;
//! only a filter that may await is run from an async frame ([`FilterChain::run_from`]),
//! after which the plain loop goes on. A chain of synchronous filters therefore runs without
//! a future per stage or per filter: `inbound` and `outbound` return a [`Staged`] that is
//! ready at once, and box the rest of their stage only when a filter may suspend or one
//! failed (the error stage may await).

use futures_util::FutureExt;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use super::{
    builtin, Entry, Failure, FilterChain, FilterCtx, FilterError, FilterFuture, FilterStage, Needs,
    State,
};
use crate::proxy::ResponseBody;
use keymaster_filter::host::KeptRequest;

/// A stage's outcome: there at once when every filter of the stage ran synchronously (no
/// future made), else a boxed future that finishes the stage. Taken with [`staged!`].
pub(crate) enum Staged<'a, T> {
    Ready(T),
    Pending(std::pin::Pin<Box<dyn Future<Output = T> + 'a>>),
}

impl<'a, T> Staged<'a, T> {
    fn boxed(f: impl Future<Output = T> + 'a) -> Self {
        Staged::Pending(Box::pin(f))
    }
}

/// The outcome of a [`Staged`], in an `async` context: a ready one taken as it is (not polled
/// as a future, nothing of it left to drop), a pending one awaited.
macro_rules! staged {
    ($e:expr) => {{
        let staged = $e; // bound first: the borrows it holds end with it
        match staged {
            $crate::filter::Staged::Ready(v) => v,
            $crate::filter::Staged::Pending(f) => f.await,
        }
    }};
}
pub(crate) use staged;

/// A filter's result, or the payload of its panic.
type Outcome = Result<Result<(), FilterError>, Box<dyn std::any::Any + Send>>;

/// Whether a filter runs for this request.
enum Admission {
    Run,
    Skip,
    Failed(Failure),
}

impl FilterChain {
    /// Run `entries` (one stage's filters, or pre and route's): `Err` is the first failure
    /// (pre/route/post); the error stage runs every filter whatever happens and never fails.
    async fn run_stage(&self, entries: &[Entry], ctx: &mut FilterCtx<'_>) -> Result<(), Failure> {
        match self.run_sync(entries, 0, ctx)? {
            None => Ok(()),
            Some(at) => self.run_from(entries, at, ctx).await,
        }
    }

    /// Run `entries[from..]` as long as their filters are synchronous. `Ok(None)`: the stage
    /// is done (every filter ran or was skipped, or a pre/route filter answered).
    /// `Ok(Some(at))`: `entries[at]` may suspend and nothing of it ran yet; go on with
    /// [`Self::run_from`]. `Err`: the first failure (never in the error stage, whose
    /// failures are counted and passed over).
    fn run_sync(
        &self,
        entries: &[Entry],
        from: usize,
        ctx: &mut FilterCtx<'_>,
    ) -> Result<Option<usize>, Failure> {
        for (at, e) in entries.iter().enumerate().skip(from) {
            ctx.state.stage = e.stage;
            if ctx.state.local.is_some() && matches!(e.stage, FilterStage::Pre | FilterStage::Route)
            {
                break; // answered: the rest of pre/route is skipped
            }
            if !e.needs.contains(Needs::SYNCHRONOUS) {
                return Ok(Some(at));
            }
            if e.plain && !ctx.state.timed {
                // Matches every request, no clock to read: asked and run under one
                // `catch_unwind`.
                let ran = match run_plain(e, ctx) {
                    Plain::Ran(Ok(Ok(()))) => {
                        count_answer(e, ctx);
                        continue;
                    }
                    Plain::Skipped => {
                        e.metrics.skips.inc();
                        continue;
                    }
                    Plain::Ran(outcome) => self.finish(e, ctx, outcome, None),
                    Plain::AskPanicked(p) => {
                        let message = format!("should_filter panicked: {}", panic_text(&p));
                        Err(self.failed(e, message))
                    }
                };
                if let Err(f) = ran {
                    if e.stage != FilterStage::Error {
                        return Err(f);
                    }
                }
                continue;
            }
            let ran = match self.admit(e, ctx) {
                Admission::Run => {
                    let started = start(e, ctx);
                    let outcome = run_now(e, ctx);
                    count_answer(e, ctx);
                    self.finish(e, ctx, outcome, started)
                }
                Admission::Skip => continue,
                Admission::Failed(f) => Err(f),
            };
            if let Err(f) = ran {
                if e.stage != FilterStage::Error {
                    return Err(f);
                }
            }
        }
        Ok(None)
    }

    /// Run `entries[at..]`, `entries[at]` being a filter that may suspend (as
    /// [`Self::run_sync`] left it): that one from this async frame, the rest as they come.
    async fn run_from(
        &self,
        entries: &[Entry],
        mut at: usize,
        ctx: &mut FilterCtx<'_>,
    ) -> Result<(), Failure> {
        loop {
            let e = &entries[at];
            let ran = self.run_suspending(e, ctx).await;
            count_answer(e, ctx);
            if let Err(f) = ran {
                if e.stage != FilterStage::Error {
                    return Err(f);
                }
            }
            match self.run_sync(entries, at + 1, ctx)? {
                None => return Ok(()),
                Some(next) => at = next,
            }
        }
    }

    /// One filter that may suspend: its future is awaited (a panic while it is polled is
    /// caught like one in `run`).
    async fn run_suspending(&self, e: &Entry, ctx: &mut FilterCtx<'_>) -> Result<(), Failure> {
        match self.admit(e, ctx) {
            Admission::Run => {}
            Admission::Skip => return Ok(()),
            Admission::Failed(f) => return Err(f),
        }
        let started = start(e, ctx);
        let c = &mut *ctx;
        let outcome = match std::panic::catch_unwind(AssertUnwindSafe(move || {
            let c = c; // moved in: the closure is FnOnce, so the future may borrow it
            e.filter.run(c)
        })) {
            Ok(f) => match f.try_ready() {
                Ok(r) => Ok(r.unwrap_or_else(polled_twice)),
                Err(f) => AssertUnwindSafe(f).catch_unwind().await,
            },
            Err(p) => Err(p),
        };
        self.finish(e, ctx, outcome, started)
    }

    /// The declarative match, then `should_filter` (a panic there is a failure of the
    /// filter). A skip is counted and traced here.
    #[inline(always)]
    fn admit(&self, e: &Entry, ctx: &mut FilterCtx<'_>) -> Admission {
        let should = e.matcher.matches(ctx)
            && match std::panic::catch_unwind(AssertUnwindSafe(|| e.filter.should_filter(ctx))) {
                Ok(b) => b,
                Err(p) => {
                    let message = format!("should_filter panicked: {}", panic_text(&p));
                    return Admission::Failed(self.failed(e, message));
                }
            };
        if should {
            return Admission::Run;
        }
        e.metrics.skips.inc();
        step(e, ctx, None, std::time::Duration::ZERO, "skip");
        if let Some(d) = ctx.state.debug_trace() {
            d.push(format!("{}:{}=skip", e.stage.as_str(), e.name));
        }
        Admission::Skip
    }

    /// After a filter ran: its sampled timing and debug entry; a failure is counted and
    /// logged.
    #[inline(always)]
    fn finish(
        &self,
        e: &Entry,
        ctx: &mut FilterCtx<'_>,
        outcome: Outcome,
        started: Option<Instant>,
    ) -> Result<(), Failure> {
        if let Some(started) = started {
            let took = started.elapsed();
            e.metrics.duration.observe(took.as_secs_f64());
            let ran = matches!(outcome, Ok(Ok(())));
            step(
                e,
                ctx,
                Some(started),
                took,
                if ran { "ran" } else { "failed" },
            );
            if let Some(d) = ctx.state.debug_trace() {
                let what = match &outcome {
                    Ok(Ok(())) => "ran",
                    _ => "failed",
                };
                d.push(format!(
                    "{}:{}={what}/{}us",
                    e.stage.as_str(),
                    e.name,
                    took.as_micros()
                ));
            }
        }
        let message = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(err)) => err.to_string(),
            Err(p) => format!("panicked: {}", panic_text(&p)),
        };
        Err(self.failed(e, message))
    }

    fn failed(&self, e: &Entry, message: String) -> Failure {
        e.metrics.errors.inc();
        let stage = e.stage.as_str();
        tracing::warn!(filter = %e.name, stage, error = %message, "filter failed");
        Failure {
            filter: e.name.clone(),
            stage: e.stage,
            message,
        }
    }

    /// A filter failed: drop any response it set and run the error stage.
    async fn fail(&self, ctx: &mut FilterCtx<'_>, f: Failure) {
        ctx.state.local = None;
        ctx.state.extras().failure = Some(f);
        ctx.state.stage = FilterStage::Error;
        self.run_error_stage(ctx).await;
    }

    /// Every error filter, whatever happens (their failures are counted and passed over).
    async fn run_error_stage(&self, ctx: &mut FilterCtx<'_>) {
        let _ = self.run_stage(self.stage(FilterStage::Error), ctx).await;
    }

    /// Debug mode: when the request carries the secret, trace this request's filters (and
    /// remove the header so it never reaches the origin).
    #[inline]
    fn start_debug(&self, ctx: &mut FilterCtx<'_>) {
        if self.debug.is_some() {
            self.check_debug_secret(ctx);
        }
    }

    #[cold]
    fn check_debug_secret(&self, ctx: &mut FilterCtx<'_>) {
        if let Some((name, secret)) = &self.debug {
            let hit = ctx
                .request_header(name.as_str())
                .is_some_and(|v| builtin::constant_time_eq(v, secret));
            if hit {
                ctx.remove_request_header(name);
                ctx.state.extras().debug = Some(Vec::new());
                ctx.state.timed = true;
            }
        }
    }

    /// Debug mode: the trace as the `x-keymaster-filters` response header.
    #[inline]
    fn stamp_debug(
        state: &mut State,
        headers: &mut HeaderMap,
        raw: &mut Option<keymaster_http::headers::RawHead>,
    ) {
        if state.debug_trace().is_some() {
            Self::stamp_trace(state, headers, raw);
        }
    }

    #[cold]
    fn stamp_trace(
        state: &mut State,
        headers: &mut HeaderMap,
        raw: &mut Option<keymaster_http::headers::RawHead>,
    ) {
        if let Some(d) = state.extras_mut().and_then(|x| x.debug.take()) {
            if let Some(r) = raw.take() {
                *headers = r.to_map();
            }
            if let Ok(v) = HeaderValue::from_str(&d.join(", ")) {
                headers.insert(HeaderName::from_static("x-keymaster-filters"), v);
            }
        }
    }

    /// Run `pre` then `route`. `true`: proxy the request. `false`: answer it with
    /// [`FilterChain::local_response`] (a filter responded, or one failed). Ready at once
    /// when every filter ran synchronously and none failed. Debug mode starts here.
    pub(crate) fn inbound<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> Staged<'a, bool> {
        self.start_debug(ctx);
        let entries = self.pre_and_route();
        match self.run_sync(entries, 0, ctx) {
            Ok(None) => Staged::Ready(ctx.state.local.is_none()),
            Ok(Some(at)) => Staged::boxed(async move {
                if let Err(f) = self.run_from(entries, at, ctx).await {
                    self.fail(ctx, f).await;
                    return false;
                }
                ctx.state.local.is_none()
            }),
            Err(f) => Staged::boxed(async move {
                self.fail(ctx, f).await;
                false
            }),
        }
    }

    /// After `inbound` let the request through: what the `post` and `error` filters may
    /// read of it (its target, its fields as they are now), copied into `state` before the
    /// proxy stage takes the request (nothing when no filter of those stages reads them).
    pub(crate) fn keep_request(
        &self,
        state: &mut State,
        uri: &http::Uri,
        map: &HeaderMap,
        wire: Option<&keymaster_http::headers::WireHead>,
    ) {
        if !(self.outbound || self.outbound_line) {
            return;
        }
        let mut kept = KeptRequest::default();
        if self.outbound_line {
            kept.target = uri.path_and_query().cloned();
        }
        if self.outbound {
            match wire {
                // The wire form's block is shared.
                Some(w) => {
                    let fields = w.fields.clone();
                    let facts = Default::default();
                    kept.wire = Some(Box::new(keymaster_http::headers::WireHead {
                        fields,
                        facts,
                    }));
                }
                None => kept.map = map.clone(),
            }
        }
        state.kept = Some(Box::new(kept));
    }

    /// Run `post` over a response head, which `ctx` shows for the stage and which is
    /// changed where it lies. `Err(response)`: a post filter failed and this (error-stage
    /// or 500) response replaces the origin's (boxed: the stage's result stays two words,
    /// and moves as such). Ready at once when every post filter ran synchronously and none
    /// failed.
    /// `raw`: the origin's head in wire form, when kept so (`headers` is then empty); it
    /// comes back as it is, with fields appended, or as `None` with the fields in `headers`.
    pub(crate) fn outbound<'a>(
        &'a self,
        mut ctx: FilterCtx<'a>,
        status: &'a mut StatusCode,
        headers: &'a mut HeaderMap,
        raw: &'a mut Option<keymaster_http::headers::RawHead>,
        failed: impl Fn() -> Response<ResponseBody> + 'a,
    ) -> Staged<'a, Result<(), Box<Response<ResponseBody>>>> {
        let post = self.stage(FilterStage::Post);
        if post.is_empty() {
            Self::stamp_debug(ctx.state, headers, raw);
            return Staged::Ready(Ok(()));
        }
        ctx.show_response(status, headers, raw);
        // `Ok(at)`: the filter the stage goes on with, asynchronously; `Err`: a failure.
        let next = match self.run_sync(post, 0, &mut ctx) {
            Ok(None) => {
                Self::stamp_shown_head(ctx);
                return Staged::Ready(Ok(()));
            }
            Ok(Some(at)) => Ok(at),
            Err(f) => Err(f),
        };
        Staged::boxed(async move {
            let ran = match next {
                Ok(at) => self.run_from(post, at, &mut ctx).await,
                Err(f) => Err(f),
            };
            match ran {
                Ok(()) => {
                    Self::stamp_shown_head(ctx);
                    Ok(())
                }
                Err(f) => {
                    // The error stage sees the origin's head as a map.
                    let _ = ctx.response_headers_mut();
                    self.fail(&mut ctx, f).await;
                    let mut r = Self::assemble(ctx.state, &failed).0;
                    Self::stamp_debug(ctx.state, r.headers_mut(), &mut None);
                    Err(Box::new(r))
                }
            }
        })
    }

    /// After the post stage: the debug trace on the response head the context showed (the
    /// filters changed it where it lies, so nothing else goes back).
    #[inline(always)]
    fn stamp_shown_head(ctx: FilterCtx<'_>) {
        let FilterCtx {
            state, response, ..
        } = ctx;
        if let Some(r) = response {
            Self::stamp_debug(state, r.map, r.raw);
        }
    }

    /// The response for a request answered by the chain: the filter's response, the error
    /// stage's, or `failed()` (500); then the post filters over it (once: a failing post
    /// filter runs the error stage and its response goes out without another post pass).
    pub(crate) async fn local_response(
        &self,
        ctx: &mut FilterCtx<'_>,
        request_id: (&HeaderName, &HeaderValue),
        failed: impl Fn() -> Response<ResponseBody>,
    ) -> (Response<ResponseBody>, bool) {
        let (resp, was_failure) = Self::assemble(ctx.state, &failed);
        let (mut parts, body) = resp.into_parts();
        if !parts.headers.contains_key(request_id.0) {
            parts
                .headers
                .insert(request_id.0.clone(), request_id.1.clone());
        }
        let mut status = parts.status;
        let mut no_raw = None;
        let headers = &mut parts.headers;
        let ctx = ctx.reborrow();
        match staged!(self.outbound(ctx, &mut status, headers, &mut no_raw, &failed)) {
            Ok(()) => {
                parts.status = status;
                (Response::from_parts(parts, body), was_failure)
            }
            Err(resp) => (*resp, true),
        }
    }

    /// The proxy stage failed after the pre and route filters ran (502, 504, 413, ...): the
    /// error filters run with `failure()` naming filter `"proxy"` and the error category;
    /// their response, or `resp`, then goes through the post filters.
    pub(crate) async fn proxy_error(
        &self,
        state: &mut State,
        category: &'static str,
        resp: Response<ResponseBody>,
        failed: &impl Fn() -> Response<ResponseBody>,
    ) -> Response<ResponseBody> {
        let mut ctx = FilterCtx::kept(state);
        let (mut parts, mut body) = resp.into_parts();
        if !self.stage(FilterStage::Error).is_empty() {
            ctx.state.local = None;
            ctx.state.extras().failure = Some(Failure {
                filter: "proxy".into(),
                stage: FilterStage::Route,
                message: category.to_string(),
            });
            ctx.state.stage = FilterStage::Error;
            self.run_error_stage(&mut ctx).await;
            if let Some(l) = ctx.state.local.take() {
                // Keep the gateway's own duties (request id, Connection: close) unless the
                // error filter set them.
                let mut headers = l.headers;
                for (name, value) in parts.headers.iter() {
                    if *name != http::header::CONTENT_TYPE && !headers.contains_key(name) {
                        headers.insert(name.clone(), value.clone());
                    }
                }
                parts.status = l.status;
                parts.headers = headers;
                body = ResponseBody::full(l.body);
            }
        }
        let mut status = parts.status;
        let mut no_raw = None;
        let headers = &mut parts.headers;
        match staged!(self.outbound(ctx, &mut status, headers, &mut no_raw, failed)) {
            Ok(()) => {
                parts.status = status;
                Response::from_parts(parts, body)
            }
            Err(r) => *r,
        }
    }

    /// `ctx.state.local` as a response, else `failed()`; the flag says whether it is a failure. A
    /// response with a 1xx status is no final response: `failed()` answers instead.
    fn assemble(
        state: &mut State,
        failed: &impl Fn() -> Response<ResponseBody>,
    ) -> (Response<ResponseBody>, bool) {
        match state.local.take() {
            Some(l) if l.status.is_informational() => {
                tracing::warn!(status = %l.status, "a filter answered with a 1xx status");
                (failed(), true)
            }
            Some(l) => {
                let mut r = Response::new(ResponseBody::full(l.body));
                *r.status_mut() = l.status;
                *r.headers_mut() = l.headers;
                let failure = state.extras_ref().is_some_and(|x| x.failure.is_some());
                (r, failure)
            }
            None => (failed(), true),
        }
    }
}

/// A pre or route filter that just answered the request: a rejection (an error status)
/// is counted (`keymaster_filter_rejections_total`).
#[inline(always)]
fn count_answer(e: &Entry, ctx: &FilterCtx<'_>) {
    if let Some(l) = &ctx.state.local {
        if matches!(e.stage, FilterStage::Pre | FilterStage::Route) {
            e.metrics.rejections.count(l.status.as_u16());
        }
    }
}

/// A traced request keeps the step (see `FilterStep`).
#[inline(always)]
fn step(
    e: &Entry,
    ctx: &mut FilterCtx<'_>,
    start: Option<Instant>,
    took: std::time::Duration,
    outcome: &'static str,
) {
    if let Some(steps) = ctx.state.steps() {
        steps.push(keymaster_filter::host::FilterStep {
            stage: e.stage.as_str(),
            filter: e.name.clone(),
            start: start.unwrap_or_else(Instant::now),
            took,
            outcome,
        });
    }
}

/// The invocation is counted; the run is timed when its request is sampled (see
/// [`sample_timing`]).
#[inline(always)]
fn start(e: &Entry, ctx: &FilterCtx<'_>) -> Option<Instant> {
    e.metrics.invocations.inc();
    ctx.state.timed.then(Instant::now)
}

/// `run` of a synchronous filter, a panic caught. A future it returns anyway is polled
/// once and must be finished then: the filter fails otherwise.
/// One `catch_unwind` covers `run` and the one poll of a future it returns anyway.
#[inline(always)]
fn run_now(e: &Entry, ctx: &mut FilterCtx<'_>) -> Outcome {
    let c = &mut *ctx;
    std::panic::catch_unwind(AssertUnwindSafe(move || {
        let c = c; // moved in: the closure is FnOnce, so the future may borrow it
        match e.filter.run(c).try_ready() {
            Ok(r) => r.unwrap_or_else(polled_twice),
            Err(f) => poll_once(f),
        }
    }))
}

/// How a plain filter's turn went.
enum Plain {
    Skipped,
    Ran(Outcome),
    AskPanicked(Box<dyn std::any::Any + Send>),
}

/// A synchronous filter that matches every request: `should_filter`, then (counted) `run`,
/// under one `catch_unwind`.
#[inline(always)]
fn run_plain(e: &Entry, ctx: &mut FilterCtx<'_>) -> Plain {
    let c = &mut *ctx;
    let mut asked = false;
    let asked_ref = &mut asked;
    let r = std::panic::catch_unwind(AssertUnwindSafe(move || {
        let c = c; // moved in: the closure is FnOnce, so the future may borrow it
        if !e.filter.should_filter(c) {
            return None;
        }
        *asked_ref = true;
        e.metrics.invocations.inc();
        Some(match e.filter.run(c).try_ready() {
            Ok(r) => r.unwrap_or_else(polled_twice),
            Err(f) => poll_once(f),
        })
    }));
    match r {
        Ok(None) => Plain::Skipped,
        Ok(Some(r)) => Plain::Ran(Ok(r)),
        Err(p) if !asked => Plain::AskPanicked(p),
        Err(p) => Plain::Ran(Err(p)),
    }
}

/// A future from a filter declared synchronous: polled once, it must be finished.
#[cold]
fn poll_once(f: FilterFuture<'_>) -> Result<(), FilterError> {
    let waker = std::task::Waker::noop();
    match std::pin::pin!(f).poll(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => Err(FilterError::new(
            "a filter declared synchronous did not finish its run at once",
        )),
    }
}

fn polled_twice() -> Result<(), FilterError> {
    Err("filter future polled after completion".into())
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}
