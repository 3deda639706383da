# a commondir planted in the project's git directory, naming a git directory of the sandbox's
# whose config runs a program: the host's `git status` during the run must not obey it (the
# sandbox's .git is its own overlay; issue 30)
# expect: blocked
# host: cd "$PROJ" && git -c safe.directory='*' status >/dev/null 2>&1; touch "$PROJ/.host-done-git-commondir"
mkdir -p evil/objects evil/refs/heads evil/hooks evil/info
printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch %s/.pwned-commondir\n' "$PWD" > evil/config
echo ../evil > .git/commondir || exit 1
touch .host-go-git-commondir-planted
i=0; while [ ! -e .host-done-git-commondir ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
# The sandbox's own git would obey it too: the next scenarios need theirs.
rm -f .git/commondir
# The host's git never ran: the scenario proved nothing.
[ -e .host-done-git-commondir ] || exit 0
test -e .pwned-commondir
