#!/bin/sh
# Benchmark: the cost of the sandbox's network paths against a direct loopback transfer, in
# one run: a 100 MB download and 1,000 small requests, (1) direct on the host, (2) through the
# proxy variables (plain HTTP, and a CONNECT tunnel as HTTPS would use), (3) transparently
# (curl --noproxy '*': the DNS stub's synthetic address, the init's relay on port 80, the same
# proxy); then the DNS stub's answers per second, the start-up cost of the feature
# (`aisb run -- true` in allow mode, transparent on vs `network transparent=#false`), and the
# credential broker's terminated TLS (issue 31) against an opaque tunnel to the same HTTPS
# server and against direct: throughput, the added time per request on a kept-alive
# connection and per new connection. The
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
TLS_SERVER=
trap 'kill $SERVER $TLS_SERVER 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/www" "$WORK/proj" "$WORK/home"
head -c "${MB}000000" /dev/zero > "$WORK/www/big"
echo ok > "$WORK/www/small"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$WORK/www" && exec python3 -m http.server "$PORT" --bind 127.0.0.1 >/dev/null 2>&1) &
SERVER=$!
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$PORT/small" && break; sleep 0.1; done
# An HTTPS server (HTTP/1.1, kept alive) with a certificate for the two names the sandbox
# reaches it by: brokered.test (a credential is bound to it: terminated) and tunnel.test (not:
# an opaque tunnel), from a CA of the bench's own, which aisb takes as the host's roots.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench-ca \
    -keyout "$WORK/ca.key" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=brokered.test \
    -keyout "$WORK/tls.key" -out "$WORK/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:brokered.test,DNS:tunnel.test\n' > "$WORK/san.ext"
openssl x509 -req -in "$WORK/tls.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial \
    -days 1 -extfile "$WORK/san.ext" -out "$WORK/tls.pem" 2>/dev/null
TLS_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$WORK/www" && exec python3 -c '
import http.server, ssl, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One write per answer, no Nagle: else each kept-alive request waits for a delayed ACK.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain(sys.argv[2], sys.argv[3])
s.socket = c.wrap_socket(s.socket, server_side=True)
s.serve_forever()' "$TLS_PORT" "$WORK/tls.pem" "$WORK/tls.key" >/dev/null 2>&1) &
TLS_SERVER=$!
for _ in $(seq 50); do curl -s -o /dev/null --cacert "$WORK/ca.pem" --resolve "brokered.test:$TLS_PORT:127.0.0.1" "https://brokered.test:$TLS_PORT/small" && break; sleep 0.1; done
(cd "$WORK/proj" && git init -q && printf 'network {\n    allow "bench.test" "brokered.test" "tunnel.test"\n}\ncredential "bench" env="BENCH_KEY" {\n    from env="BENCH_REAL_KEY"\n    hosts "brokered.test"\n    header "x-api-key"\n}\n' > sandbox.kdl)
mkdir -p "$WORK/off"
(cd "$WORK/off" && git init -q && printf 'network transparent=#false {\n    allow "bench.test"\n}\n' > sandbox.kdl)
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache" AISB_PROXY_PIN="bench.test=127.0.0.1:$PORT,brokered.test=127.0.0.1:$TLS_PORT,tunnel.test=127.0.0.1:$TLS_PORT"
export SSL_CERT_FILE="$WORK/ca.pem" BENCH_REAL_KEY="sk-bench-0123456789abcdef0123456789abcdef" TLS_PORT
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
# The TLS paths: a download, REQS requests on one kept-alive connection (the time of the whole
# curl, connection included), and REQS requests each on a new connection.
cat > "$WORK/proj/tls.sh" <<EOF
set -f
c() { curl -s -o /dev/null -H "x-api-key: \$BENCH_KEY" \$CURL "\$@"; }
echo "download \$(c -w '%{time_total}' "\$BASE/big")"
s=\$(date +%s%N); c "\$BASE/small?[1-$REQS]"; e=\$(date +%s%N)
echo "kept \$(( (e - s) / 1000 ))e-6"
echo "new \$(c -w '%{time_total}\n' -H 'Connection: close' "\$BASE/small?[1-$REQS]" | awk '{ s += \$1 } END { print s }')"
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

export AISB MB REQS STARTS QUERIES PORT
python3 - "$ROUNDS" "$WORK" <<'PY'
import subprocess, sys, os, time, statistics
rounds, work = int(sys.argv[1]), sys.argv[2]
mb, reqs, starts, queries = (int(os.environ[k]) for k in ("MB", "REQS", "STARTS", "QUERIES"))
aisb = os.environ["AISB"]
port = os.environ["PORT"]
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
def best_of(cases):
    """Each case's numbers, the best of `rounds` runs (the cases interleaved per round)."""
    best = {}
    for _ in range(rounds):
        for name, cmd in cases.items():
            for k, v in measure(cmd, env).items():
                best.setdefault(name, {})
                best[name][k] = min(best[name].get(k, v), v)
    return best
best = best_of(cases)
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

tls = os.path.join(work, "proj", "tls.sh")
tport = os.environ["TLS_PORT"]
tcases = {"direct (host loopback)": ["env", f"BASE=https://brokered.test:{tport}", f"CURL=--cacert {work}/ca.pem --resolve brokered.test:{tport}:127.0.0.1", "BENCH_KEY=x", "sh", tls]}
for b in ("bwrap", "libcontainer"):
    tcases[f"opaque tunnel ({b})"] = run(b) + ["BASE=https://tunnel.test", "sh", tls]
    tcases[f"brokered, terminated ({b})"] = run(b) + ["BASE=https://brokered.test", "sh", tls]
tbest = best_of(tcases)
d = tbest["direct (host loopback)"]
print(f"\nHTTPS through the credential broker, best of {rounds} rounds ({mb} MB download; {reqs} requests kept alive, and {reqs} each on a new connection); + ms against the opaque tunnel of the same backend")
print(f"{'case':<34}{'MB/s':>8}{'% direct':>10}{'+ms/req':>9}{'+ms/new conn':>14}")
for name, r in tbest.items():
    mbs = mb / r["download"]
    pct = 100 * mbs / (mb / d["download"])
    base = tbest.get(name.replace("brokered, terminated", "opaque tunnel")) if "brokered" in name else None
    per = f"{(r['kept'] - base['kept']) / reqs * 1000:>9.3f}" if base else f"{'-':>9}"
    new = f"{(r['new'] - base['new']) / reqs * 1000:>14.3f}" if base else f"{'-':>14}"
    print(f"{name:<34}{mbs:>8.0f}{pct:>9.0f}%{per}{new}")

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
