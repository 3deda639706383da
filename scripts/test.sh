#!/bin/sh
# The test command (README, .ci/run): set-up, then every test of the workspace, including the
# property test that throws arbitrary input at parse+eval and the runc cross-check.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
PROPTEST_CASES="${PROPTEST_CASES:-1000}" cargo test --workspace --locked
