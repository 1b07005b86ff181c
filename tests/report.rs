//! Integration tests: report.

#[allow(unused_imports)]
use crate::util::*;
