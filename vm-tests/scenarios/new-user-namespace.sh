# a nested user namespace
# expect: blocked
"$PROBE" userns
