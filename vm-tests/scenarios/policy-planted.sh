# a sandbox.kdl the sandbox writes where there was none, loosening everything (the project's
# parent mounted read-write, .env unmasked, host network): the host's next aisb run in the
# project must refuse it as untrusted, not run under it (issue 29)
# expect: blocked
# host: cd "$PROJ" && if env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp/policy-home XDG_CACHE_HOME=/tmp/policy-cache "$PROJ/../aisb" run -- true </dev/null >/dev/null 2>&1; then touch "$PROJ/.pwned-policy"; fi; touch "$PROJ/.host-done-policy"
printf 'project ".."\nallow ".env"\nnetwork "host"\n' > sandbox.kdl || exit 1
touch .host-go-policy-planted
i=0; while [ ! -e .host-done-policy ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
rm -f sandbox.kdl
# The host never tried: the scenario proved nothing.
[ -e .host-done-policy ] || exit 0
test -e .pwned-policy
