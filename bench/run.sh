#!/bin/sh
# Benchmark: start-up cost of `aisb run -- true` per backend, against the natural baselines in
# the same run: `/bin/true` and raw bubblewrap with a comparable sandbox. srt (Claude Code's
# sandbox runtime) is included when it is installed (npm i -g @anthropic-ai/sandbox-runtime).
#
#   sh bench/run.sh             # release build, median of RUNS (default 30) runs each
set -eu
cd "$(dirname "$0")/.."
RUNS="${RUNS:-30}"
cargo build --release -q
AISB="$PWD/target/release/aisb"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/proj" "$WORK/home"
(cd "$WORK/proj" && git init -q && echo 'fn main() {}' > main.rs && echo SECRET=1 > .env && git add main.rs)
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache"
cd "$WORK/proj"
"$AISB" run -- true    # warm the scan cache, as every run after the first is
sleep 0.2
"$AISB" run -- true
# An agent's preset: its config copy-on-write, the proxy for its API, its mirrored settings.
mkdir -p "$WORK/agent" "$HOME/.claude"
(cd "$WORK/agent" && git init -q && echo 'import "preset:claude"' > sandbox.kdl && git add sandbox.kdl)
(cd "$WORK/agent" && "$AISB" --trust run -- true && "$AISB" --trust run -- true)
# Every limit (memory and CPU too: one cgroup directory per controller on cgroup v1).
mkdir -p "$WORK/limited"
(cd "$WORK/limited" && git init -q && printf 'limits {\n    memory "1G"\n    cpus 1\n}\n' > sandbox.kdl && git add sandbox.kdl)
(cd "$WORK/limited" && "$AISB" run -- true && "$AISB" run -- true)
# A loosening approved with `aisb trust`: every run compares its plan's loosenings with the
# approved ones (issue 29); `--trust` skips the comparison, so the difference is its cost.
mkdir -p "$WORK/trusted"
(cd "$WORK/trusted" && git init -q && printf 'network {\n    allow "example.com"\n}\nenv {\n    pass "BUILD_ID"\n}\n' > sandbox.kdl && git add sandbox.kdl)
(cd "$WORK/trusted" && "$AISB" trust >/dev/null 2>&1 && "$AISB" run -- true && "$AISB" run -- true)

# A bigger project: 10,000 directories, which the end of every run stats for policy files the
# sandbox made below the top (issue 29); the switch shows that check's share.
mkdir -p "$WORK/big"
(cd "$WORK/big" && git init -q && python3 -c "
import os
for i in range(100):
    for j in range(100):
        os.makedirs(f'd{i}/e{j}'); open(f'd{i}/e{j}/f.txt', 'w').write('x')
" && git add -A && "$AISB" run -- true && "$AISB" run -- true)

python3 - "$RUNS" "$AISB" <<'PY'
import os, shutil, subprocess, sys, time
runs, aisb = int(sys.argv[1]), sys.argv[2]
# The start-up cost of the limits: the same runs with none (the tests' switch; it says so on
# stderr), and with memory and CPU limits besides the default pids one.
off = dict(os.environ, AISB_TEST_BREAK_ISOLATION="pids")
no_live = dict(os.environ, AISB_TEST_BREAK_ISOLATION="late-secrets")
cases = [
    ("/bin/true", ["/bin/true"]),
    ("bwrap --unshare-all (raw)", ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"]),
    ("aisb run --backend bwrap -- true", [aisb, "run", "--backend", "bwrap", "--", "true"]),
    # The same without the live mask layer (its watcher thread and project walk), to show
    # what the layer costs at start-up.
    ("  without the live mask layer", [aisb, "run", "--backend", "bwrap", "--", "true"], no_live),
    ("aisb run --backend libcontainer -- true", [aisb, "run", "--backend", "libcontainer", "--", "true"]),
    ("  bwrap, no limits", [aisb, "run", "--backend", "bwrap", "--", "true"], off),
    ("  libcontainer, no limits", [aisb, "run", "--backend", "libcontainer", "--", "true"], off),
    ("  bwrap, pids+memory+cpus", [aisb, "-C", "../limited", "run", "--backend", "bwrap", "--", "true"]),
    ("  libcontainer, pids+memory+cpus", [aisb, "-C", "../limited", "run", "--backend", "libcontainer", "--", "true"]),
]
no_below = dict(os.environ, AISB_TEST_BREAK_ISOLATION="policy-below")
cases += [
    ("10,000-directory project, bwrap", [aisb, "-C", "../big", "run", "--backend", "bwrap", "--", "true"]),
    ("  without the check below the top", [aisb, "-C", "../big", "run", "--backend", "bwrap", "--", "true"], no_below),
    ("approved loosenings, bwrap", [aisb, "-C", "../trusted", "run", "--backend", "bwrap", "--", "true"]),
    ("  --trust (no plan comparison)", [aisb, "-C", "../trusted", "--trust", "run", "--backend", "bwrap", "--", "true"]),
]
if os.geteuid() == 0:  # copy-on-write with bwrap needs root (see README)
    cases.append(("preset:claude, bwrap", [aisb, "-C", "../agent", "--trust", "run", "--backend", "bwrap", "--", "true"]))
cases.append(("preset:claude, libcontainer", [aisb, "-C", "../agent", "--trust", "run", "--backend", "libcontainer", "--", "true"]))
if shutil.which("srt"):
    cases.append(("srt -c true", ["srt", "-c", "true"]))
# Round-robin: every round runs each case once, so a slow spell of this noisy machine hits
# all cases alike and the ratios stay meaningful.
times = {c[0]: [] for c in cases}
for _ in range(runs):
    for name, cmd, *env in cases:
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env[0] if env else None)
        times[name].append((time.perf_counter() - t) * 1000)
res = {}
for name, ts in times.items():
    ts.sort()
    res[name] = (ts[len(ts) // 2], ts[int(len(ts) * 0.9)])
base, raw = res["/bin/true"][0], res["bwrap --unshare-all (raw)"][0]
print(f"start-up, median (p90) of {runs} runs")
print(f"{'case':<36}{'median ms':>10}{'p90 ms':>9}{'x true':>8}{'x raw bwrap':>13}")
for name, (med, p90) in res.items():
    print(f"{name:<36}{med:>10.1f}{p90:>9.1f}{med / base:>8.1f}{med / raw:>13.2f}")
PY
