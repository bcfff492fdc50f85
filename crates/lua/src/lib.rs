//! keymaster's Lua filters: LuaJIT (vendored through mlua) filters loaded from a directory,
//! one `.lua` file per filter (see `docs/filters.md`, "Lua filters").
//!
//! | module | owns |
//! |---|---|
//! | [`LuaFilters`] (here) | the [`FilterSource`] the gateway asks for each config version; the directory watcher |
//! | `set` | compiling and validating a directory into a filter set (off the request path) |
//! | `vm` | one sandboxed VM per worker thread, its count hook, memory cap |
//! | `meter` | what one call may spend: instructions and wall-clock time |
//! | `strlib`, `pattern`, `gsub` | the string functions that charge the meter (Lua patterns in Rust) |
//! | `ctx` | the `ctx` method table mirroring the native `FilterCtx`, and the lent context it works on |
//! | `api` | `shared` (process-wide dictionary) |
//! | `http_client` | `http` (`ctx.http`): the non-blocking client, its per-worker pool, TLS, metrics |
//! | [`dict`] | the sharded shared dictionary |
//!
//! It depends on the filter API (`keymaster-filter`) and the config alone, not on the
//! gateway: it plugs in through [`keymaster_filter::FilterSource`] and
//! [`keymaster_filter::Reloader`], and the `keymaster` crate wires it to a running gateway.

mod api;
mod cfind;
mod ctx;
pub mod dict;
mod gsub;
mod http_client;
mod meter;
mod methods;
mod pattern;
mod set;
mod strlib;
mod vm;
mod watch;

use ctx::Lent;
use keymaster_config::Config;
use keymaster_filter::{done, Filter, FilterCtx, FilterFuture, FilterSource, FilterSpec, Needs};
use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use set::LuaSet;

/// The Lua filter host: a [`FilterSource`] that compiles `[lua] dir` for every config
/// version, plus the shared dictionary and the directory watcher state.
#[derive(Clone, Default)]
pub struct LuaFilters {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    dict: Arc<dict::SharedDict>,
    watch: Mutex<watch::Target>,
    /// The admin listener's bound address, once the gateway has started (`ctx.http` may
    /// not reach it).
    admin: Arc<OnceLock<SocketAddr>>,
    /// The `ctx.http` client's counters (every worker's calls).
    http_metrics: Arc<http_client::HttpMetrics>,
}

impl LuaFilters {
    pub fn new() -> LuaFilters {
        LuaFilters::default()
    }

    /// The admin listener's bound address, once the gateway has started: `ctx.http` may
    /// not reach it (unless `http_allow_admin`).
    pub fn set_admin_addr(&self, admin: SocketAddr) {
        let _ = self.inner.admin.set(admin);
    }

    /// The process-wide dictionary behind `shared`.
    pub fn dict(&self) -> Arc<dict::SharedDict> {
        self.inner.dict.clone()
    }

    /// Watch the filters directory of the running config and reload through `reloader` when
    /// a `.lua` file is added, changed or removed (`[lua] watch`, `poll_interval`). The
    /// thread ends once the gateway is gone.
    pub fn spawn_watcher(
        &self,
        reloader: keymaster_filter::Reloader,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let inner = self.inner.clone();
        std::thread::Builder::new()
            .name("keymaster-lua-watch".into())
            .spawn(move || watch::run(&inner.watch, reloader))
    }
}

impl FilterSource for LuaFilters {
    /// The `ctx.http` client's counters (`keymaster_lua_http_*`).
    fn metrics_text(&self) -> String {
        self.inner.http_metrics.render()
    }

    fn build(&self, config: &Config) -> Result<Vec<FilterSpec>, String> {
        let l = &config.lua;
        let Some(dir) = l.dir.as_deref().map(PathBuf::from) else {
            watch::record(&self.inner.watch, None, l);
            return Ok(Vec::new());
        };
        // Recorded before compiling: a broken file is not retried until it changes again.
        watch::record(&self.inner.watch, Some(&dir), l);
        self.inner.dict.configure(
            usize::try_from(l.shared_dict_size.0).unwrap_or(usize::MAX),
            usize::try_from(l.shared_max_value.0).unwrap_or(usize::MAX),
        );
        let settings = set::Settings::from_config(
            l,
            config.admin.listen,
            self.inner.admin.clone(),
            self.inner.dict.clone(),
            self.inner.http_metrics.clone(),
        )?;
        let mut set = set::compile(&dir, settings)?;
        set::attach_settings(&mut set, config)?;
        let set = Arc::new(set);
        for f in &set.files {
            if let Some(r) = f
                .matches
                .routes
                .iter()
                .find(|r| !config.routes.iter().any(|c| &c.name == *r))
            {
                let file = f.chunk_name.trim_start_matches('@');
                return Err(format!("{file}: `match.routes` names unknown route {r:?}"));
            }
        }
        Ok((0..set.files.len())
            .map(|index| {
                let f = &set.files[index];
                FilterSpec {
                    name: f.name.clone(),
                    stage: f.stage,
                    order: f.order,
                    matches: f.matches.clone(),
                    filter: Arc::new(LuaFilter {
                        set: set.clone(),
                        index,
                    }),
                }
            })
            .collect())
    }
}

