# a refused read of a masked file is an audit event on the host, with the rule that masks it
# (issue 32: the reporting layer of masks, a FUSE file system over each mask)
# expect: works
# host: i=0; while [ $i -lt 600 ]; do if grep -hs '"event":"file"' "$PROJ"/../cache/aisb/*/default/audit.jsonl | grep '"operation":"read"' | grep -q '"target":"'"$PROJ"'/.env"'; then touch "$PROJ/.reported-read"; break; fi; sleep 0.1; i=$((i+1)); done; touch "$PROJ/.host-done-audit"
touch .host-go-masked-read-audited
# The layer lands just after the start (under TCG, slowly): read until the host saw one.
i=0
while [ ! -e .host-done-audit ] && [ $i -lt 600 ]; do
    cat .env >/dev/null 2>&1 && exit 2
    [ -e .reported-read ] && break
    sleep 0.1; i=$((i+1))
done
test -e .reported-read
