//! Heads kept in wire form: a client's request fields as its bytes, with the edits filters
//! make ([`RawRequestFields`]), and an origin's response head ([`RawHead`]). Fields are found
//! in them with `memchr`; a `HeaderMap` is built only when something needs one.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;
use std::sync::Arc;

use super::{affects_head_scan, put_field};
#[cfg(doc)]
use super::{AddedFields, HeadScan};

/// A client's request header fields in wire form, as keymaster's HTTP/1.1 server parsed and
/// validated them (names are tokens, values visible characters, every line ends in CRLF):
/// `name: value\r\n` lines exactly as the client sent them. The proxy stage forwards them as
/// they are to an HTTP/1.1 origin when it has nothing to do with them as a map
/// ([`AddedFields`] writes them), and builds the map ([`RawRequestFields::to_map`]) when
/// something needs one.
///
/// Filters may set, append and remove fields other than the ones [`HeadScan`] looks at
/// without a map: the changes are kept beside the block ([`FieldEdit`]) and applied when it
/// is written or turned into a map.
#[derive(Debug, Clone)]
pub struct RawRequestFields {
    block: bytes::Bytes,
    /// The block's names, summarised: a name it does not hold is mostly known so without a
    /// search (a filter usually sets a field of the gateway's own, which the client did not
    /// send).
    names: NameSummary,
    /// The client's Content-Length, and whether its line goes upstream as sent.
    content_length: ClientLength,
    /// The client's Connection lines carried only options for this hop (`close`,
    /// `keep-alive`) and are left out upstream ([`Self::leave_out_connection`]).
    no_connection: bool,
    /// The changes, no two of them to one name unless all but the first append. The first
    /// two are kept inline: a configured edit (a `headers` filter's) takes no allocation,
    /// whose block would cost a cache miss when it is handed out.
    edits: SmallVec<[FieldEdit; 2]>,
}

/// The Content-Length a client's wire-form fields hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientLength {
    /// None (no body, or a chunked one).
    None,
    /// One `Content-Length` line with one value: it goes upstream as sent.
    AsSent,
    /// The same length more than once (repeated lines, or a list such as `5, 5`, which the
    /// server accepted as one length, RFC 9110 §8.6): the lines are left out upstream and
    /// the origin gets one `content-length` written from the body, as on the map path.
    Rewritten,
}

/// A request head's fields in wire form, with what the server's parse noted about them.
/// Boxed by the server, and passed on in that box: the proxy stage takes the facts out and
/// hands the fields to the filter context and back as one pointer.
pub struct WireHead {
    pub fields: RawRequestFields,
    pub facts: super::HeadFacts,
}

/// A change to a [`RawRequestFields`]: the client's fields called by the edit's name are
/// dropped (`replaces`: the client sent one), and the edit's field, if any, follows the
/// block. Never a name [`HeadScan`] looks at.
#[derive(Debug, Clone)]
struct FieldEdit {
    field: EditField,
    replaces: bool,
}

#[derive(Debug, Clone)]
enum EditField {
    /// A name and its value, or `None` for a removal (a filter's call). Boxed: an edit is
    /// two words, so the inline edits keep the fields small for every request.
    Owned(Box<(HeaderName, Option<HeaderValue>)>),
    /// A field of a filter's configuration, shared: no name or value copied per request.
    Compiled(Arc<CompiledField>),
}

impl FieldEdit {
    fn name(&self) -> &HeaderName {
        match &self.field {
            EditField::Owned(f) => &f.0,
            EditField::Compiled(f) => &f.name,
        }
    }
    fn value(&self) -> Option<&HeaderValue> {
        match &self.field {
            EditField::Owned(f) => f.1.as_ref(),
            EditField::Compiled(f) => Some(&f.value),
        }
    }
}

/// A field a configured edit sets or adds, built when the config is loaded: its name and
/// value, validated then, and its `name: value\r\n` line, written upstream as it is.
#[derive(Debug)]
pub struct CompiledField {
    pub name: HeaderName,
    pub value: HeaderValue,
    line: Box<[u8]>,
    /// The name's bit in a [`NameSummary`].
    name_bit: u64,
}

