//! Any lines expanded as `sweep -p` specs with braces and parsed: errors, never a panic or more than the cap.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fragsim::whatif::fuzz::policy_specs(data);
});
