#!/bin/sh
# Benchmark: two aisb binaries side by side in one run (before/after a change), against the
# natural baselines: `/bin/true` and raw bubblewrap. Start-up of `aisb run -- true` on both
# backends and `aisb plan` (a small project, and bench/plan.sh's 100,000-file repository when
# it has been generated), round-robin so a slow spell of this noisy machine hits both alike.
#
#   sh bench/compare.sh OLD_AISB [NEW_AISB]     # NEW defaults to this tree's release build
#   RUNS=50 sh bench/compare.sh /work/before/target/release/aisb
#
# Each binary gets its own cache directory (their store and scan formats may differ).
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: sh bench/compare.sh OLD_AISB [NEW_AISB]" >&2; exit 2; }
OLD=$(realpath "$1")
if [ $# -ge 2 ]; then NEW=$(realpath "$2"); else cargo build --release -q; NEW="$PWD/target/release/aisb"; fi
RUNS="${RUNS:-30}"
REPO="$PWD/target/bench/repo-100k"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/proj" "$WORK/home"
(cd "$WORK/proj" && git init -q && echo 'fn main() {}' > main.rs && echo SECRET=1 > .env && git add main.rs)
export HOME="$WORK/home"
for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    # Warm each binary's caches as every run after the first finds them.
    (cd "$WORK/proj" && XDG_CACHE_HOME="$WORK/cache-$b" "$bin" run -- true && XDG_CACHE_HOME="$WORK/cache-$b" "$bin" plan >/dev/null)
    [ -f "$REPO/.generated" ] && XDG_CACHE_HOME="$WORK/cache-$b" "$bin" -C "$REPO" plan >/dev/null
done
python3 - "$RUNS" "$OLD" "$NEW" "$WORK" "$REPO" <<'PY'
import os, subprocess, sys, time
runs, old, new, work, repo = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
proj = os.path.join(work, "proj")
env = lambda b: dict(os.environ, XDG_CACHE_HOME=os.path.join(work, "cache-" + b))
cases = [("/bin/true", ["/bin/true"], None, proj),
         ("bwrap --unshare-all (raw)", ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"], None, proj)]
for label, b, bin in (("before", "old", old), ("after", "new", new)):
    cases += [(f"run, bwrap ({label})", [bin, "run", "--backend", "bwrap", "--", "true"], env(b), proj),
              (f"run, libcontainer ({label})", [bin, "run", "--backend", "libcontainer", "--", "true"], env(b), proj),
              (f"plan, small project ({label})", [bin, "plan"], env(b), proj)]
    if os.path.exists(os.path.join(repo, ".generated")):
        cases.append((f"plan, 100k files, warm ({label})", [bin, "plan"], env(b), repo))
times = {c[0]: [] for c in cases}
for _ in range(runs):
    for name, cmd, e, cwd in cases:
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e, cwd=cwd)
        times[name].append((time.perf_counter() - t) * 1000)
med = {n: sorted(ts)[len(ts) // 2] for n, ts in times.items()}
p90 = {n: sorted(ts)[int(len(ts) * 0.9)] for n, ts in times.items()}
base, raw = med["/bin/true"], med["bwrap --unshare-all (raw)"]
print(f"before: {old}\nafter:  {new}\nmedian (p90) of {runs} runs, round-robin")
print(f"{'case':<38}{'median ms':>10}{'p90 ms':>9}{'x true':>8}{'x raw bwrap':>13}{'after/before':>14}")
for n in med:
    ratio = ""
    if n.endswith("(after)"):
        ratio = f"{med[n] / med[n.replace('(after)', '(before)')]:.2f}"
    print(f"{n:<38}{med[n]:>10.1f}{p90[n]:>9.1f}{med[n] / base:>8.1f}{med[n] / raw:>13.2f}{ratio:>14}")
PY
