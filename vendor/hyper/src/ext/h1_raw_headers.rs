use bytes::Bytes;

/// keymaster patch (vendor/PATCHES.md #5): header fields of an HTTP/1 server response that
/// are already in wire form.
///
/// A connection built with `Builder::raw_header_source` asks that function for each
/// response's block. The block is written as it is right after the status line, before the
/// fields of the response's `HeaderMap` (which the service leaves empty). The block is
/// `name: value\r\n` lines and must hold no field that hyper derives itself: `Content-Length`, `Transfer-Encoding`, `Connection`, or `Date` unless
/// [`RawHeaderBlock::new`] is told it does (then hyper adds none). hyper still writes the
/// framing from the body and closes the head.
///
/// A proxy uses this to pass on an origin's response head without building a `HeaderMap`
/// that would only be encoded again.
#[derive(Clone, Debug)]
pub struct RawHeaderBlock {
    block: Bytes,
    has_date: bool,
}

impl RawHeaderBlock {
    /// `block`: `name: value\r\n` lines; `has_date`: one of them is `Date`.
    pub fn new(block: Bytes, has_date: bool) -> Self {
        RawHeaderBlock { block, has_date }
    }

    pub(crate) fn block(&self) -> &[u8] {
        &self.block
    }

    pub(crate) fn has_date(&self) -> bool {
        self.has_date
    }
}

/// keymaster patch (vendor/PATCHES.md #5): finds a response's [`RawHeaderBlock`], given the
/// response body (to be downcast to the service's body type, which may carry one).
pub type RawHeaderSource = fn(&mut dyn std::any::Any) -> Option<RawHeaderBlock>;
