//! Turning replay results into what people read: tables, JSON, CSV, Markdown, plots, HTML.

pub mod csv;
pub mod json;
pub mod snapshot_out;
pub mod table;
