//! Integration tests: cuda.

#[allow(unused_imports)]
use crate::util::*;
