//! The on-disk object envelope. The only module that touches `bincode` (pinned at 2.0.1,
//! which RUSTSEC-2025-0141 marks unmaintained: keep it contained here).

use sha2::{Digest, Sha256};

/// An object as stored: its key, a checksum of the payload, the payload.
#[derive(bincode::Encode, bincode::Decode)]
struct Envelope {
    key: String,
    checksum: [u8; 32],
    payload: Vec<u8>,
}

fn checksum(payload: &[u8]) -> [u8; 32] {
    Sha256::digest(payload).into()
}

/// Encodes an object.
pub(crate) fn encode(key: &str, payload: &[u8]) -> Vec<u8> {
    let envelope = Envelope {
        key: key.to_owned(),
        checksum: checksum(payload),
        payload: payload.to_vec(),
    };
    // Encoding into a Vec cannot fail for these field types.
    bincode::encode_to_vec(&envelope, bincode::config::standard()).unwrap_or_default()
}

/// Decodes an object, returning its payload only if the key and checksum match.
pub(crate) fn decode(key: &str, bytes: &[u8]) -> Option<Vec<u8>> {
    let (envelope, _): (Envelope, usize) =
        bincode::decode_from_slice(bytes, bincode::config::standard()).ok()?;
    (envelope.key == key && envelope.checksum == checksum(&envelope.payload))
        .then_some(envelope.payload)
}

/// The key and payload length of a stored object, if it decodes and its checksum holds.
pub(crate) fn verified_key(bytes: &[u8]) -> Option<(String, u64)> {
    let (envelope, _): (Envelope, usize) =
        bincode::decode_from_slice(bytes, bincode::config::standard()).ok()?;
    let len = envelope.payload.len() as u64;
    (envelope.checksum == checksum(&envelope.payload)).then_some((envelope.key, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let bytes = encode("k", &[1, 2, 3]);
        assert_eq!(decode("k", &bytes), Some(vec![1, 2, 3]));
        assert_eq!(
            decode("other", &bytes),
            None,
            "a renamed object is not this key's"
        );
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(decode("k", &bad), None);
        assert_eq!(decode("k", &bytes[..bytes.len() / 2]), None, "truncated");
    }
}
