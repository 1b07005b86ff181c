//! Option parsing shared by the policies whose options are `key=value,key=value` (every policy
//! but `pytorch`, whose options follow `PYTORCH_CUDA_ALLOC_CONF`).
//!
//! A policy lists its keys once, as a `const KEYS: &[OptionKey<Options>]` table: the same table
//! drives the parser ([`parse`]), the help text ([`help`]) and the "unknown option" error, so a
//! key cannot be accepted without being documented, or documented without being accepted.

use crate::error::{Error, Result};

/// One option key a policy accepts, and how it sets the policy's options struct `O`.
pub struct OptionKey<O> {
    /// The key, as written before `=`.
    pub key: &'static str,
    /// What the value looks like, for help and errors (`SIZE`, `true|false`, `N`).
    pub value: &'static str,
    /// Stores `value` (the text after `=`) in the options; the key is passed for error messages.
    pub set: fn(&mut O, key: &str, value: &str) -> Result<()>,
}

/// Parses `options` (`key=value,...`) into `into` with `keys`, the table of `policy`'s keys.
pub fn parse<O>(policy: &str, options: &str, keys: &[OptionKey<O>], into: &mut O) -> Result<()> {
    parse_key_values(options, |k, v| match keys.iter().find(|o| o.key == k) {
        Some(o) => (o.set)(into, k, v),
        None => Err(unknown_option(policy, k, keys)),
    })
}

/// The accepted keys as help text (`key=VALUE, key=VALUE`), or `(none)`.
pub fn help<O>(keys: &[OptionKey<O>]) -> String {
    if keys.is_empty() {
        return "(none)".to_string();
    }
    keys.iter().map(|o| format!("{}={}", o.key, o.value)).collect::<Vec<_>>().join(", ")
}

/// The error for an option key `policy` does not know, listing the ones it accepts.
pub fn unknown_option<O>(policy: &str, key: &str, keys: &[OptionKey<O>]) -> Error {
    if keys.is_empty() {
        return Error::usage(format!("unknown option '{key}' ({policy} takes no options)"));
    }
    Error::usage(format!("unknown option '{key}' for {policy} (accepted: {})", help(keys)))
}

/// Parses `key=value,key=value` options, calling `set(key, value)` for each.
pub fn parse_key_values(
    options: &str,
    mut set: impl FnMut(&str, &str) -> Result<()>,
) -> Result<()> {
    for item in options.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| Error::usage(format!("option '{item}' is not of the form key=value")))?;
        set(key.trim(), value.trim())?;
    }
    Ok(())
}

/// Parses a boolean option value (`true`/`false`, `1`/`0`, any case), naming `key` on error.
pub fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::usage(format!("option '{key}': expected true or false, got '{value}'"))),
    }
}

/// Parses an integer option value, naming `key` on error.
pub fn parse_int<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| Error::usage(format!("option '{key}': expected an integer, got '{value}'")))
}

/// Parses a size option value (`512`, `2MiB`, ...): [`crate::units::parse_size`], for the tables.
pub fn parse_size(_key: &str, value: &str) -> Result<u64> {
    crate::units::parse_size(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Opts {
        on: bool,
        n: u32,
    }

    const KEYS: &[OptionKey<Opts>] = &[
        OptionKey {
            key: "on",
            value: "true|false",
            set: |o, k, v| {
                o.on = parse_bool(k, v)?;
                Ok(())
            },
        },
        OptionKey {
            key: "n",
            value: "N",
            set: |o, k, v| {
                o.n = parse_int(k, v)?;
                Ok(())
            },
        },
    ];

    #[test]
    fn one_table_parses_and_documents() {
        let mut o = Opts::default();
        parse("p", " on=yes , n=7 ", KEYS, &mut o).unwrap();
        assert!(o.on);
        assert_eq!(o.n, 7);
        assert_eq!(help(KEYS), "on=true|false, n=N");
        let e = parse("p", "x=1", KEYS, &mut o).unwrap_err().to_string();
        assert!(e.contains("unknown option 'x' for p (accepted: on=true|false, n=N)"), "{e}");
        let e = parse("p", "n=x", KEYS, &mut o).unwrap_err().to_string();
        assert!(e.contains("option 'n': expected an integer, got 'x'"), "{e}");
        let none: &[OptionKey<Opts>] = &[];
        let e = parse("q", "x=1", none, &mut o).unwrap_err().to_string();
        assert!(e.contains("unknown option 'x' (q takes no options)"), "{e}");
        assert_eq!(help(none), "(none)");
    }
}
