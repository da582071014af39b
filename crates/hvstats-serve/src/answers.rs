//! The answers of `serve`, made once per reading and shared by every request waiting for them.
//!
//! Reading every instance and encoding `/metrics` or a snapshot are the expensive part of a
//! request; a client that asks for them in a loop (on many connections, pipelined) must not make
//! the exporter do that work once per request, nor queue readings behind each other. So there is
//! one reader of bodies, on a blocking thread: a request registers what it wants for the next
//! reading and waits for it; the reader takes the next reading when anyone waits, then encodes
//! each body wanted of it, once, into chunks every waiting connection sends
//! ([`crate::body::SharedBody`]). `/healthz` has a reader of its own that only checks what it can
//! read (the global pages, not every VP's: [`hvstats_present::live::Live::health`]), so it never
//! waits behind an encoding. A request is answered from a reading begun after it arrived (so
//! nothing is stale), whatever the number of requests waits for at most two readings (and their
//! encodings), and the memory of the answers is a reading and one body of each kind.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;

use hvstats_present::collectors::Selection;
use hvstats_present::exposition::{self, Exposition};
use hvstats_present::live::{Live, Reading};

use crate::body::{Body, ChunkWriter, SharedBody};
use crate::bounds::Bounds;
use crate::compress::Encoded;
use crate::http::Reply;
use crate::negotiate::Format;

/// What a request can ask of a reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// `/healthz`: what could be read.
    Health,
    /// `/metrics` in a format, of some collectors, gzipped or not.
    Metrics(Scrape),
    /// `/api/v1/snapshot`.
    Snapshot,
}

/// One kind of `/metrics` body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Scrape {
    /// The format negotiated.
    pub format: Format,
    /// The collectors exported.
    pub selection: Selection,
    /// Whether the body is gzipped.
    pub gzip: bool,
}

/// Different kinds of `/metrics` body one reading makes at most; a request for one more waits
/// for the next reading.
const MAX_SCRAPES: usize = 16;

/// One reading and what was made of it.
#[derive(Default)]
struct Generation {
    number: u64,
    /// The bodies are made (or this reading wanted none).
    complete: bool,
    /// `/healthz`: whether something could be read, and the text.
    health: Option<(bool, String)>,
    /// Each kind of `/metrics` body asked of this reading.
    scrapes: Vec<(Scrape, Result<SharedBody, String>)>,
    /// The snapshot, or why there is none (nothing could be read: the health text).
    snapshot: Option<Result<SharedBody, String>>,
}

#[derive(Default)]
struct State {
    /// Readings begun so far.
    started: u64,
    /// True while the reader runs.
    running: bool,
    /// What the requests waiting for the next reading want of it.
    wanted: Wanted,
}

/// What the next reading is wanted for.
#[derive(Default)]
struct Wanted {
    health: bool,
    snapshot: bool,
    scrapes: Vec<Scrape>,
}

impl Wanted {
    fn any(&self) -> bool {
        self.health || self.snapshot || !self.scrapes.is_empty()
    }

    /// Adds `want`; false when the reading already makes as many kinds of body as it may.
    fn add(&mut self, want: Want) -> bool {
        match want {
            Want::Health => self.health = true,
            Want::Snapshot => self.snapshot = true,
            Want::Metrics(scrape) if self.scrapes.contains(&scrape) => {}
            Want::Metrics(_) if self.scrapes.len() >= MAX_SCRAPES => return false,
            Want::Metrics(scrape) => self.scrapes.push(scrape),
        }
        true
    }
}

/// Readings taken back to back while anyone waits for one, and the last one's answers.
#[derive(Default)]
struct Lane {
    state: Mutex<State>,
    published: watch::Sender<Arc<Generation>>,
}

impl Lane {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The number of the next reading and what it is wanted for, taken from the requests
    /// waiting; none when nobody waits, and then the reader is said to be gone (under the lock: a
    /// request registering from then on starts another).
    fn next_reading(&self) -> Option<(u64, Wanted)> {
        let mut state = self.state();
        if !state.wanted.any() {
            state.running = false;
            return None;
        }
        state.started += 1;
        Some((state.started, std::mem::take(&mut state.wanted)))
    }
}

/// The readers and what they last made: one lane for the bodies, one for health alone, so
/// `/healthz` waits for a reading, never for an encoding.
pub(crate) struct Answers {
    live: Live,
    max_vps: usize,
    bounds: Arc<Bounds>,
    bodies: Lane,
    health: Lane,
}

