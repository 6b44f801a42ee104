//! The sample envelope: what one vsync message of a topic carries.
//!
//! ```text
//! 0      1      2        4          8              16               24
//! | 0xD5 | 0    | keylen | datalen  | writer seq   | source time ns | key, padded to 8 | data |
//! ```
//!
//! # Invariants
//! - A payload decodes only if its length is exactly
//!   `24 + pad8(keylen) + datalen`: a peer cannot make a reader look past
//!   the message it sent.
//! - The data starts 8-aligned relative to the payload (ring payloads
//!   start 8-aligned), so plain-old-data samples of alignment ≤ 8 are written
//!   and read in place.

/// First byte of every envelope.
pub const MAGIC: u8 = 0xD5;
/// Bytes before the key.
pub const HEADER: usize = 24;
/// Longest instance key.
pub const MAX_KEY: usize = 256;

/// Bytes of an envelope around `key_len` key bytes and `data_len` data bytes.
pub fn encoded_len(key_len: usize, data_len: usize) -> usize {
    HEADER + key_len.next_multiple_of(8) + data_len
}

/// Where the data starts.
pub fn data_offset(key_len: usize) -> usize {
    HEADER + key_len.next_multiple_of(8)
}

/// Writes the header and key into `buf` (exactly `encoded_len` bytes);
/// the caller writes the data at [`data_offset`].
pub fn write_header(buf: &mut [u8], seq: u64, source_ns: u64, key: &[u8]) {
    assert!(key.len() <= MAX_KEY, "key of {} bytes", key.len());
    let data_len = buf.len() - data_offset(key.len());
    buf[0] = MAGIC;
    buf[1] = 0;
    buf[2..4].copy_from_slice(&(key.len() as u16).to_le_bytes());
    buf[4..8].copy_from_slice(&(data_len as u32).to_le_bytes());
    buf[8..16].copy_from_slice(&seq.to_le_bytes());
    buf[16..24].copy_from_slice(&source_ns.to_le_bytes());
    buf[HEADER..HEADER + key.len()].copy_from_slice(key);
    buf[HEADER + key.len()..data_offset(key.len())].fill(0);
}

/// A decoded envelope: offsets into its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The writer's sequence number (1, 2, … per publishing member and topic).
    pub seq: u64,
    /// The writer's clock when it wrote the sample (Unix ns).
    pub source_ns: u64,
    /// Key bytes: `HEADER..HEADER + key_len`.
    pub key_len: u16,
    /// Data bytes start here.
    pub data_at: u32,
}

impl Envelope {
    /// Decodes `b`, checking every length against `b`'s.
    pub fn decode(b: &[u8]) -> Result<Envelope, &'static str> {
        if b.len() < HEADER || b[0] != MAGIC || b[1] != 0 {
            return Err("not an ordo-dds sample");
        }
        let key_len = u16::from_le_bytes([b[2], b[3]]);
        let data_len = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
        if usize::from(key_len) > MAX_KEY {
            return Err("key longer than MAX_KEY");
        }
        if encoded_len(key_len.into(), data_len) != b.len() {
            return Err("sample lengths do not add up to the message");
        }
        Ok(Envelope {
            seq: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            source_ns: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            key_len,
            data_at: data_offset(key_len.into()) as u32,
        })
    }

    /// The key within the payload it was decoded from.
    pub fn key<'a>(&self, b: &'a [u8]) -> &'a [u8] {
        &b[HEADER..HEADER + usize::from(self.key_len)]
    }

    /// The data within the payload it was decoded from.
    pub fn data<'a>(&self, b: &'a [u8]) -> &'a [u8] {
        &b[self.data_at as usize..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(key in proptest::collection::vec(any::<u8>(), 0..40), data in proptest::collection::vec(any::<u8>(), 0..300), seq: u64, ns: u64) {
            let mut b = vec![0xAA; encoded_len(key.len(), data.len())];
            write_header(&mut b, seq, ns, &key);
            let at = data_offset(key.len());
            b[at..].copy_from_slice(&data);
            let e = Envelope::decode(&b).unwrap();
            prop_assert_eq!((e.seq, e.source_ns), (seq, ns));
            prop_assert_eq!(e.key(&b), &key[..]);
            prop_assert_eq!(e.data(&b), &data[..]);
            prop_assert_eq!(e.data_at % 8, 0);
            // Any cut or extension is refused.
            for cut in 0..b.len() {
                prop_assert!(Envelope::decode(&b[..cut]).is_err());
            }
            let mut longer = b.clone();
            longer.push(0);
            prop_assert!(Envelope::decode(&longer).is_err());
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(e) = Envelope::decode(&b) {
                let _ = (e.key(&b), e.data(&b));
            }
        }
    }

    #[test]
    fn a_lying_length_is_refused() {
        let mut b = vec![0; encoded_len(3, 10)];
        write_header(&mut b, 1, 2, b"abc");
        b[4..8].copy_from_slice(&1000u32.to_le_bytes());
        assert!(Envelope::decode(&b).is_err());
        b[4..8].copy_from_slice(&10u32.to_le_bytes());
        b[2..4].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(Envelope::decode(&b).is_err());
    }
}
