//! Integration tests: policies.

#[allow(unused_imports)]
use crate::util::*;
