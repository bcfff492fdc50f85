//! The extension point for filter sets built outside the gateway crate (the Lua host in
//! `keymaster-lua`): a [`FilterSource`] is asked for its filters every time a config version
//! is compiled (start, reload), off the request path, and a [`Reloader`] lets it ask for a
//! new version when its own inputs change (a watched directory).

use std::sync::{Arc, Weak};

use super::FilterSpec;
use crate::gateway::Shared;
use keymaster_config::Config;

/// Produces filters for each config version. `build` runs off the request path, serialised
/// with other reloads; an `Err` rejects the whole version and the running one stays.
pub trait FilterSource: Send + Sync + 'static {
    /// The filters of the version being built from `config`.
    fn build(&self, config: &Config) -> Result<Vec<FilterSpec>, String>;
}

/// A handle that reloads the gateway's config source (and so every [`FilterSource`]) from any
/// thread. It does not keep the gateway alive: once the gateway is gone `reload` says so.
#[derive(Clone)]
pub struct Reloader(pub(crate) Weak<Shared>);

impl Reloader {
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

/// Every source's filters for `config`, after the ones registered in code.
pub(crate) fn collect(
    config: &Config,
    natives: &[FilterSpec],
    sources: &[Arc<dyn FilterSource>],
) -> Result<Vec<FilterSpec>, String> {
    let mut all = natives.to_vec();
    for s in sources {
        all.extend(s.build(config)?);
    }
    Ok(all)
}
