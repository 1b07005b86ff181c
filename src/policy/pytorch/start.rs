//! Start-state recovery (in progress).
