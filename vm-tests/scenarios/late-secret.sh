# a .env file the host writes into the project while the sandbox runs (masked within 100 ms)
# expect: blocked
# host: printf 'LATE_SECRET=1\n' > "$PROJ/.env.late"
touch .host-go-late-secret
i=0; while [ ! -e .env.late ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
# The host never wrote it: the scenario proved nothing.
[ -e .env.late ] || exit 0
sleep 0.1
cat .env.late 2>&1 | grep -q 'Permission denied' && exit 1
exit 0
