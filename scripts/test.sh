#!/bin/sh
# The test command (README, .ci/run): the tests' set-up (scripts/setup-tests.sh), then every
# test of the workspace, including the property test that throws arbitrary input at
# parse+eval, the runc cross-check, the isolation and network suites on both backends, then each fuzz target for a bounded time,
# then the VM testbed's kernel matrix. Ends with one summary line: `N passed, M failed`
# (cargo's tests; the fuzz script and the testbed print their own).
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup-tests.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
PROPTEST_CASES="${PROPTEST_CASES:-1000}" cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log" || status=1
# `cargo test` exits non-zero on any failure (--no-fail-fast: every test binary runs, so one
# failure cannot hide another); the pipe hides the status, so read it back.
grep -q '^test result: FAILED' "$log" && status=1
# A line starting with `error` is cargo's (a build that failed) or a child process's that a
# test let through (a helper that would not start): either fails the run, and is named at the
# end so the summary says why.
errors=$(grep -n '^error' "$log" | head -5 || true)
[ -n "$errors" ] && status=1
# The network benchmark, short (debug build, one small round): it must keep working.
echo "== bench/net.sh (short)" >&2
SHORT=1 sh bench/net.sh || status=1
# The fleet benchmark (docs/scale.md's inputs), short, for the same reason.
echo "== bench/fleet.sh (short)" >&2
SHORT=1 sh bench/fleet.sh || status=1
# The cargo-fuzz targets (fuzz/): hostile layers, proxy requests, dotenv files, generated
# sandbox.kdl projects, OCI documents; 30 s each by default, a crash fails the run.
echo "== fuzz" >&2
sh scripts/fuzz.sh || status=1
# The VM matrix: every scenario in Debian's 6.1 and 6.12 kernels, both backends, root and
# uid 1000 (testbed/, vm-tests/); then proof that it catches a sandbox that leaks ~/.ssh.
echo "== VM testbed" >&2
cargo run -q --locked -p testbed -- run || status=1
cargo run -q --locked -p testbed -- run --filter ssh --break-isolation --bin-dir target/release >/dev/null || {
    echo "the testbed did not catch a deliberately leaking sandbox" >&2; status=1; }
if [ -n "$errors" ]; then
    printf 'the test output has lines starting with `error` (line: text):\n%s\n' "$errors"
fi
[ $status -eq 0 ] || echo "the run failed (see the sections above: cargo, bench, fuzz, testbed)"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit $status
