//! fragsim's integration tests: one binary, one module per area.

mod util;

mod bad_input;
mod cli;
mod cuda;
mod mutations;
mod pipes;
mod policies;
mod pytorch;
mod readers;
mod report;
mod snapshot;
mod synth;
