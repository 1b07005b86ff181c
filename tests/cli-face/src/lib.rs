//! `src/cli/` built outside the `fragsim` crate: see this crate's `Cargo.toml`.

#[path = "../../../src/cli/mod.rs"]
#[allow(missing_docs)]
pub mod cli;
