//! A plain-data pickle reader and writer: never executes anything.
