#!/bin/sh
# Benchmark: image builds and start-up on an image (issue 8), as root.
#  - `aisb build` of a 5-step Dockerfile on the cached Debian base (the tests' layout, made with
#    debootstrap once): cold (empty store: the base layer is unpacked, every step runs), cold
#    steps only (base layer already in the store), and fully cached; each against the natural
#    baseline of running the same five commands directly (`sh -c`).
#  - the same cold builds as an ordinary user (BUILD_USER, default aisb-bench, created and
#    given subordinate ids by `aisb setup-user` if missing): rootless RUN steps, same run.
#  - `aisb up -- true` on the built image vs the host's root, both backends, round-robin.
#
#   sh bench/build.sh       # release build; RUNS (default 20) for the start-up table
set -eu
cd "$(dirname "$0")/.."
RUNS="${RUNS:-20}"
[ "$(id -u)" -eq 0 ] || { echo "bench/build.sh: builds need root" >&2; exit 1; }
BASE=/var/cache/aisb-test/debian-bookworm.oci
if ! [ -f "$BASE/index.json" ]; then
    echo "making the Debian base (debootstrap, once)…" >&2
    rm -rf /var/cache/aisb-test/bench.rootfs
    mkdir -p /var/cache/aisb-test
    /usr/sbin/debootstrap --variant=minbase bookworm /var/cache/aisb-test/bench.rootfs http://deb.debian.org/debian >/dev/null
    sh tests/images/oci-layout.sh /var/cache/aisb-test/bench.rootfs "$BASE" 1 >/dev/null
    rm -rf /var/cache/aisb-test/bench.rootfs
fi
cargo build --release -q
AISB="$PWD/target/release/aisb"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/proj/data" "$WORK/home"
cd "$WORK/proj"
git init -q
echo payload > data/file
cat > Dockerfile <<DF
FROM oci:$BASE:1
RUN echo one > /etc/one
RUN mkdir -p /opt/app && echo two > /opt/app/two
COPY data/ /opt/data/
RUN cat /opt/data/file > /etc/copied
WORKDIR /opt/app
DF
echo 'rootfs dockerfile="Dockerfile"' > sandbox.kdl
mkdir -p "$WORK/host" && (cd "$WORK/host" && git init -q)
# A project of 100 files of 1 MB that its image copies whole (`COPY . /src/`): what a start
# costs when the build context is large (its files' hashes are remembered by stat).
mkdir -p "$WORK/big/data" && (cd "$WORK/big" && git init -q)
i=0; while [ $i -lt 100 ]; do head -c 1000000 /dev/urandom > "$WORK/big/data/f$i"; i=$((i + 1)); done
printf 'FROM oci:%s:1\nCOPY . /src/\n' "$BASE" > "$WORK/big/Dockerfile"
echo 'rootfs dockerfile="Dockerfile"' > "$WORK/big/sandbox.kdl"
export HOME="$WORK/home" CI=true
BUILD_USER="${BUILD_USER:-aisb-bench}"
id "$BUILD_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$BUILD_USER"
out=$("$AISB" setup-user "$BUILD_USER" 2>&1) || { echo "$out" >&2; exit 1; }
chmod 755 "$WORK"
cp -a "$WORK/proj" "$WORK/uproj" && mkdir -p "$WORK/uhome" && chown -R "$BUILD_USER:" "$WORK/uproj" "$WORK/uhome"
export BUILD_USER

python3 - "$RUNS" "$AISB" "$WORK" <<'PY'
import json, os, shutil, subprocess, sys, time
runs, aisb, work = int(sys.argv[1]), sys.argv[2], sys.argv[3]
proj = os.path.join(work, "proj")

def timed(cmd, env_cache, cwd=proj, user=None):
    env = dict(os.environ, XDG_CACHE_HOME=env_cache)
    ids = {}
    if user:
        import pwd
        pw = pwd.getpwnam(user)
        env["HOME"] = os.path.join(work, "uhome")
        ids = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **ids)
    return (time.perf_counter() - t) * 1000

