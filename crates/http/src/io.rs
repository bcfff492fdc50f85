//! The byte stream under an HTTP/1.1 connection, on either side of the proxy: plain TCP or
//! TLS (a client's session on a TLS listener, or keymaster's session with an origin), and
//! what a `101 Switching Protocols` leaves of it for a tunnel; and the worker's spare
//! buffers ([`spare`]).

use bytes::{Buf, Bytes, BytesMut};
use socket2::SockRef;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;
use tokio_util::io::poll_read_buf;

/// A write to a peer that went away fails with `EPIPE` instead of raising `SIGPIPE`, as
/// the standard library's socket writes do.
const NO_SIGNAL: libc::c_int = libc::MSG_NOSIGNAL;

/// The largest read into a connection's buffer.
pub const MAX_READ: usize = 64 * 1024;

/// The worker's spare buffers, in two sizes: a client connection gives back its read
/// buffer when it goes idle with nothing unread (to the class of its size), and the buffer
/// its response head was written in once that is out ([`SMALL`]); an origin connection
/// gives back its read buffer when a response is complete ([`LARGE`]). The next read or
/// head that needs a buffer takes the most recently given back. An idle connection then
/// holds no buffer (as nginx frees an idle connection's), a busy one writes into memory a
/// recent request used, still in the core's caches, instead of its own, cold after the
/// connection's idle time, and a request costs the allocator nothing for them. Each worker
/// is one thread: the spares are the thread's.
pub mod spare {
    use bytes::BytesMut;
    use std::cell::RefCell;

    /// Buffers of one size.
    #[derive(Clone, Copy)]
    pub struct Class {
        /// The size of a buffer made when no spare is left. A spare holds at least this
        /// once reserved again (a buffer comes back whole when nothing else shares it).
        pub size: usize,
        /// Buffers larger than this are freed, not kept (a large body or head made them
        /// grow).
        max: usize,
        /// The most kept: more than the requests one turn of a busy event loop has in
        /// flight.
        kept: usize,
        /// Where its spares are in [`SPARES`].
        index: usize,
    }

    thread_local! {
        /// The spares of each class, the most recently given back last.
        static SPARES: RefCell<[Vec<BytesMut>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
    }

    /// Keep `buf` in the class its capacity belongs to: a client connection's read
    /// buffer is mostly small, but a body read into it when it had no room took a large
    /// spare (as an origin's reads do), and a large head grew it.
    pub fn give(mut buf: BytesMut) {
        if buf.capacity() == 0 {
            return;
        }
        buf.clear();
        // As in `Class::give`: fails where the allocation is within a small spare's `max`.
        if buf.try_reclaim(SMALL.max + 1) {
            LARGE.give(buf);
        } else {
            SMALL.keep(buf);
        }
    }

    /// Client connections' read buffers and response heads.
    pub const SMALL: Class = Class {
        size: 1024,
        max: 8 * 1024,
        kept: 256,
        index: 0,
    };

    /// Origin connections' read buffers.
    pub const LARGE: Class = Class {
        size: 16 * 1024,
        max: super::MAX_READ,
        kept: 32,
        index: 1,
    };

    impl Class {
        /// The most recently given back buffer (empty), or a new one of `size` bytes.
        pub fn take(&self) -> BytesMut {
            let spare = SPARES.with_borrow_mut(|spares| spares[self.index].pop());
            // A spare whose allocation others shared when it was given back may be its only
            // holder now: one larger than `max` is freed, not lent (see `give`).
            if let Some(mut buf) = spare {
                if !buf.try_reclaim(self.max + 1) {
                    return buf;
                }
            }
            BytesMut::with_capacity(self.size)
        }

        /// Keep `buf` for the next [`take`](Self::take); its bytes must all have been used
        /// (they are cleared). Buffers of no or more than `max` bytes are dropped, by the
        /// size of their allocation where `buf` is its only holder: the tail of a large
        /// buffer whose head was split off and dropped shows only the tail's capacity,
        /// and would keep the whole allocation. (A tail whose allocation other handles
        /// still hold, the body bytes a client has yet to be sent, is kept by its own
        /// capacity, and [`take`](Self::take) looks again once they may have let go.)
        pub fn give(&self, mut buf: BytesMut) {
            if buf.capacity() == 0 || buf.capacity() > self.max {
                return;
            }
            buf.clear();
            // Succeeds, without allocating, exactly when `buf` is the allocation's only
            // holder and the allocation is larger than `max`.
            if buf.try_reclaim(self.max + 1) {
                return;
            }
            self.keep(buf);
        }

        /// Keep `buf` (empty, of no more than `max` bytes) unless `kept` are.
        fn keep(&self, buf: BytesMut) {
            SPARES.with_borrow_mut(|spares| {
                let spares = &mut spares[self.index];
                if spares.len() < self.kept {
                    spares.push(buf);
                }
            });
        }

        #[cfg(test)]
        pub(crate) fn kept(&self) -> usize {
            SPARES.with_borrow(|spares| spares[self.index].len())
        }
    }
}

/// A connection's transport.
pub enum Io {
    Tcp(TcpStream),
    /// Boxed: a TLS session is large, and most connections are plain.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Io {
    /// The TCP socket under the transport.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Io::Tcp(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }

