//! A trace read from any text input, written in every format and read back: equal events
//! wherever the format reports no loss.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fragsim::testing::fuzz::round_trip(data);
});
