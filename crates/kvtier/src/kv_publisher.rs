//! KV events over ZeroMQ, as vLLM publishes them: a PUB socket sends each batch as a
//! multipart message (topic, 8-byte big-endian sequence number, the `KVEventBatch`
//! msgpack of [`crate::vllm_events`]). The first batch says `AllBlocksCleared`, so a
//! subscriber starts from an empty index.
//!
//! The socket lives on a thread of its own (a current-thread tokio runtime): `publish`
//! only queues the batch, so a slow or absent subscriber never holds up a step.

use std::thread::JoinHandle;

use zeromq::{Socket, SocketSend, ZmqMessage};

use crate::vllm_events::{WireEvent, encode_batch};
use crate::{KvError, SetupError};

/// A PUB socket publishing KV event batches. Stops (after sending what is queued) when
/// dropped.
#[derive(Debug)]
pub struct KvEventPublisher {
    tx: Option<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
    endpoint: String,
    thread: Option<JoinHandle<()>>,
}

impl KvEventPublisher {
    /// Binds `endpoint` (`tcp://127.0.0.1:PORT`; port 0 picks a free one) and publishes
    /// under `topic`, starting with an `AllBlocksCleared` batch.
    pub fn bind(
        endpoint: &str,
        topic: &str,
        data_parallel_rank: Option<u32>,
    ) -> Result<Self, KvError> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (endpoint, topic) = (endpoint.to_string(), topic.as_bytes().to_vec());
        let thread = std::thread::Builder::new()
            .name("kvtier-kv-events".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = bound_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut socket = zeromq::PubSocket::new();
                    match socket.bind(&endpoint).await {
                        Ok(bound) => {
                            let _ = bound_tx.send(Ok(bound.to_string()));
                        }
                        Err(e) => {
                            let _ = bound_tx.send(Err(e.to_string()));
                            return;
                        }
                    }
                    let mut seq: u64 = 0;
                    while let Some(payload) = rx.recv().await {
                        let mut message = ZmqMessage::from(topic.clone());
                        message.push_back(seq.to_be_bytes().to_vec().into());
                        message.push_back(payload.into());
                        // No subscriber, or one that went away: the batch is lost, as
                        // on any PUB socket.
                        let _ = socket.send(message).await;
                        seq += 1;
                    }
                });
            })
            .map_err(|_| SetupError::Thread("kv events"))?;
        let endpoint = match bound_rx.recv() {
            Ok(Ok(endpoint)) => endpoint,
            Ok(Err(why)) => return Err(SetupError::Publisher(why).into()),
            Err(_) => return Err(SetupError::Thread("kv events").into()),
        };
        let publisher = Self {
            tx: Some(tx),
            endpoint,
            thread: Some(thread),
        };
        publisher.publish(0.0, &[WireEvent::AllBlocksCleared], data_parallel_rank);
        Ok(publisher)
    }

    /// The endpoint it is bound to (with the port it picked).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Queues one batch (sequence numbers follow the order of calls).
    pub fn publish(&self, ts: f64, events: &[WireEvent<'_>], data_parallel_rank: Option<u32>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(encode_batch(ts, events, data_parallel_rank));
        }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use zeromq::SocketRecv;

    use super::*;

    /// A subscriber on loopback gets each batch as (topic, big-endian sequence,
    /// msgpack), the sequence counting up from the `AllBlocksCleared` batch (0).
    #[test]
    fn a_subscriber_gets_topic_sequence_and_batch() {
        let publisher = KvEventPublisher::bind("tcp://127.0.0.1:0", "kv@test", Some(0))
            .expect("binds on loopback");
        let endpoint = publisher.endpoint().to_string();
        assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
        let event = crate::vllm_events::tests::vector_event();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let received = runtime.block_on(async {
            let mut sub = zeromq::SubSocket::new();
            sub.connect(&endpoint).await.expect("connect");
            sub.subscribe("").await.expect("subscribe");
            // A subscriber misses what was sent before it joined: publish until two
            // batches arrive.
            let mut received = Vec::new();
            for _ in 0..200 {
                publisher.publish(1.5, &[WireEvent::Cache(&event)], Some(0));
                if let Ok(Ok(message)) =
                    tokio::time::timeout(Duration::from_millis(50), sub.recv()).await
                {
                    received.push(message.into_vec());
                    if received.len() == 2 {
                        break;
                    }
                }
            }
            received
        });
        assert_eq!(received.len(), 2, "batches arrived");
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
}
