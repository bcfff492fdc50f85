//! Native filter types named in the config: `[[filters]]` tables with `type = "native"` are
//! built by the factory registered under their `native` name, from their `params`.

use keymaster_config::{Config, FilterType};
use keymaster_filter::{FilterSource, FilterSpec, NativeFactory, Params};
use std::collections::BTreeMap;

/// The native filter types a binary registered, by name.
#[derive(Clone, Default)]
pub(crate) struct NativeTypes(BTreeMap<String, NativeFactory>);

impl NativeTypes {
    pub(crate) fn add(&mut self, name: &str, factory: NativeFactory) {
        self.0.insert(name.to_string(), factory);
    }
}

impl FilterSource for NativeTypes {
    fn build(&self, config: &Config) -> Result<Vec<FilterSpec>, String> {
        let mut specs = Vec::new();
        for (i, f) in config.filters.iter().enumerate() {
            if f.kind != FilterType::Native {
                continue;
            }
            let at = format!("filters[{i}] ({})", f.name);
            let kind = f.native.as_deref().unwrap_or_default();
            let factory = self.0.get(kind).ok_or_else(|| {
                let known: Vec<&str> = self.0.keys().map(String::as_str).collect();
                format!(
                    "{at}.native: no native filter type {kind:?} in this binary; expected one of: {}",
                    if known.is_empty() { "(none registered)".to_string() } else { known.join(", ") }
                )
            })?;
            let params = Params::resolve(&f.params).map_err(|e| format!("{at}.params.{e}"))?;
            let filter = factory(&params).map_err(|e| format!("{at}.params: {e}"))?;
            specs.push(FilterSpec {
                name: f.name.clone(),
                stage: f.stage,
                order: f.order,
                matches: f.matches.clone(),
                filter,
            });
        }
        Ok(specs)
    }
}
