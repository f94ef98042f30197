//! A JSON object's keys written twice. `serde_json` keeps the last value of a repeated key
//! without a word; in a file where each key names one thing (a safetensors header's tensors, an
//! expert-load file's layers) a second entry is a corrupt or mistaken file, and keeping either
//! silently gives a wrong answer. [`repeated_key`] finds the first repeat of the top-level
//! object, so readers can refuse it at its line.

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use std::collections::HashSet;
use std::fmt;

/// The first key of the top-level JSON object in `json` that is written a second time; `None`
/// when every key is written once, or when `json` is not an object (its reader says so).
pub fn repeated_key(json: &[u8]) -> Option<String> {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
            // Read to the end: the deserializer refuses a map left half read.
            let mut seen = HashSet::new();
            let mut repeated = None;
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if repeated.is_none() && !seen.insert(key.clone()) {
                    repeated = Some(key);
                }
            }
            Ok(repeated)
        }
    }
    serde_json::Deserializer::from_slice(json).deserialize_map(Keys).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::repeated_key;

    #[test]
    fn the_first_repeated_top_level_key_is_found() {
        assert_eq!(repeated_key(br#"{"a": 1, "b": {"a": 2}, "a": 3}"#), Some("a".into()));
        assert_eq!(
            repeated_key(br#"{"a": 1, "a": 3, "b": 2, "b": 4}"#),
            Some("a".into()),
            "not the last key"
        );
        assert_eq!(
            repeated_key(br#"{"a": {"x": 1, "x": 2}}"#),
            None,
            "nested objects are their readers' own"
        );
        assert_eq!(repeated_key(br#"{"a": 1, "b": 2}"#), None);
        assert_eq!(repeated_key(b"[1, 2]"), None);
        assert_eq!(repeated_key(b"{\"a\": "), None, "malformed: the reader reports it");
    }
}
