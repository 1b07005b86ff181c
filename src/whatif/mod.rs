//! What-if answers: the library behind `fit`, `sweep`, `merge` and `check` (`docs/interface.md`).
//!
//! Each module is one question, written against small abstractions rather than the replay
//! engine itself, so the commands can drive them with whatever runs a spec on a trace:
//!
//! - [`grid`]: brace expansion of specs, the built-in grid of PyTorch knobs, and the
//!   `export PYTORCH_CUDA_ALLOC_CONF=...` line that names a winning config;
//! - [`fit`]: the smallest device capacity with no OOM, given a closure that replays at a
//!   capacity; the common GPU cards it fits on;
//! - [`sweep`]: ranks (trace, config) results by an objective, worst case across traces;
//! - [`check`]: compares results with a baseline and lists regressions and improvements;
//! - [`fuzz`]: the bodies of the fuzz targets for parts, baselines and specs;
//! - [`input`]: sweep parts and baselines read as untrusted input, every key checked;
//! - [`row`]: one (trace, policy) result as the JSON keys, the currency of `sweep` and `check`.

pub mod check;
pub mod fit;
pub mod fuzz;
pub mod grid;
pub mod input;
pub mod own_json;
pub mod row;
pub mod sweep;

pub use row::Row;
