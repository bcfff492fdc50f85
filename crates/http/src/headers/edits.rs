//! Configured header edits (a route's `request_headers` / `response_headers`, the `headers`
//! filter): names and values validated when the config is loaded, applied to a map or, as
//! shared [`CompiledField`]s, to wire-form request fields.

use http::header::{HeaderMap, HeaderName, HeaderValue};

#[cfg(doc)]
use super::HeadScan;
use super::{affects_head_scan, CompiledField, RawRequestFields};

/// A compiled header edit list: remove, then set, then add.
#[derive(Debug, Default, Clone)]
pub struct HeaderEdits {
    pub remove: Vec<HeaderName>,
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub add: Vec<(HeaderName, HeaderValue)>,
    /// Some edited name is one [`HeadScan`] looks at (computed once, at compile time).
    touches_scan: bool,
    /// `set` and `add` built for wire-form request fields ([`Self::apply_wire`]).
    wire_set: Vec<std::sync::Arc<CompiledField>>,
    wire_add: Vec<std::sync::Arc<CompiledField>>,
    /// Bit `n` (`n` < 63): a set or added name is `n` bytes long; bit 63: one is longer.
    set_name_lens: u64,
}

impl HeaderEdits {
    pub fn compile(cfg: &keymaster_config::HeaderEdits) -> Result<Self, String> {
        let name = |n: &str| HeaderName::from_bytes(n.as_bytes()).map_err(|e| format!("{n}: {e}"));
        let pair = |(n, v): (&String, &String)| -> Result<(HeaderName, HeaderValue), String> {
            Ok((
                name(n)?,
                HeaderValue::from_str(v).map_err(|e| format!("{n}: {e}"))?,
            ))
        };
        let mut edits = HeaderEdits {
            remove: cfg
                .remove
                .iter()
                .map(|n| name(n))
                .collect::<Result<_, _>>()?,
            set: cfg.set.iter().map(pair).collect::<Result<_, _>>()?,
            add: cfg.add.iter().map(pair).collect::<Result<_, _>>()?,
            touches_scan: false,
            wire_set: Vec::new(),
            wire_add: Vec::new(),
            set_name_lens: 0,
        };
        let compiled = |l: &[(HeaderName, HeaderValue)]| {
            l.iter().map(|(n, v)| CompiledField::new(n, v)).collect()
        };
        (edits.wire_set, edits.wire_add) = (compiled(&edits.set), compiled(&edits.add));
        for (n, _) in edits.set.iter().chain(&edits.add) {
            edits.set_name_lens |= 1 << n.as_str().len().min(63);
        }
        edits.touches_scan = edits
            .remove
            .iter()
            .chain(edits.set.iter().map(|(n, _)| n))
            .chain(edits.add.iter().map(|(n, _)| n))
            .any(affects_head_scan);
        Ok(edits)
    }

    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }

    /// Whether a set or added name is `len` bytes long (a cheap "may it set this field?").
    pub fn sets_name_of_len(&self, len: usize) -> bool {
        self.set_name_lens & (1 << len.min(63)) != 0
    }

    /// The added fields, compiled (with their wire lines).
    pub fn compiled_adds(&self) -> &[std::sync::Arc<CompiledField>] {
        &self.wire_add
    }

    /// Whether applying these edits can change what [`HeadScan`] finds.
    pub fn affects_head_scan(&self) -> bool {
        self.touches_scan
    }

    pub fn apply(&self, headers: &mut HeaderMap) {
        for n in &self.remove {
            headers.remove(n);
        }
        for (n, v) in &self.set {
            headers.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            headers.append(n.clone(), v.clone());
        }
    }

    /// [`Self::apply`] to wire-form request fields (edits that do not
    /// [`Self::affects_head_scan`]): the set and added fields are shared, not copied.
    pub fn apply_wire(&self, fields: &mut RawRequestFields) {
        for n in &self.remove {
            fields.remove(n);
        }
        for f in &self.wire_set {
            fields.set_compiled(f);
        }
        for f in &self.wire_add {
            fields.append_compiled(f);
        }
    }
}
