//! Byte sizes on the command line and in human output.
//!
//! Users write sizes the way GPU specs and PyTorch messages do: `80GB`, `40GiB`, `512MiB`, or plain
//! bytes. Parsing and formatting live here once, so every command accepts and prints the same
//! spelling.

use crate::error::{Error, Result};

pub mod cards;
pub mod spelling;

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
    if t.starts_with('-') {
        return Err(Error::usage(format!("invalid size '{text}': a size is not negative")));
    }
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

/// Parses a device capacity (`--capacity`): a size as `parse_size` reads it, at least 1 MiB.
///
/// No GPU has less, and a smaller value is almost always a forgotten unit (`--capacity 40` is 40
/// bytes and would OOM at the first event), so it is an error that suggests the units.
///
/// Suffixes are exact: `GB` is 10⁹ bytes, `GiB` 2³⁰. A one-letter unit (`40G`) could mean either,
/// so it is refused with both readings; a negative or zero size is refused with what to give.
pub fn parse_capacity(text: &str) -> Result<u64> {
    let n = text.trim();
    if let Some(rest) = n.strip_prefix('-') {
        return Err(Error::usage(format!(
            "capacity '{n}' is negative: give the device memory as a positive size, e.g. {rest}, \
             or 'none' for unlimited"
        )));
    }
    let split = n.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(n.len());
    let (number, unit) = n.split_at(split);
    if let Some(letter) = ["K", "M", "G", "T"].iter().find(|u| unit.trim().eq_ignore_ascii_case(u))
    {
        let (si, iec) = (format!("{number}{letter}B"), format!("{number}{letter}iB"));
        let bytes = |t: &str| parse_size(t).map(|b| format!("{b} B")).unwrap_or_default();
        return Err(Error::usage(format!(
            "capacity '{n}' is ambiguous: write {si} ({}) or {iec} ({})",
            bytes(&si),
            bytes(&iec)
        )));
    }
    let bytes = parse_size(n)?;
    if bytes == 0 {
        return Err(Error::usage(format!(
            "capacity '{n}' is 0 bytes, which holds no allocation: give the device memory, e.g. \
             40GiB or 80GB, or 'none' for unlimited"
        )));
    }
    if bytes < MIB {
        // A bare number lacks its unit; a number that has one is just too small.
        let hint = if unit.trim().is_empty() || unit.trim().eq_ignore_ascii_case("b") {
            format!("give a unit, e.g. {number}GB or {number}GiB")
        } else {
            "no GPU has less: give the device memory, e.g. 40GiB or 80GB".to_string()
        };
        return Err(Error::usage(format!(
            "capacity '{n}' is {bytes} bytes, less than 1 MiB: {hint}"
        )));
    }
    Ok(bytes)
}

/// A capacity as the user typed it and in GiB, for headers: `40GB (37.25 GiB)`.
pub fn describe_capacity(typed: &str, bytes: u64) -> String {
    format!("{} ({:.2} GiB)", typed.trim(), bytes as f64 / GIB as f64)
}

/// The binary units human output uses, largest first: (bytes, long name, one-letter name).
const UNITS: [(u64, &str, &str); 4] =
    [(1 << 40, "TiB", "T"), (GIB, "GiB", "G"), (MIB, "MiB", "M"), (1 << 10, "KiB", "K")];

/// Formats bytes with a binary prefix and two decimals, in the spelling of PyTorch's
/// `format_size` (`"1023 bytes"`, `"20.00 MiB"`, `"12.66 GiB"`), GiB at most.
///
/// Each unit starts at its own size, so 1 MiB prints as `1.00 MiB` (PyTorch, and fragsim before,
/// printed `1024.00 KiB`), and a size that would round to `1024.00` of one unit prints in the next.
pub fn format_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    // The largest unit in which the next smaller one would show 1024.00 or more.
    let &(unit, name, _) = UNITS[1..]
        .iter()
        .find(|&&(unit, _, _)| (bytes as f64 / (unit / 1024) as f64 * 100.0).round() >= 102_400.0)
        .unwrap_or(&UNITS[3]);
    format!("{:.2} {name}", bytes as f64 / unit as f64)
}

