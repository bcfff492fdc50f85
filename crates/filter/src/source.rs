//! The extension point for filter sets built outside the gateway crate (the Lua host in
//! `keymaster-lua`): a [`FilterSource`] is asked for its filters every time a config version
//! is compiled (start, reload), off the request path, and a [`Reloader`] lets it ask for a
//! new version when its own inputs change (a watched directory).

use std::sync::Weak;

use crate::FilterSpec;
use keymaster_config::Config;

/// Produces filters for each config version. `build` runs off the request path, serialised
/// with other reloads; an `Err` rejects the whole version and the running one stays.
pub trait FilterSource: Send + Sync + 'static {
    /// The filters of the version being built from `config`.
    fn build(&self, config: &Config) -> Result<Vec<FilterSpec>, String>;

    /// The source's own metrics in the Prometheus text format (`# HELP`, `# TYPE` and
    /// samples, each family once), appended to the gateway's `/metrics` on every scrape.
    /// Family names must not clash with the gateway's. None by default.
    fn metrics_text(&self) -> String {
        String::new()
    }
}

/// A handle that reloads the gateway's config source (and so every [`FilterSource`]) from any
/// thread. It does not keep the gateway alive: once the gateway is gone `reload` says so.
#[derive(Clone)]
pub struct Reloader(Weak<dyn Reload>);

/// What a [`Reloader`] calls: the running gateway.
pub trait Reload: Send + Sync + 'static {
    /// Re-read the config source, rebuild every filter set and swap the new version in.
    fn reload_from_source(&self) -> Result<u64, String>;
}

impl Reloader {
    /// A handle on `gateway` that does not keep it alive.
    pub fn new(gateway: Weak<dyn Reload>) -> Reloader {
        Reloader(gateway)
    }

    /// Re-read the config source, rebuild every filter set and swap the new version in.
    /// Blocks (reading files, compiling): call it from a thread of your own.
    pub fn reload(&self) -> Result<u64, String> {
        match self.0.upgrade() {
            Some(shared) => shared.reload_from_source(),
            None => Err("the gateway has stopped".into()),
        }
    }

    /// Whether the gateway is still running.
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}