impl CompiledField {
    pub fn new(name: &HeaderName, value: &HeaderValue) -> Arc<CompiledField> {
        let mut line = Vec::with_capacity(name.as_str().len() + value.len() + 4);
        put_field(&mut line, name.as_str().as_bytes(), value.as_bytes());
        Arc::new(CompiledField {
            name: name.clone(),
            value: value.clone(),
            line: line.into_boxed_slice(),
            name_bit: NameSummary::bit(name.as_str().as_bytes()),
        })
    }

    /// `name: value\r\n`.
    pub fn line(&self) -> &[u8] {
        &self.line
    }
}

/// A summary of a field block's names: one bit of 64 per name, picked by a hash of its
/// length and its first and last bytes, case folded. A name whose bit is clear is not in
/// the block; a set bit means it may be (the block is then searched).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NameSummary(u64);

impl NameSummary {
    /// The name's bit. `| 0x20` folds an ASCII letter's case and is the same for both
    /// spellings of any other byte, so names equal in any case get one bit.
    #[inline]
    fn bit(name: &[u8]) -> u64 {
        let (Some(&first), Some(&last)) = (name.first(), name.last()) else {
            return 1;
        };
        let key = u32::from(first | 0x20) << 16 | u32::from(last | 0x20) << 8 | name.len() as u32;
        1 << (key.wrapping_mul(0x9E37_79B9) >> 26)
    }

    /// Note a name the block holds.
    #[inline]
    pub fn add(&mut self, name: &[u8]) {
        self.0 |= Self::bit(name);
    }

    /// Whether the block may hold `name` (`false`: surely not).
    #[inline]
    fn may_hold(self, name: &[u8]) -> bool {
        self.0 & Self::bit(name) != 0
    }

    /// The summary of a block's names, found by reading it.
    fn of(block: &[u8]) -> NameSummary {
        let mut s = NameSummary::default();
        for (name, _) in wire_lines(block) {
            s.add(name);
        }
        s
    }
}

impl RawRequestFields {
    /// `block`: complete CRLF-terminated field lines that passed the server's parse;
    /// `content_length`: what they say of the body's length; `names`: their names,
    /// summarised as the server read them.
    pub fn new(block: bytes::Bytes, content_length: ClientLength, names: NameSummary) -> Self {
        debug_assert_eq!(names, NameSummary::of(&block), "the summary of {block:?}");
        RawRequestFields {
            block,
            names,
            content_length,
            no_connection: false,
            edits: SmallVec::new(),
        }
    }

    /// Leave the client's Connection lines out upstream, in the map and to the filters:
    /// they carried only options for the client's hop (`close`, `keep-alive`), no field
    /// names. Its head then needs no map for the hop-by-hop fields
    /// ([`HeadScan::connection_left_out`]).
    pub fn leave_out_connection(&mut self) {
        self.no_connection = true;
    }

    /// A client line the fields leave out whatever the edits: a repeated Content-Length
    /// (see [`ClientLength`]) or a Connection line of options.
    fn left_out(&self, name: &[u8]) -> bool {
        (self.content_length == ClientLength::Rewritten
            && name.eq_ignore_ascii_case(b"content-length"))
            || self.connection_left_out(name)
    }

    /// A Connection line of options ([`Self::leave_out_connection`]).
    fn connection_left_out(&self, name: &[u8]) -> bool {
        self.no_connection && name.eq_ignore_ascii_case(b"connection")
    }

    /// [`Self::new`] with the names summarised here (tests).
    #[cfg(test)]
    pub fn from_block(block: bytes::Bytes, content_length: bool) -> Self {
        let names = NameSummary::of(&block);
        let length = match content_length {
            true => ClientLength::AsSent,
            false => ClientLength::None,
        };
        Self::new(block, length, names)
    }

    /// Whether the client sent a field called `name` (any case).
    fn client_sent(&self, name: &[u8]) -> bool {
        self.names.may_hold(name) && has_field(&self.block, name)
    }

    /// Whether an edit drops the client's fields called `name`.
    fn removes(&self, name: &[u8]) -> bool {
        self.edits
            .iter()
            .any(|e| e.replaces && e.name().as_str().as_bytes().eq_ignore_ascii_case(name))
    }

