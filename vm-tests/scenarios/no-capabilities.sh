# the effective capability set is empty
# expect: works
"$PROBE" capeff
