//! The device memory a session's replays run under: what the user asked for ([`Capacity`]) and
//! what it resolves to on one recording ([`Resolved`]).

use crate::error::{Error, Result};
use crate::recorded::limit::DeviceLimit;
use crate::recorded::CapacityKind;
use crate::units::cards;

/// What the user asks the replays to run under (`--capacity`, Python's `capacity=`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Capacity {
    /// A size: as the user typed it (for headers) and in bytes.
    Size {
        /// The text as the user typed it (a card's canonical name for a card).
        typed: String,
        /// The capacity in bytes.
        bytes: u64,
    },
    /// `recorded`: the device limit inferred from the recording, which must show one.
    Recorded,
    /// `none`: unlimited, even where the recording shows a limit.
    Unlimited,
}

impl Capacity {
    /// Reads a capacity: a size of at least 1 MiB (`40` alone is an error that suggests `40GB`
    /// or `40GiB`), a card by name (`a100-40gb`: the total its driver reports,
    /// [`crate::units::cards`]), `recorded` or `none`. The error is the message alone, for a
    /// flag parser to wrap.
    pub fn parse(text: &str) -> std::result::Result<Capacity, String> {
        match text.trim() {
            "recorded" => Ok(Capacity::Recorded),
            "none" => Ok(Capacity::Unlimited),
            t => match cards::named(t) {
                Some(card) => {
                    Ok(Capacity::Size { typed: card.name.to_string(), bytes: card.bytes() })
                }
                None if t.starts_with(|c: char| c.is_ascii_alphabetic()) => {
                    let hint = cards::closest(t)
                        .map(|n| format!(": did you mean '{n}'?"))
                        .unwrap_or_default();
                    Err(format!(
                        "unknown card '{t}'{hint} (cards by name: {}; or give the memory as a \
                         size, e.g. 40GiB, or 'recorded' or 'none')",
                        cards::names()
                    ))
                }
                None => crate::units::parse_capacity(t)
                    .map(|bytes| Capacity::Size { typed: t.to_string(), bytes })
                    .map_err(|e| e.message().to_string()),
            },
        }
    }

    /// A size given in bytes (Python's `capacity=40 << 30`), typed as its byte count.
    pub fn bytes(bytes: u64) -> Capacity {
        Capacity::Size { typed: format!("{bytes}B"), bytes }
    }

    /// Whether resolving it reads the recording's limit (no capacity given, or `recorded`).
    pub fn reads_recording(asked: Option<&Capacity>) -> bool {
        matches!(asked, None | Some(Capacity::Recorded))
    }
}

/// A capacity resolved on one recording: the bytes the replays run under and where they came
/// from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The limit in bytes; `None` is unlimited.
    pub bytes: Option<u64>,
    /// Where the limit was inferred from the recording (no capacity given, or `recorded`): what
    /// was inferred and from which events. `None` when given or unlimited.
    pub inferred: Option<String>,
    /// What the limit stands for: the GPU's memory, or an allocator's own cap.
    pub kind: CapacityKind,
}

impl Resolved {
    /// Where the limit was inferred, the note that says so and how to override it.
    pub fn inferred_note(&self) -> Option<String> {
        let why = self.inferred.as_ref()?;
        Some(format!("capacity inferred from the recording: {why} (--capacity overrides)"))
    }

    /// Resolves `asked` against the recording's inferred device `limit`: the size asked for;
    /// with nothing asked (or `recorded`) the limit the recording shows, if it shows one (an
    /// error for `recorded` where it shows none); `none` is unlimited.
    pub(crate) fn of(asked: Option<&Capacity>, limit: Option<&DeviceLimit>) -> Result<Resolved> {
        let inferred =
            limit.and_then(|l| l.limit_bytes.map(|b| (b, l.describe(), l.capacity_kind())));
        let unlimited = Resolved { bytes: None, inferred: None, kind: CapacityKind::GpuMemory };
        match asked {
            Some(Capacity::Size { bytes, .. }) => Ok(Resolved { bytes: Some(*bytes), ..unlimited }),
            Some(Capacity::Unlimited) => Ok(unlimited),
            Some(Capacity::Recorded) => match inferred {
                Some((b, why, kind)) => Ok(Resolved { bytes: Some(b), inferred: Some(why), kind }),
                None => Err(Error::usage(format!(
                    "--capacity recorded: the recording shows no device limit ({})",
                    limit.map_or("no recorded allocator figures".to_string(), |l| l.describe())
                ))),
            },
            None => Ok(inferred.map_or(unlimited, |(b, why, kind)| Resolved {
                bytes: Some(b),
                inferred: Some(why),
                kind,
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_read_sizes_cards_and_words() {
        assert_eq!(
            Capacity::parse("40GB"),
            Ok(Capacity::Size { typed: "40GB".into(), bytes: 40_000_000_000 })
        );
        assert_eq!(
            Capacity::parse("a100_40GB"),
            Ok(Capacity::Size { typed: "a100-40gb".into(), bytes: 40_540 << 20 })
        );
        assert_eq!(Capacity::parse("recorded"), Ok(Capacity::Recorded));
        assert_eq!(Capacity::parse(" none "), Ok(Capacity::Unlimited));
        let e = Capacity::parse("a100-40g").unwrap_err();
        assert!(e.contains("did you mean 'a100-40gb'?"), "{e}");
        assert!(Capacity::parse("40").unwrap_err().contains("40GiB"));
    }

    #[test]
    fn an_inferred_limit_says_so_and_how_to_override_it() {
        let kind = CapacityKind::GpuMemory;
        let why = "the OOM at event 7".to_string();
        let inferred = Resolved { bytes: Some(1 << 30), inferred: Some(why), kind };
        assert_eq!(
            inferred.inferred_note().as_deref(),
            Some("capacity inferred from the recording: the OOM at event 7 (--capacity overrides)")
        );
        let given = Resolved { bytes: Some(1 << 30), inferred: None, kind };
        assert_eq!(given.inferred_note(), None);
    }

    #[test]
    fn nothing_asked_is_the_recorded_limit_and_recorded_needs_one() {
        let none = Resolved::of(None, None).unwrap();
        assert_eq!(none.bytes, None);
        assert!(none.inferred.is_none());
        let e = Resolved::of(Some(&Capacity::Recorded), None).unwrap_err();
        assert!(e.message().contains("shows no device limit"), "{e}");
        let sized = Resolved::of(Some(&Capacity::bytes(1 << 30)), None).unwrap();
        assert_eq!(sized.bytes, Some(1 << 30));
        assert_eq!(Resolved::of(Some(&Capacity::Unlimited), None).unwrap().bytes, None);
    }
}
