#!/bin/sh
# Benchmark: the inputs of docs/scale.md, in one run.
#   1. What one sandbox costs a node: N sandboxes of the claude preset (its copy-on-write
#      config, its proxy, its mirrored settings) held open at once per backend; the memory
#      (PSS, so shared pages count once) of everything aisb adds per sandbox: aisb itself,
#      its proxy, the init, the backend's helpers — the workload (`sleep`) left out. Then how
#      fast N of them start at once (wall time until all N `true` runs ended), against N raw
#      bwrap sandboxes started the same way.
#   2. What `aisb proxy serve` (the fleet's egress proxy, docs/scale.md) costs per connection
#      and per byte: its CPU time (utime+stime from /proc) for C short HTTPS-style tunnels
#      (CONNECT, one request, close) and for one large transfer, against the same client
#      talking to the origin directly; and its memory per idle open tunnel (T tunnels held).
#      The origin is a small asyncio server on loopback, reached by a name pinned with
#      AISB_PROXY_PIN.
#
#   sh bench/fleet.sh                # release build; N=10 sandboxes, C=2000, T=2000
#   SHORT=1 sh bench/fleet.sh        # debug build, tiny sizes (keeps the script working)
set -eu
cd "$(dirname "$0")/.."
if [ -n "${SHORT:-}" ]; then
    N=2 C=100 T=100 MB=10
    cargo build -q --bin aisb --bin aisb-init
    AISB="$PWD/target/debug/aisb"
else
    N="${N:-10}" C="${C:-2000}" T="${T:-2000}" MB="${MB:-200}"
    cargo build --release -q
    AISB="$PWD/target/release/aisb"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# One project per agent, as a fleet runs them (a profile's copy-on-write layer serves one
# run at a time); each warmed (store, scan cache), as every run after a project's first is.
mkdir -p "$WORK/home/.claude"
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache"
i=0
while [ "$i" -lt "$N" ]; do
    mkdir -p "$WORK/agent$i"
    (cd "$WORK/agent$i" && git init -q && echo 'import "preset:claude"' > sandbox.kdl && git add sandbox.kdl &&
        "$AISB" --trust run -- true && "$AISB" --trust run --backend libcontainer -- true)
    i=$((i + 1))
done
ulimit -n 65536 2>/dev/null || ulimit -n 16384 2>/dev/null || true

python3 - "$AISB" "$N" "$C" "$T" "$MB" "$WORK" <<'PY'
import asyncio, os, signal, socket, subprocess, sys, time

aisb, N, C, T, MB, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
PAGE = os.sysconf("SC_PAGE_SIZE")

def children():
    """pid -> parent pid, for every process now."""
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    s = f.read()
                out[int(p)] = int(s[s.rindex(")") + 2:].split()[1])
            except OSError:
                pass
    return out

def tree(root, parents):
    pids, grew = {root}, True
    while grew:
        grew = False
        for p, pp in parents.items():
            if pp in pids and p not in pids:
                pids.add(p); grew = True
    return pids

