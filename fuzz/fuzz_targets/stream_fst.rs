//! Any bytes streamed as an `.fst` (what `replay` does with an uncompressed one): never a panic,
//! and the same replay as loading the same bytes wherever both accept them.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fragsim::testing::fuzz::stream_fst(data);
});
