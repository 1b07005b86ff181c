//! Any bytes read as Kineto: an error or a trace within the limits, never a panic, hang or abort.
#![no_main]
use fragsim::trace::Format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fragsim::testing::fuzz::read(data, Format::Kineto);
});
