//! fragsim's integration tests: one binary, one module per area.

mod util;

mod bad_input;
mod cli;
mod cuda;
mod mutations;
mod policies;
mod pytorch;
mod readers;
mod recorded;
mod report;
mod snapshot;
mod synth;
