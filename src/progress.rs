//! Progress on the terminal for long library steps (reading a big trace, writing a report).
//!
//! The library says *what* is progressing; whether anyone sees it is the program's choice. With
//! the `cli` feature a [`Bar`] is drawn by `indicatif` on stderr (hidden when stderr is not a
//! terminal, as indicatif decides); without it every method is a no-op, so a library user who
//! builds with `default-features = false` gets no terminal output and no `indicatif` in the tree.

#[cfg(feature = "cli")]
use std::time::Instant;

/// A progress bar of `len` steps, or a spinner for a step of unknown length.
#[derive(Debug)]
pub struct Bar {
    #[cfg(feature = "cli")]
    inner: indicatif::ProgressBar,
}

// Bars with steps are drawn only by the report, which needs the `charts` feature.
#[cfg_attr(not(feature = "charts"), allow(dead_code))]
impl Bar {
    /// A bar that draws nothing (asked for by a caller that wants no progress shown).
    pub(crate) fn hidden() -> Bar {
        Bar {
            #[cfg(feature = "cli")]
            inner: indicatif::ProgressBar::hidden(),
        }
    }

    /// A bar of `len` steps labelled `what`, drawn on stderr where the build can draw one.
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    pub(crate) fn steps(len: u64, what: &str) -> Bar {
        #[cfg(feature = "cli")]
        {
            let inner = indicatif::ProgressBar::new(len);
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed})")
            {
                inner.set_style(style.progress_chars("=> "));
            }
            inner.set_message(what.to_string());
            Bar { inner }
        }
        #[cfg(not(feature = "cli"))]
        Bar::hidden()
    }

    /// A spinner labelled `reading WHAT` that has run since `start`, ticking by itself. Only a
    /// build that can draw it has it: without `cli`, reading starts no spinner at all.
    #[cfg(feature = "cli")]
    pub(crate) fn reading(what: &str, start: Instant) -> Bar {
        let inner = indicatif::ProgressBar::new_spinner().with_elapsed(start.elapsed());
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{spinner} reading {msg} {elapsed}")
        {
            inner.set_style(style);
        }
        inner.set_message(what.to_string());
        inner.enable_steady_tick(std::time::Duration::from_millis(100));
        Bar { inner }
    }

    /// Advances the bar by `n` steps.
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    pub(crate) fn inc(&self, n: u64) {
        #[cfg(feature = "cli")]
        self.inner.inc(n);
    }

    /// Moves the bar to step `pos`.
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    pub(crate) fn set_position(&self, pos: u64) {
        #[cfg(feature = "cli")]
        self.inner.set_position(pos);
    }

    /// Removes the bar from the terminal.
    pub(crate) fn finish_and_clear(&self) {
        #[cfg(feature = "cli")]
        self.inner.finish_and_clear();
    }
}