# The same work without a sandbox: the RUN commands into a scratch directory, the COPY a cp.
t = os.path.join(work, "direct")
direct_cmd = f"rm -rf {t}; mkdir -p {t} && echo one > {t}/one && mkdir -p {t}/app && echo two > {t}/app/two && cp -r data {t}/ && cat {t}/data/file > {t}/copied && mkdir -p {t}/opt/app"
direct = sorted(timed(["sh", "-c", direct_cmd], work) for _ in range(5))[2]
cold, steps, cached = [], [], []
for i in range(3):
    c = os.path.join(work, f"cache{i}")
    cold.append(timed([aisb, "build"], c))
    # Steps only: the same store minus everything but the base layer.
    out = subprocess.run([aisb, "build", "--json"], cwd=proj, env=dict(os.environ, XDG_CACHE_HOME=c), capture_output=True, check=True).stdout
    nodes = json.loads(out)["nodes"]
    for n in nodes:
        if n["entry"] and not n["what"].startswith("layer "):
            shutil.rmtree(n["entry"])
            os.remove(n["entry"] + ".ready")
    img = json.loads(out)["entry"]
    shutil.rmtree(img); os.remove(img + ".ready")
    steps.append(timed([aisb, "build"], c))
    cached.append(timed([aisb, "build"], c))
# The same as an ordinary user: RUN steps as root of a user namespace over their subordinate
# ids (bwrap), base layers unpacked there.
user = os.environ["BUILD_USER"]
uproj = os.path.join(work, "uproj")
ucold, usteps = [], []
for i in range(3):
    c = os.path.join(work, f"ucache{i}")
    os.makedirs(c)
    shutil.chown(c, user)
    ucold.append(timed([aisb, "build"], c, uproj, user))
    out = subprocess.run([aisb, "build", "--json"], cwd=uproj, env=dict(os.environ, XDG_CACHE_HOME=c, HOME=os.path.join(work, "uhome")), capture_output=True, check=True, user=user).stdout
    for n in json.loads(out)["nodes"]:
        if n["entry"] and not n["what"].startswith("layer "):
            subprocess.run(["rm", "-rf", n["entry"], n["entry"] + ".ready"], check=True)
    img = json.loads(out)["entry"]
    subprocess.run(["rm", "-rf", img, img + ".ready"], check=True)
    usteps.append(timed([aisb, "build"], c, uproj, user))
cold.sort(); steps.sort(); cached.sort(); ucold.sort(); usteps.sort()
print("aisb build of a 5-step image (RUN, RUN, COPY, RUN, WORKDIR), median of 3")
print(f"{'case':<44}{'ms':>10}{'x direct':>10}")
print(f"{'the same commands, no sandbox (sh -c)':<44}{direct:>10.1f}{1:>10.1f}")
for name, ts in [("cold (empty store, base layer unpacked)", cold), ("cold steps (base layer in the store)", steps), ("fully cached", cached),
                 (f"as {user}: cold", ucold), (f"as {user}: cold steps", usteps)]:
    print(f"{name:<44}{ts[1]:>10.1f}{ts[1] / direct:>10.1f}")

cache = os.path.join(work, "cache0")
cases = [
    ("bwrap --unshare-all (raw)", ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"], proj),
    ("host root, bwrap", [aisb, "up", "--backend", "bwrap", "--", "true"], os.path.join(work, "host")),
    ("image, bwrap", [aisb, "up", "--backend", "bwrap", "--", "true"], proj),
    ("host root, libcontainer", [aisb, "up", "--backend", "libcontainer", "--", "true"], os.path.join(work, "host")),
    ("image, libcontainer", [aisb, "up", "--backend", "libcontainer", "--", "true"], proj),
    ("image COPY . 100 MB, bwrap", [aisb, "up", "--backend", "bwrap", "--", "true"], os.path.join(work, "big")),
]
for _, cmd, cwd in cases:  # warm the scan caches (and build the big image)
    timed(cmd, cache, cwd)
# The big project's files were just written: their hashes are remembered once they are 2 s
# old (a change in the same timestamp tick could go unseen before).
time.sleep(2.5)
timed(cases[-1][1], cache, cases[-1][2])
cold_hash = []
for _ in range(3):
    shutil.rmtree(os.path.join(cache, "aisb", "copy-hashes"), ignore_errors=True)
    cold_hash.append(timed(cases[-1][1], cache, cases[-1][2]))
times = {name: [] for name, _, _ in cases}
for _ in range(runs):
    for name, cmd, cwd in cases:
        times[name].append(timed(cmd, cache, cwd))
print(f"\n`aisb up -- true` on the built image vs the host's root, median (p90) of {runs}")
print(f"{'case':<28}{'median ms':>10}{'p90 ms':>9}{'x raw bwrap':>13}")
raw = sorted(times["bwrap --unshare-all (raw)"])[runs // 2]
for name, ts in times.items():
    ts.sort()
    print(f"{name:<28}{ts[runs // 2]:>10.1f}{ts[int(runs * 0.9)]:>9.1f}{ts[runs // 2] / raw:>13.2f}")
c = sorted(cold_hash)[1]
print(f"{'  the same, hashes forgotten':<28}{c:>10.1f}{'':>9}{c / raw:>13.2f}  (median of 3: every file read and hashed)")
PY