impl Answers {
    /// Answers from `live`, exporting at most `max_vps` VPs one by one (and snapshotting at most
    /// as many), counting bodies against `bounds`.
    pub(crate) fn new(live: Live, max_vps: usize, bounds: Arc<Bounds>) -> Arc<Self> {
        Arc::new(Self { live, max_vps, bounds, bodies: Lane::default(), health: Lane::default() })
    }

    fn lane(&self, want: Want) -> &Lane {
        match want {
            Want::Health => &self.health,
            _ => &self.bodies,
        }
    }

    /// Asks the next reading of `want`'s lane for it; returns the number of the reading that
    /// will have it (the one after, when the next one is asked for as many kinds of body as it
    /// makes).
    fn register(self: &Arc<Self>, want: Want) -> u64 {
        let mut state = self.lane(want).state();
        let next = if state.wanted.add(want) { state.started + 1 } else { state.started + 2 };
        if !state.running {
            state.running = true;
            let answers = Arc::clone(self);
            tokio::task::spawn_blocking(move || answers.work(want == Want::Health));
        }
        next
    }

    /// The answer to `want` from a reading begun after this call.
    pub(crate) async fn answer(self: Arc<Self>, want: Want) -> Reply {
        let mut published = self.lane(want).published.subscribe();
        loop {
            let need = self.register(want);
            let ready = |g: &Arc<Generation>| {
                g.number >= need && (g.complete || (want == Want::Health && g.health.is_some()))
            };
            let generation = match published.wait_for(ready).await {
                Ok(g) => Arc::clone(&g),
                Err(_) => return Reply::text(503, "the reader stopped\n"),
            };
            let (body, content_type, encoding, vary) = match want {
                Want::Health => {
                    let (healthy, text) = generation.health.clone().unwrap_or_default();
                    return Reply::text(if healthy { 200 } else { 503 }, text);
                }
                Want::Metrics(scrape) => {
                    let body = generation.scrapes.iter().find(|(s, _)| *s == scrape).map(|(_, b)| b);
                    let content_type = match scrape.format {
                        Format::Protobuf => hvstats_present::protobuf::CONTENT_TYPE,
                        Format::OpenMetrics => exposition::CONTENT_TYPE,
                        Format::Classic => exposition::CLASSIC_CONTENT_TYPE,
                    };
                    (body, content_type, scrape.gzip.then_some("gzip"), Some("Accept, Accept-Encoding"))
                }
                Want::Snapshot => (generation.snapshot.as_ref(), "application/json", None, None),
            };
            match body {
                Some(Ok(body)) => {
                    return Reply {
                        status: 200,
                        content_type,
                        body: Body::Shared(body.clone()),
                        encoding,
                        vary,
                    };
                }
                Some(Err(text)) if want == Want::Snapshot => return Reply::text(503, text.clone()),
                Some(Err(text)) => return Reply::text(500, text.clone()),
                // A later reading that nobody asked this of (this request's reading was
                // replaced before it looked): ask the next one.
                None => continue,
            }
        }
    }

