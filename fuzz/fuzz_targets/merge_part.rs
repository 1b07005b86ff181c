//! Any bytes read as a `sweep --out` part and merged: an error or a consistent merge, never a panic, abort or allocation sized by the part.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fragsim::whatif::fuzz::merge_part(data);
});
