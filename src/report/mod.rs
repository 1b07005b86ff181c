//! Turning replay results into what people read: tables, JSON, CSV, Markdown, plots, HTML.
//!
//! Every results table takes its columns from [`columns`]; each format is one file with one
//! `write_*` function over already-computed results. [`bundle`] gathers what `fragsim report`
//! shows (replays, segment map, size histogram) and writes the report directory.

#[cfg(feature = "charts")]
pub mod bundle;
pub mod columns;
pub mod csv;
#[cfg(feature = "charts")]
pub mod html;
pub mod json;
#[cfg(feature = "charts")]
pub mod markdown;
pub mod output;

#[cfg(feature = "charts")]
pub mod overlay;
#[cfg(feature = "charts")]
pub mod plot;
pub mod snapshot_out;
pub mod table;
#[cfg(test)]
pub mod testing;

#[cfg(feature = "charts")]
pub use bundle::{collect, write_dir, ReportData, ReportPlan};