    /// A reader (of the health lane, or of the bodies'): readings back to back while anyone
    /// waits for one.
    fn work(&self, health: bool) {
        let lane = if health { &self.health } else { &self.bodies };
        // A reader that panics is gone all the same: the next request starts another.
        struct Panicked<'a>(&'a Lane);
        impl Drop for Panicked<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.state().running = false;
                }
            }
        }
        let _panicked = Panicked(lane);
        while let Some((number, wanted)) = lane.next_reading() {
            let generation = match health {
                // The health lane checks what it can read without reading every page.
                true => Generation {
                    number,
                    complete: true,
                    health: Some(self.live.health()),
                    ..Default::default()
                },
                false => self.read(lane, number, &wanted),
            };
            lane.published.send_replace(Arc::new(generation));
        }
    }

    /// Reading `number` of the bodies' lane and the bodies `wanted` of it. Its health is
    /// published at once (and the last reading's bodies let go of, but by the connections still
    /// sending them), then room is made for the new bodies.
    fn read(&self, lane: &Lane, number: u64, wanted: &Wanted) -> Generation {
        let started = Instant::now();
        let mut reading = self.live.read().unwrap_or_else(|e| self.live.unreadable(&e));
        let took = started.elapsed();
        let health = exposition::health(&reading);
        lane.published.send_replace(Arc::new(Generation {
            number,
            health: Some(health.clone()),
            ..Default::default()
        }));
        let mut generation =
            Generation { number, complete: true, health: Some(health), ..Default::default() };
        if wanted.snapshot || !wanted.scrapes.is_empty() {
            self.bounds.make_room();
        }
        if !wanted.scrapes.is_empty() {
            let shared = Arc::new(reading);
            generation.scrapes = self.metrics(&shared, took, &wanted.scrapes);
            // The expositions are gone with their encodings: the reading is ours alone again.
            reading = Arc::try_unwrap(shared).unwrap_or_else(|shared| (*shared).clone());
        }
        if wanted.snapshot {
            generation.snapshot = Some(self.snapshot(&mut reading));
        }
        generation
    }

    /// The snapshot of `reading`, or why there is none (nothing could be read: the health text).
    fn snapshot(&self, reading: &mut Reading) -> Result<SharedBody, String> {
        if exposition::nothing_read(reading) {
            return Err(exposition::health(reading).1);
        }
        let mut out = ChunkWriter::default();
        hvstats_present::snapshot_json::write_capped(&mut out, &mut reading.instances, self.max_vps)
            .map(|_| out.finish(&self.bounds))
            .map_err(|e| format!("encoding failed: {e}\n"))
    }

    /// The `/metrics` bodies `scrapes` ask of `reading`: one encoding of each selection's text
    /// for every text body of it (OpenMetrics or classic, gzipped or not), one of its protobuf.
    fn metrics(
        &self,
        reading: &Arc<Reading>,
        took: std::time::Duration,
        scrapes: &[Scrape],
    ) -> Vec<(Scrape, Result<SharedBody, String>)> {
        let mut out = Vec::with_capacity(scrapes.len());
        let mut selections: Vec<Selection> = Vec::new();
        for s in scrapes {
            if !selections.contains(&s.selection) {
                selections.push(s.selection);
            }
        }
        let exposition =
            |selection| Exposition::new(Arc::clone(reading), self.max_vps).read_in(took).collect(selection);
        let failed = || Err("encoding failed\n".to_owned());
        for selection in selections {
            let of_it = scrapes.iter().filter(|s| s.selection == selection);
            let mut texts: Vec<(Scrape, Text)> = of_it
                .clone()
                .filter(|s| s.format != Format::Protobuf)
                .map(|s| {
                    let body = Encoded::new(s.gzip);
                    let text = match s.format {
                        Format::Classic => Text::Classic(exposition::Classic::new(body)),
                        _ => Text::Open(body),
                    };
                    (*s, text)
                })
                .collect();
            if !texts.is_empty() {
                let mut fanout = Fanout(&mut texts);
                match exposition(selection).encode_into(&mut fanout) {
                    Ok(()) => out.extend(texts.into_iter().map(|(s, t)| (s, t.finish(&self.bounds)))),
                    Err(_) => out.extend(texts.into_iter().map(|(s, _)| (s, failed()))),
                }
            }
            let protobufs: Vec<Scrape> = of_it.filter(|s| s.format == Format::Protobuf).copied().collect();
            if !protobufs.is_empty() {
                let bytes = exposition(selection).encode_protobuf();
                for s in protobufs {
                    let mut body = Encoded::new(s.gzip);
                    let written = std::io::Write::write_all(&mut body, &bytes);
                    out.push((
                        s,
                        written
                            .map_err(|_| "encoding failed\n".to_owned())
                            .and_then(|()| body.finish(&self.bounds)),
                    ));
                }
            }
        }
        out
    }
}

/// A text body being made.
enum Text {
    Open(Encoded),
    Classic(exposition::Classic<Encoded>),
}

impl Text {
    fn finish(self, bounds: &Arc<Bounds>) -> Result<SharedBody, String> {
        match self {
            Text::Open(body) => body.finish(bounds),
            Text::Classic(mut classic) => {
                classic.finish().map_err(|_| "encoding failed\n".to_owned())?;
                classic.into_inner().finish(bounds)
            }
        }
    }
}

/// Writes the OpenMetrics text to every text body made of it.
struct Fanout<'a>(&'a mut Vec<(Scrape, Text)>);

impl std::fmt::Write for Fanout<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for (_, text) in self.0.iter_mut() {
            match text {
                Text::Open(body) => body.write_str(s)?,
                Text::Classic(classic) => classic.write_str(s)?,
            }
        }
        Ok(())
    }
}
