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

/// The same envelope over borrowed fields: encodes to the same bytes without copying
/// the payload first.
#[derive(bincode::Encode)]
struct EnvelopeRef<'a> {
    key: &'a str,
    checksum: [u8; 32],
    payload: &'a [u8],
}

fn checksum(payload: &[u8]) -> [u8; 32] {
    Sha256::digest(payload).into()
}

/// Encodes an object (the owned form: tests check the borrowed one against it).
#[cfg(test)]
pub(crate) fn encode(key: &str, payload: &[u8]) -> Vec<u8> {
    let envelope = Envelope {
        key: key.to_owned(),
        checksum: checksum(payload),
        payload: payload.to_vec(),
    };
    // Encoding into a Vec cannot fail for these field types.
    bincode::encode_to_vec(&envelope, bincode::config::standard()).unwrap_or_default()
}

/// Encodes an object at the end of `out` (one copy of the payload); returns the bytes
/// appended.
pub(crate) fn encode_into(out: &mut Vec<u8>, key: &str, payload: &[u8]) -> usize {
    let envelope = EnvelopeRef {
        key,
        checksum: checksum(payload),
        payload,
    };
    let start = out.len();
    // Writing into a Vec cannot fail for these field types.
    let _ = bincode::encode_into_std_write(&envelope, out, bincode::config::standard());
    out.len() - start
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
    fn the_borrowed_encoding_is_the_owned_one() {
        let mut out = vec![7u8];
        let n = encode_into(&mut out, "key", &[1, 2, 3, 4]);
        assert_eq!(&out[1..], encode("key", &[1, 2, 3, 4]).as_slice());
        assert_eq!(n, out.len() - 1);
        assert_eq!(decode("key", &out[1..]), Some(vec![1, 2, 3, 4]));
    }

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