    /// The client's lines not removed by an edit, nor left out ([`Self::leave_out_connection`]).
    fn kept_lines(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        let edited = !self.edits.is_empty();
        wire_lines(&self.block)
            .filter(move |(n, _)| !(edited && self.removes(n) || self.connection_left_out(n)))
    }

    /// The fields the edits add, in order.
    fn appended(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        (self.edits.iter()).filter_map(|e| Some((e.name(), e.value()?)))
    }

    /// The fields as a map, values sharing the block's memory.
    pub fn to_map(&self) -> HeaderMap {
        let lines = self.kept_lines();
        let mut map = HeaderMap::with_capacity(lines.clone().count() + self.edits.len());
        for (name, value) in lines {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name),
                HeaderValue::from_maybe_shared(self.block.slice_ref(value)),
            ) {
                map.append(n, v);
            }
        }
        for (n, v) in self.appended() {
            map.append(n.clone(), v.clone());
        }
        map
    }

    /// The value of the first field called `name` (any case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.get_all(name).next()
    }

    /// Every value of the fields called `name` (any case), in order.
    pub fn get_all<'a, 'n>(
        &'a self,
        name: &'n str,
    ) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        let is = move |n: &[u8]| n.eq_ignore_ascii_case(name.as_bytes());
        // None of the client's lines when the summary says none has the name.
        let own = (self
            .names
            .may_hold(name.as_bytes())
            .then(|| self.kept_lines()))
        .into_iter()
        .flatten()
        .filter(move |(n, _)| is(n))
        .map(|(_, v)| v);
        own.chain(
            self.appended()
                .filter(move |(n, _)| is(n.as_str().as_bytes()))
                .map(|(_, v)| v.as_bytes()),
        )
    }

    /// The client's Content-Length line goes upstream as sent (the origin's framing).
    pub fn declares_length(&self) -> bool {
        self.content_length == ClientLength::AsSent
    }

    /// Whether a filter may change the field `name` here, without a map: not one the proxy
    /// stage's head scan looks at.
    pub fn may_edit(name: &HeaderName) -> bool {
        !affects_head_scan(name)
    }

    /// Replace every field called `name` with `name: value` (a [`Self::may_edit`] name).
    pub fn set(&mut self, name: HeaderName, value: HeaderValue) {
        let replaces = self.drop_named(&name);
        let field = EditField::Owned(Box::new((name, Some(value))));
        self.push_edit(FieldEdit { field, replaces });
    }

    /// [`Self::set`] with a configured field (shared, not copied). The usual case, a field
    /// of the gateway's own that the client did not send and nothing edited yet, is told by
    /// the field's summary bit alone.
    pub fn set_compiled(&mut self, f: &Arc<CompiledField>) {
        let fresh = self.edits.is_empty() && self.names.0 & f.name_bit == 0;
        let replaces = !fresh && self.drop_named(&f.name);
        let field = EditField::Compiled(f.clone());
        self.push_edit(FieldEdit { field, replaces });
    }

    /// Add the field `name: value` (a [`Self::may_edit`] name).
    pub fn append(&mut self, name: HeaderName, value: HeaderValue) {
        let field = EditField::Owned(Box::new((name, Some(value))));
        self.push_edit(FieldEdit {
            field,
            replaces: false,
        });
    }

    /// [`Self::append`] with a configured field (shared, not copied).
    pub fn append_compiled(&mut self, f: &Arc<CompiledField>) {
        let field = EditField::Compiled(f.clone());
        self.push_edit(FieldEdit {
            field,
            replaces: false,
        });
    }

    /// Add an edit.
    fn push_edit(&mut self, edit: FieldEdit) {
        debug_assert!(Self::may_edit(edit.name()), "{:?} is scanned", edit.name());
        self.edits.push(edit);
    }

    /// Remove every field called `name` (a [`Self::may_edit`] name).
    pub fn remove(&mut self, name: &HeaderName) {
        if self.drop_named(name) {
            let field = EditField::Owned(Box::new((name.clone(), None)));
            self.push_edit(FieldEdit {
                field,
                replaces: true,
            });
        }
    }

    /// Drop the earlier edits of `name`; whether the client sent a field called `name`
    /// (the edit that follows then drops it from the block). Only a name the client sent is
    /// marked so: the usual set of a field of the gateway's own leaves the block to be
    /// written in one piece.
    fn drop_named(&mut self, name: &HeaderName) -> bool {
        if !self.edits.is_empty() {
            self.edits.retain(|e| e.name() != name);
        }
        self.client_sent(name.as_str().as_bytes())
    }

    /// Write the fields as `name: value\r\n` lines: the client's as it sent them, without
    /// the removed ones and those left out ([`Self::left_out`]), then the appended ones.
    pub(super) fn write(&self, dst: &mut Vec<u8>) {
        let drop_length = self.content_length == ClientLength::Rewritten;
        let replaces = self.edits.iter().any(|e| e.replaces);
        if self.no_connection && !drop_length && !replaces {
            // The common case of a line left out: a client's `Connection: close`.
            write_without(dst, &self.block, b"connection");
        } else if drop_length || self.no_connection || replaces {
            for line in self.block.split_inclusive(|&b| b == b'\n') {
                let name = line.split(|&b| b == b':').next().unwrap_or(line);
                if !self.left_out(name) && !self.removes(name) {
                    dst.extend_from_slice(line);
                }
            }
        } else {
            dst.extend_from_slice(&self.block);
        }
        for e in &self.edits {
            match &e.field {
                EditField::Compiled(f) => dst.extend_from_slice(f.line()),
                EditField::Owned(f) => {
                    if let (n, Some(v)) = &**f {
                        put_field(dst, n.as_str().as_bytes(), v.as_bytes())
                    }
                }
            }
        }
    }

    /// The length of what [`Self::write`] writes, about (for reserving).
    pub(super) fn len_hint(&self) -> usize {
        let added = self.edits.iter().map(|e| match &e.field {
            EditField::Compiled(f) => f.line().len(),
            EditField::Owned(f) => match &**f {
                (n, Some(v)) => n.as_str().len() + v.len() + 4,
                (_, None) => 0,
            },
        });
        self.block.len() + added.sum::<usize>()
    }
}

