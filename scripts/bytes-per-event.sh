#!/bin/sh
# Prints, for each trace format, the bytes a loaded trace holds per event and the most reading
# held per event (frames and Kineto's recorded totals excluded), measured by a counting
# allocator in tests/memory.rs, which also checks the bounds.
set -eu
cd "$(dirname "$0")/.."
exec cargo test --release --test memory -- --nocapture --test-threads 1
