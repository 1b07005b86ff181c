//! Integration tests: pytorch.

#[allow(unused_imports)]
use crate::util::*;