    /// Read what the peer sent into `buf`'s spare room: `Ok(0)` when it closed its side.
    ///
    /// The buffer grows (by `want`, at least `least` and at most [`MAX_READ`] bytes) when
    /// its room is under 512 bytes or under `want` (up to 4 KiB); a buffer of no capacity
    /// is a [`spare`] one ([`spare::SMALL`] for a `want` and `least` it holds, else
    /// [`spare::LARGE`]). On a plain socket it
    /// grows only once the socket is readable, so a connection waiting on a slow peer
    /// holds no more buffer than it had; TLS reads straight away (the session may hold
    /// decrypted bytes).
    ///
    /// A plain socket's read is one readiness poll (where the task's cooperative budget is
    /// spent) and one `recv`; a readiness poll and then tokio's `poll_read` made two.
    pub fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
        want: usize,
        least: usize,
    ) -> Poll<io::Result<usize>> {
        match self {
            Io::Tcp(tcp) => loop {
                std::task::ready!(tcp.poll_read_ready(cx))?;
                let took = make_room(buf, want, least);
                let room = buf.capacity() - buf.len();
                let read = try_transfer(tcp, Interest::READABLE, room, || recv_into(tcp, buf));
                give_back_unused(took, buf);
                match read {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    done => return Poll::Ready(done),
                }
            },
            Io::Tls(_) => {
                let took = make_room(buf, want, least);
                let read = poll_read_buf(Pin::new(self), cx, buf);
                give_back_unused(took, buf);
                read
            }
        }
    }
}

/// Room in `buf` for a read of up to `want` (at least `least`) bytes; the [`spare`] class
/// a buffer was taken from, if it had none.
#[inline(always)]
fn make_room(buf: &mut BytesMut, want: usize, least: usize) -> Option<spare::Class> {
    let mut took = None;
    if buf.capacity() == 0 {
        let class = if want.max(least) <= spare::SMALL.size {
            spare::SMALL
        } else {
            spare::LARGE
        };
        *buf = class.take();
        took = Some(class);
    }
    let free = buf.capacity() - buf.len();
    if free < 512 || free < want.min(4096) {
        buf.reserve(want.clamp(least, MAX_READ));
    }
    took
}

