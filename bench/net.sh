#!/bin/sh
# Benchmark: the cost of the sandbox's network paths against a direct loopback transfer, in
# one run: a 100 MB download and 1,000 small requests, (1) direct on the host, (2) through the
# proxy variables (plain HTTP, and a CONNECT tunnel as HTTPS would use), (3) transparently
# (curl --noproxy '*': the DNS stub's synthetic address, the init's relay on port 80, the same
# proxy); then the DNS stub's answers per second, and the start-up cost of the feature
# (`aisb run -- true` in allow mode, transparent on vs `network transparent=#false`). The
# server is on the host's loopback; the sandbox reaches it by a name pinned with
# AISB_PROXY_PIN.
#
#   sh bench/net.sh              # release build; ROUNDS (default 3) rounds, best of each
#   SHORT=1 sh bench/net.sh      # CI: the debug build, 1 round, 10 MB, 100 requests (the
#                                # numbers mean nothing; the script must keep working)
set -eu
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-3}"
#   DEBUG=1 sh bench/net.sh      # full sizes on the debug build (ratios only: no release)
if [ -n "${SHORT:-}" ]; then
    ROUNDS=1 MB=10 REQS=100 STARTS=5 QUERIES=500
else
    MB=100 REQS=1000 STARTS=20 QUERIES=5000
fi
if [ -n "${SHORT:-}${DEBUG:-}" ]; then
    cargo build -q --bin aisb --bin aisb-init
    AISB="$PWD/target/debug/aisb"
else
    cargo build --release -q
    AISB="$PWD/target/release/aisb"
fi
WORK=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/www" "$WORK/proj" "$WORK/home"
head -c "${MB}000000" /dev/zero > "$WORK/www/big"
echo ok > "$WORK/www/small"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$WORK/www" && exec python3 -m http.server "$PORT" --bind 127.0.0.1 >/dev/null 2>&1) &
SERVER=$!
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$PORT/small" && break; sleep 0.1; done
(cd "$WORK/proj" && git init -q && printf 'network {\n    allow "bench.test"\n}\n' > sandbox.kdl)
mkdir -p "$WORK/off"
(cd "$WORK/off" && git init -q && printf 'network transparent=#false {\n    allow "bench.test"\n}\n' > sandbox.kdl)
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache" AISB_PROXY_PIN="bench.test=127.0.0.1:$PORT"
cd "$WORK/proj"

# One script (in the project, so the sandbox sees it), run on the host and inside the
# sandbox: prints `name seconds` lines. BASE: the URL prefix; CURL: extra curl options.
cat > "$WORK/proj/probe.sh" <<EOF
set -f  # CURL may hold '--noproxy *'
big() { curl -s -o /dev/null -w '%{time_total}' \$CURL "\$@" "\$BASE/big"; }
echo "download \$(big)"
[ -n "\${TUNNEL:-}" ] && echo "download_tunnel \$(big -p)"
echo "small \$(curl -s -o /dev/null -w '%{time_total}\n' \$CURL "\$BASE/small?[1-$REQS]" | awk '{ s += \$1 } END { print s }')"
exit 0
EOF
# The stub's answer rate: QUERIES lookups of an allowed name (answered from the pool after
# the first) and as many of distinct unlisted names (each asks the proxy once).
cat > "$WORK/proj/dns.py" <<'EOF'
import socket, struct, sys, time
n = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); s.connect(("127.0.0.53", 53))
def q(i, name):
    s.send(struct.pack(">HHHHHH", i & 0xffff, 256, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l for l in name.split(b".")) + b"\x00\x00\x01\x00\x01")
    s.recv(512)
for label, names in (("dns_allowed", lambda i: b"bench.test"), ("dns_denied", lambda i: b"n%d.denied.test" % i)):
    t = time.perf_counter()
    for i in range(n):
        q(i, names(i))
    print(label, n / (time.perf_counter() - t))
EOF

export AISB MB REQS STARTS QUERIES
python3 - "$ROUNDS" "$WORK" <<'PY'
import subprocess, sys, os, time, statistics
rounds, work = int(sys.argv[1]), sys.argv[2]
mb, reqs, starts, queries = (int(os.environ[k]) for k in ("MB", "REQS", "STARTS", "QUERIES"))
aisb = os.environ["AISB"]
port = os.environ["AISB_PROXY_PIN"].rsplit(":", 1)[1]
def measure(cmd, env, cwd=None):
    out = subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, text=True).stdout
    return {l.split()[0]: float(l.split()[1]) for l in out.splitlines() if len(l.split()) == 2}
env = dict(os.environ)
for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
    env.pop(k, None)
probe = os.path.join(work, "proj", "probe.sh")
run = lambda b: [aisb, "--trust", "run", "--backend", b, "--", "env"]
cases = {"direct (host loopback)": ["env", f"BASE=http://127.0.0.1:{port}", "sh", probe]}
for b in ("bwrap", "libcontainer"):
    cases[f"proxy variables ({b})"] = run(b) + [f"BASE=http://bench.test:{port}", "TUNNEL=1", "sh", probe]
    cases[f"transparent ({b})"] = run(b) + ["BASE=http://bench.test", "CURL=--noproxy *", "sh", probe]
best = {}
for _ in range(rounds):
    for name, cmd in cases.items():
        for k, v in measure(cmd, env).items():
            best.setdefault(name, {})
            best[name][k] = min(best[name].get(k, v), v)
d = best["direct (host loopback)"]
print(f"network paths, best of {rounds} rounds ({mb} MB download, {reqs} small requests; direct = the same curl on the host)")
print(f"{'case':<34}{'MB/s':>8}{'tunnel MB/s':>12}{'% direct':>10}{'req total s':>12}{'+ms/req':>9}")
for name, r in best.items():
    mbs = mb / r["download"]
    tun = mb / r["download_tunnel"] if "download_tunnel" in r else None
    pct = 100 * min(mbs, tun or mbs) / (mb / d["download"])
    per = (r["small"] - d["small"]) / reqs * 1000
    tun_s = f"{tun:>12.0f}" if tun else f"{'-':>12}"
    print(f"{name:<34}{mbs:>8.0f}{tun_s}{pct:>9.0f}%{r['small']:>12.3f}{per:>9.3f}")

print(f"\nDNS stub, answers per second ({queries} queries each, UDP, one client)")
for b in ("bwrap", "libcontainer"):
    r = measure(run(b) + ["python3", os.path.join(work, "proj", "dns.py"), str(queries)], env)
    print(f"  {b:<14} allowed name {r['dns_allowed']:>9.0f}/s   distinct unlisted names {r['dns_denied']:>9.0f}/s")

print(f"\nstart-up, `aisb run -- true` in allow mode (median of {starts})")
print(f"{'backend':<16}{'transparent ms':>16}{'off ms':>10}{'cost ms':>10}")
for b in ("bwrap", "libcontainer"):
    t = {}
    for label, cwd in (("on", os.path.join(work, "proj")), ("off", os.path.join(work, "off"))):
        times = []
        for _ in range(starts):
            s = time.perf_counter()
            subprocess.run([aisb, "--trust", "run", "--backend", b, "--", "true"], env=env, cwd=cwd, check=True, capture_output=True)
            times.append((time.perf_counter() - s) * 1000)
        t[label] = statistics.median(times)
    print(f"{b:<16}{t['on']:>16.1f}{t['off']:>10.1f}{t['on'] - t['off']:>10.1f}")
PY
