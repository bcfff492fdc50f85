//! Mapping between key paths and places in the TOML text: byte offset → line/column,
//! dotted key path → offset of that key (via a spanned `toml_edit` parse), and
//! error span → the key path it falls in.

use std::fmt;
use std::ops::Range;
use toml_edit::{Array, ArrayOfTables, Item, TableLike, Value};

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A path into the document, displayed TOML-style: `routes[2].match.headers."x.y"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(Vec<Seg>);

impl KeyPath {
    pub(crate) fn root() -> Self {
        Self::default()
    }
    /// This path extended by a table key.
    pub(crate) fn key(&self, k: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(k.to_owned()));
        p
    }
    /// This path extended by an array index.
    pub(crate) fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn is_bare(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    if is_bare(k) {
                        f.write_str(k)?;
                    } else {
                        write!(f, "{k:?}")?;
                    }
                }
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A node of the spanned document that may have children.
#[derive(Clone, Copy)]
enum Node<'a> {
    Table(&'a dyn TableLike),
    Array(&'a Array),
    Tables(&'a ArrayOfTables),
    Leaf,
}

fn node_of_item(item: &Item) -> Node<'_> {
    match item {
        Item::Table(t) => Node::Table(t),
        Item::ArrayOfTables(a) => Node::Tables(a),
        Item::Value(v) => node_of_value(v),
        Item::None => Node::Leaf,
    }
}

fn node_of_value(v: &Value) -> Node<'_> {
    match v {
        Value::InlineTable(t) => Node::Table(t),
        Value::Array(a) => Node::Array(a),
        _ => Node::Leaf,
    }
}

/// Finds places in one config text.
pub(crate) struct Locator<'a> {
    text: &'a str,
    /// None when the text is not valid TOML (then only spans from the parser are usable).
    doc: Option<toml_edit::Document<&'a str>>,
}

impl<'a> Locator<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self {
            text,
            doc: toml_edit::Document::parse(text).ok(),
        }
    }

    /// 1-based (line, column) of a byte offset; the column counts characters.
    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }

    /// Byte offset of the key at `path`, or of its deepest ancestor present in the text
    /// (a missing `cluster` points at its `[[routes]]` header).
    pub(crate) fn offset_of(&self, path: &KeyPath) -> Option<usize> {
        let doc = self.doc.as_ref()?;
        let mut node = node_of_item(doc.as_item());
        let mut best: Option<Range<usize>> = None;
        for seg in &path.0 {
            let (span, next) = match (seg, node) {
                (Seg::Key(k), Node::Table(t)) => match t.get_key_value(k) {
                    Some((key, item)) => (key.span().or_else(|| item.span()), node_of_item(item)),
                    None => break,
                },
                (Seg::Index(i), Node::Array(a)) => match a.get(*i) {
                    Some(v) => (v.span(), node_of_value(v)),
                    None => break,
                },
                (Seg::Index(i), Node::Tables(a)) => match a.get(*i) {
                    Some(t) => (t.span(), Node::Table(t)),
                    None => break,
                },
                _ => break,
            };
            if span.is_some() {
                best = span;
            }
            node = next;
        }
        best.map(|r| r.start)
    }

    /// The deepest key path whose key or value span contains `offset` (root if none).
    pub(crate) fn path_at(&self, offset: usize) -> KeyPath {
        let mut best = KeyPath::root();
        if let Some(doc) = &self.doc {
            walk(
                node_of_item(doc.as_item()),
                &KeyPath::root(),
                offset,
                &mut best,
            );
        }
        best
    }
}

fn contains(span: Option<Range<usize>>, offset: usize) -> bool {
    span.is_some_and(|r| r.start <= offset && offset < r.end.max(r.start + 1))
}

fn consider(path: KeyPath, hit: bool, best: &mut KeyPath) {
    if hit && path.len() > best.len() {
        *best = path;
    }
}

fn walk(node: Node<'_>, path: &KeyPath, offset: usize, best: &mut KeyPath) {
    match node {
        Node::Table(t) => {
            for (k, item) in t.iter() {
                let child = path.key(k);
                let key_span = t.key(k).and_then(|key| key.span());
                let hit = contains(key_span, offset) || contains(item.span(), offset);
                consider(child.clone(), hit, best);
                walk(node_of_item(item), &child, offset, best);
            }
        }
        Node::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                let child = path.index(i);
                consider(child.clone(), contains(v.span(), offset), best);
                walk(node_of_value(v), &child, offset, best);
            }
        }
        Node::Tables(a) => {
            for (i, t) in a.iter().enumerate() {
                let child = path.index(i);
                consider(child.clone(), contains(t.span(), offset), best);
                walk(Node::Table(t), &child, offset, best);
            }
        }
        Node::Leaf => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[server]\nworkers = 2\n\n[[routes]]\nname = \"a\"\nmatch = { path_prefix = \"/\", headers = { \"x.y\" = \"1\" } }\n\n[[routes]]\nname = \"b\"\nmethods = [\"GET\", \"PUT\"]\n";

    #[test]
    fn display_quotes_odd_keys() {
        let p = KeyPath::root()
            .key("routes")
            .index(0)
            .key("match")
            .key("headers")
            .key("x.y");
        assert_eq!(p.to_string(), "routes[0].match.headers.\"x.y\"");
    }

    #[test]
    fn offsets_map_to_lines() {
        let l = Locator::new(TEXT);
        let at = |p: &KeyPath| l.offset_of(p).map(|o| l.line_col(o));
        let routes = KeyPath::root().key("routes");
        assert_eq!(
            at(&KeyPath::root().key("server").key("workers")),
            Some((2, 1))
        );
        assert_eq!(at(&routes.index(0).key("name")), Some((5, 1)));
        assert_eq!(at(&routes.index(1).key("name")), Some((9, 1)));
        // A missing key falls back to its table's header.
        assert_eq!(at(&routes.index(1).key("cluster")).map(|p| p.0), Some(8));
        assert_eq!(
            at(&routes.index(0).key("match").key("headers").key("x.y")),
            Some((6, 42))
        );
        assert_eq!(at(&routes.index(1).key("methods").index(1)), Some((10, 19)));
    }

    #[test]
    fn path_at_finds_deepest_key() {
        let l = Locator::new(TEXT);
        let off = TEXT.find("\"PUT\"").unwrap_or(0);
        assert_eq!(l.path_at(off).to_string(), "routes[1].methods[1]");
        let off = TEXT.find("workers").unwrap_or(0);
        assert_eq!(l.path_at(off).to_string(), "server.workers");
    }

    #[test]
    fn line_col_counts_chars() {
        let l = Locator::new("a = \"é\"\nb = 1");
        assert_eq!(l.line_col(0), (1, 1));
        assert_eq!(l.line_col(7), (1, 7));
        assert_eq!(l.line_col(9), (2, 1));
        assert_eq!(l.line_col(999), (2, 6));
    }
}
