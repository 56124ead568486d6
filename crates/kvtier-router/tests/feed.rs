//! The router's side of the KV event wire against kvtier's publisher: what it encodes
//! decodes to the same blocks, and a subscriber that joins after batches went out gets
//! them through the publisher's replay socket, in order, each once.

use kvtier::kv_publisher::{KvEventPublisher, PublisherConfig};
use kvtier::vllm_events::{WireEvent, encode_batch};
use kvtier_router::{Event, Feed, KvIndex, Medium, decode_batch};
use kvtier_types::KvEvent;

fn stored(hashes: &[u64], parent: Option<u64>, medium: kvtier_types::Medium) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: vec![1; 2 * hashes.len()],
        block_size: 2,
        medium,
    }
}

#[test]
fn what_kvtier_encodes_decodes_to_the_same_blocks() {
    let events = [
        stored(&[1, u64::MAX], None, kvtier_types::Medium::Device),
        stored(&[3], Some(u64::MAX), kvtier_types::Medium::Storage),
        KvEvent::BlockRemoved {
            block_hashes: vec![1],
            medium: kvtier_types::Medium::Host,
        },
    ];
    let mut wired: Vec<WireEvent<'_>> = vec![WireEvent::AllBlocksCleared];
    wired.extend(events.iter().map(WireEvent::Cache));
    let batch = decode_batch(&encode_batch(12.5, &wired, Some(3))).unwrap();
    assert_eq!(batch.ts, 12.5);
    assert_eq!(batch.data_parallel_rank, Some(3));
    assert_eq!(
        batch.events,
        [
            Event::AllCleared,
            Event::Stored {
                hashes: vec![1, u64::MAX],
                medium: Medium::Gpu
            },
            Event::Stored {
                hashes: vec![3],
                medium: Medium::Disk
            },
            Event::Removed {
                hashes: vec![1],
                medium: Medium::Cpu
            },
        ]
    );
    let bytes = encode_batch(1.0, &wired, None);
    for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
        assert!(decode_batch(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    assert!(decode_batch(&[bytes.clone(), vec![0]].concat()).is_err());
}

#[test]
fn a_late_subscriber_gets_what_it_missed_by_replay_and_holds_the_future_back() {
    let publisher = KvEventPublisher::start(PublisherConfig {
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        ..PublisherConfig::new("tcp://127.0.0.1:0", "kv-events")
    })
    .unwrap();
    // Published before anyone subscribed: only a replay has these.
    publisher.publish(
        1.0,
        &[WireEvent::Cache(&stored(
            &[10],
            None,
            kvtier_types::Medium::Device,
        ))],
    );
    publisher.publish(
        2.0,
        &[WireEvent::Cache(&stored(
            &[11],
            Some(10),
            kvtier_types::Medium::Device,
        ))],
    );
    let mut feed = Feed::connect(&[(
        publisher.endpoint().to_owned(),
        publisher.replay_endpoint().map(str::to_owned),
    )])
    .unwrap();
    feed.receive(&[publisher.published()]).unwrap();
    publisher.publish(
        5.0,
        &[WireEvent::Cache(&stored(
            &[12],
            Some(11),
            kvtier_types::Medium::Host,
        ))],
    );
    feed.receive(&[publisher.published()]).unwrap();
    let stats = feed.stats();
    assert_eq!(
        stats.batches, 4,
        "AllBlocksCleared and three batches, each once"
    );
    assert!(stats.replays >= 1);
    let mut index = KvIndex::new(1).unwrap();
    // At t = 2 s the batch of t = 5 s is still in flight.
    feed.apply_until(2.0, &mut index);
    assert_eq!(index.matched_blocks(&[10, 11, 12], false), [2]);
    feed.apply_until(5.0, &mut index);
    assert_eq!(index.matched_blocks(&[10, 11, 12], false), [3]);
    assert!(
        Feed::connect(&[("tcp://10.0.0.1:5555".into(), None)]).is_err(),
        "loopback only"
    );
}
