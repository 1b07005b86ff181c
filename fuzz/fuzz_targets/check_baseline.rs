//! Any bytes read as a `check` baseline: an error or a baseline that passes against itself, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fragsim::whatif::fuzz::check_baseline(data);
});
