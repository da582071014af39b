//! A `/metrics` body as it is made: plain, or gzipped on the way into its chunks when the
//! scraper accepts gzip (Prometheus always does), so an uncompressed copy of a gzipped reply is
//! never held whole. What the reply budget ([`crate::Limits::max_reply_bytes`]) counts is
//! what is held: the compressed bytes.

use std::io::{self, Write};
use std::sync::Arc;

use flate2::Compression;
use flate2::write::GzEncoder;

use crate::body::{ChunkWriter, SharedBody};
use crate::bounds::Bounds;

/// A body being written.
pub(crate) enum Encoded {
    /// As written.
    Plain(ChunkWriter),
    /// Gzipped as written.
    Gzip(GzEncoder<ChunkWriter>),
}

impl Encoded {
    /// A body, gzipped when `gzip`.
    pub(crate) fn new(gzip: bool) -> Self {
        match gzip {
            // Level 1: a scrape's text repeats names and labels line after line, which the
            // fastest level already takes out (about 10:1), at a fraction of the default's time.
            true => Encoded::Gzip(GzEncoder::new(ChunkWriter::default(), Compression::fast())),
            false => Encoded::Plain(ChunkWriter::default()),
        }
    }

    /// The body, counted against `bounds`' budget of reply bytes.
    ///
    /// # Errors
    /// When the compressor fails to finish (it writes to memory: it does not).
    pub(crate) fn finish(self, bounds: &Arc<Bounds>) -> Result<SharedBody, String> {
        match self {
            Encoded::Plain(out) => Ok(out.finish(bounds)),
            Encoded::Gzip(gz) => {
                gz.finish().map(|out| out.finish(bounds)).map_err(|e| format!("gzip failed: {e}\n"))
            }
        }
    }
}

impl Write for Encoded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Encoded::Plain(out) => out.write(buf),
            Encoded::Gzip(gz) => gz.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Write for Encoded {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.write_all(s.as_bytes()).map_err(|_| std::fmt::Error)
    }
}
