#!/usr/bin/env bash
# Checks fragsim's dependencies with cargo-deny (deny.toml): licences, bans and sources by
# default, as .ci/run does; `scripts/deny.sh advisories` (or `all`) also checks the RustSec
# advisories, which needs GitHub (CI cannot reach it). Installs cargo-deny from crates.io when it
# is not on PATH (`cargo install --locked cargo-deny`: a few minutes of build on a laptop).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "cargo-deny is not on PATH: cargo install --locked cargo-deny (builds it from crates.io)"
  cargo install --locked cargo-deny
fi
case "${1:-}" in
  advisories) cargo deny check advisories ;;
  all) cargo deny check ;;
  *) cargo deny check licenses bans sources ;;
esac
