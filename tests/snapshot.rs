//! Integration tests: snapshot.

#[allow(unused_imports)]
use crate::util::*;
