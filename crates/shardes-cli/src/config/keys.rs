//! The keys and names a config section accepts, read from its serde definition: a struct's
//! fields, an enum's variants and each variant's fields. A key or a name is then defined
//! once, where serde reads it, and the errors that refuse an unknown one can still list the
//! accepted ones (serde's own messages do not name the section, and no hint can come with
//! them).
//!
//! serde's derive hands the list of what it expects to [`de::Error::unknown_field`] and
//! [`de::Error::unknown_variant`]; deserializing a key or a name that no definition has,
//! with an error type that keeps that list, reads it. The sections probed refuse unknown
//! keys (`deny_unknown_fields`), so the probe key always reaches that error; a test checks
//! each list the config module uses.

use std::fmt;
use std::mem::discriminant;

use serde::de::{self, value::MapDeserializer, DeserializeOwned};

/// The key that names the variant of a tagged section (`[problem]`, `[task]`).
pub const TAG: &str = "name";

/// A key and a name no section has (no TOML key or name can hold a NUL).
const PROBE: &str = "\u{0}";

/// What serde expected where it met the probe (a field or a variant), or another error.
#[derive(Debug)]
enum Probe {
    Fields(&'static [&'static str]),
    Variants(&'static [&'static str]),
    Other,
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Fields(list) => write!(f, "expected a field of {list:?}"),
            Probe::Variants(list) => write!(f, "expected a variant of {list:?}"),
            Probe::Other => f.write_str("not a probe"),
        }
    }
}

impl std::error::Error for Probe {}

impl de::Error for Probe {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Probe::Other
    }
    fn unknown_field(_: &str, expected: &'static [&'static str]) -> Self {
        Probe::Fields(expected)
    }
    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        Probe::Variants(expected)
    }
}

/// How `T` refuses `entries`: at the first one it does not know, with what it expected.
fn refusal<T: DeserializeOwned>(entries: &[(&str, &str)]) -> Probe {
    match T::deserialize(MapDeserializer::<_, Probe>::new(entries.iter().copied())) {
        Err(e) => e,
        Ok(_) => Probe::Other,
    }
}

/// The keys of the struct `T`, in field order.
pub fn fields<T: DeserializeOwned>() -> &'static [&'static str] {
    match refusal::<T>(&[(PROBE, "")]) {
        Probe::Fields(list) => list,
        _ => &[],
    }
}

/// The names of the enum `T`, tagged by [`TAG`], in variant order.
pub fn variants<T: DeserializeOwned>() -> &'static [&'static str] {
    match refusal::<T>(&[(TAG, PROBE)]) {
        Probe::Variants(list) => list,
        _ => &[],
    }
}

/// The keys besides [`TAG`] of the variant `name` of `T`, a struct variant, in field order;
/// empty for a name `T` does not have.
pub fn variant_fields<T: DeserializeOwned>(name: &str) -> &'static [&'static str] {
    match refusal::<T>(&[(TAG, name), (PROBE, "")]) {
        Probe::Fields(list) => list,
        _ => &[],
    }
}

/// The variant `name` of `T` with every key unset; `None` for a name `T` does not have, or
/// a variant that needs more than its name.
pub fn named<T: DeserializeOwned>(name: &str) -> Option<T> {
    T::deserialize(MapDeserializer::<_, de::value::Error>::new(
        [(TAG, name)].into_iter(),
    ))
    .ok()
}

/// The name `value` is written with: the one of [`variants`] that reads as the same variant.
pub fn name_of<T: DeserializeOwned>(value: &T) -> &'static str {
    variants::<T>()
        .iter()
        .copied()
        .find(|name| named::<T>(name).is_some_and(|v| discriminant(&v) == discriminant(value)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Plain {
        first: u32,
        second: Option<String>,
    }

    #[derive(Deserialize, PartialEq, Debug)]
    #[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
    enum Tagged {
        OneThing { a: Option<u32>, b: Option<u32> },
        Other {},
    }

    #[test]
    fn the_lists_are_serdes() {
        assert_eq!(fields::<Plain>(), ["first", "second"]);
        assert_eq!(variants::<Tagged>(), ["one_thing", "other"]);
        assert_eq!(variant_fields::<Tagged>("one_thing"), ["a", "b"]);
        assert!(variant_fields::<Tagged>("nothing").is_empty());
        assert_eq!(
            named::<Tagged>("one_thing"),
            Some(Tagged::OneThing { a: None, b: None })
        );
        assert_eq!(named::<Tagged>("nothing"), None);
        assert_eq!(name_of(&Tagged::Other {}), "other");
        assert_eq!(
            name_of(&Tagged::OneThing {
                a: Some(1),
                b: None
            }),
            "one_thing"
        );
    }
}