/// A spare taken for a read that brought nothing goes back: the connection waits (tokio
/// takes a new connection for readable until a read says otherwise), or ends, without it.
#[inline(always)]
fn give_back_unused(took: Option<spare::Class>, buf: &mut BytesMut) {
    if let Some(class) = took.filter(|_| buf.is_empty()) {
        class.give(std::mem::take(buf));
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => poll_write_tcp(s, cx, buf.len(), |s| s.send_with_flags(buf, NO_SIGNAL)),
            Io::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => {
                // One call writes from at most IOV_MAX slices (1,024 on Linux): a write is
                // short only against what those hold.
                let bufs = &bufs[..bufs.len().min(1024)];
                let len = bufs.iter().map(|b| b.len()).sum();
                poll_write_tcp(s, cx, len, |s| s.send_vectored_with_flags(bufs, NO_SIGNAL))
            }
            Io::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Tcp(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// A write on a plain socket: straight away while tokio holds the socket writable (no
/// readiness poll, no cooperative budget: a writer that fills the socket waits on its
/// readiness like any other), through its readiness once a write would block.
fn poll_write_tcp(
    s: &TcpStream,
    cx: &mut Context<'_>,
    len: usize,
    mut write: impl FnMut(SockRef<'_>) -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        match try_transfer(s, Interest::WRITABLE, len, || write(SockRef::from(s))) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::task::ready!(s.poll_write_ready(cx))?
            }
            done => return Poll::Ready(done),
        }
    }
}

/// `op`, a read or write of up to `len` bytes on a plain socket, if tokio holds the socket
/// ready for it; `WouldBlock` if not. `op` makes the system call itself, not through
/// tokio's `TcpStream`, whose methods would check and clear the readiness again.
///
/// A short transfer also clears tokio's readiness, as its own `poll_read` and `poll_write`
/// do (not its `poll_write_vectored`): with edge-triggered epoll it shows the socket
/// drained (or full), and trying again would be a system call answering `EAGAIN`. The
/// closure reports it as `WouldBlock`, which is how `try_io` is told to clear.
fn try_transfer(
    tcp: &TcpStream,
    interest: Interest,
    len: usize,
    op: impl FnOnce() -> io::Result<usize>,
) -> io::Result<usize> {
    let mut short = None;
    let done = tcp.try_io(interest, || match op()? {
        n if 0 < n && n < len => {
            short = Some(n);
            Err(io::ErrorKind::WouldBlock.into()) // try_io clears the readiness
        }
        n => Ok(n),
    });
    short.map_or(done, Ok)
}

/// `recv` into `buf`'s spare room.
fn recv_into(tcp: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let n = SockRef::from(tcp).recv(buf.spare_capacity_mut())?;
    // SAFETY: `recv` wrote the first `n` bytes of the spare room (it returns at most the
    // length it was given), so `len + n` bytes are initialized and within the capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// A connection after `101 Switching Protocols`: the bytes the peer sent after the head that
/// were already read, then the socket. `H` is held until the tunnel ends (an origin
/// connection's slot under its cluster's cap).
pub struct Upgraded<H = ()> {
    pub read_ahead: Bytes,
    pub io: Io,
    pub _held: H,
}

impl<H: Unpin> AsyncRead for Upgraded<H> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read_ahead.has_remaining() {
            let n = this.read_ahead.len().min(buf.remaining());
            buf.put_slice(&this.read_ahead[..n]);
            this.read_ahead.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<H: Unpin> AsyncWrite for Upgraded<H> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::spare::{give, LARGE, SMALL};
    use super::*;

    /// Where a buffer's bytes start: the same allocation, reused, starts at the same place.
    fn at(buf: &BytesMut) -> usize {
        buf.as_ptr() as usize
    }

    #[test]
    fn a_given_buffer_is_the_next_one_taken_cleared() {
        let fresh = SMALL.take();
        assert!(fresh.capacity() >= SMALL.size && fresh.is_empty());
        let mut buf = SMALL.take();
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let place = at(&buf);
        SMALL.give(buf);
        let again = SMALL.take();
        assert_eq!(at(&again), place, "the same allocation");
        assert!(again.is_empty(), "its bytes cleared");
        // The classes keep apart: a large read does not get a small buffer.
        SMALL.give(again);
        assert!(LARGE.take().capacity() >= LARGE.size);
        assert_eq!(SMALL.kept(), 1);
        drop(SMALL.take());
        drop(fresh);
    }

    #[test]
    fn buffers_of_no_or_too_much_room_are_not_kept_nor_more_than_the_cap() {
        let before = SMALL.kept();
        SMALL.give(BytesMut::new());
        SMALL.give(BytesMut::with_capacity(64 * 1024));
        assert_eq!(SMALL.kept(), before, "neither kept");
        let many: Vec<_> = (0..300).map(|_| BytesMut::with_capacity(1024)).collect();
        for b in many {
            SMALL.give(b);
        }
        assert_eq!(SMALL.kept(), 256, "no more than the cap");
        while SMALL.kept() > 0 {
            SMALL.take();
        }
    }

    #[test]
    fn the_tail_of_a_larger_allocation_is_kept_by_the_allocation_size() {
        // A 64 KiB buffer whose first 60 KiB were split off and dropped shows 4 KiB of
        // room, but is the whole allocation's only holder.
        let tail = || {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            buf.resize(60 * 1024, b'x');
            drop(buf.split_to(60 * 1024));
            assert!(buf.capacity() <= 8 * 1024);
            buf
        };
        SMALL.give(tail());
        assert_eq!(SMALL.kept(), 0, "64 KiB is not a small spare");
        give(tail());
        assert_eq!(
            (SMALL.kept(), LARGE.kept()),
            (0, 1),
            "filed by its allocation"
        );
        let whole = LARGE.take();
        assert!(whole.capacity() >= 64 * 1024, "reclaimed whole");
        // Past the large class's size too: not kept at all.
        let mut huge = BytesMut::with_capacity(256 * 1024);
        huge.resize(250 * 1024, b'x');
        drop(huge.split_to(250 * 1024));
        give(huge);
        assert_eq!((SMALL.kept(), LARGE.kept()), (0, 0));
        // A tail that other handles still share is kept by its own room: they hold the
        // allocation either way, and the next reserve does not reach into their bytes.
        let mut shared = BytesMut::with_capacity(4 * 1024);
        shared.resize(1024, b'x');
        let body = shared.split_to(1024).freeze();
        give(shared);
        assert_eq!(SMALL.kept(), 1);
        let mut again = SMALL.take();
        again.extend_from_slice(&[b'y'; 3 * 1024]);
        assert_eq!(
            &body[..],
            &[b'x'; 1024][..],
            "the shared bytes are untouched"
        );
        // A tail given back while its head is still held, then left the allocation's only
        // holder: a 64 KiB allocation is not lent as a small spare.
        let mut large = BytesMut::with_capacity(64 * 1024);
        large.resize(60 * 1024, b'x');
        let head = large.split_to(60 * 1024).freeze();
        let place = at(&large);
        give(large);
        assert_eq!(SMALL.kept(), 1, "kept while shared, by its own room");
        drop(head);
        let fresh = SMALL.take();
        assert_eq!(SMALL.kept(), 0);
        assert_ne!(at(&fresh), place, "a new small buffer, not the large one");
    }

    #[test]
    fn an_allocation_of_exactly_max_is_kept_and_one_byte_more_is_not() {
        // `with_capacity` allocates exactly what it is asked for.
        let exact = BytesMut::with_capacity(8 * 1024);
        assert_eq!(exact.capacity(), 8 * 1024);
        SMALL.give(exact);
        assert_eq!(SMALL.kept(), 1, "8 KiB is a small spare's max");
        drop(SMALL.take());
        SMALL.give(BytesMut::with_capacity(8 * 1024 + 1));
        assert_eq!(SMALL.kept(), 0, "over the max by its own capacity");
        // The tail of an allocation of exactly `max`, and of one byte more: its head
        // advanced past (the buffer keeps its allocation without sharing it), then given
        // back.
        let tail = |size: usize| {
            let mut buf = BytesMut::with_capacity(size);
            buf.resize(4 * 1024, b'x');
            bytes::Buf::advance(&mut buf, 4 * 1024);
            assert!(buf.capacity() <= size - 4 * 1024);
            buf
        };
        SMALL.give(tail(8 * 1024));
        assert_eq!(SMALL.kept(), 1, "an 8 KiB allocation is kept");
        let again = SMALL.take();
        assert!(again.capacity() <= 8 * 1024);
        SMALL.give(tail(8 * 1024 + 1));
        assert_eq!(SMALL.kept(), 0, "a larger allocation is not");
        give(tail(8 * 1024 + 1));
        assert_eq!((SMALL.kept(), LARGE.kept()), (0, 1), "it is a large spare");
        assert!(LARGE.take().capacity() > 8 * 1024, "reclaimed whole");
        drop(again);
    }

    #[test]
    fn a_client_buffer_goes_back_to_the_class_of_its_size() {
        give(BytesMut::with_capacity(1024));
        give(BytesMut::with_capacity(16 * 1024));
        give(BytesMut::new());
        assert_eq!((SMALL.kept(), LARGE.kept()), (1, 1));
    }

    /// A read into a buffer of no room takes a spare once the socket is readable, not
    /// before: a connection waiting for its peer holds none.
    #[tokio::test]
    async fn a_read_takes_a_spare_only_once_there_is_something_to_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let mut io = Io::Tcp(accepted);
        let spare = SMALL.take();
        let place = at(&spare);
        SMALL.give(spare);

        let mut buf = BytesMut::new();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(io.poll_fill(&mut cx, &mut buf, 1024, 1024).is_pending());
        assert_eq!(buf.capacity(), 0, "nothing to read: no buffer taken");

        tokio::io::AsyncWriteExt::write_all(&mut peer, b"hello")
            .await
            .unwrap();
        let n = std::future::poll_fn(|cx| io.poll_fill(cx, &mut buf, 1024, 1024))
            .await
            .unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(at(&buf), place, "the spare holds what was read");
    }
}
