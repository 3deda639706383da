# a bounded fork bomb (5,000 subshells) stops at the pids limit; the sandbox carries on once they
# end and are reaped (builtins only until then: every slot may be taken). Each waits in open() on
# a FIFO, so one writer ends them all; no exec (under TCG an exec costs ten forks). In the VMs
# it runs in a sandbox with `limits { pids 256 }` (see run.sh's SMALL_PIDS).
# pids: small
# expect: blocked
f=/tmp/fork-bomb-fifo-$$
mkfifo "$f" || exit 126
sh -c 'i=0; while [ $i -lt 5000 ]; do ( read -r _ < "$1" ) & i=$((i+1)); done' sh "$f"
r=$?
exec 3<>"$f"; exec 3>&-
tries=0
while [ $tries -lt 2000 ]; do
    set -- /proc/[0-9]*
    [ $# -lt 50 ] && break
    tries=$((tries + 1))
done
rm -f "$f"
exit $r
