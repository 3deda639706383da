# the seccomp filter is applied
# expect: works
"$PROBE" seccomp
