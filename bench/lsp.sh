#!/bin/sh
# Benchmark: `aisb lsp`'s keystroke-to-diagnostics latency on a warm cache, in bench/plan.sh's
# generated repository of 100,000 files (20,000 ignored), against the natural baseline in the
# same run: `aisb check` from the command line (a process, the load and every profile's
# evaluation on the same warm scan cache) and /bin/true (the process floor).
#
# A client (Python, over stdio) opens sandbox.kdl, waits for the first diagnostics (the cold
# evaluation that warms the cache), then sends RUNS edits one at a time and times each from
# the `didChange` to the `publishDiagnostics` of that version: edits that leave a decoding
# error (no evaluation needed) and edits that leave a valid file (every profile evaluated).
#
#   sh bench/lsp.sh             # builds --release; generates the repo once (bench/plan.sh's)
#   RUNS=50 sh bench/lsp.sh
#   AISB=target/debug/aisb sh bench/lsp.sh   # another build, no cargo
set -eu
cd "$(dirname "$0")/.."
RUNS="${RUNS:-20}"
# AISB=path/to/aisb measures that binary instead (say which build it is when you quote it).
if [ -z "${AISB:-}" ]; then
    cargo build --release -q
    AISB="$PWD/target/release/aisb"
fi
REPO="$PWD/target/bench/repo-100k"
export XDG_CACHE_HOME="$PWD/target/bench/cache"
if [ ! -f "$REPO/.generated" ]; then
    # bench/plan.sh generates the repository (and measures `aisb plan` once on it).
    RUNS=1 sh bench/plan.sh >/dev/null
fi
KDL="$REPO/sandbox.kdl"
cleanup() { rm -f "$KDL"; }
trap cleanup EXIT
cat > "$KDL" <<'KDL'
import "preset:claude"
network {
    allow "api.example.com"
    group "github"
}
profile "review" extends="investigate" {
    block "docs/internal/"
}
task "test" {
    run "cargo test"
    profile "review"
}
KDL
python3 - "$AISB" "$REPO" "$RUNS" <<'PY'
import json, os, statistics, subprocess, sys, time
aisb, repo, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
kdl = os.path.join(repo, "sandbox.kdl")
uri = "file://" + kdl
good = open(kdl).read()

def median_ms(cmd, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); subprocess.run(cmd, cwd=repo, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ts.append((time.perf_counter() - t) * 1000)
    return statistics.median(ts)

p = subprocess.Popen([aisb, "lsp"], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
def send(m):
    b = json.dumps(m).encode()
    p.stdin.write(b"Content-Length: %d\r\n\r\n" % len(b) + b); p.stdin.flush()
def recv():
    n = None
    while True:
        line = p.stdout.readline()
        if not line: raise SystemExit("aisb lsp exited")
        line = line.strip()
        if not line: break
        if line.lower().startswith(b"content-length:"): n = int(line.split(b":")[1])
    return json.loads(p.stdout.read(n))
def diagnostics(version, deadline=60):
    end = time.perf_counter() + deadline
    while time.perf_counter() < end:
        m = recv()
        if m.get("method") == "textDocument/publishDiagnostics" and m["params"].get("version") == version:
            return m["params"]["diagnostics"]
    raise SystemExit("no diagnostics in time")

send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}); recv()
send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
t = time.perf_counter()
send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "kdl", "version": 1, "text": good}}})
d = diagnostics(1); first = (time.perf_counter() - t) * 1000
assert d == [], d
version = 1
def edit(text):
    global version
    version += 1
    t = time.perf_counter()
    send({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]}})
    d = diagnostics(version)
    return (time.perf_counter() - t) * 1000, d
broken, valid = [], []
for i in range(runs):
    # A typo being typed (the decoder reports it), then the fix with a new allowed domain
    # (a valid file: every profile evaluated on the warm scan cache).
    ms, d = edit(good.replace("network {", f"netwrk{i} {{")); assert d, "expected an error"; broken.append(ms)
    ms, d = edit(good.replace("api.example.com", f"api{i}.example.com")); assert d == [], d; valid.append(ms)
send({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}); recv(); send({"jsonrpc": "2.0", "method": "exit"}); p.wait(timeout=10)

t_true = median_ms(["/bin/true"], runs)
subprocess.run([aisb, "check"], cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
t_check = median_ms([aisb, "check"], runs)
files = int(subprocess.run("git ls-files | wc -l", shell=True, cwd=repo, capture_output=True, text=True).stdout)
def q(v, f): return sorted(v)[min(len(v) - 1, int(len(v) * f))]
print(f"aisb lsp on a {files}-file repository (+20k ignored), {runs} edits each, warm cache; first diagnostics after open (cold evaluation): {first:.1f} ms")
print(f"{'case':<46}{'median ms':>10}{'p90 ms':>9}{'x aisb check':>14}")
for name, v in [("keystroke -> diagnostics, decoding error", broken), ("keystroke -> diagnostics, valid (full eval)", valid)]:
    m = statistics.median(v)
    print(f"{name:<46}{m:>10.1f}{q(v, 0.9):>9.1f}{m / t_check:>14.2f}")
print(f"{'aisb check (CLI, warm cache)':<46}{t_check:>10.1f}{'':>9}{1:>14.2f}")
print(f"{'/bin/true':<46}{t_true:>10.1f}{'':>9}{t_true / t_check:>14.2f}")
PY
