//! fragsim replays GPU allocation traces against allocator policies and measures peak reserved
//! memory and fragmentation: would this run have fit with another allocator, another setting, or
//! a smaller GPU — and where did the memory go?
//!
//! Data flows one way:
//!
//! 1. **read** — [`trace::read_trace`] turns a PyTorch memory snapshot, a Kineto profiler trace,
//!    an RMM log, an `.fst` file or a text trace into a [`trace::Trace`];
//! 2. **replay** — [`replay::ReplayInput`] picks a device and the blocks live before the first
//!    event; a [`policy::PolicyInfo`] from [`policy::POLICIES`] replays it on a
//!    [`backend::Backend`] (simulated, or real GPU memory);
//! 3. **measure** — the engine returns a [`metrics::PolicyResult`] (the `replay --json` keys) and a
//!    memory-over-time [`metrics::Series`];
//! 4. **report** — [`report`] prints tables and writes JSON, CSV, Markdown, plots and HTML.
//!
//! ```
//! use fragsim::policy::{self, PolicySpec};
//! use fragsim::replay::{ReplayInput, ReplayOptions};
//! use fragsim::trace::{self, Format, ReadOptions};
//!
//! let text = "alloc 0x1000 4096 s0\nalloc 0x2000 1000 s0\nfree 0x1000 4096 s0\n";
//! let trace = trace::read_bytes(text.as_bytes(), Format::Text, &ReadOptions::default())?;
//! let input = ReplayInput::new(&trace, None)?;
//! let spec = &PolicySpec::parse_list("bound")?[0];
//! let out = policy::lookup(&spec.name)?.run(spec, &input, &ReplayOptions::default())?;
//! assert_eq!(out.result.peak_reserved_bytes, 5096);
//! # Ok::<(), fragsim::Error>(())
//! ```

#![warn(missing_docs)]

// The command line below names the library by its crate name, as the binary it came from did.
extern crate self as fragsim;

pub mod backend;
// The command line is compiled into the library only so that the binary and the Python
// package share one implementation of every command; it is no API to build on.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;

pub mod blame;
pub mod error;
pub mod explain;
pub mod metrics;
pub mod policy;
mod progress;
pub mod recorded;
pub mod replay;
pub mod report;
pub mod synth;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace;
pub mod units;
pub mod validate;
pub mod whatif;

pub use error::{Error, ErrorKind, Result};
