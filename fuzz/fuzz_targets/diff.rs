//! Any bytes read as two traces (formats picked by the first byte, split by the second) and compared as `diff A B` does: an error or a diff whose site deltas add up, never a panic, hang or abort.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fragsim::blame::fuzz::diff(data);
});
