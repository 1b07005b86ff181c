//! Integration tests: readers.

#[allow(unused_imports)]
use crate::util::*;
