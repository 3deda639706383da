#!/bin/sh
# Benchmark: what the reporting layer of masks costs (issue 32). Per backend, in the same run,
# round-robin:
#   - a workload that opens FILES unmasked files (a compiler or `git status` on a large tree),
#     timed inside the sandbox, with the layer on and off (AISB_TEST_BREAK_ISOLATION=report
#     turns it off); the ratio is the cost on opens that are not masked (target: noise, ≤ 2%);
#   - the latency from a refused open of a masked file to its line in the audit log (the
#     event's time minus the time just before the open; target ≤ 50 ms).
#
#   sh bench/file-denials.sh             # release build; FILES (100000), ROUNDS (5), BACKENDS
set -eu
cd "$(dirname "$0")/.."
FILES="${FILES:-100000}"
ROUNDS="${ROUNDS:-5}"
BACKENDS="${BACKENDS:-bwrap libcontainer}"
if [ -z "${AISB:-}" ]; then
    cargo build --release -q
    AISB="$PWD/target/release/aisb"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/proj" "$WORK/home"
cd "$WORK/proj"
git init -q
echo "TOKEN=1" > .env
python3 - "$FILES" <<'PY'
import os, sys
n = int(sys.argv[1])
for i in range(n):
    d = "tree/%03d" % (i // 1000)
    if i % 1000 == 0:
        os.makedirs(d, exist_ok=True)
    with open("%s/f%d.c" % (d, i), "w") as f:
        f.write("int x;\n")
PY
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache"

python3 - "$ROUNDS" "$AISB" $BACKENDS <<'PY'
import glob, json, os, statistics, subprocess, sys, time
rounds, aisb, backends = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
# Inside: wait (at most 10 s) for the layer over .env, open every file of the tree, then one
# refused open of .env with the time just before it.
PROBE = r'''
import os, time
for _ in range(200):
    if os.environ.get("OFF") or sum(" - fuse aisb-deny" in l for l in open("/proc/self/mountinfo")) >= 2:
        break
    time.sleep(0.05)
t = time.perf_counter()
n = 0
for root, _, files in os.walk("tree"):
    for f in files:
        open(os.path.join(root, f), "rb").close()
        n += 1
print("OPENS %d %.6f" % (n, time.perf_counter() - t), flush=True)
before = time.time()
try:
    open(".env").read()
except PermissionError:
    pass
print("DENIED %.3f" % (before * 1000), flush=True)
'''
def audit_ts_after(t0):
    best = None
    for log in glob.glob(os.path.join(os.environ["XDG_CACHE_HOME"], "aisb/*/default/audit.jsonl")):
        for line in open(log):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "file" and e.get("target", "").endswith("/.env") and e["ts"] >= t0 - 1:
                best = e["ts"] if best is None else min(best, e["ts"])
    return best

times = {(b, m): [] for b in backends for m in ("on", "off")}
lat = {b: [] for b in backends}
for r in range(rounds):
    for b in backends:
        for mode in ("on", "off"):
            env = dict(os.environ)
            if mode == "off":
                env["AISB_TEST_BREAK_ISOLATION"] = "report"
                env["OFF"] = "1"
            out = subprocess.run([aisb, "run", "--backend", b, "--", "python3", "-c", PROBE],
                                 env=env, capture_output=True, text=True, timeout=600)
            opens = [l for l in out.stdout.splitlines() if l.startswith("OPENS ")]
            if not opens:
                sys.exit("the sandbox did not run: %s %s" % (out.stdout, out.stderr))
            times[(b, mode)].append(float(opens[0].split()[2]))
            if mode == "on":
                t0 = float([l for l in out.stdout.splitlines() if l.startswith("DENIED ")][0].split()[1])
                ts = None
                for _ in range(50):
                    ts = audit_ts_after(t0)
                    if ts is not None:
                        break
                    time.sleep(0.02)
                # The log's times are whole milliseconds: so is the latency.
                lat[b].append(None if ts is None else max(0, ts - int(t0)))

n = int(os.popen("find tree -type f | wc -l").read())
print("reporting layer of masks, %d rounds, %d unmasked files opened inside (median seconds)" % (rounds, n))
print("%-14s %10s %10s %8s   %s" % ("backend", "layer on", "layer off", "ratio", "denied open -> audit line, ms (median, max)"))
for b in backends:
    on, off = statistics.median(times[(b, "on")]), statistics.median(times[(b, "off")])
    seen = [x for x in lat[b] if x is not None]
    l = "%.1f, %.1f" % (statistics.median(seen), max(seen)) if seen else "never seen"
    missing = len(lat[b]) - len(seen)
    print("%-14s %10.3f %10.3f %8.3f   %s%s" % (b, on, off, on / off, l,
          "" if not missing else " (%d of %d not logged)" % (missing, len(lat[b]))))
PY
