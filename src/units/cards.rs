//! GPUs by name: `--capacity a100-40gb` means the memory that card's driver reports as total.
//!
//! A card's nominal size is not what a process gets: an A100 40GB's driver reports 39.59 GiB, an
//! H100 80GB's 79.11 GiB (ECC and the driver's own reservations take the rest). The figure users
//! see is the "total capacity" in PyTorch's out-of-memory message, which is `cudaMemGetInfo`'s
//! total, printed in GiB with two decimals. Each row below takes that figure from one published
//! out-of-memory message on that card, and cites it; the bytes are the figure rounded to whole
//! MiB, so each is exact to about ±5 MiB. Cards no such message was found for are not listed:
//! give their memory as a size.

use super::MIB;

/// One card `--capacity` accepts by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamedCard {
    /// The name on the command line, lower case: `a100-40gb`.
    pub name: &'static str,
    /// The card as its vendor names it.
    pub model: &'static str,
    /// The nominal size in GB the card is sold with (what `fit`'s rows are labelled by).
    pub nominal_gb: u32,
    /// The total PyTorch reported on it, as printed: `39.59` (GiB).
    pub reported_gib: &'static str,
    /// Where that figure was published: an out-of-memory message quoting it.
    pub source: &'static str,
}

impl NamedCard {
    /// The card's memory in bytes: the reported GiB figure in whole MiB.
    pub(crate) fn bytes(&self) -> u64 {
        let gib: f64 = self.reported_gib.parse().unwrap_or(0.0);
        (gib * 1024.0).round() as u64 * MIB
    }
}

macro_rules! card {
    ($name:literal, $model:literal, $gb:literal, $gib:literal, $source:literal) => {
        NamedCard {
            name: $name,
            model: $model,
            nominal_gb: $gb,
            reported_gib: $gib,
            source: $source,
        }
    };
}

/// The cards `--capacity` knows by name, smallest first.
pub const NAMED_CARDS: &[NamedCard] = &[
    card!("t4", "Tesla T4", 16, "14.75", "https://github.com/hpcaitech/Open-Sora/issues/697"),
    card!("rtx-a4000", "RTX A4000", 16, "15.61", "https://github.com/DengKaiCQ/VGGT-Long/issues/6"),
    card!(
        "v100-16gb",
        "V100 16GB",
        16,
        "15.78",
        "https://github.com/kchengiva/Shift-GCN/issues/34"
    ),
    card!("a30", "A30", 24, "23.53", "https://github.com/google/RB-Modulation/issues/5"),
    card!(
        "rtx-4090",
        "GeForce RTX 4090",
        24,
        "23.64",
        "https://github.com/ali-vilab/VGen/issues/104"
    ),
    card!(
        "rtx-3090",
        "GeForce RTX 3090",
        24,
        "23.70",
        "https://github.com/yandex/YaLM-100B/issues/9"
    ),
    card!("a10", "A10", 24, "23.70", "https://github.com/tatsu-lab/stanford_alpaca/issues/76"),
    card!(
        "rtx-5090",
        "GeForce RTX 5090",
        32,
        "31.37",
        "https://github.com/Wan-Video/Wan2.1/issues/465"
    ),
    card!(
        "v100-32gb",
        "V100 32GB",
        32,
        "31.74",
        "https://github.com/liucongg/ChatGLM-Finetuning/issues/73"
    ),
    card!(
        "a100-40gb",
        "A100 40GB",
        40,
        "39.59",
        "https://github.com/raoyongming/DenseCLIP/issues/52"
    ),
    card!(
        "rtx-6000-ada",
        "RTX 6000 Ada",
        48,
        "44.43",
        "https://github.com/DINGYANB/MTVCrafter/issues/21"
    ),
    card!("l40s", "L40S", 48, "44.53", "https://github.com/Wan-Video/Wan2.1/issues/205"),
    card!(
        "h100-80gb",
        "H100 80GB",
        80,
        "79.11",
        "https://github.com/vllm-project/vllm/issues/27508"
    ),
    card!(
        "a100-80gb",
        "A100 80GB",
        80,
        "79.25",
        "https://github.com/levihsu/OOTDiffusion/issues/235"
    ),
    card!("a800-80gb", "A800 80GB", 80, "79.33", "https://github.com/hahnyuan/PB-LLM/issues/3"),
];

/// The card called `name` (case and `-`/`_` ignored: `A100_40GB` is `a100-40gb`).
pub fn named(name: &str) -> Option<&'static NamedCard> {
    let key = name.trim().to_ascii_lowercase().replace('_', "-");
    NAMED_CARDS.iter().find(|c| c.name == key)
}

/// The cards sold with a nominal size of `nominal_gb` GB.
pub fn of_nominal(nominal_gb: u32) -> impl Iterator<Item = &'static NamedCard> {
    NAMED_CARDS.iter().filter(move |c| c.nominal_gb == nominal_gb)
}

/// Every name `--capacity` accepts, comma-separated, for messages.
pub fn names() -> String {
    NAMED_CARDS.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
}

/// The known name nearest `typed` when it is close enough to be a typo (`a100-40g`,
/// `h100`), for "did you mean".
pub fn closest(typed: &str) -> Option<&'static str> {
    let key = typed.trim().to_ascii_lowercase().replace('_', "-");
    // A bare model (`h100`, `a100`) names the smallest card of that model.
    if let Some(c) = NAMED_CARDS.iter().find(|c| c.name.split('-').next() == Some(key.as_str())) {
        return Some(c.name);
    }
    let known: Vec<&'static str> = NAMED_CARDS.iter().map(|c| c.name).collect();
    super::spelling::closest(&key, &known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_the_reported_gib_in_whole_mib() {
        let a100 = named("a100-40gb").unwrap();
        assert_eq!(a100.bytes(), 40_540 * MIB, "39.59 GiB = 40,540.16 MiB");
        assert_eq!(named("H100_80GB").unwrap().bytes(), 81_009 * MIB);
        for c in NAMED_CARDS {
            let reported: f64 = c.reported_gib.parse().expect(c.name);
            let gib = c.bytes() as f64 / (1u64 << 30) as f64;
            assert!((gib - reported).abs() < 0.005, "{}: {gib} vs {reported}", c.name);
            // What a driver reports is a little under the nominal size, never over it.
            assert!(c.bytes() < u64::from(c.nominal_gb) << 30, "{}", c.name);
            assert!(c.bytes() as f64 > 0.9 * (u64::from(c.nominal_gb) << 30) as f64, "{}", c.name);
            assert!(c.source.starts_with("https://"), "{} cites a source", c.name);
            assert_eq!(c.name, c.name.to_ascii_lowercase());
        }
        let mut sorted = NAMED_CARDS.to_vec();
        sorted.sort_by_key(|c| c.bytes());
        assert_eq!(sorted, NAMED_CARDS, "smallest first");
    }

    #[test]
    fn near_misses_get_a_suggestion_and_strangers_none() {
        assert_eq!(closest("a100-40g"), Some("a100-40gb"));
        assert_eq!(closest("h100"), Some("h100-80gb"));
        assert_eq!(closest("rtx4090"), Some("rtx-4090"));
        assert_eq!(closest("tpu-v5"), None);
        assert_eq!(named("a100"), None, "a bare model is not a card: A100s come in two sizes");
        assert_eq!(of_nominal(80).count(), 3);
        assert!(names().starts_with("t4, rtx-a4000"));
    }
}
