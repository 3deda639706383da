# a new mount namespace
# expect: blocked
"$PROBE" mountns
