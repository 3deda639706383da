#!/bin/sh
# Run every scenario of vm-tests/scenarios in one sandbox per (backend, caller) and print one
# `@@RESULT {json}` line per scenario. Used the same way by `cargo test` on the host
# (tests/vm_scenarios.rs) and by the testbed's guest init in each VM.
#
#   run.sh AISB PROBE WORKDIR "BACKENDS" "CALLERS"
#   CALLERS: `root` and/or `NAME:UID:GID` (an unprivileged account)
set -u
aisb=$1; probe=$2; work=$3; backends=$4; callers=$5
here=$(cd "$(dirname "$0")" && pwd)

# util-linux setpriv by its path: a busybox shell may prefer its own applet of that name.
setpriv=""
for p in /usr/bin/setpriv /bin/setpriv; do
    if [ -x "$p" ] && "$p" --help 2>&1 | grep -q reuid; then setpriv=$p; break; fi
done
as_caller() { # uid gid command...
    uid=$1; gid=$2; shift 2
    if [ "$uid" = 0 ]; then "$@";
    elif [ -n "$setpriv" ]; then "$setpriv" --reuid="$uid" --regid="$gid" --clear-groups "$@";
    else chpst -u "$uid:$gid" "$@"; fi
}

# Scenarios marked `# network: transparent` run in a second sandbox whose network allows
# allowed.test (pinned to a busybox httpd on loopback); the rest in the default one (no network).
plain=$(grep -L '^# network: transparent' "$here"/scenarios/*.sh)
transparent=$(grep -l '^# network: transparent' "$here"/scenarios/*.sh)
# SMALL_PIDS=1 (the VM testbed): scenarios marked `# pids: small` (the fork bomb) run in a third
# sandbox whose sandbox.kdl sets `limits { pids 256 }`: under TCG each fork costs ~16 ms, and
# 4,096 of them per backend and caller were 90% of the matrix. The same cgroup stops them, a
# sixteenth as many; on the host (cargo test) they keep the default of 4,096.
limited=""
if [ "${SMALL_PIDS:-}" = 1 ] && [ -n "$plain" ]; then
    limited=$(grep -l '^# pids: small' $plain </dev/null)
    plain=$(grep -L '^# pids: small' $plain </dev/null)
fi

# The script that runs inside the sandbox: each scenario in its own shell, `name=status`, and
# `name.t=START END` (the uptime around it, read by a builtin: under TCG a fork costs).
make_driver() { # scenario files...
    echo 'cd "$PROJ"'
    for f in "$@"; do
        name=$(basename "$f" .sh)
        printf 'read -r t0 _ < /proc/uptime\n( %s\n) >/dev/null 2>&1 </dev/null; echo "%s=$?"; read -r t1 _ < /proc/uptime; echo "%s.t=$t0 $t1"\n' \
            "$(grep -v '^#' "$f")" "$name" "$name"
    done
}
driver=$(mktemp); make_driver $plain > "$driver"
net_driver=$(mktemp); make_driver $transparent > "$net_driver"
lim_driver=$(mktemp); make_driver $limited > "$lim_driver"

# One `@@RESULT` line per scenario in $3... from the sandbox's output $1 (aisb's status $2).
report() {
    out=$1; rc=$2; shift 2
    for f in "$@"; do
        scen=$(basename "$f" .sh)
        expect=$(sed -n 's/^# expect: *//p' "$f")
        got=$(printf '%s\n' "$out" | sed -n "s/^$scen=//p")
        if [ -z "$got" ]; then
            said=$(head -c 300 "$errfile" | tr '\n"\\' '   ')
            # Nothing said (once, in CI: exit 101, an empty stderr): what the host had left.
            [ -n "$said" ] || said="nothing on stderr; $(df -Pk "$root" 2>/dev/null | awk 'NR == 2 { print $4 }') KiB free on the disk, $(awk '/^MemAvailable/ { print $2 }' /proc/meminfo) KiB memory available"
            outcome=fail; detail="did not run (aisb exit $rc: $said)"
        elif [ "$got" = 126 ] || [ "$got" = 127 ]; then
            outcome=fail; detail="the attempt could not run (status $got: a missing tool or a bad probe)"
        elif [ "$expect" = blocked ] && [ "$got" != 0 ]; then outcome=pass; detail="refused (status $got)"
        elif [ "$expect" = works ] && [ "$got" = 0 ]; then outcome=pass; detail="works"
        else outcome=fail; detail="expected $expect, got status $got"; fi
        secs=$(printf '%s\n' "$out" | sed -n "s/^$scen\.t=//p" | awk '{ printf "%.2f", $2 - $1 }')
        printf '@@RESULT {"scenario":"%s","backend":"%s","user":"%s","outcome":"%s","detail":"%s","seconds":%s}\n' \
            "$scen" "$backend" "$name" "$outcome" "$detail" "${secs:-0}"
    done
}