/// The (name, value) of each `name: value\r\n` line of a wire-form field block, the value
/// without surrounding whitespace.
fn wire_lines(block: &[u8]) -> WireLines<'_> {
    WireLines { rest: block }
}

/// Whether a wire-form field block has a field called `name` (any case). One pass over the
/// block for the name's first letter (either case), each hit checked for a line start, the
/// rest of the name and a colon: cheaper than a search per line, since a line start is
/// always after a `\n` (values hold no line breaks) and the server's parse left no
/// whitespace before a colon.
fn has_field(block: &[u8], name: &[u8]) -> bool {
    let Some(&first) = name.first() else {
        return false;
    };
    let (lower, upper) = (first.to_ascii_lowercase(), first.to_ascii_uppercase());
    memchr::memchr2_iter(lower, upper, block).any(|i| {
        (i == 0 || block[i - 1] == b'\n')
            && block.get(i + name.len()) == Some(&b':')
            && block[i..i + name.len()].eq_ignore_ascii_case(name)
    })
}

/// `block` without its lines of a field called `name` (any case), appended to `dst`: the
/// runs between them copied whole. Walks the lines (a handful in a request head): cheaper
/// than searching for the name's letters, which common names are full of.
fn write_without(dst: &mut Vec<u8>, block: &[u8], name: &[u8]) {
    let (mut run, mut at) = (0, 0);
    while at < block.len() {
        let end = memchr::memchr(b'\n', &block[at..]).map_or(block.len(), |n| at + n + 1);
        let line = &block[at..end];
        if line.get(name.len()) == Some(&b':') && line[..name.len()].eq_ignore_ascii_case(name) {
            dst.extend_from_slice(&block[run..at]);
            run = end;
        }
        at = end;
    }
    dst.extend_from_slice(&block[run..]);
}

