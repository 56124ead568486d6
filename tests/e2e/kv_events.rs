//! KV events on the wire, read by libzmq: a Python subscriber with pyzmq
//! (`tools/kv_events/subscribe.py`; `cargo xtask ci` installs it and sets
//! `KVTIER_PYZMQ_PYTHON`) receives kvtier's PUB messages as (topic, 8-byte big-endian
//! sequence, `KVEventBatch` msgpack), the sequence counting up by one.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use kvtier::kv_publisher::KvEventPublisher;
use kvtier::vllm_events::{WireEvent, encode_batch};
use kvtier_types::{KvEvent, Medium};

use crate::common::tool_from_env;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn libzmq_reads_the_published_batches() {
    let Some(python) = tool_from_env("KVTIER_PYZMQ_PYTHON", "pyzmq") else {
        return;
    };
    let publisher = KvEventPublisher::bind("tcp://127.0.0.1:0", "kvtier", Some(0)).expect("binds");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tools/kv_events/subscribe.py"
    );
    let mut child = Command::new(python)
        .arg(script)
        .arg(publisher.endpoint())
        .arg("2")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the subscriber starts");
    let (lines_tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(20)).as_deref(),
        Ok("ready")
    );
    let event = KvEvent::BlockStored {
        block_hashes: vec![111],
        parent_block_hash: None,
        token_ids: vec![1, 2, 3, 4],
        block_size: 4,
        medium: Medium::Device,
    };
    // A subscriber misses what was sent before it joined: publish until two arrive.
    let mut received = Vec::new();
    for _ in 0..400 {
        publisher.publish(1.5, &[WireEvent::Cache(&event)]);
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(50)) {
            received.push(line);
            if received.len() == 2 {
                break;
            }
        }
    }
    assert!(child.wait().expect("the subscriber ends").success());
    assert_eq!(received.len(), 2, "{received:?}");
    let payload = hex(&encode_batch(1.5, &[WireEvent::Cache(&event)], Some(0)));
    let seqs: Vec<u64> = received
        .iter()
        .map(|line| {
            let frames: Vec<&str> = line.split(' ').collect();
            assert_eq!(frames.len(), 3, "{line}");
            assert_eq!(frames[0], hex(b"kvtier"));
            assert_eq!(frames[2], payload);
            u64::from_str_radix(frames[1], 16).expect("8 bytes of sequence")
        })
        .collect();
    assert!(seqs[0] >= 1, "0 is the AllBlocksCleared batch");
    assert_eq!(seqs[1], seqs[0] + 1);
}
