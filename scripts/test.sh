#!/bin/sh
# The test command (README, .ci/run): set-up, then every test of the workspace, including the
# property test that throws arbitrary input at parse+eval, the runc cross-check and the
# isolation suite on both backends. Ends with one summary line: `N passed, M failed`.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
PROPTEST_CASES="${PROPTEST_CASES:-1000}" cargo test --workspace --locked 2>&1 | tee "$log" || status=1
# `cargo test` exits non-zero on any failure; the pipe hides that, so read it back.
grep -q '^test result: FAILED' "$log" && status=1
grep -q '^error' "$log" && status=1
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit $status
