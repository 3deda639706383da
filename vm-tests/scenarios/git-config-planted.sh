# a program planted in the project's git config (git on the host would run it)
# expect: blocked
git config core.fsmonitor 'touch /tmp/pwned'
