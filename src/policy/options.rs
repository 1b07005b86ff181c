//! Option parsing shared by the policies whose options are `key=value,key=value` (every policy
//! but `pytorch`, whose options follow `PYTORCH_CUDA_ALLOC_CONF`).
//!
//! A policy lists its keys once, as a `const KEYS: &[OptionKey<Options>]` table: the same table
//! drives the parser (`parse`), the help text (`help`) and the "unknown option" error, so a
//! key cannot be accepted without being documented, or documented without being accepted.

use crate::error::{quoted, Error, Result};

/// How a key's value is read and stored in the policy's options struct `O`: the kind decides the
/// parser (and so the error a bad value gets), the function only stores the parsed value.
pub enum Setter<O> {
    /// A boolean (`true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, any case): `parse_bool`.
    Bool(fn(&mut O, bool)),
    /// A byte size (`512`, `2MiB`, ...): `crate::units::parse_size`.
    Size(fn(&mut O, u64)),
    /// A whole number: `parse_int`.
    Count(fn(&mut O, u32)),
}

/// One option key a policy accepts, and how it sets the policy's options struct `O`.
pub struct OptionKey<O> {
    /// The key, as written before `=`.
    pub(crate) key: &'static str,
    /// What the value looks like, for help and errors (`SIZE`, `true|false`, `N`).
    pub(crate) value: &'static str,
    /// How the text after `=` is parsed and stored.
    pub(crate) set: Setter<O>,
}

impl<O> OptionKey<O> {
    /// A key shown in help and errors as `key=VALUE` (e.g. `SIZE (power of two)`), set by `set`.
    pub(crate) const fn new(key: &'static str, value: &'static str, set: Setter<O>) -> Self {
        OptionKey { key, value, set }
    }

    /// A boolean key, shown as `key=true|false`.
    pub(crate) const fn flag(key: &'static str, set: fn(&mut O, bool)) -> Self {
        OptionKey { key, value: "true|false", set: Setter::Bool(set) }
    }

    /// A byte-size key, shown as `key=SIZE`.
    pub(crate) const fn size(key: &'static str, set: fn(&mut O, u64)) -> Self {
        OptionKey { key, value: "SIZE", set: Setter::Size(set) }
    }

    /// A whole-number key, shown as `key=N`.
    pub(crate) const fn count(key: &'static str, set: fn(&mut O, u32)) -> Self {
        OptionKey { key, value: "N", set: Setter::Count(set) }
    }

    /// Parses `value` (the text after `=`) and stores it in `into`; errors name the key.
    pub(crate) fn apply(&self, into: &mut O, value: &str) -> Result<()> {
        match self.set {
            Setter::Bool(set) => set(into, parse_bool(self.key, value)?),
            Setter::Size(set) => set(into, crate::units::parse_size(value)?),
            Setter::Count(set) => set(into, parse_int(self.key, value)?),
        }
        Ok(())
    }
}

/// Parses `options` (`key=value,...`) with `keys`, the table of `policy`'s keys, into the
/// defaults of `O`: what every keyed policy's `from_options` starts with.
pub(crate) fn parse<O: Default>(policy: &str, options: &str, keys: &[OptionKey<O>]) -> Result<O> {
    let mut into = O::default();
    parse_key_values(options, |k, v| match keys.iter().find(|o| o.key == k) {
        Some(o) => o.apply(&mut into, v),
        None => Err(unknown_option(policy, k, keys)),
    })?;
    Ok(into)
}

/// The accepted keys as help text (`key=VALUE, key=VALUE`), or `(none)`.
pub(crate) fn help<O>(keys: &[OptionKey<O>]) -> String {
    if keys.is_empty() {
        return "(none)".to_string();
    }
    keys.iter().map(|o| format!("{}={}", o.key, o.value)).collect::<Vec<_>>().join(", ")
}

/// The error for an option key `policy` does not know, listing the ones it accepts.
pub(crate) fn unknown_option<O>(policy: &str, key: &str, keys: &[OptionKey<O>]) -> Error {
    if keys.is_empty() {
        return Error::usage(format!(
            "unknown option {key} ({policy} takes no options)",
            key = quoted(key)
        ));
    }
    Error::usage(format!(
        "unknown option {key} for {policy} (accepted: {})",
        help(keys),
        key = quoted(key)
    ))
}

/// Parses `key=value,key=value` options, calling `set(key, value)` for each.
pub(crate) fn parse_key_values(
    options: &str,
    mut set: impl FnMut(&str, &str) -> Result<()>,
) -> Result<()> {
    let mut seen: Vec<&str> = Vec::new();
    for item in options.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = item.split_once('=').ok_or_else(|| {
            Error::usage(format!("option {item} is not of the form key=value", item = quoted(item)))
        })?;
        // The last value would win while the spec's label shows both.
        if seen.contains(&key.trim()) {
            return Err(Error::usage(format!(
                "option '{}' is given twice in {options}: give each option once",
                key.trim(),
                options = quoted(options)
            )));
        }
        seen.push(key.trim());
        set(key.trim(), value.trim())?;
    }
    Ok(())
}

/// Parses a boolean option value (`true`/`false`, `1`/`0`, any case), naming `key` on error.
pub(crate) fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::usage(format!(
            "option {key}: expected true or false, got {value}",
            key = quoted(key),
            value = quoted(value)
        ))),
    }
}

/// Parses an integer option value, naming `key` on error.
pub(crate) fn parse_int<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value.parse().map_err(|_| {
        Error::usage(format!(
            "option {key}: expected an integer, got {value}",
            key = quoted(key),
            value = quoted(value)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Opts {
        on: bool,
        n: u32,
        size: Option<u64>,
    }

    const KEYS: &[OptionKey<Opts>] = &[
        OptionKey::flag("on", |o, v| o.on = v),
        OptionKey::count("n", |o, v| o.n = v),
        OptionKey::new("size", "SIZE (even)", Setter::Size(|o, v| o.size = Some(v))),
    ];

    #[test]
    fn one_table_parses_and_documents() {
        let o = parse("p", " on=yes , n=7 ", KEYS).unwrap();
        assert!(o.on);
        assert_eq!(o.n, 7);
        assert_eq!(o.size, None, "a key not given keeps its default");
        assert_eq!(parse("p", "size=2KiB", KEYS).unwrap().size, Some(2048));
        assert_eq!(help(KEYS), "on=true|false, n=N, size=SIZE (even)");
        let e = parse("p", "x=1", KEYS).err().unwrap().to_string();
        assert!(
            e.contains("unknown option 'x' for p (accepted: on=true|false, n=N, size=SIZE (even))"),
            "{e}"
        );
        let e = parse("p", "n=x", KEYS).err().unwrap().to_string();
        assert!(e.contains("option 'n': expected an integer, got 'x'"), "{e}");
        let e = parse("p", "on=maybe", KEYS).err().unwrap().to_string();
        assert!(e.contains("option 'on': expected true or false, got 'maybe'"), "{e}");
        let none: &[OptionKey<Opts>] = &[];
        let e = parse("q", "x=1", none).err().unwrap().to_string();
        assert!(e.contains("unknown option 'x' (q takes no options)"), "{e}");
        assert_eq!(help(none), "(none)");
    }
}
