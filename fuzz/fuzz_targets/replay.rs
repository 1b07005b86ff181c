//! An arbitrary event sequence replayed through every policy with an arbitrary capacity.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fragsim::testing::fuzz::replay(data);
});
