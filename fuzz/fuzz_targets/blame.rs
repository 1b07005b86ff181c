//! Any bytes read as a trace (format picked by the first byte) and broken down as `blame` does: an error or a breakdown whose sums hold, never a panic, hang or abort.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fragsim::blame::fuzz::blame(data);
});
