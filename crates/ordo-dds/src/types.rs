//! Sample types: what a `Topic<T>` carries.
//!
//! A type implements [`TopicType`]: its name (checked against the topic's
//! `type_name`), its serialized form and, for keyed topics, its instance
//! key. Provided: [`Bytes`] (the paper's *Sequence* type: a byte sequence),
//! `String`, [`Json`] (any serde type, keyless) and [`KeyedJson`] (serde,
//! keyed by [`JsonKey`]), and [`Pod`] (plain-old-data, written **in place**
//! in the ring slot through [`crate::DataWriter::loan`], read without a
//! copy).

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A sample type.
pub trait TopicType: Sized + Send + 'static {
    /// The type's name, compared with the topic's `type_name` when that is
    /// set (a mismatch is an error, never a misread sample).
    fn type_name() -> String;
    /// Bytes of the serialized sample.
    fn encoded_len(&self) -> usize;
    /// Writes exactly `encoded_len()` bytes.
    fn encode(&self, out: &mut [u8]);
    /// Reads a sample back; bad bytes are an error.
    fn decode(bytes: &[u8]) -> Result<Self, String>;
    /// The instance key (empty for keyless types), at most
    /// [`crate::sample::MAX_KEY`] bytes.
    fn key(&self) -> Vec<u8> {
        Vec::new()
    }
}

/// A byte sequence (spindle §IV-F's *Sequence* type).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl TopicType for Bytes {
    fn type_name() -> String {
        "bytes".into()
    }
    fn encoded_len(&self) -> usize {
        self.0.len()
    }
    fn encode(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.0);
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(Bytes(bytes.to_vec()))
    }
}

impl TopicType for String {
    fn type_name() -> String {
        "string".into()
    }
    fn encoded_len(&self) -> usize {
        self.len()
    }
    fn encode(&self, out: &mut [u8]) {
        out.copy_from_slice(self.as_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())
    }
}

/// Any serde type, as JSON, keyless.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Json<T>(pub T);

fn json<T: Serialize>(t: &T) -> Vec<u8> {
    serde_json::to_vec(t).expect("a serde type serializes to JSON")
}

impl<T: Serialize + DeserializeOwned + Send + 'static> TopicType for Json<T> {
    fn type_name() -> String {
        format!("json:{}", std::any::type_name::<T>())
    }
    fn encoded_len(&self) -> usize {
        json(&self.0).len()
    }
    fn encode(&self, out: &mut [u8]) {
        out.copy_from_slice(&json(&self.0));
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map(Json).map_err(|e| e.to_string())
    }
}

/// The instance key of a serde type (DDS `@key` fields).
pub trait JsonKey {
    /// The key's bytes (at most [`crate::sample::MAX_KEY`]).
    fn key(&self) -> Vec<u8>;
}

/// A serde type, as JSON, keyed by [`JsonKey`]: `KEEP_LAST(n)` readers keep
/// `n` samples per key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyedJson<T>(pub T);

impl<T: Serialize + DeserializeOwned + JsonKey + Send + 'static> TopicType for KeyedJson<T> {
    fn type_name() -> String {
        format!("keyed-json:{}", std::any::type_name::<T>())
    }
    fn encoded_len(&self) -> usize {
        json(&self.0).len()
    }
    fn encode(&self, out: &mut [u8]) {
        out.copy_from_slice(&json(&self.0));
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map(KeyedJson).map_err(|e| e.to_string())
    }
    fn key(&self) -> Vec<u8> {
        self.0.key()
    }
}

/// A plain-old-data type (`bytemuck::Pod`, alignment at most 8): its bytes
/// are the sample. Writers construct it in the ring slot
/// ([`crate::DataWriter::loan`]); readers can view it in place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pod<T>(pub T);

impl<T: bytemuck::Pod + Send> TopicType for Pod<T> {
    fn type_name() -> String {
        format!("pod:{}:{}", std::any::type_name::<T>(), std::mem::size_of::<T>())
    }
    fn encoded_len(&self) -> usize {
        std::mem::size_of::<T>()
    }
    fn encode(&self, out: &mut [u8]) {
        out.copy_from_slice(bytemuck::bytes_of(&self.0));
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != std::mem::size_of::<T>() {
            return Err(format!("{} bytes for a {}-byte type", bytes.len(), std::mem::size_of::<T>()));
        }
        Ok(Pod(bytemuck::pod_read_unaligned(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Reading {
        sensor: String,
        value: f64,
    }
    impl JsonKey for Reading {
        fn key(&self) -> Vec<u8> {
            self.sensor.as_bytes().to_vec()
        }
    }

    fn round_trip<T: TopicType + PartialEq + std::fmt::Debug>(t: T) {
        let mut b = vec![0; t.encoded_len()];
        t.encode(&mut b);
        assert_eq!(T::decode(&b).unwrap(), t);
    }

    #[test]
    fn types_round_trip_and_refuse_garbage() {
        round_trip(Bytes(vec![1, 2, 3]));
        round_trip("héllo".to_string());
        round_trip(Json(vec![1u32, 2, 3]));
        round_trip(KeyedJson(Reading { sensor: "a".into(), value: 1.5 }));
        round_trip(Pod([7u64, 8]));
        assert_eq!(KeyedJson(Reading { sensor: "k1".into(), value: 0.0 }).key(), b"k1");
        assert!(String::decode(&[0xff, 0xfe]).is_err());
        assert!(Json::<Vec<u32>>::decode(b"{").is_err());
        assert!(Pod::<u64>::decode(&[1, 2, 3]).is_err());
        assert_ne!(Pod::<u64>::type_name(), Pod::<i64>::type_name());
    }
}