/// The iterator of [`wire_lines`]: line ends and colons found with `memchr` (a byte-by-byte
/// split costs several instructions per byte of the head).
#[derive(Clone)]
struct WireLines<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for WireLines<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        while !self.rest.is_empty() {
            let end = memchr::memchr(b'\n', self.rest).map_or(self.rest.len(), |i| i + 1);
            let (line, rest) = self.rest.split_at(end);
            self.rest = rest;
            let line = line.strip_suffix(b"\n").unwrap_or(line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(colon) = memchr::memchr(b':', line) {
                return Some((&line[..colon], line[colon + 1..].trim_ascii()));
            }
        }
        None
    }
}

/// An origin's response head kept in wire form (keymaster's HTTP/1.1 client keeps one it
/// has nothing to change in but the fields the proxy stage adds): no `HeaderMap` is built
/// only to be encoded again. keymaster's HTTP/1.1 server writes it as it is (an HTTP/2
/// client gets the map path); post filters see it as a map built when one reads or changes a
/// field other than by appending (`FilterCtx::response_headers`).
#[derive(Debug)]
pub struct RawHead {
    /// The fields as `name: value\r\n` lines (names as the origin spelled them), without
    /// `Content-Length` and `Transfer-Encoding`: the client's framing is written from the
    /// body.
    pub block: bytes::BytesMut,
    /// One of them is `Date`.
    pub has_date: bool,
    /// One of them is the request-id field.
    pub has_request_id: bool,
    /// The origin's Content-Length, for a map built from the block.
    pub content_length: Option<u64>,
}

