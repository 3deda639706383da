# mounting a filesystem
# expect: blocked
"$PROBE" mount
