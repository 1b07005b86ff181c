//! Integration tests: bad_input.

#[allow(unused_imports)]
use crate::util::*;
