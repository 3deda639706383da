#!/bin/sh
# Benchmark: start-up of `aisb run -- true` as the number of masks grows (0, 500, 5,000 and
# 50,000: one gitignored file in each of N directories, the worst case, since git cannot
# collapse them into one directory), and with a 200 MB `node_modules` (a dependency
# directory: visible, copy-on-write), per backend, against /bin/true and raw bwrap in the same
# run. Round-robin, median of RUNS (default 10). A start that fails prints its error instead
# of a time. As root; set AS_USER=name to run the cases as that ordinary user (it must own
# nothing special: the projects are made for it).
#
# The floor per mask is the kernel's own: a bind mount of an empty file (a mount of its own,
# as aisb's masking file is) over each of the N files, made by a loop in a fresh mount
# namespace (in `unshare -r` as the user) with nothing else around it, timed until that
# namespace is torn down (its mounts go when its last process exits, as a sandbox's do). It
# is printed as `kernel bind, N` (us/mask is its cost per mount), and each aisb row's us/mask
# is also given as a multiple of it (`x floor`).
#
#   sh bench/masks.sh                 # release build
#   COUNTS="0 500" RUNS=5 sh bench/masks.sh
#   AS_USER=aisb-test BACKENDS=libcontainer sh bench/masks.sh
set -eu
cd "$(dirname "$0")/.."
RUNS="${RUNS:-10}"
COUNTS="${COUNTS:-0 500 5000 50000}"
cargo build --release -q
WORK=$(mktemp -d /tmp/aisb-masks.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cp target/release/aisb target/release/aisb-init "$WORK/"
AISB="$WORK/aisb"
for n in $COUNTS; do
    d="$WORK/p$n"
    mkdir -p "$d"
    (cd "$d" && git init -q && printf 'secret.txt\n' > .gitignore && git add .gitignore &&
        python3 - "$n" <<'PY'
import os, sys
for i in range(int(sys.argv[1])):
    os.makedirs(f"d{i}", exist_ok=True)
    open(f"d{i}/tracked.txt", "w").write("x")
    open(f"d{i}/secret.txt", "w").write("s")
PY
        git add -A >/dev/null && git -c user.email=b@b -c user.name=b commit -qm m)
done
# 200 MB of dependencies: 2,000 packages of 20 files of 5 KB.
nm="$WORK/node"
mkdir -p "$nm"
(cd "$nm" && git init -q && printf 'node_modules/\n' > .gitignore && git add .gitignore &&
    python3 - <<'PY'
import os
blob = os.urandom(5 * 1024)
for p in range(2000):
    d = f"node_modules/pkg{p}/lib"
    os.makedirs(d, exist_ok=True)
    for f in range(20):
        open(f"{d}/f{f}.js", "wb").write(blob)
PY
)
# The user's own group too: a 0700 directory whose group is not mapped in the sandbox's user
# namespace cannot be crossed by its root while libcontainer prepares the root file system.
if [ -n "${AS_USER:-}" ]; then chown -R "$AS_USER:" "$WORK"; fi
python3 - "$RUNS" "$AISB" "$WORK" "$COUNTS" "${AS_USER:-}" <<'PY'
import os, subprocess, sys, time, statistics
runs, aisb, work, counts, user = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5]
env = dict(os.environ, HOME=f"{work}/home", XDG_CACHE_HOME=f"{work}/cache", XDG_CONFIG_HOME=f"{work}/config")
os.makedirs(f"{work}/home", exist_ok=True)
if user:
    import pwd
    pw = pwd.getpwnam(user)
    for d in ("home",):
        os.chown(f"{work}/{d}", pw.pw_uid, pw.pw_gid)
def pre():
    if user:
        os.setgid(pw.pw_gid); os.setgroups([pw.pw_gid]); os.setuid(pw.pw_uid)
cases = [("/bin/true", ["/bin/true"], None),
         ("bwrap --unshare-all (raw)", ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"], None)]
backends = os.environ.get("BACKENDS", "bwrap libcontainer").split()
for b in backends:
    for n in counts:
        cases.append((f"{b}, {int(n):,} masks", [aisb, "run", "--backend", b, "--", "true"], f"{work}/p{n}"))
    cases.append((f"{b}, 200 MB node_modules", [aisb, "run", "--backend", b, "--", "true"], f"{work}/node"))
times = {c[0]: [] for c in cases}
errors = {}
for name, cmd, cwd in cases:  # warm: the scan cache, the layers
    for _ in range(2):
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, preexec_fn=pre)
        if r.returncode != 0:
            errors[name] = " ".join(r.stderr.decode(errors="replace").split())[:400] or "exit %d" % r.returncode
for _ in range(runs):
    for name, cmd, cwd in cases:
        if name in errors:
            continue
        t = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, preexec_fn=pre)
        times[name].append((time.perf_counter() - t) * 1000)
FLOOR = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
root, n, src = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
def once(n):
    paths = [f"{root}/d{i}/secret.txt".encode() for i in range(n)]
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 0
        if (libc.unshare(0x20000) != 0  # CLONE_NEWNS
                or libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None) != 0  # MS_REC|MS_PRIVATE
                # The source a mount of its own, as aisb's masking file is (binding straight
                # from the root file system's mount costs more with each bind).
                or libc.mount(src, src, None, 4096, None) != 0):  # MS_BIND
            code = 1
        for p in paths:
            if code == 0 and libc.mount(src, p, None, 4096, None) != 0:
                code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"the bind loop failed: {status}")
    # Until the namespace is gone: its mounts are torn down before the child is reaped.
    return time.perf_counter() - t
print((once(n) - once(0)) * 1e6 / n)
"""
floor = {}
empty = f"{work}/empty"
open(empty, "w").close()
os.chmod(empty, 0)
for n in counts:
    if int(n) == 0:
        continue
    unshare = ["unshare", "-r"] if user else []
    got = []
    for _ in range(3):
        r = subprocess.run(unshare + ["python3", "-c", FLOOR, f"{work}/p{n}", n, empty],
                           capture_output=True, preexec_fn=pre)
        if r.returncode == 0:
            got.append(float(r.stdout))
    if got:
        floor[int(n)] = statistics.median(got)
base = {}
print(f"{'case':<34} {'median ms':>10} {'x small':>8} {'us/mask':>8} {'x floor':>8}")
for n, us in floor.items():
    print(f"{'kernel bind, ' + f'{n:,}':<34} {us * n / 1000:>10.1f} {'':>8} {us:>8.1f}")
for name, cmd, cwd in cases:
    if name in errors:
        print(f"{name:<34} FAILED: {errors[name]}")
        continue
    m = statistics.median(times[name])
    b = name.split(",")[0]
    extra = ""
    if name.endswith(" 0 masks"):
        base[b] = m
    ratio = f"{m / base[b]:.2f}" if b in base and b in backends else ""
    vs = ""
    if b in base and "masks" in name and not name.endswith(" 0 masks"):
        n = int(name.split(", ")[1].split()[0].replace(",", ""))
        per = (m - base[b]) * 1000 / n
        extra = f"{per:.1f}"
        if n in floor:
            vs = f"{per / floor[n]:.2f}"
    print(f"{name:<34} {m:>10.1f} {ratio:>8} {extra:>8} {vs:>8}")
PY
