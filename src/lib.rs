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
//! A [`session::Session`] reads a trace once and answers questions about it; here three, on a
//! real snapshot bundled with the crate:
//!
//! ```
//! use fragsim::blame::BlameOptions;
//! use fragsim::policy::PolicySpec;
//! use fragsim::session::{OpenOptions, ReplayRequest, Session};
//! use fragsim::validate::ValidateOptions;
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/real/cs336-lm-step-a.pickle");
//! let open = OpenOptions { keep_frames: true, ..OpenOptions::default() };
//! let session = Session::open(path.as_ref(), &open)?;
//!
//! // Does the PyTorch model make the recorded allocator's decisions?
//! let v = session.validate(&ValidateOptions::default())?;
//! assert!(v.mismatches.is_empty());
//! assert_eq!(v.segment_events_matched, v.segment_events_recorded);
//!
//! // What would each policy reserve, beside what the recording reserved?
//! let specs = PolicySpec::parse_many(&["pytorch".into(), "bound".into()])?;
//! let answer = session.replay(&ReplayRequest::new(specs.clone()), &Default::default())?;
//! let recorded = answer.recorded.as_ref().and_then(|r| r.peak_reserved_bytes);
//! let pytorch = answer.results.iter().find(|r| r.policy == "pytorch").unwrap();
//! assert_eq!(Some(pytorch.peak_reserved_bytes), recorded);
//!
//! // Where did the memory go at the peak?
//! let report = session.blame(&specs[..1], &BlameOptions::default())?;
//! assert!(!report.results[0].sites.is_empty());
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
pub mod session;
pub mod synth;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace;
pub mod units;
pub mod validate;
pub mod whatif;

pub use error::{Error, ErrorKind, Result};