def comm(p):
    try:
        with open(f"/proc/{p}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""

def pss(p):
    try:
        with open(f"/proc/{p}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

def cpu(p):
    with open(f"/proc/{p}/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def rss(p):
    with open(f"/proc/{p}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0

print(f"1. sandboxes of the claude preset, {N} at once per backend")
print(f"{'backend':<14}{'aisb MiB/sandbox (PSS)':>24}{'processes':>11}{'start N at once, s':>20}{'raw bwrap, s':>14}{'ratio':>7}")
rows = {}
for backend in ["bwrap", "libcontainer"]:
    procs = [subprocess.Popen([aisb, "--trust", "run", "--backend", backend, "--", "sleep", "30"],
                              cwd=f"{work}/agent{i}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
             for i in range(N)]
    deadline = time.time() + 60
    while time.time() < deadline:
        parents = children()
        sleeps = [p for p in set().union(*(tree(x.pid, parents) for x in procs)) if comm(p) == "sleep"]
        if len(sleeps) >= N:
            break
        time.sleep(0.2)
    else:
        alive = [x.poll() for x in procs]
        sys.exit(f"{backend}: the {N} sandboxes did not all start within 60 s (exit codes: {alive}; processes: {sorted(comm(p) for p in set().union(*(tree(x.pid, parents) for x in procs)))})")
    time.sleep(1)  # let the proxies and watchers settle
    parents = children()
    total, count = 0, 0
    for x in procs:
        for p in tree(x.pid, parents):
            if comm(p) != "sleep":
                total += pss(p); count += 1
    for x in procs:
        os.killpg(x.pid, signal.SIGTERM)
    for x in procs:
        try:
            x.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(x.pid, signal.SIGKILL); x.wait()

    def burst(cmd):
        t = time.perf_counter()
        ps = [subprocess.Popen(cmd, cwd=f"{work}/agent{i}", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
              for i in range(N)]
        for p in ps:
            err = p.communicate(timeout=120)[1]
            if p.returncode != 0:
                sys.exit(f"{cmd}: exit {p.returncode}: {err.decode(errors='replace')}")
        return time.perf_counter() - t
    best_aisb = min(burst([aisb, "--trust", "run", "--backend", backend, "--", "true"]) for _ in range(3))
    best_raw = min(burst(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"]) for _ in range(3))
    print(f"{backend:<14}{total / N / 2**20:>24.1f}{count / N:>11.1f}{best_aisb:>20.2f}{best_raw:>14.2f}{best_aisb / best_raw:>7.1f}")

# 2. The standalone proxy.
async def origin_main(port_holder, ready, stop):
    body_small = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"
    big = b"\0" * (1 << 20)
    async def handle(r, w):
        try:
            line = await r.readline()
            while (await r.readline()) not in (b"\r\n", b""):
                pass
            if b"/big" in line:
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MB << 20))
                for _ in range(MB):
                    w.write(big)
                    await w.drain()
            else:
                w.write(body_small)
            await w.drain()
            if b"/hold" in line:
                await r.read()  # keep the connection until the client goes
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()
    srv = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    port_holder.append(srv.sockets[0].getsockname()[1])
    ready.set()
    await stop.wait()
    srv.close()

import threading
port_holder, ready_t = [], threading.Event()
loop = asyncio.new_event_loop()
stop = asyncio.Event()
async def run_origin():
    ev = asyncio.Event()
    task = asyncio.create_task(origin_main(port_holder, ev, stop))
    await ev.wait(); ready_t.set(); await task
th = threading.Thread(target=lambda: loop.run_until_complete(run_origin()), daemon=True)
th.start(); ready_t.wait(10)
oport = port_holder[0]

policy = os.path.join(work, "policy.json")  # outside every project
with open(policy, "w") as f:
    f.write('{"allow": ["origin.test"], "deny": []}')

def measure(buffer_kib):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); pport = s.getsockname()[1]
    env = dict(os.environ, AISB_PROXY_PIN=f"origin.test=127.0.0.1:{oport}")
    proxy = subprocess.Popen([aisb, "proxy", "serve", "--listen", f"127.0.0.1:{pport}", "--policy", policy,
                              "--audit", os.devnull, "--max-connections", str(max(T, C) + 100),
                              "--buffer-kib", str(buffer_kib)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", pport), timeout=1).close(); break
            except OSError:
                if time.time() > deadline: sys.exit("the proxy did not listen within 20 s")
                time.sleep(0.1)

        async def one(via_proxy, path=b"/small"):
            if via_proxy:
                r, w = await asyncio.open_connection("127.0.0.1", pport)
                w.write(b"CONNECT origin.test:443 HTTP/1.1\r\nHost: origin.test:443\r\n\r\n")
                await w.drain()
                status = await r.readline()
                if b" 200" not in status: raise RuntimeError(status)
                while (await r.readline()) not in (b"\r\n", b""): pass
            else:
                r, w = await asyncio.open_connection("127.0.0.1", oport)
            w.write(b"GET " + path + b" HTTP/1.1\r\nHost: origin.test\r\n\r\n")
            await w.drain()
            n = 0
            while True:
                b = await r.read(1 << 20)
                if not b: break
                n += len(b)
            w.close()
            return n

        async def many(via_proxy, count, width=50):
            sem = asyncio.Semaphore(width)
            async def lim():
                async with sem: return await one(via_proxy)
            return await asyncio.gather(*[lim() for _ in range(count)])

        def timed(coro_fn):
            c0 = cpu(proxy.pid); t = time.perf_counter()
            asyncio.run(coro_fn())
            return time.perf_counter() - t, cpu(proxy.pid) - c0

        asyncio.run(many(True, 50))  # warm up
        d_direct, _ = timed(lambda: many(False, C))
        d_proxy, c_proxy = timed(lambda: many(True, C))
        b_direct, _ = timed(lambda: one(False, b"/big"))
        b_proxy, cb_proxy = timed(lambda: one(True, b"/big"))

        async def hold():
            base = rss(proxy.pid)
            conns = []
            for i in range(T):
                r, w = await asyncio.open_connection("127.0.0.1", pport)
                w.write(b"CONNECT origin.test:443 HTTP/1.1\r\nHost: origin.test:443\r\n\r\n")
                await w.drain()
                if b" 200" not in await r.readline(): raise RuntimeError("refused")
                while (await r.readline()) not in (b"\r\n", b""): pass
                # A request in flight each way, as a tunnel that has carried traffic holds.
                w.write(b"GET /hold HTTP/1.1\r\nHost: origin.test\r\n\r\n")
                conns.append(w)
            await asyncio.sleep(1)
            held = rss(proxy.pid)
            for w in conns: w.close()
            return base, held
        base, held = asyncio.run(hold())
    finally:
        proxy.send_signal(signal.SIGTERM)
        try: proxy.wait(timeout=40)
        except subprocess.TimeoutExpired: proxy.kill()
    return dict(d_direct=d_direct, d_proxy=d_proxy, c_proxy=c_proxy, b_direct=b_direct, b_proxy=b_proxy,
                cb_proxy=cb_proxy, base=base, held=held)

results = [(kib, measure(kib)) for kib in (64, 256)]
loop.call_soon_threadsafe(stop.set)

print(f"\n2. aisb proxy serve (one process; the client and the origin share this machine's cores)")
print(f"{'case':<46}{'direct':>12}{'via proxy':>13}{'ratio':>7}{'proxy CPU':>15}")
for kib, m in results:
    print(f"--buffer-kib {kib}{' (default)' if kib == 64 else ''}")
    print(f"{f'  {C} tunnels (CONNECT, 1 request, close)':<46}{C / m['d_direct']:>10.0f}/s{C / m['d_proxy']:>11.0f}/s{m['d_direct'] / m['d_proxy']:>7.2f}{m['c_proxy'] / C * 1e6:>10.0f} µs/conn")
    print(f"{f'  {MB} MiB through one tunnel':<46}{MB / m['b_direct']:>6.0f} MiB/s{MB / m['b_proxy']:>7.0f} MiB/s{m['b_direct'] / m['b_proxy']:>7.2f}{m['cb_proxy'] / MB * 1e3:>10.2f} ms/MiB")
    print(f"{f'  {T} open tunnels, one request each':<46}{'':>12}{'':>13}{'':>7}{(m['held'] - m['base']) / T / 1024:>9.1f} KiB/conn   (RSS {m['base'] / 2**20:.0f} -> {m['held'] / 2**20:.0f} MiB)")
    print(f"  per CPU-second of the proxy: {C / max(m['c_proxy'], 1e-9):.0f} tunnels, {MB / max(m['cb_proxy'], 1e-9):.0f} MiB")
PY
