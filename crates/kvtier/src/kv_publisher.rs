//! KV events over ZeroMQ, as vLLM publishes them: a PUB socket sends each batch as a
//! multipart message (topic, 8-byte big-endian sequence number, the `KVEventBatch`
//! msgpack of [`crate::vllm_events`]). The first batch says `AllBlocksCleared`, so a
//! subscriber starts from an empty index.
//!
//! A subscriber that joined late, or saw a gap in the sequence, asks the ROUTER socket
//! (when one is bound) to replay: a request `[identity, "", start]` (8-byte big-endian
//! sequence) is answered with every kept batch from `start` on, each as `[identity, "",
//! topic, sequence, payload]`, then `[identity, "", topic, u64::MAX, ""]` to say that was
//! all (the framing Dynamo's indexer asks with). The last `keep` batches are kept.
//!
//! The sockets are libzmq's (the `zmq` crate) and live on a thread of their own:
//! `publish` only queues the batch, so a slow or absent subscriber never holds up a
//! step. A subscriber more than 100,000 batches behind loses the excess (libzmq's
//! high-water mark), and dropping the publisher waits up to two seconds for queued
//! batches to leave.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::vllm_events::{WireEvent, encode_batch};
use crate::{KvError, SetupError};

/// Batches a publisher keeps for replay unless told otherwise.
pub const DEFAULT_REPLAY_BATCHES: usize = 100_000;

/// Batches queued per subscriber before libzmq drops the excess.
const HIGH_WATER_MARK: i32 = 100_000;

/// How long dropping the publisher waits for queued batches to leave.
const LINGER_MS: i32 = 2_000;

/// How long the socket thread waits for a batch before it looks for replay requests.
const POLL: Duration = Duration::from_millis(5);

/// Where and how a [`KvEventPublisher`] publishes.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// The PUB endpoint (`tcp://127.0.0.1:PORT`; port 0 picks a free one).
    pub endpoint: String,
    /// The ROUTER endpoint that replays kept batches; `None`: no replay.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message.
    pub topic: String,
    /// The data-parallel rank every batch carries (`None`: nil).
    pub data_parallel_rank: Option<u32>,
    /// Batches kept for replay (the oldest go first).
    pub keep: usize,
}

impl PublisherConfig {
    /// Publishes on `endpoint` under `topic`, without replay.
    pub fn new(endpoint: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: topic.into(),
            data_parallel_rank: None,
            keep: DEFAULT_REPLAY_BATCHES,
        }
    }
}

/// A PUB socket publishing KV event batches, and optionally a ROUTER socket replaying
/// them. Stops (after sending what is queued) when dropped.
#[derive(Debug)]
pub struct KvEventPublisher {
    tx: Option<Sender<Vec<u8>>>,
    endpoint: String,
    replay_endpoint: Option<String>,
    data_parallel_rank: Option<u32>,
    thread: Option<JoinHandle<()>>,
    /// Batches queued so far: the next one's sequence number.
    published: std::sync::atomic::AtomicU64,
}

/// What the socket thread tells the caller once its sockets are bound.
type Bound = Result<(String, Option<String>), String>;

impl KvEventPublisher {
    /// Binds `endpoint` (`tcp://127.0.0.1:PORT`; port 0 picks a free one) and publishes
    /// under `topic`, starting with an `AllBlocksCleared` batch. No replay socket.
    pub fn bind(
        endpoint: &str,
        topic: &str,
        data_parallel_rank: Option<u32>,
    ) -> Result<Self, KvError> {
        Self::start(PublisherConfig {
            data_parallel_rank,
            ..PublisherConfig::new(endpoint, topic)
        })
    }

    /// Binds the sockets `config` names and publishes, starting with an
    /// `AllBlocksCleared` batch.
    pub fn start(config: PublisherConfig) -> Result<Self, KvError> {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel::<Bound>();
        let data_parallel_rank = config.data_parallel_rank;
        let thread = std::thread::Builder::new()
            .name("kvtier-kv-events".into())
            .spawn(move || serve(&config, &rx, &bound_tx))
            .map_err(|_| SetupError::Thread("kv events"))?;
        let (endpoint, replay_endpoint) = match bound_rx.recv() {
            Ok(Ok(bound)) => bound,
            Ok(Err(why)) => return Err(SetupError::Publisher(why).into()),
            Err(_) => return Err(SetupError::Thread("kv events").into()),
        };
        let publisher = Self {
            tx: Some(tx),
            endpoint,
            replay_endpoint,
            data_parallel_rank,
            thread: Some(thread),
            published: std::sync::atomic::AtomicU64::new(0),
        };
        publisher.publish(0.0, &[WireEvent::AllBlocksCleared]);
        Ok(publisher)
    }

