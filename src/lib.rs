//! keymaster as a library: the whole gateway binary, with filters of your own.
//!
//! A binary with native filters is a `main` of a few lines (see `examples/native-filter`):
//!
//! ```no_run
//! use keymaster::filter::{done, Filter, FilterCtx, FilterFuture, FilterSpec, FilterStage};
//!
//! struct Stamp;
//! impl Filter for Stamp {
//!     fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
//!         ctx.append_response_header(
//!             http::HeaderName::from_static("x-stamp"),
//!             http::HeaderValue::from_static("1"),
//!         );
//!         done(Ok(()))
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     keymaster::Keymaster::new()
//!         .filter(FilterSpec::new("stamp", FilterStage::Post, 0, Stamp))
//!         .main()
//! }
//! ```
//!
//! [`Keymaster::main`] is the `keymaster` command line (`run`, `validate`, `proxy`, `bench`
//! ...), with signals (SIGTERM/SIGINT drain, SIGHUP reloads), the admin listener and the
//! Lua filters and their watcher, exactly as the stock binary runs them.

mod alloc;
mod cli;
mod natives;

pub use alloc::Allocator;
pub use keymaster_config as config;
pub use keymaster_filter as filter;
pub use keymaster_gateway::{ConfigSource, Gateway, Signals};
pub use keymaster_lua::LuaFilters;

use keymaster_filter::{Filter, FilterSource, FilterSpec, NativeFactory, Params};
use std::sync::Arc;

/// The gateway with its filters: the built-in ones (from `[[filters]]`), the Lua host, and
/// the native filters this binary adds.
#[derive(Clone, Default)]
pub struct Keymaster {
    /// Registered in code: in every config version's chain.
    filters: Vec<FilterSpec>,
    /// Native filter types by name: built from `[[filters]]` tables with `type = "native"`.
    natives: natives::NativeTypes,
}

impl Keymaster {
    /// The stock gateway: built-in and Lua filters.
    pub fn new() -> Keymaster {
        Keymaster::default()
    }

    /// Add a filter to every config version's chain, as it is.
    pub fn filter(mut self, spec: FilterSpec) -> Keymaster {
        self.filters.push(spec);
        self
    }

    /// Add a native filter type that `[[filters]]` tables name (`type = "native"`,
    /// `native = "<name>"`), built from their `params` by `factory` for each config version.
    pub fn native_type<F, T>(mut self, name: &str, factory: F) -> Keymaster
    where
        F: Fn(&Params) -> Result<T, String> + Send + Sync + 'static,
        T: Filter,
    {
        let factory: NativeFactory =
            Arc::new(move |p: &Params| factory(p).map(|f| Arc::new(f) as Arc<dyn Filter>));
        self.natives.add(name, factory);
        self
    }

    /// Run the `keymaster` command line with these filters; the process's exit code.
    pub fn main(&self) -> std::process::ExitCode {
        cli::main(self)
    }

    /// Start a gateway on `config` with these filters and the Lua host wired in: the `[lua]`
    /// filters join every config version and the directory watcher runs. The caller owns
    /// the gateway's life ([`Gateway::run_until_signal`], [`Gateway::shutdown`]).
    pub fn start(
        &self,
        config: keymaster_config::Config,
        source: ConfigSource,
    ) -> Result<(Gateway, LuaFilters), String> {
        let lua = LuaFilters::new();
        let (natives, sources) = self.filters(&lua);
        let gateway = Gateway::start_with_sources(config, source, natives, sources)?;
        if let Some(admin) = gateway.admin_addr() {
            lua.set_admin_addr(admin);
        }
        lua.spawn_watcher(gateway.reloader())
            .map_err(|e| format!("cannot start the lua watcher thread: {e}"))?;
        Ok((gateway, lua))
    }

    /// The filters registered in code, and the sources asked for each config version.
    pub(crate) fn filters(
        &self,
        lua: &LuaFilters,
    ) -> (Vec<FilterSpec>, Vec<Arc<dyn FilterSource>>) {
        let sources: Vec<Arc<dyn FilterSource>> =
            vec![Arc::new(self.natives.clone()), Arc::new(lua.clone())];
        (self.filters.clone(), sources)
    }
}

/// [`Keymaster::start`] of the stock gateway (no filters of your own).
pub fn start_gateway(
    config: keymaster_config::Config,
    source: ConfigSource,
) -> Result<(Gateway, LuaFilters), String> {
    Keymaster::new().start(config, source)
}
