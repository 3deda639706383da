# tracing another process
# expect: blocked
"$PROBE" ptrace
