# another repository's objects appended to the project's object alternates: the host's git
# directory must not gain them during the run (the sandbox's .git is its own overlay; issue 30)
# expect: blocked
# host: test -e "$PROJ/.git/objects/info/alternates" && touch "$PROJ/.pwned-alternates"; touch "$PROJ/.host-done-git-alternates"
mkdir -p .git/objects/info && echo /tmp/elsewhere/.git/objects >> .git/objects/info/alternates || exit 1
touch .host-go-git-alternates-planted
i=0; while [ ! -e .host-done-git-alternates ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
[ -e .host-done-git-alternates ] || exit 0
test -e .pwned-alternates; r=$?
rm -f .git/objects/info/alternates
exit $r
