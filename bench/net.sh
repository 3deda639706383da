#!/bin/sh
# Benchmark: the cost of the sandbox's network path (in-sandbox relay + host proxy) against a
# direct loopback transfer, in one run: a 100 MB download (plain HTTP through the proxy, and
# through a CONNECT tunnel as HTTPS would use) and 1,000 small requests. The server is on the
# host's loopback; the sandbox reaches it by a name the proxy's resolver override maps.
#
#   sh bench/net.sh            # release build; ROUNDS (default 3) rounds, best of each
set -eu
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-3}"
cargo build --release -q
AISB="$PWD/target/release/aisb"
WORK=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/www" "$WORK/proj" "$WORK/home"
head -c 100000000 /dev/zero > "$WORK/www/100mb"
echo ok > "$WORK/www/small"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$WORK/www" && exec python3 -m http.server "$PORT" --bind 127.0.0.1 >/dev/null 2>&1) &
SERVER=$!
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$PORT/small" && break; sleep 0.1; done
(cd "$WORK/proj" && git init -q && printf 'network {\n    allow "bench.test:%s"\n}\n' "$PORT" > sandbox.kdl)
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache" AISB_PROXY_RESOLVE="bench.test=127.0.0.1"
cd "$WORK/proj"

# One script (in the project, so the sandbox sees it), run on the host and inside the
# sandbox: prints `name seconds` lines.
cat > "$WORK/proj/probe.sh" <<EOF
big() { curl -s -o /dev/null -w '%{time_total}' "\$@" http://\$HOSTNAME_UNDER_TEST:$PORT/100mb; }
echo "download \$(big)"
echo "download_tunnel \$(big -p)"
echo "small \$(curl -s -o /dev/null -w '%{time_total}\n' "http://\$HOSTNAME_UNDER_TEST:$PORT/small?[1-1000]" | awk '{ s += \$1 } END { print s }')"
EOF

export AISB
python3 - "$ROUNDS" "$WORK" <<'PY'
import subprocess, sys, os
rounds, work = int(sys.argv[1]), sys.argv[2]
def measure(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return {l.split()[0]: float(l.split()[1]) for l in out.splitlines() if len(l.split()) == 2}
base_env = dict(os.environ)
direct_env = dict(base_env, HOSTNAME_UNDER_TEST="127.0.0.1")
for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
    direct_env.pop(k, None)
probe = os.path.join(work, "proj", "probe.sh")
aisb_bin = os.environ.get("AISB")
cases = {"direct (host loopback)": ["sh", probe]}
for b in ("bwrap", "libcontainer"):
    cases[f"sandbox via proxy ({b})"] = [aisb_bin, "run", "--backend", b, "--", "env", "HOSTNAME_UNDER_TEST=bench.test", "sh", probe]
best = {}
for _ in range(rounds):
    for name, cmd in cases.items():
        r = measure(cmd, direct_env if name.startswith("direct") else base_env)
        for k, v in r.items():
            best.setdefault(name, {})
            best[name][k] = min(best[name].get(k, v), v)
d = best["direct (host loopback)"]
print(f"network path, best of {rounds} rounds (direct = same curl on the host, no proxy)")
print(f"{'case':<32}{'100 MB MB/s':>12}{'tunnel MB/s':>12}{'% direct':>10}{'1000 req s':>12}{'+ms/req':>9}")
for name, r in best.items():
    mbs = 100 / r["download"]
    tun = 100 / r["download_tunnel"]
    pct = 100 * min(mbs, tun) / (100 / d["download"])
    per = (r["small"] - d["small"]) / 1000 * 1000
    print(f"{name:<32}{mbs:>12.0f}{tun:>12.0f}{pct:>9.0f}%{r['small']:>12.2f}{per:>9.3f}")
PY