    /// The endpoint it is bound to (with the port it picked).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay (ROUTER) endpoint, if it has one.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Queues one batch (sequence numbers follow the order of calls).
    pub fn publish(&self, ts: f64, events: &[WireEvent<'_>]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(encode_batch(ts, events, self.data_parallel_rank));
            self.published
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Batches published so far (the first, `AllBlocksCleared`, included): a
    /// subscriber that has sequence numbers `0..published()` has them all.
    pub fn published(&self) -> u64 {
        self.published.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has sent what was queued.
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A bound socket and the endpoint it is bound to.
type BoundSocket = (zmq::Socket, String);

/// The sockets `config` names, bound: the PUB socket and the ROUTER, if any.
fn bind(
    context: &zmq::Context,
    config: &PublisherConfig,
) -> Result<(BoundSocket, Option<BoundSocket>), String> {
    let bound = |socket: &zmq::Socket, endpoint: &str| -> Result<String, String> {
        socket
            .set_linger(LINGER_MS)
            .and_then(|()| socket.set_sndhwm(HIGH_WATER_MARK))
            .and_then(|()| socket.bind(endpoint))
            .map_err(|e| format!("{endpoint}: {e}"))?;
        match socket.get_last_endpoint() {
            Ok(Ok(endpoint)) => Ok(endpoint),
            _ => Err(format!("{endpoint}: no bound address")),
        }
    };
    let publisher = context.socket(zmq::PUB).map_err(|e| e.to_string())?;
    let endpoint = bound(&publisher, &config.endpoint)?;
    let router = match &config.replay_endpoint {
        Some(wanted) => {
            let router = context.socket(zmq::ROUTER).map_err(|e| e.to_string())?;
            let endpoint = bound(&router, wanted)?;
            Some((router, endpoint))
        }
        None => None,
    };
    Ok(((publisher, endpoint), router))
}

/// The socket thread: binds, then publishes queued batches and answers replay requests
/// until the queue closes.
fn serve(config: &PublisherConfig, rx: &Receiver<Vec<u8>>, bound: &Sender<Bound>) {
    let context = zmq::Context::new();
    let (publisher, router) = match bind(&context, config) {
        Ok(((publisher, endpoint), router)) => {
            let replay = router.as_ref().map(|(_, endpoint)| endpoint.clone());
            let _ = bound.send(Ok((endpoint, replay)));
            (publisher, router.map(|(socket, _)| socket))
        }
        Err(why) => {
            let _ = bound.send(Err(why));
            return;
        }
    };
    let topic = config.topic.as_bytes();
    let mut outbox = Outbox {
        publisher,
        topic,
        kept: VecDeque::new(),
        keep: config.keep,
        seq: 0,
    };
    loop {
        match rx.recv_timeout(POLL) {
            // Everything queued goes out before a replay request is answered, so a
            // replay holds every batch published before the request came.
            Ok(payload) => {
                outbox.publish(payload);
                while let Ok(payload) = rx.try_recv() {
                    outbox.publish(payload);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if let Some(router) = &router {
            while let Ok(request) = router.recv_multipart(zmq::DONTWAIT) {
                replay(router, topic, &outbox.kept, &request);
            }
        }
    }
}

/// The PUB side: numbers each batch, sends it, keeps the last `keep` for replay.
struct Outbox<'a> {
    publisher: zmq::Socket,
    topic: &'a [u8],
    kept: VecDeque<(u64, Vec<u8>)>,
    keep: usize,
    seq: u64,
}

impl Outbox<'_> {
    fn publish(&mut self, payload: Vec<u8>) {
        // A subscriber that is gone or too far behind loses the batch, as on any PUB
        // socket (the replay still has it).
        let _ = self.publisher.send_multipart(
            [self.topic, &self.seq.to_be_bytes()[..], &payload[..]],
            zmq::DONTWAIT,
        );
        if self.keep > 0 {
            if self.kept.len() == self.keep {
                self.kept.pop_front();
            }
            self.kept.push_back((self.seq, payload));
        }
        self.seq += 1;
    }
}

/// Answers one replay request with the kept batches from the sequence it names.
fn replay(
    router: &zmq::Socket,
    topic: &[u8],
    kept: &VecDeque<(u64, Vec<u8>)>,
    request: &[Vec<u8>],
) {
    // [identity, "", start]; anything else is not a request of this protocol.
    let (Some(identity), Some(start)) = (request.first(), request.last()) else {
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(&start[..]).map(u64::from_be_bytes) else {
        return;
    };
    let send = |seq: u64, payload: &[u8]| {
        router.send_multipart(
            [&identity[..], &[], topic, &seq.to_be_bytes()[..], payload],
            0,
        )
    };
    for (seq, payload) in kept.iter().filter(|(seq, _)| *seq >= start) {
        if send(*seq, payload).is_err() {
            return;
        }
    }
    let _ = send(u64::MAX, &[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscriber(context: &zmq::Context, endpoint: &str) -> zmq::Socket {
        let sub = context.socket(zmq::SUB).expect("a SUB socket");
        sub.connect(endpoint).expect("connect");
        sub.set_subscribe(b"").expect("subscribe");
        sub.set_rcvtimeo(50).expect("timeout");
        sub
    }

    /// A subscriber on loopback gets each batch as (topic, big-endian sequence,
    /// msgpack), the sequence counting up from the `AllBlocksCleared` batch (0).
    #[test]
    fn a_subscriber_gets_topic_sequence_and_batch() {
        let publisher = KvEventPublisher::bind("tcp://127.0.0.1:0", "kv@test", Some(0))
            .expect("binds on loopback");
        let endpoint = publisher.endpoint().to_string();
        assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
        let event = crate::vllm_events::tests::vector_event();
        let context = zmq::Context::new();
        let sub = subscriber(&context, &endpoint);
        // A subscriber misses what was sent before it joined: publish until two
        // batches arrive. One that joined in time also gets the first batch (sequence
        // 0), which says AllBlocksCleared.
        let cleared = encode_batch(0.0, &[WireEvent::AllBlocksCleared], Some(0));
        let mut received = Vec::new();
        for _ in 0..200 {
            publisher.publish(1.5, &[WireEvent::Cache(&event)]);
            while let Ok(frames) = sub.recv_multipart(0) {
                if frames[1][..] == 0u64.to_be_bytes() {
                    assert_eq!(&frames[2][..], &cleared[..]);
                    continue;
                }
                received.push(frames);
            }
            if received.len() >= 2 {
                break;
            }
        }
        assert!(received.len() >= 2, "batches arrived");
        received.truncate(2);
        let expected = encode_batch(1.5, &[WireEvent::Cache(&event)], Some(0));
        let seqs: Vec<u64> = received
            .iter()
            .map(|frames| {
                assert_eq!(frames.len(), 3);
                assert_eq!(&frames[0][..], b"kv@test");
                assert_eq!(&frames[2][..], &expected[..]);
                u64::from_be_bytes(frames[1][..].try_into().expect("8 bytes"))
            })
            .collect();
        assert!(seqs[0] >= 1, "0 is the AllBlocksCleared batch");
        assert_eq!(seqs[1], seqs[0] + 1);
    }

    /// A late subscriber asks the ROUTER socket for what it missed: the kept batches from
    /// the sequence it names, each with topic and sequence, then the end marker.
    #[test]
    fn the_router_replays_kept_batches_from_a_sequence() {
        let publisher = KvEventPublisher::start(PublisherConfig {
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            keep: 3,
            ..PublisherConfig::new("tcp://127.0.0.1:0", "kv@test")
        })
        .expect("binds on loopback");
        let event = crate::vllm_events::tests::vector_event();
        for _ in 0..4 {
            publisher.publish(2.5, &[WireEvent::Cache(&event)]);
        }
        let context = zmq::Context::new();
        let dealer = context.socket(zmq::DEALER).expect("a DEALER socket");
        dealer.set_rcvtimeo(10_000).expect("timeout");
        dealer
            .connect(publisher.replay_endpoint().expect("a replay socket"))
            .expect("connect");
        // Sequences 0..=4 were published; the last 3 are kept. Ask from 3.
        dealer
            .send_multipart([&[][..], &3u64.to_be_bytes()[..]], 0)
            .expect("ask");
        let mut messages = Vec::new();
        loop {
            let frames = dealer.recv_multipart(0).expect("an answer in time");
            let end = frames.last().is_some_and(Vec::is_empty);
            messages.push(frames);
            if end {
                break;
            }
        }
        let expected = encode_batch(2.5, &[WireEvent::Cache(&event)], None);
        let seq = |m: &Vec<Vec<u8>>| u64::from_be_bytes(m[2][..].try_into().expect("8"));
        assert_eq!(messages.len(), 3, "{messages:?}");
        for (message, want) in messages.iter().zip([3, 4]) {
            assert_eq!(message.len(), 4, "empty, topic, sequence, payload");
            assert!(message[0].is_empty());
            assert_eq!(&message[1][..], b"kv@test");
            assert_eq!(seq(message), want);
            assert_eq!(&message[3][..], &expected[..]);
        }
        assert_eq!(seq(&messages[2]), u64::MAX, "the end marker");
    }
}
