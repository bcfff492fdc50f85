//! The streaming encoder: body bytes in as they come, compressed bytes out into a buffer the
//! body takes from (never the whole body at once). `flush` makes everything written so far
//! decodable by the client (gzip's sync flush, brotli's and zstd's flush operations), for
//! a body whose origin paused: server-sent events and other streams keep streaming.

use bytes::buf::{BufMut, Writer};
use bytes::{Bytes, BytesMut};
use std::io::{self, Write};

use super::{Algorithm, Levels};

/// Brotli's largest window, log2: 256 KiB (the format's default is 4 MiB), memory per stream
/// bounded like gzip's.
const BROTLI_WINDOW_LOG: u32 = 18;
/// gzip's largest window, log2 (32 KiB, zlib's default).
const GZIP_WINDOW_LOG: u8 = 15;
/// Brotli's internal buffer.
const BROTLI_BUFFER: usize = 8 * 1024;

type Sink = Writer<BytesMut>;

/// One response body's encoder.
pub(crate) struct Encoder(Kind);

enum Kind {
    /// A zlib stream with the gzip wrapper (`Compress::new_gzip`), so its window can shrink.
    Gzip(flate2::write::ZlibEncoder<Sink>),
    Brotli(Box<brotli::CompressorWriter<Sink>>),
    Zstd(zstd::stream::write::Encoder<'static, Sink>),
    /// A finished brotli stream's last output (brotli finishes by giving its writer back).
    Finished(Sink),
}

/// The window (log2) for a body of `size` bytes, at most `max` and at least `min`: a small
/// body gets a small window, so its encoder allocates and clears less (nginx does the same
/// for gzip).
pub(super) fn window_log(size: Option<u64>, max: u32, min: u32) -> u32 {
    let mut log = max;
    if let Some(n) = size {
        while log > min && n < (1u64 << (log - 1)) - 262 {
            log -= 1;
        }
    }
    log
}

impl Encoder {
    /// `size`: the body's length when the origin declared it (a smaller window, and zstd's
    /// frame says the size).
    pub(crate) fn new(a: Algorithm, levels: &Levels, size: Option<u64>) -> io::Result<Encoder> {
        let sink = empty();
        Ok(Encoder(match a {
            Algorithm::Gzip => {
                let bits = window_log(size, GZIP_WINDOW_LOG.into(), 9) as u8;
                let level = flate2::Compression::new(levels.gzip);
                let compress = flate2::Compress::new_gzip(level, bits);
                Kind::Gzip(flate2::write::ZlibEncoder::new_with_compress(
                    sink, compress,
                ))
            }
            Algorithm::Brotli => Kind::Brotli(Box::new(brotli::CompressorWriter::new(
                sink,
                BROTLI_BUFFER,
                levels.brotli,
                window_log(size, BROTLI_WINDOW_LOG, 10),
            ))),
            Algorithm::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(sink, levels.zstd)?;
                e.set_pledged_src_size(size)?;
                Kind::Zstd(e)
            }
        }))
    }

    /// Compress `data` (the output may stay inside the encoder until a flush).
    pub(crate) fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match &mut self.0 {
            Kind::Gzip(e) => e.write_all(data),
            Kind::Brotli(e) => e.write_all(data),
            Kind::Zstd(e) => e.write_all(data),
            Kind::Finished(_) => Err(finished()),
        }
    }

    /// Everything written so far becomes decodable output.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        match &mut self.0 {
            Kind::Gzip(e) => e.flush(),
            Kind::Brotli(e) => e.flush(),
            Kind::Zstd(e) => e.flush(),
            Kind::Finished(_) => Err(finished()),
        }
    }

    /// End the stream: the last output is then in the buffer.
    pub(crate) fn finish(&mut self) -> io::Result<()> {
        match &mut self.0 {
            Kind::Gzip(e) => e.try_finish(),
            Kind::Zstd(e) => e.do_finish(),
            Kind::Finished(_) => Ok(()),
            Kind::Brotli(_) => {
                let Kind::Brotli(e) = std::mem::replace(&mut self.0, Kind::Finished(empty()))
                else {
                    unreachable!("matched above");
                };
                self.0 = Kind::Finished(e.into_inner());
                Ok(())
            }
        }
    }

    /// Compressed bytes ready to send.
    pub(crate) fn pending(&self) -> usize {
        let sink = match &self.0 {
            Kind::Gzip(e) => e.get_ref(),
            Kind::Brotli(e) => e.get_ref(),
            Kind::Zstd(e) => e.get_ref(),
            Kind::Finished(s) => s,
        };
        sink.get_ref().len()
    }

    /// Take the compressed bytes ready to send.
    pub(crate) fn take(&mut self) -> Bytes {
        let sink = match &mut self.0 {
            Kind::Gzip(e) => e.get_mut(),
            Kind::Brotli(e) => e.get_mut(),
            Kind::Zstd(e) => e.get_mut(),
            Kind::Finished(s) => s,
        };
        sink.get_mut().split().freeze()
    }
}

fn empty() -> Sink {
    BytesMut::new().writer()
}

fn finished() -> io::Error {
    io::Error::other("the compressed stream has ended")
}
