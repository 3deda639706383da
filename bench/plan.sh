#!/bin/sh
# Benchmark: `aisb plan` on a generated git repository of 100,000 files, 20,000 of them
# gitignored, cold (no scan cache) and warm (cached), against the natural baselines in the
# same run: `/bin/true` (process floor) and `git ls-files` (git's own listing of the tree).
#
#   sh bench/plan.sh            # builds --release, generates the repo once under target/bench
#   RUNS=20 sh bench/plan.sh
set -eu
cd "$(dirname "$0")/.."
RUNS="${RUNS:-10}"
cargo build --release -q
AISB="$PWD/target/release/aisb"
REPO="$PWD/target/bench/repo-100k"
CACHE="$PWD/target/bench/cache"

if [ ! -f "$REPO/.generated" ]; then
    echo "generating $REPO (100k files, 20k ignored) ..." >&2
    rm -rf "$REPO"
    mkdir -p "$REPO"
    python3 - "$REPO" <<'PY'
import os, sys
root = sys.argv[1]
def w(p, s="x\n"):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f: f.write(s)
# 80,000 visible files: 1,000 dirs x 80 files, a few sensitive ones among them.
for d in range(1000):
    base = f"{root}/src/m{d // 50}/d{d}"
    for i in range(80):
        w(f"{base}/f{i}.rs")
    if d % 100 == 0:
        w(f"{base}/server.pem")
# 20,000 ignored: node_modules (10k), build output (5k), logs scattered in tracked dirs (5k).
for i in range(10000):
    w(f"{root}/node_modules/p{i // 20}/f{i}.js")
for i in range(5000):
    w(f"{root}/target/o{i // 100}/f{i}.o")
for i in range(5000):
    w(f"{root}/src/m{(i % 1000) // 50}/d{i % 1000}/run{i // 1000}.log")
w(f"{root}/.gitignore", "node_modules/\ntarget/\n*.log\n.env\n")
w(f"{root}/.env", "SECRET=1\n")
PY
    (cd "$REPO" && git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm init)
    touch "$REPO/.generated"
    sleep 1
fi

# Median wall time in ms of RUNS runs of a command (run by sh -c).
median() {
    python3 - "$RUNS" "$1" <<'PY'
import subprocess, sys, time
runs, cmd = int(sys.argv[1]), sys.argv[2]
ts = []
for _ in range(runs):
    t = time.perf_counter(); subprocess.run(cmd, shell=True, check=True); ts.append((time.perf_counter() - t) * 1000)
ts.sort(); print(f"{ts[len(ts) // 2]:.1f}")
PY
}

export XDG_CACHE_HOME="$CACHE"
files=$(cd "$REPO" && git ls-files | wc -l)
ignored=$(cd "$REPO" && git ls-files -oi --exclude-standard | wc -l)
t_true=$(median "/bin/true")
t_git=$(median "cd '$REPO' && git ls-files -z --cached --others --exclude-standard >/dev/null && git ls-files -z -oi --exclude-standard --directory >/dev/null")
t_cold=$(median "rm -rf '$CACHE/aisb/scan' && cd '$REPO' && '$AISB' plan >/dev/null")
"$AISB" -C "$REPO" plan >/dev/null; sleep 0.2; "$AISB" -C "$REPO" plan >/dev/null
t_warm=$(median "cd '$REPO' && '$AISB' plan >/dev/null")
cached=$(cd "$REPO" && "$AISB" plan | grep -c 'cached)' || true)
masked=$(cd "$REPO" && "$AISB" plan --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["masks"]))')

python3 - "$t_true" "$t_git" "$t_cold" "$t_warm" <<PY
import sys
t_true, t_git, t_cold, t_warm = map(float, sys.argv[1:])
print(f"aisb plan on {$files} tracked + {$ignored} ignored files ({$masked} masks; warm run cached: {'yes' if $cached else 'NO'}), median of $RUNS runs")
print(f"{'case':<34}{'ms':>9}{'x /bin/true':>13}{'x git ls-files':>16}{'target':>10}")
for name, t, target in [("/bin/true", t_true, ""), ("git ls-files (2 listings)", t_git, ""),
                        ("aisb plan, cold (no cache)", t_cold, "< 1000"), ("aisb plan, warm (cached)", t_warm, "< 50")]:
    print(f"{name:<34}{t:>9.1f}{t / t_true:>13.1f}{t / t_git:>16.2f}{target:>10}")
PY
