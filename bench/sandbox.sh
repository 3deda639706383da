#!/bin/sh
# Benchmark: named sandboxes, in one run: a warm `aisb up NAME -- true` on an existing
# sandbox (start the sandbox, join it, stop it) per backend, and `aisb exec NAME -- true`
# into a running one, against `/bin/true`. Median (p90) of RUNS (default 20).
#
#   sh bench/sandbox.sh
set -eu
cd "$(dirname "$0")/.."
RUNS="${RUNS:-20}"
cargo build --release -q
AISB="$PWD/target/release/aisb"
WORK=$(mktemp -d)
trap 'kill $OWNER 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/repo" "$WORK/home"
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache"
cd "$WORK/repo"
git init -q -b main && echo hi > README && git add README && git -c user.name=b -c user.email=b@b commit -qm one
for b in bwrap libcontainer; do "$AISB" up "warm-$b" --backend "$b" -- true 2>/dev/null; done
"$AISB" run --backend libcontainer --sandbox svc -- sleep 600 2>/dev/null &
OWNER=$!
for _ in $(seq 100); do "$AISB" exec svc -- true 2>/dev/null && break; sleep 0.1; done
python3 - "$RUNS" "$AISB" <<'PY'
import subprocess, sys, time
runs, aisb = int(sys.argv[1]), sys.argv[2]
cases = [
    ("/bin/true", ["/bin/true"]),
    ("aisb up NAME -- true (bwrap)", [aisb, "up", "warm-bwrap", "--backend", "bwrap", "--", "true"]),
    ("aisb up NAME -- true (libcontainer)", [aisb, "up", "warm-libcontainer", "--backend", "libcontainer", "--", "true"]),
    ("aisb exec NAME -- true (running)", [aisb, "exec", "svc", "--", "true"]),
]
times = {n: [] for n, _ in cases}
for _ in range(runs):
    for name, cmd in cases:
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times[name].append((time.perf_counter() - t) * 1000)
print(f"named sandboxes, median (p90) of {runs} runs, round-robin")
print(f"{'case':<40}{'median ms':>10}{'p90 ms':>9}")
for name, ts in times.items():
    ts.sort()
    print(f"{name:<40}{ts[len(ts) // 2]:>10.1f}{ts[int(len(ts) * 0.9)]:>9.1f}")
PY
