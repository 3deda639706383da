# a bounded fork bomb (5,000 sleeps) stops at the pids limit; the sandbox carries on once they are
# killed and reaped (builtins only until then: every slot may be taken)
# expect: blocked
sh -c 'i=0; while [ $i -lt 5000 ]; do sleep 300 & i=$((i+1)); done'
r=$?
tries=0
while [ $tries -lt 2000 ]; do
    left=0
    for p in /proc/[0-9]*; do
        read -r c < "$p/comm" && [ "$c" = sleep ] && kill -9 "${p#/proc/}" && left=1
    done 2>/dev/null
    [ $left = 0 ] && break
    tries=$((tries + 1))
done
exit $r
