//! The bodies of replies: a short text of one connection's own, or a large reply made once, kept
//! in chunks ([`ChunkWriter`]) and sent by every connection that asked for it, counted against
//! the budget of reply bytes ([`crate::bounds::Bounds`]) until the last one lets go.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};

use crate::bounds::{Bounds, Hold};

/// The body of a reply.
#[derive(Clone, Debug)]
pub(crate) enum Body {
    /// A short text, the connection's own.
    Small(Bytes),
    /// A large reply made once and sent by every connection that asked for it.
    Shared(SharedBody),
}

/// A large reply in chunks, counted against [`crate::Limits::max_reply_bytes`] until the last
/// connection sending it lets go.
#[derive(Clone, Debug)]
pub(crate) struct SharedBody(Arc<Chunks>);

#[derive(Debug)]
struct Chunks {
    parts: Vec<Bytes>,
    len: usize,
    bounds: Arc<Bounds>,
}

impl Drop for Chunks {
    fn drop(&mut self) {
        self.bounds.reply_gone(self.len);
    }
}

/// A writer (of bytes, or of text) that keeps what it is given in chunks of at most
/// [`ChunkWriter::CHUNK`] bytes: a large reply costs its size, without the copies of a growing
/// buffer.
#[derive(Default)]
pub(crate) struct ChunkWriter {
    parts: Vec<Bytes>,
    current: Vec<u8>,
    len: usize,
}

impl ChunkWriter {
    /// The size of a chunk.
    pub(crate) const CHUNK: usize = 1 << 20;

    fn push(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len();
        while !bytes.is_empty() {
            if self.current.capacity() == 0 {
                self.current.reserve_exact(Self::CHUNK);
            }
            let room = Self::CHUNK - self.current.len();
            let (now, later) = bytes.split_at(room.min(bytes.len()));
            self.current.extend_from_slice(now);
            bytes = later;
            if self.current.len() == Self::CHUNK {
                self.parts.push(Bytes::from(std::mem::take(&mut self.current)));
            }
        }
    }

    /// The reply, counted against `bounds`' budget of reply bytes.
    pub(crate) fn finish(mut self, bounds: &Arc<Bounds>) -> SharedBody {
        if !self.current.is_empty() {
            self.current.shrink_to_fit();
            self.parts.push(Bytes::from(std::mem::take(&mut self.current)));
        }
        bounds.reply_made(self.len);
        SharedBody(Arc::new(Chunks { parts: self.parts, len: self.len, bounds: Arc::clone(bounds) }))
    }
}

impl io::Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Write for ChunkWriter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

/// The body hyper writes: a small text, or a shared reply's chunks one at a time.
pub(crate) struct ReplyBody {
    body: Body,
    next: usize,
    hold: Option<Hold>,
}

impl ReplyBody {
    /// `body`, sent for the request `hold` marks in flight.
    pub(crate) fn new(body: Body, hold: Hold) -> Self {
        Self { body, next: 0, hold: Some(hold) }
    }
}

impl HttpBody for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        let chunk = match &mut this.body {
            Body::Small(bytes) if this.next == 0 && !bytes.is_empty() => Some(bytes.clone()),
            Body::Small(_) => None,
            Body::Shared(shared) => shared.0.parts.get(this.next).cloned(),
        };
        this.next += 1;
        if chunk.is_none()
            && let Some(hold) = this.hold.take()
        {
            hold.done();
        }
        Poll::Ready(chunk.map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Body::Small(bytes) => self.next > 0 || bytes.is_empty(),
            Body::Shared(shared) => self.next >= shared.0.parts.len(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let len = match &self.body {
            Body::Small(bytes) => bytes.len(),
            Body::Shared(shared) => shared.0.len,
        };
        SizeHint::with_exact(len as u64)
    }
}
