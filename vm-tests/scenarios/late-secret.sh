# a .env file the host writes into the project while the sandbox runs (masked promptly: the
# scenario gives it 5 s, since TCG runs the watcher and its helper far slower than a real CPU;
# bench/late-secrets.sh measures the latency on real hardware)
# expect: blocked
# host: printf 'LATE_SECRET=1\n' > "$PROJ/.env.late"
touch .host-go-late-secret
i=0; while [ ! -e .env.late ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
# The host never wrote it: the scenario proved nothing.
[ -e .env.late ] || exit 0
i=0
while [ $i -lt 50 ]; do
    cat .env.late 2>&1 | grep -q 'Permission denied' && exit 1
    sleep 0.1; i=$((i+1))
done
exit 0
