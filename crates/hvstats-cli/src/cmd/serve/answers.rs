//! The answers of `serve`, made once per reading and shared by every request waiting for them.
//!
//! Reading every instance and encoding `/metrics` or a snapshot are the expensive part of a
//! request; a client that asks for them in a loop (on many connections, pipelined) must not make
//! the exporter do that work once per request, nor queue readings behind each other. So there is
//! one reader of bodies, on a blocking thread: a request registers what it wants for the next
//! reading and waits for it; the reader takes the next reading when anyone waits, then encodes
//! each body wanted of it, once, into chunks every waiting connection sends
//! ([`super::http::SharedBody`]). `/healthz` has a reader of its own that only checks what it can
//! read (the global pages, not every VP's: [`hvstats_present::live::Live::health`]), so it never
//! waits behind an encoding. A request is answered from a reading begun after it arrived (so
//! nothing is stale), whatever the number of requests waits for at most two readings (and their
//! encodings), and the memory of the answers is a reading and one body of each kind.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;

use hvstats_present::exposition::{self, Exposition};
use hvstats_present::live::{Live, Reading};

use super::http::{Body, Bounds, ChunkWriter, Reply, SharedBody};

/// What a request can ask of a reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// `/healthz`: what could be read.
    Health,
    /// `/metrics` in the OpenMetrics format.
    OpenMetrics,
    /// `/metrics` in the classic Prometheus text format.
    Classic,
    /// `/api/v1/snapshot`.
    Snapshot,
}

impl Want {
    /// Its bit in the set of what the next reading is wanted for.
    fn bit(self) -> u8 {
        match self {
            Want::Health => 8,
            Want::OpenMetrics => 1,
            Want::Classic => 2,
            Want::Snapshot => 4,
        }
    }
}

/// One reading and what was made of it.
#[derive(Default)]
struct Generation {
    number: u64,
    /// The bodies are made (or this reading wanted none).
    complete: bool,
    /// `/healthz`: whether something could be read, and the text.
    health: Option<(bool, String)>,
    open_metrics: Option<Result<SharedBody, String>>,
    classic: Option<Result<SharedBody, String>>,
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
    wanted: u8,
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
    /// will have it.
    fn register(self: &Arc<Self>, want: Want) -> u64 {
        let mut state = self.lane(want).state();
        state.wanted |= want.bit();
        if !state.running {
            state.running = true;
            let answers = Arc::clone(self);
            tokio::task::spawn_blocking(move || answers.work(want == Want::Health));
        }
        state.started + 1
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
            let body = match want {
                Want::Health => {
                    let (healthy, text) = generation.health.clone().unwrap_or_default();
                    return Reply::text(if healthy { 200 } else { 503 }, text);
                }
                Want::OpenMetrics => &generation.open_metrics,
                Want::Classic => &generation.classic,
                Want::Snapshot => &generation.snapshot,
            };
            let content_type = match want {
                Want::OpenMetrics => exposition::CONTENT_TYPE,
                Want::Classic => exposition::CLASSIC_CONTENT_TYPE,
                _ => "application/json",
            };
            match body {
                Some(Ok(body)) => {
                    return Reply { status: 200, content_type, body: Body::Shared(body.clone()) };
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
        loop {
            let (number, wanted) = {
                let mut state = lane.state();
                if state.wanted == 0 {
                    // Said under the lock: a request registering from now on starts a reader.
                    state.running = false;
                    return;
                }
                state.started += 1;
                (state.started, std::mem::take(&mut state.wanted))
            };
            if health {
                // The health lane checks what it can read without reading every page.
                let health = self.live.health();
                let generation =
                    Generation { number, complete: true, health: Some(health), ..Default::default() };
                lane.published.send_replace(Arc::new(generation));
                continue;
            }
            let started = Instant::now();
            let mut reading = self.live.read().unwrap_or_else(|e| self.live.unreadable(&e));
            let took = started.elapsed();
            let health = exposition::health(&reading);
            // Health at once (and the last reading's bodies let go of, but by the connections
            // still sending them), then room for the new bodies.
            lane.published.send_replace(Arc::new(Generation {
                number,
                health: Some(health.clone()),
                ..Default::default()
            }));
            let mut generation =
                Generation { number, complete: true, health: Some(health), ..Default::default() };
            if wanted & (Want::OpenMetrics.bit() | Want::Classic.bit() | Want::Snapshot.bit()) != 0 {
                self.bounds.make_room();
            }
            let metrics = Want::OpenMetrics.bit() | Want::Classic.bit();
            if wanted & metrics != 0 {
                let shared = Arc::new(reading);
                let (open, classic) = self.metrics(Arc::clone(&shared), took, wanted);
                generation.open_metrics = open;
                generation.classic = classic;
                // The exposition is gone with its encoding: the reading is ours alone again.
                reading = match Arc::try_unwrap(shared) {
                    Ok(reading) => reading,
                    Err(shared) => (*shared).clone(),
                };
            }
            if wanted & Want::Snapshot.bit() != 0 {
                generation.snapshot = Some(match exposition::nothing_read(&reading) {
                    true => Err(exposition::health(&reading).1),
                    false => {
                        let mut out = ChunkWriter::default();
                        hvstats_present::snapshot_json::write_capped(
                            &mut out,
                            &mut reading.instances,
                            self.max_vps,
                        )
                        .map(|_| out.finish(&self.bounds))
                        .map_err(|e| format!("encoding failed: {e}\n"))
                    }
                });
            }
            drop(reading);
            lane.published.send_replace(Arc::new(generation));
        }
    }

    /// `/metrics` of `reading` in the formats `wanted`, from one encoding.
    #[allow(clippy::type_complexity, reason = "the two bodies, each made or not")]
    fn metrics(
        &self,
        reading: Arc<Reading>,
        took: std::time::Duration,
        wanted: u8,
    ) -> (Option<Result<SharedBody, String>>, Option<Result<SharedBody, String>>) {
        let exposition = Exposition::new(reading, self.max_vps).read_in(took);
        let (mut open, mut classic) =
            (ChunkWriter::default(), exposition::Classic::new(ChunkWriter::default()));
        let want_open = wanted & Want::OpenMetrics.bit() != 0;
        let want_classic = wanted & Want::Classic.bit() != 0;
        let mut both =
            Tee { open: want_open.then_some(&mut open), classic: want_classic.then_some(&mut classic) };
        let encoded = exposition.encode_into(&mut both).and_then(|()| classic.finish());
        let failed = || Err("encoding failed\n".to_owned());
        match encoded {
            Ok(()) => (
                want_open.then(|| Ok(open.finish(&self.bounds))),
                want_classic.then(|| Ok(classic.into_inner().finish(&self.bounds))),
            ),
            Err(_) => (want_open.then(failed), want_classic.then(failed)),
        }
    }
}

/// Writes the OpenMetrics text to the formats wanted of it.
struct Tee<'a> {
    open: Option<&'a mut ChunkWriter>,
    classic: Option<&'a mut exposition::Classic<ChunkWriter>>,
}

impl std::fmt::Write for Tee<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if let Some(open) = self.open.as_deref_mut() {
            open.write_str(s)?;
        }
        if let Some(classic) = self.classic.as_deref_mut() {
            classic.write_str(s)?;
        }
        Ok(())
    }
}