/// One Lua file of one set version, as a filter of the chain.
struct LuaFilter {
    set: Arc<LuaSet>,
    index: usize,
}

thread_local! {
    /// A `should_filter` that failed: `run` (which the chain calls right after, on this
    /// thread) reports it as the filter's failure.
    static PENDING: RefCell<Option<(u64, usize, String)>> = const { RefCell::new(None) };
}

impl Filter for LuaFilter {
    fn should_filter(&self, ctx: &FilterCtx<'_>) -> bool {
        if !self.set.files[self.index].has_should {
            return true;
        }
        match should_filter(&self.set, self.index, ctx) {
            Ok(b) => b,
            Err(e) => {
                PENDING.with(|p| *p.borrow_mut() = Some((self.set.id, self.index, e)));
                true
            }
        }
    }

    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        let file = &self.set.files[self.index];
        let pending = file.has_should.then(|| {
            PENDING.with(|p| {
                let mut p = p.borrow_mut();
                match p.take() {
                    Some((id, i, e)) if id == self.set.id && i == self.index => Some(e),
                    other => {
                        *p = other;
                        None
                    }
                }
            })
        });
        if let Some(e) = pending.flatten() {
            return done(Err(format!("should_filter: {e}").into()));
        }
        if !file.may_suspend {
            return done(run_sync(&self.set, self.index, ctx));
        }
        FilterFuture::new(run(self.set.clone(), self.index, ctx))
    }

    fn needs(&self) -> Needs {
        Needs::NONE
            .with_if(Needs::SYNCHRONOUS, !self.set.files[self.index].may_suspend)
            .with_if(
                Needs::REQUEST_LINE,
                self.set.files[self.index].reads_request_line,
            )
            .with_if(
                Needs::REQUEST_HEADERS,
                self.set.files[self.index].reads_request_headers,
            )
            .with_if(
                Needs::REQUEST_HEADERS_AFTER_PROXY,
                self.set.files[self.index].needs_request_headers,
            )
            .with_if(Needs::REQUEST_BODY, self.set.files[self.index].request_body)
            .with_if(
                Needs::RESPONSE_BODY,
                self.set.files[self.index].response_body,
            )
    }
}

fn should_filter(set: &Arc<LuaSet>, index: usize, ctx: &FilterCtx<'_>) -> Result<bool, String> {
    vm::call(set, index, vm::Entry::ShouldFilter, Lent::read_only(ctx))
}

type FilterResult = Result<(), keymaster_filter::FilterError>;

/// A file that never names `http` cannot suspend: a plain protected call, no coroutine.
fn run_sync(set: &Arc<LuaSet>, index: usize, ctx: &mut FilterCtx<'_>) -> FilterResult {
    match vm::call(set, index, vm::Entry::Run, Lent::writable(ctx)) {
        Ok(_) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A file that may call `http`: the call runs as a coroutine the worker can suspend. The
/// future borrows `ctx` for its whole life; the context is lent to the call for each poll.
async fn run(set: Arc<LuaSet>, index: usize, ctx: &mut FilterCtx<'_>) -> FilterResult {
    let h = vm::handle(&set, index)?;
    let call = h.fns.run.call_async::<()>(&h.fns.ctx);
    let r = meter::Metered::new(call, set.settings.limits, Lent::writable(ctx)).await;
    vm::after_call(&h, set.settings.memory_limit, &r);
    r.map_err(|e| error_text(&e).into())
}

/// A Lua error as one line: the message with `file:line`, without the traceback.
pub(crate) fn error_text(e: &mlua::Error) -> String {
    let e = match e {
        mlua::Error::CallbackError { cause, .. } => {
            let mut c: &mlua::Error = cause;
            while let mlua::Error::CallbackError { cause, .. } = c {
                c = cause;
            }
            c
        }
        other => other,
    };
    let text = match e {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::MemoryError(m) => format!("memory cap reached: {m}"),
        other => other.to_string(),
    };
    text.lines().next().unwrap_or("").to_string()
}
