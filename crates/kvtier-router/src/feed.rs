//! The instances' KV events, received the way Dynamo's indexer receives vLLM's: a SUB
//! socket per publisher (`[topic, sequence, KVEventBatch]`) and, for what it missed (a
//! subscriber that joined late loses what was sent before it), a replay request to the
//! publisher's ROUTER socket.
//!
//! On a replay's virtual clock the feed must not see the future: batches are held until
//! the clock passes their timestamp ([`Feed::apply_until`]), so the router's view lags
//! the instances by the steps still running, as a real router's lags by the events in
//! flight.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::RouterError;
use crate::index::KvIndex;
use crate::wire::{Batch, decode_batch};

/// How long [`Feed::receive`] waits for a publisher before it gives up.
const PATIENCE: Duration = Duration::from_secs(10);

/// How long one poll waits before the feed asks for a replay instead.
const POLL_MS: i64 = 50;

/// One publisher's sockets and where its sequence stands.
struct Source {
    sub: zmq::Socket,
    replay: Option<zmq::Socket>,
    /// The next sequence number it expects.
    next: u64,
    held: VecDeque<Batch>,
}

/// Counters of a feed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedStats {
    pub batches: u64,
    pub events: u64,
    /// Replay requests sent for missed batches.
    pub replays: u64,
    pub bytes: u64,
}

/// Subscriptions to every instance's publisher, worker `w` being the `w`-th.
pub struct Feed {
    _context: zmq::Context,
    sources: Vec<Source>,
    stats: FeedStats,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("workers", &self.sources.len())
            .field("stats", &self.stats)
            .finish()
    }
}

fn zmq_error(what: &str) -> impl Fn(zmq::Error) -> RouterError + '_ {
    move |e| RouterError::Zmq(format!("{what}: {e}"))
}

impl Feed {
    /// Subscribes to each `(endpoint, replay endpoint)`. Loopback endpoints only.
    pub fn connect(publishers: &[(String, Option<String>)]) -> Result<Self, RouterError> {
        let context = zmq::Context::new();
        let mut sources = Vec::with_capacity(publishers.len());
        for (endpoint, replay) in publishers {
            for e in std::iter::once(endpoint).chain(replay) {
                if !e.starts_with("tcp://127.0.0.1:")
                    && !e.starts_with("ipc://")
                    && !e.starts_with("inproc://")
                {
                    return Err(RouterError::NotLoopback(e.clone()));
                }
            }
            let sub = context.socket(zmq::SUB).map_err(zmq_error("SUB"))?;
            sub.set_subscribe(b"").map_err(zmq_error("subscribe"))?;
            sub.set_rcvhwm(0)
                .map_err(zmq_error("SUB high-water mark"))?;
            sub.connect(endpoint).map_err(zmq_error(endpoint))?;
            let replay = match replay {
                Some(r) => {
                    let dealer = context.socket(zmq::DEALER).map_err(zmq_error("DEALER"))?;
                    dealer.connect(r).map_err(zmq_error(r))?;
                    Some(dealer)
                }
                None => None,
            };
            sources.push(Source {
                sub,
                replay,
                next: 0,
                held: VecDeque::new(),
            });
        }
        Ok(Self {
            _context: context,
            sources,
            stats: FeedStats::default(),
        })
    }

    pub fn stats(&self) -> FeedStats {
        self.stats
    }

    /// Receives, from each publisher `w`, every batch up to the `published[w]`-th
    /// (sequence numbers `0..published[w]`): what the SUB socket brings, and a replay
    /// of what it missed.
    pub fn receive(&mut self, published: &[u64]) -> Result<(), RouterError> {
        for (w, &target) in published.iter().enumerate() {
            let started = Instant::now();
            while self.sources.get(w).is_some_and(|s| s.next < target) {
                if started.elapsed() > PATIENCE {
                    let next = self.sources[w].next;
                    return Err(RouterError::Behind {
                        worker: w,
                        next,
                        target,
                    });
                }
                let source = &mut self.sources[w];
                let ready = source
                    .sub
                    .poll(zmq::POLLIN, POLL_MS)
                    .map_err(zmq_error("poll"))?;
                if ready > 0 {
                    let parts = source.sub.recv_multipart(0).map_err(zmq_error("recv"))?;
                    let (seq, payload) = frame(&parts[..])?;
                    if seq > source.next {
                        self.replay(w, seq)?;
                    }
                    self.take(w, seq, payload)?;
                } else {
                    // Nothing came: what is still missing was sent before we joined.
                    self.replay(w, target)?;
                }
            }
        }
        Ok(())
    }

    /// Asks publisher `w` to replay from its next expected batch; keeps those before
    /// `until`.
    fn replay(&mut self, w: usize, until: u64) -> Result<(), RouterError> {
        let Some(dealer) = self.sources[w].replay.as_ref() else {
            return Ok(());
        };
        self.stats.replays += 1;
        let start = self.sources[w].next;
        dealer
            .send_multipart([&[][..], &start.to_be_bytes()[..]], 0)
            .map_err(zmq_error("replay request"))?;
        let mut batches = Vec::new();
        loop {
            if dealer.poll(zmq::POLLIN, 5_000).map_err(zmq_error("poll"))? == 0 {
                return Err(RouterError::Zmq(format!(
                    "worker {w}'s replay did not answer"
                )));
            }
            let parts = dealer.recv_multipart(0).map_err(zmq_error("replay"))?;
            // [empty, topic, sequence, payload]
            let (seq, payload) = frame(parts.get(1..).unwrap_or_default())?;
            if seq == u64::MAX {
                break;
            }
            batches.push((seq, payload.to_vec()));
        }
        for (seq, payload) in batches {
            if seq < until {
                self.take(w, seq, &payload)?;
            }
        }
        Ok(())
    }

    /// Holds batch `seq` of publisher `w` if it is the next one (a duplicate from a
    /// replay is dropped).
    fn take(&mut self, w: usize, seq: u64, payload: &[u8]) -> Result<(), RouterError> {
        let source = &mut self.sources[w];
        if seq != source.next {
            return Ok(());
        }
        let batch = decode_batch(payload)?;
        self.stats.batches += 1;
        self.stats.bytes += payload.len() as u64;
        source.held.push_back(batch);
        source.next += 1;
        Ok(())
    }

    /// Applies to `index` every held batch stamped at or before `ts` (each publisher's
    /// in order). Returns the events applied.
    pub fn apply_until(&mut self, ts: f64, index: &mut KvIndex) -> u64 {
        let mut applied = 0;
        for (w, source) in self.sources.iter_mut().enumerate() {
            while source.held.front().is_some_and(|b| b.ts <= ts) {
                if let Some(batch) = source.held.pop_front() {
                    for event in &batch.events {
                        index.apply(w, event);
                        applied += 1;
                    }
                }
            }
        }
        self.stats.events += applied;
        applied
    }
}

/// `[topic, 8-byte big-endian sequence, payload]`.
fn frame(parts: &[Vec<u8>]) -> Result<(u64, &[u8]), RouterError> {
    match parts {
        [_topic, seq, payload] => {
            let seq = <[u8; 8]>::try_from(&seq[..])
                .map(u64::from_be_bytes)
                .map_err(|_| RouterError::Wire("a sequence number is 8 bytes".into()))?;
            Ok((seq, payload))
        }
        _ => Err(RouterError::Wire(format!(
            "a message of {} frames",
            parts.len()
        ))),
    }
}
