//! fragsim's integration tests: one binary, one module per area.

mod util;

mod cli;
