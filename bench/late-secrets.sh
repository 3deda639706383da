#!/bin/sh
# Benchmark: the window of the live mask layer. A sandbox reads `.env.late` in a tight loop;
# the host creates it (with content), waits, deletes it, ROUNDS times. For each round: the time
# from the host's create to the first "Permission denied" inside, and whether the content was
# read before that (the race). Per backend; as root, or as the user running it.
#
#   sh bench/late-secrets.sh             # release build; ROUNDS (default 40), BACKENDS
set -eu
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-40}"
BACKENDS="${BACKENDS:-bwrap libcontainer}"
if [ -z "${AISB:-}" ]; then
    cargo build --release -q
    AISB="$PWD/target/release/aisb"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/proj" "$WORK/home"
(cd "$WORK/proj" && git init -q && echo hi > README && git add README \
    && git -c user.name=b -c user.email=b@b commit -qm init)
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache"
cd "$WORK/proj"

python3 - "$ROUNDS" "$AISB" $BACKENDS <<'PY'
import os, subprocess, sys, time
rounds, aisb, backends = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
MONITOR = r'''
import os, sys, time
seen = []
last = None
print("started", flush=True)
while not os.path.exists("bench-stop"):
    try:
        with open(".env.late", "rb") as f:
            s = "readable" if f.read() else "empty"
    except PermissionError:
        s = "denied"
    except FileNotFoundError:
        s = "missing"
    if s != last:
        seen.append((s, time.time_ns()))
        last = s
for s, t in seen:
    print(s, t)
'''
for backend in backends:
    for f in (".env.late", "bench-stop"):
        if os.path.exists(f):
            os.remove(f)
    p = subprocess.Popen([aisb, "run", "--backend", backend, "--", "python3", "-c", MONITOR],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "started\n"
    time.sleep(0.5)
    writes = []
    for _ in range(rounds):
        t = time.time_ns()
        with open(".env.late", "w") as f:
            f.write("SECRET=1\n")
        writes.append(t)
        time.sleep(0.05)
        os.remove(".env.late")
        time.sleep(0.05)
    open("bench-stop", "w").close()
    out = p.communicate()[0].split("\n")
    events = [(l.split()[0], int(l.split()[1])) for l in out if l.strip()]
    masked, leaked = [], 0
    for i, w in enumerate(writes):
        end = writes[i + 1] if i + 1 < len(writes) else w + 10**9
        ev = [(s, t) for s, t in events if w <= t < end]
        denied = [t for s, t in ev if s == "denied"]
        if not denied:
            masked.append(None)
            continue
        masked.append((denied[0] - w) / 1e6)
        if any(s == "readable" and t < denied[0] for s, t in ev):
            leaked += 1
    ok = sorted(m for m in masked if m is not None)
    missing = sum(m is None for m in masked)
    def pct(q):
        return ok[min(len(ok) - 1, int(len(ok) * q))] if ok else float("nan")
    print(f"{backend} ({'root' if os.geteuid() == 0 else 'user'}): {rounds} late secrets; "
          f"create -> denied inside, ms: median {pct(0.5):.2f}, p90 {pct(0.9):.2f}, max {ok[-1] if ok else float('nan'):.2f}; "
          f"content read before the mask in {leaked}/{rounds}; never masked: {missing}")
PY