for backend in $backends; do
    for caller in $callers; do
        case $caller in
            root) name=root; uid=0; gid=0 ;;
            *) name=${caller%%:*}; rest=${caller#*:}; uid=${rest%%:*}; gid=${rest#*:} ;;
        esac
        root=$work/$backend-$name
        owner=""; [ "$uid" = 0 ] || owner="$uid:$gid"
        sh "$here/fixture.sh" "$root" "$owner" "$probe" >/dev/null 2>&1
        cp "$driver" "$root/proj/bin/driver.sh"; cp "$aisb" "$root/aisb"
        # The transparent egress project: its own sandbox.kdl, the probe, a page to fetch.
        mkdir -p "$root/net/bin" "$root/www"; echo hello > "$root/www/hello.txt"
        printf 'network {\n    allow "allowed.test"\n}\n' > "$root/net/sandbox.kdl"
        (cd "$root/net" && git init -q)
        cp "$probe" "$root/net/bin/aisb-probe"; cp "$net_driver" "$root/net/bin/driver.sh"
        [ -e "$(dirname "$aisb")/aisb-init" ] && cp "$(dirname "$aisb")/aisb-init" "$root/aisb-init"
        # The small-pids project: its own sandbox.kdl (narrower than the default: no trust).
        mkdir -p "$root/lim/bin"
        printf 'limits {\n    pids 256\n}\n' > "$root/lim/sandbox.kdl"
        (cd "$root/lim" && git init -q)
        cp "$lim_driver" "$root/lim/bin/driver.sh"
        [ -n "$owner" ] && chown -R "$owner" "$root"
        # Host-side steps (`# host: CMD`, with $PROJ): run while the sandbox runs, once the
        # scenario inside has created .host-go-NAME in the project (a secret that appears late).
        # Every scenario before it runs first (under TCG, minutes): each waits as long as the
        # sandbox runs, at most 15 minutes, and is stopped when it ends.
        host_steps=""
        for f in "$here"/scenarios/*.sh; do
            hostcmd=$(sed -n 's/^# host: *//p' "$f"); [ -n "$hostcmd" ] || continue
            go="$root/proj/.host-go-$(basename "$f" .sh)"
            ( i=0; while [ ! -e "$go" ] && [ $i -lt 9000 ]; do sleep 0.1; i=$((i+1)); done
              [ -e "$go" ] && PROJ="$root/proj" sh -c "$hostcmd" ) &
            host_steps="$host_steps $!"
        done
        out=$(cd "$root/proj" && as_caller "$uid" "$gid" env -i PATH=/usr/local/bin:/usr/bin:/bin \
            HOME="$root/home" XDG_CACHE_HOME="$root/cache" GITHUB_TOKEN=ghp_leaked \
            ${AISB_TEST_BREAK_ISOLATION:+AISB_TEST_BREAK_ISOLATION=$AISB_TEST_BREAK_ISOLATION} \
            "$root/aisb" run --backend "$backend" -- env PROJ="$root/proj" PROBE="$root/proj/bin/aisb-probe" \
            HOST_PID=$$ /bin/sh "$root/proj/bin/driver.sh" 2>"$root/stderr")
        rc=$?
        for p in $host_steps; do kill "$p" 2>/dev/null; done
        wait
        errfile="$root/stderr"
        report "$out" "$rc" $plain
        if [ -n "$limited" ]; then
            out=$(cd "$root/lim" && as_caller "$uid" "$gid" env -i PATH=/usr/local/bin:/usr/bin:/bin \
                HOME="$root/home" XDG_CACHE_HOME="$root/cache" \
                "$root/aisb" run --backend "$backend" -- env PROJ="$root/lim" \
                /bin/sh "$root/lim/bin/driver.sh" 2>"$root/lim-stderr")
            rc=$?
            errfile="$root/lim-stderr"
            report "$out" "$rc" $limited
        fi
        [ -n "$transparent" ] || continue
        port=$((18000 + $$ % 1000))
        busybox httpd -f -p "127.0.0.1:$port" -h "$root/www" & httpd=$!
        out=$(cd "$root/net" && as_caller "$uid" "$gid" env -i PATH=/usr/local/bin:/usr/bin:/bin \
            HOME="$root/home" XDG_CACHE_HOME="$root/cache" AISB_PROXY_PIN="allowed.test=127.0.0.1:$port" \
            "$root/aisb" --trust run --backend "$backend" -- env PROJ="$root/net" PROBE="$root/net/bin/aisb-probe" \
            /bin/sh "$root/net/bin/driver.sh" 2>"$root/net-stderr")
        rc=$?
        kill "$httpd" 2>/dev/null; wait "$httpd" 2>/dev/null
        errfile="$root/net-stderr"
        report "$out" "$rc" $transparent
    done
done
rm -f "$driver" "$net_driver" "$lim_driver"
