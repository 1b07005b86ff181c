//! fragsim's integration tests: one binary, one module per area.

mod util;

mod answers;
mod architecture;
mod bad_input;
mod blame;
mod cancel;
mod capacity;
mod cli;
mod cuda;
mod custom_policy;
mod deploy;
mod docs;
mod explain;
mod fst_stream;
mod golden;
mod hostile;
mod kineto_warm;
mod mutations;
mod npu;
mod pickle_stream;
mod pipes;
mod policies;
mod pytorch;
mod readers;
mod readme;
mod recorded;
mod report;
mod snapshot;
mod synth;
mod versions;
mod whatif;
mod whatif_cli;
mod whatif_hostile;
