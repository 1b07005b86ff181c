//! Byte sizes on the command line and in human output.
//!
//! Users write sizes the way GPU specs and PyTorch messages do: `80GB`, `40GiB`, `512MiB`, or plain
//! bytes. Parsing and formatting live here once, so every command accepts and prints the same
//! spelling.

use crate::error::{Error, Result};

/// One mebibyte, the unit of most `PYTORCH_CUDA_ALLOC_CONF` options.
pub const MIB: u64 = 1 << 20;
/// One gibibyte.
pub const GIB: u64 = 1 << 30;

/// Parses a size such as `40GiB`, `512MiB`, `80GB`, `1.5GiB`, `4096` or `4096B`.
///
/// Binary suffixes (`KiB`, `MiB`, `GiB`, `TiB`) are powers of 1024; decimal ones (`kB`, `MB`,
/// `GB`, `TB`) powers of 1000, as GPU data sheets use them. Suffixes are case-insensitive.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => MIB,
        "gib" => GIB,
        "tib" => 1 << 40,
        _ => {
            return Err(Error::usage(format!(
                "invalid size '{text}': unknown unit '{suffix}' (accepted: B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
            )))
        }
    };
    let bad = || {
        Error::usage(format!(
            "invalid size '{text}': expected a number with an optional unit, e.g. 40GiB"
        ))
    };
    if number.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = number.parse::<u64>() {
        return n
            .checked_mul(multiplier)
            .ok_or_else(|| Error::usage(format!("size '{text}' is too large")));
    }
    let x: f64 = number.parse().map_err(|_| bad())?;
    let bytes = x * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(Error::usage(format!("size '{text}' is too large")));
    }
    Ok(bytes.round() as u64)
}

/// Parses a device capacity (`--capacity`): a size as [`parse_size`] reads it, at least 1 MiB.
///
/// No GPU has less, and a smaller value is almost always a forgotten unit (`--capacity 40` is 40
/// bytes and would OOM at the first event), so it is an error that suggests the units.
pub fn parse_capacity(text: &str) -> Result<u64> {
    let bytes = parse_size(text)?;
    if bytes < MIB {
        let n = text.trim();
        return Err(Error::usage(format!(
            "capacity '{n}' is {bytes} bytes, less than 1 MiB: give a unit, e.g. {n}GB or {n}GiB"
        )));
    }
    Ok(bytes)
}

/// A capacity as the user typed it and in GiB, for headers: `40GB (37.25 GiB)`.
pub fn describe_capacity(typed: &str, bytes: u64) -> String {
    format!("{} ({:.2} GiB)", typed.trim(), bytes as f64 / GIB as f64)
}

/// Formats bytes with a binary prefix and two decimals, as PyTorch's `format_size` does
/// (`"1023 bytes"`, `"20.00 MiB"`, `"12.66 GiB"`).
pub fn format_bytes(bytes: u64) -> String {
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / 1024.0)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_size("40GiB").unwrap(), 40 * GIB);
        assert_eq!(parse_size("512MiB").unwrap(), 512 * MIB);
        assert_eq!(parse_size("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5gib").unwrap(), 3 * GIB / 2);
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        assert!(parse_size("").is_err());
        assert!(parse_size("12 parsecs").unwrap_err().to_string().contains("'12 parsecs'"));
        assert!(parse_size("99999999999TiB").is_err());
        assert!(parse_size("-5").is_err());
    }

    #[test]
    fn capacities_below_a_mebibyte_suggest_a_unit() {
        assert_eq!(parse_capacity("40GB").unwrap(), 40_000_000_000);
        assert_eq!(parse_capacity("1MiB").unwrap(), MIB);
        let e = parse_capacity("40").unwrap_err();
        assert_eq!(e.kind().exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "capacity '40' is 40 bytes, less than 1 MiB: give a unit, e.g. 40GB or 40GiB"
        );
        assert!(parse_capacity("1048575").is_err());
        assert!(parse_capacity("forty").unwrap_err().to_string().contains("'forty'"));
        assert_eq!(describe_capacity("40GB", 40_000_000_000), "40GB (37.25 GiB)");
    }

    #[test]
    fn formats_like_pytorch() {
        assert_eq!(format_bytes(1024), "1024 bytes");
        assert_eq!(format_bytes(20 * MIB), "20.00 MiB");
        assert_eq!(format_bytes(12_660_506_624), "11.79 GiB");
    }
}
