//! Integration tests: synth.

#[allow(unused_imports)]
use crate::util::*;
