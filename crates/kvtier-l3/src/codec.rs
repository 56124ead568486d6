//! The on-disk object envelope. The only module that touches `bincode` (pinned at 2.0.1,
//! which RUSTSEC-2025-0141 marks unmaintained: keep it contained here).

//!
//! An object is stored as its envelope: its key, a CRC32C of key and payload, the
//! payload. The checksum covers the key too, so a damaged key is caught when the log is
//! replayed (it would otherwise index the object under another key).

/// The envelope as one owned value: the format the borrowed forms below must match.
#[cfg(test)]
#[derive(bincode::Encode)]
struct Envelope {
    key: String,
    checksum: u32,
    payload: Vec<u8>,
}

/// An envelope read in place (no copy of the payload).
#[derive(bincode::BorrowDecode)]
struct EnvelopeView<'a> {
    key: &'a str,
    checksum: u32,
    payload: &'a [u8],
}

fn view(bytes: &[u8]) -> Option<EnvelopeView<'_>> {
    let (envelope, _) =
        bincode::borrow_decode_from_slice(bytes, bincode::config::standard()).ok()?;
    Some(envelope)
}

/// Everything of an envelope before its payload's bytes: followed by the payload, the
/// same bytes as the envelope (bincode writes a byte slice as its `u64` length, then the
/// bytes), so a put can hand the payload to the kernel without copying it first.
#[derive(bincode::Encode)]
struct Prefix<'a> {
    key: &'a str,
    checksum: u32,
    payload_len: u64,
}

/// An object's checksum: CRC32C of key and payload (hardware where the CPU has it, about
/// 13 GB/s here, where SHA-256 cost more than the disk write itself).
pub(crate) fn checksum(key: &str, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(key.as_bytes()), payload)
}

/// Encodes an object (the owned form: tests check the prefix form against it).
#[cfg(test)]
pub(crate) fn encode(key: &str, payload: &[u8]) -> Vec<u8> {
    let envelope = Envelope {
        key: key.to_owned(),
        checksum: checksum(key, payload),
        payload: payload.to_vec(),
    };
    // Encoding into a Vec cannot fail for these field types.
    bincode::encode_to_vec(&envelope, bincode::config::standard()).unwrap_or_default()
}

/// Appends the envelope's bytes before the payload to `out`, given the object's
/// [`checksum`]; returns how many. The envelope is those bytes followed by the payload.
pub(crate) fn encode_prefix(out: &mut Vec<u8>, key: &str, checksum: u32, payload: &[u8]) -> usize {
    let prefix = Prefix {
        key,
        checksum,
        payload_len: payload.len() as u64,
    };
    let start = out.len();
    // Writing into a Vec cannot fail for these field types.
    let _ = bincode::encode_into_std_write(&prefix, out, bincode::config::standard());
    out.len() - start
}

/// The payload of an object, if its key is `key` and its checksum holds.
fn verified<'a>(key: &str, bytes: &'a [u8]) -> Option<&'a [u8]> {
    let envelope = view(bytes)?;
    (envelope.key == key && envelope.checksum == checksum(key, envelope.payload))
        .then_some(envelope.payload)
}

/// Decodes an object, returning its payload only if the key and checksum match.
pub(crate) fn decode(key: &str, bytes: &[u8]) -> Option<Vec<u8>> {
    verified(key, bytes).map(<[u8]>::to_vec)
}

/// Copies an object's payload into `out` if the key and checksum match and it is
/// exactly `out`'s length; `out` is untouched otherwise.
pub(crate) fn decode_into(key: &str, bytes: &[u8], out: &mut [u8]) -> bool {
    match verified(key, bytes) {
        Some(payload) if payload.len() == out.len() => {
            out.copy_from_slice(payload);
            true
        }
        _ => false,
    }
}

/// The key and payload length of a stored object, if it decodes and its checksum holds.
pub(crate) fn verified_key(bytes: &[u8]) -> Option<(String, u64)> {
    let envelope = view(bytes)?;
    (envelope.checksum == checksum(envelope.key, envelope.payload))
        .then(|| (envelope.key.to_owned(), envelope.payload.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_then_payload_is_the_envelope() {
        let payload: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut out = vec![7u8];
        let n = encode_prefix(&mut out, "key", checksum("key", &payload), &payload);
        assert_eq!(n, out.len() - 1);
        out.extend_from_slice(&payload);
        assert_eq!(&out[1..], encode("key", &payload).as_slice());
        assert_eq!(decode("key", &out[1..]), Some(payload));
    }

    #[test]
    fn a_damaged_key_fails_the_checksum() {
        let mut bytes = encode("key-a", &[1, 2, 3]);
        assert_eq!(verified_key(&bytes), Some(("key-a".to_owned(), 3)));
        let at = bytes
            .iter()
            .position(|&b| b == b'a')
            .expect("the key's last byte");
        bytes[at] = b'b';
        assert_eq!(verified_key(&bytes), None, "not indexed under key-b");
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
