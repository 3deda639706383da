#!/bin/sh
# Benchmark: what the run's own git directory (issue 30: `.git` an overlay private to the run,
# brought back with reduced trust when it ends) costs, on a repository of FILES files (default
# 100,000) and COMMITS commits (default 10,000, made with git fast-import), per backend:
#
#   true       `aisb run -- true`: the overlay's mount and the host's side noted, nothing to
#              bring back
#   status     `aisb run -- git status`: the sandbox refreshes its index (brought back when it
#              differs: git parses it, paths checked, installed through index.lock)
#   commit     `aisb run -- git commit --allow-empty`: a commit brought back (aisb's own
#              repository, a fetch with fsckObjects, the branch fast-forwarded)
#
# each against the same command with the project's git directory shared with the host as it
# was before (`AISB_TEST_BREAK_ISOLATION=git`: no overlay, no guards: the floor), and with the
# overlay but the host's objects as they are (`…=git-objects`: no store without masked
# content, issue 30 item 4), in the same run, round-robin, median of RUNS (default 10). The
# history has 1,000 masked paths (`hist/sN/.env`, one every tenth commit). Prints a table of
# milliseconds and ratios, then the store's cold build, its update after one host commit, and
# its size on disk.
#
#   sh bench/git.sh
#   FILES=10000 COMMITS=1000 RUNS=5 BACKENDS=bwrap sh bench/git.sh
set -eu
cd "$(dirname "$0")/.."
RUNS="${RUNS:-10}"
FILES="${FILES:-100000}"
COMMITS="${COMMITS:-10000}"
BACKENDS="${BACKENDS:-bwrap libcontainer}"
cargo build --release -q
WORK=$(mktemp -d /tmp/aisb-gitbench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cp target/release/aisb target/release/aisb-init "$WORK/"
P="$WORK/proj"
mkdir -p "$P" "$WORK/home" "$WORK/cache"
(
    cd "$P"
    git init -q -b main
    # COMMITS commits touching one file each, then one commit with FILES files.
    python3 - "$COMMITS" <<'PY' | git fast-import --quiet
import sys
n = int(sys.argv[1])
for i in range(n):
    data = f"line {i}\n".encode()
    sys.stdout.write(f"commit refs/heads/main\ncommitter b <b@b> {1700000000 + i} +0000\n")
    sys.stdout.write("data 2\nc\n")
    sys.stdout.write(f"M 100644 inline hist/f{i % 1000}.txt\ndata {len(data)}\n")
    sys.stdout.write(data.decode() + "\n")
    if i % 10 == 0:
        secret = f"TOKEN=secret-{i}\n".encode()
        sys.stdout.write(f"M 100644 inline hist/s{(i // 10) % 1000}/.env\ndata {len(secret)}\n")
        sys.stdout.write(secret.decode() + "\n")
PY
    git reset -q --hard main
    python3 - "$FILES" <<'PY'
import os, sys
n = int(sys.argv[1])
for i in range(n):
    d = f"src/d{i // 1000}"
    os.makedirs(d, exist_ok=True)
    open(f"{d}/f{i}.txt", "w").write(f"{i}\n")
PY
    git add -A
    git -c user.name=b -c user.email=b@b commit -qm files
)
du -sh "$P/.git" | sed 's/^/repository: /'
# The store (issue 30 item 4): built cold at the first run, updated after a host commit.
store_run() {
    t0=$(date +%s%N)
    (cd "$P" && env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache" \
        AISB_TEST_BREAK_ISOLATION="${1:-}" "$WORK/aisb" --trust run --backend bwrap -- true 2>/dev/null)
    echo $(( ($(date +%s%N) - t0) / 1000000 ))
}
store_run git-objects >/dev/null   # the project scan's cache, without the store
cold=$(store_run)
warm=$(store_run)
(cd "$P" && echo more >> hist/f1.txt && git -c user.name=b -c user.email=b@b commit -qam more)
updated=$(store_run)
store_du=$(du -sh "$WORK/cache" 2>/dev/null | cut -f1)
pack_du=$(du -sh "$P/.git/objects" | cut -f1)
python3 - "$RUNS" "$WORK" "$BACKENDS" <<'PY'
import os, statistics, subprocess, sys, time
runs, work, backends = int(sys.argv[1]), sys.argv[2], sys.argv[3].split()
proj = os.path.join(work, "proj")
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.path.join(work, "home"),
       "XDG_CACHE_HOME": os.path.join(work, "cache")}
cmds = {
    "true": ["true"],
    "status": ["git", "status", "--porcelain"],
    "commit": ["git", "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-q",
               "--allow-empty", "-m", "bench"],
}
# "own": the private .git with the store; "shared": the floor; "nostore": the host's objects.
cases = [(b, c, v) for b in backends for c in cmds for v in ("own", "shared", "nostore")]
times = {k: [] for k in cases}
errors = {}
def once(b, c, variant):
    e = dict(env)
    if variant == "shared":
        e["AISB_TEST_BREAK_ISOLATION"] = "git"
    elif variant == "nostore":
        e["AISB_TEST_BREAK_ISOLATION"] = "git-objects"
    argv = [os.path.join(work, "aisb"), "--trust", "run", "--backend", b, "--"] + cmds[c]
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=proj, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = (time.perf_counter() - t) * 1000
    if r.returncode != 0:
        errors[(b, c, variant)] = r.stderr.decode(errors="replace").strip().splitlines()[-1:]
    return dt
for k in cases:  # warm: the scan cache, the store, the page cache
    once(*k)
for _ in range(runs):
    for k in cases:
        times[k].append(once(*k))
print(f"{'backend':<13} {'case':<8} {'own .git ms':>12} {'shared ms':>10} {'ratio':>6} {'added ms':>9} {'no store ms':>12} {'store ms':>9}")
for b in backends:
    for c in cmds:
        own = statistics.median(times[(b, c, "own")])
        shared = statistics.median(times[(b, c, "shared")])
        nostore = statistics.median(times[(b, c, "nostore")])
        print(f"{b:<13} {c:<8} {own:>12.1f} {shared:>10.1f} {own / shared:>6.2f} {own - shared:>9.1f} {nostore:>12.1f} {own - nostore:>9.1f}")
for k, e in errors.items():
    print("error", k, e)
PY
echo "store: cold build (first run, bwrap) ${cold} ms, next run ${warm} ms, after one host commit ${updated} ms; aisb's cache ${store_du} (the repository's objects: ${pack_du})"