impl RawHead {
    /// Append the field `name: value`.
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        self.block.reserve(name.len() + value.len() + 4);
        put_field(&mut self.block, name, value);
    }

    /// Append a whole `name: value\r\n` line (a field [`Self::may_append`] allows, written
    /// ahead of time: one copy instead of four).
    pub fn push_line(&mut self, line: &[u8]) {
        self.block.extend_from_slice(line);
    }

    /// Whether a field may be appended to the block: not one hyper writes or acts on itself
    /// (framing, Connection and the other hop-by-hop fields, Trailer, Date).
    pub fn may_append(name: &HeaderName) -> bool {
        !(affects_head_scan(name)
            || *name == header::DATE
            || *name == header::TRAILER
            || *name == header::CONTENT_LENGTH)
    }

    /// The fields the proxy stage adds: Via, and the request id unless the origin sent one.
    pub fn add_proxy_fields(
        &mut self,
        via: &HeaderValue,
        (rid_name, rid): (&HeaderName, &HeaderValue),
    ) {
        self.push(b"via", via.as_bytes());
        if !self.has_request_id {
            self.push(rid_name.as_str().as_bytes(), rid.as_bytes());
            self.has_request_id = true;
        }
    }

    /// The fields as a map (with the origin's Content-Length), as the map path has them.
    pub fn to_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(16);
        for (name, value) in wire_lines(&self.block) {
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
                map.append(n, v);
            }
        }
        if let Some(n) = self.content_length {
            map.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        map
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    /// Connection lines of options are left out of what is written, of the map and of the
    /// lookups; the other lines, and an edit's removal, work as before.
    #[test]
    fn connection_lines_of_options_are_left_out() {
        let block = b"Host: a\r\nConnection: close\r\nx-drop: 1\r\nconnection: keep-alive\r\n";
        let mut f = RawRequestFields::from_block(bytes::Bytes::from_static(block), false);
        f.leave_out_connection();
        f.remove(&HeaderName::from_static("x-drop"));
        let mut w = Vec::new();
        f.write(&mut w);
        assert_eq!(w, b"Host: a\r\n");
        assert!(f.len_hint() >= w.len());
        assert_eq!(f.get("connection"), None);
        let map = f.to_map();
        assert_eq!(map.len(), 1);
        assert_eq!(map["host"], "a");
    }

    /// With no other edit, the Connection lines are cut out of the block as it is, wherever
    /// they are and however the name is cased; names that only start with it stay.
    #[test]
    fn connection_lines_alone_are_cut_out_of_the_block() {
        let cases: [(&[u8], &[u8]); 4] = [
            (b"Connection: close\r\nHost: a\r\n", b"Host: a\r\n"),
            (
                b"Host: a\r\nCONNECTION: close\r\nconnection-x: 1\r\nx: connection: y\r\n",
                b"Host: a\r\nconnection-x: 1\r\nx: connection: y\r\n",
            ),
            (
                b"Host: a\r\nconnection: close\r\nAccept: */*\r\nConnection: te\r\n",
                b"Host: a\r\nAccept: */*\r\n",
            ),
            (b"connection: close\r\n", b""),
        ];
        for (block, expected) in cases {
            let mut f = RawRequestFields::from_block(bytes::Bytes::from_static(block), false);
            f.leave_out_connection();
            let mut w = b"GET / HTTP/1.1\r\n".to_vec();
            f.write(&mut w);
            assert_eq!(w[16..], *expected, "{}", String::from_utf8_lossy(block));
        }
    }

    /// A configured field (shared, with its line built at load) edits the fields exactly as
    /// the same name and value given by a filter's call: written, mapped and looked up.
    #[test]
    fn compiled_edits_apply_like_owned_ones() {
        let block = bytes::Bytes::from_static(b"Host: a\r\nX-In: old\r\nx-keep: 1\r\n");
        let name = |n: &'static str| HeaderName::from_static(n);
        let value = HeaderValue::from_static;
        let (mut owned, mut compiled) = (
            RawRequestFields::from_block(block.clone(), false),
            RawRequestFields::from_block(block, false),
        );
        owned.set(name("x-in"), value("1"));
        owned.append(name("x-add"), value("2"));
        owned.set(name("x-fresh"), value("3"));
        owned.append(name("x-in"), value("4"));
        for (set, n, v) in [
            (true, "x-in", "1"),
            (false, "x-add", "2"),
            (true, "x-fresh", "3"),
            (false, "x-in", "4"),
        ] {
            let f = CompiledField::new(&name(n), &value(v));
            assert_eq!(f.line(), format!("{n}: {v}\r\n").as_bytes());
            if set {
                compiled.set_compiled(&f);
            } else {
                compiled.append_compiled(&f);
            }
        }
        let written = |f: &RawRequestFields| {
            let mut w = Vec::new();
            f.write(&mut w);
            assert!(f.len_hint() >= w.len());
            String::from_utf8(w).unwrap()
        };
        assert_eq!(written(&compiled), written(&owned));
        assert_eq!(
            written(&compiled),
            "Host: a\r\nx-keep: 1\r\nx-in: 1\r\nx-add: 2\r\nx-fresh: 3\r\nx-in: 4\r\n"
        );
        assert_eq!(compiled.to_map(), owned.to_map());
        assert_eq!(compiled.get_all("X-IN").collect::<Vec<_>>(), [b"1", b"4"]);
        // A later call replaces a configured field like any other.
        compiled.set(name("x-add"), value("5"));
        assert_eq!(compiled.get_all("x-add").collect::<Vec<_>>(), [b"5"]);

        // The first edit setting a name the client did not send (told by the summary bit
        // alone), then the same name set again: the second replaces the first.
        let mut fresh = RawRequestFields::from_block(bytes::Bytes::from_static(b"A: 1\r\n"), false);
        for v in ["1", "2"] {
            fresh.set_compiled(&CompiledField::new(&name("x-gw"), &value(v)));
        }
        assert_eq!(written(&fresh), "A: 1\r\nx-gw: 2\r\n");
        assert_eq!(fresh.get_all("x-gw").collect::<Vec<_>>(), [b"2"]);
    }

    /// The name summary: a name the block holds is always found whatever its case (the
    /// summary may only err towards a search), and a set or lookup of a name it does not
    /// hold is answered without one when its bit is clear.
    #[test]
    fn the_name_summary_never_hides_a_field_the_client_sent() {
        let names = [
            "Host",
            "User-Agent",
            "accept",
            "X-Forwarded-For",
            "te",
            "a",
            "X-Request-Id",
            "content-length",
            "X-1",
        ];
        let block: String = names.iter().map(|n| format!("{n}: v\r\n")).collect();
        let f = RawRequestFields::from_block(bytes::Bytes::from(block), true);
        for n in names {
            for spelled in [
                n.to_string(),
                n.to_ascii_lowercase(),
                n.to_ascii_uppercase(),
            ] {
                assert!(f.names.may_hold(spelled.as_bytes()), "{spelled}");
                assert!(f.client_sent(spelled.as_bytes()), "{spelled}");
                assert_eq!(f.get(&spelled), Some(&b"v"[..]), "{spelled}");
            }
        }
        // Names it does not hold: never found, and most are ruled out by the summary alone.
        let absent: Vec<String> = (0..200).map(|i| format!("x-gateway-{i}")).collect();
        let ruled_out = absent
            .iter()
            .inspect(|n| assert!(!f.client_sent(n.as_bytes()) && f.get(n).is_none(), "{n}"))
            .filter(|n| !f.names.may_hold(n.as_bytes()))
            .count();
        assert!(ruled_out > 100, "only {ruled_out} of 200 ruled out");
        // An empty block holds nothing.
        let empty = RawRequestFields::from_block(bytes::Bytes::new(), false);
        assert_eq!(empty.names, NameSummary::default());
        assert!(!empty.client_sent(b"host"));
    }

    /// Filters' edits to wire-form request fields: what is written upstream, what a map built
    /// from them holds and what lookups see agree, and untouched lines keep the client's
    /// spelling.
    #[test]
    fn edits_to_wire_form_fields_apply_alike_written_mapped_and_looked_up() {
        let block = bytes::Bytes::from_static(
            b"Host: a\r\nX-Keep:  spaced \r\nx-gone: 1\r\nX-Set: old\r\nx-set: older\r\nx-multi: 1\r\n",
        );
        let mut f = RawRequestFields::from_block(block, false);
        let name = |n: &'static str| HeaderName::from_static(n);
        let value = HeaderValue::from_static;
        f.append(name("x-gone"), value("appended, then removed"));
        f.remove(&name("x-gone"));
        f.set(name("x-set"), value("new"));
        f.append(name("x-multi"), value("2"));
        f.set(name("x-fresh"), value("a"));
        f.set(name("x-fresh"), value("b"));

        let mut wire = Vec::new();
        f.write(&mut wire);
        assert_eq!(
            String::from_utf8(wire.clone()).unwrap(),
            "Host: a\r\nX-Keep:  spaced \r\nx-multi: 1\r\nx-set: new\r\nx-multi: 2\r\nx-fresh: b\r\n"
        );
        assert!(f.len_hint() >= wire.len());

        let map = f.to_map();
        assert_eq!(map.len(), 6); // values, not names
        assert_eq!(map["x-keep"], "spaced");
        assert!(!map.contains_key("x-gone"));
        assert_eq!(map.get_all("x-set").iter().collect::<Vec<_>>(), ["new"]);
        assert_eq!(
            map.get_all("x-multi").iter().collect::<Vec<_>>(),
            ["1", "2"]
        );
        assert_eq!(map["x-fresh"], "b");

        assert_eq!(f.get("X-SET"), Some(&b"new"[..]));
        assert_eq!(f.get("x-gone"), None);
        assert_eq!(f.get("x-keep"), Some(&b"spaced"[..]));
        assert_eq!(f.get_all("X-Multi").collect::<Vec<_>>(), [b"1", b"2"]);
        // A field is found by its name at a line start, in any case, never inside a value or
        // as a prefix of a longer name.
        let block = b"Host: a\r\nX-Forwarded: x-in: 1\r\nx-inn: 2\r\nAx-In: 3\r\nX-IN:4\r\n";
        assert!(has_field(block, b"x-in"));
        assert!(has_field(block, b"host"));
        assert!(has_field(block, b"x-inn"));
        assert!(!has_field(&block[..block.len() - 8], b"x-in"));
        assert!(!has_field(block, b"x-i"));
        assert!(!has_field(b"", b"x-in"));
        assert!(!has_field(b"x-in", b"x-in"));
        // Without edits the block goes out as it came.
        let plain = RawRequestFields::from_block(bytes::Bytes::from_static(b"A:b\r\n"), false);
        let mut wire = Vec::new();
        plain.write(&mut wire);
        assert_eq!(wire, b"A:b\r\n");
    }
}