/// Bytes in three significant digits with a one-letter binary unit: `640M`, `22.9G`, `12K`
/// (chart labels, where space is short).
pub fn compact_bytes(bytes: u64) -> String {
    for (unit, _, name) in UNITS {
        if bytes >= unit {
            let v = bytes as f64 / unit as f64;
            return if v >= 100.0 {
                format!("{v:.0}{name}")
            } else if v >= 10.0 {
                format!("{v:.1}{name}")
            } else {
                format!("{v:.2}{name}")
            };
        }
    }
    bytes.to_string()
}

/// A power-of-two size, short: `512`, `1K`, `2M`, `1G` (size-class labels).
pub fn short_size(bytes: u64) -> String {
    for (unit, _, name) in UNITS {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{name}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// A byte unit chosen so axis numbers stay short (GiB, MiB, KiB or bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ByteScale {
    /// Bytes per unit.
    pub(crate) divisor: f64,
    /// The unit's name, e.g. `GiB`.
    pub(crate) unit: &'static str,
}

impl ByteScale {
    /// The largest unit (GiB at most) in which `max_bytes` is at least 1.
    pub fn for_max(max_bytes: u64) -> ByteScale {
        let (divisor, unit) = UNITS[1..]
            .iter()
            .find(|&&(unit, _, _)| max_bytes >= unit)
            .map_or((1.0, "bytes"), |&(unit, name, _)| (unit as f64, name));
        ByteScale { divisor, unit }
    }

    /// `bytes` in this unit.
    pub fn of(&self, bytes: u64) -> f64 {
        bytes as f64 / self.divisor
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
        let e = parse_size("-1GB").unwrap_err().to_string();
        assert_eq!(e, "invalid size '-1GB': a size is not negative");
        assert!(parse_size("-5").is_err());
    }

    #[test]
    fn capacities_below_a_mebibyte_suggest_a_unit() {
        assert_eq!(parse_capacity("40GB").unwrap(), 40_000_000_000);
        let e = parse_capacity("0.0001MiB").unwrap_err().to_string();
        assert!(e.contains("less than 1 MiB") && !e.contains("MiBGB"), "{e}");
        let e = parse_capacity("40").unwrap_err().to_string();
        assert!(e.contains("40GB or 40GiB"), "{e}");
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
        assert_eq!(format_bytes(1023), "1023 bytes");
        assert_eq!(format_bytes(20 * MIB), "20.00 MiB");
        assert_eq!(format_bytes(12_660_506_624), "11.79 GiB");
        assert_eq!(format_bytes(2048 * GIB), "2048.00 GiB");
    }

    #[test]
    fn each_unit_starts_at_its_own_size() {
        assert_eq!(format_bytes(1024), "1.00 KiB");
        assert_eq!(format_bytes(MIB - 1), "1.00 MiB", "rounds to 1024.00 KiB: shown as MiB");
        assert_eq!(format_bytes(MIB), "1.00 MiB");
        assert_eq!(format_bytes(MIB + 1), "1.00 MiB");
        assert_eq!(format_bytes(MIB - 10_000), "1014.23 KiB");
        assert_eq!(format_bytes(GIB), "1.00 GiB");
        assert_eq!(format_bytes(GIB - MIB), "1023.00 MiB");
    }

    #[test]
    fn chart_labels_are_short() {
        assert_eq!(short_size(512), "512");
        assert_eq!(short_size(1024), "1K");
        assert_eq!(short_size(2 << 20), "2M");
        assert_eq!(short_size(1 << 30), "1G");
        assert_eq!(short_size(1), "1");
        assert_eq!(compact_bytes(640 << 20), "640M");
        assert_eq!(compact_bytes(22_900 << 20), "22.4G");
        assert_eq!(compact_bytes(3 << 9), "1.50K");
        assert_eq!(compact_bytes(999), "999");
    }

    #[test]
    fn byte_scale_follows_the_maximum() {
        assert_eq!(ByteScale::for_max(12 * GIB).unit, "GiB");
        assert_eq!(ByteScale::for_max(GIB - 1).unit, "MiB");
        assert_eq!(ByteScale::for_max(5000).unit, "KiB");
        assert_eq!(ByteScale::for_max(5).unit, "bytes");
        assert_eq!(ByteScale::for_max(3 * GIB).of(3 * GIB / 2), 1.5);
    }
}
