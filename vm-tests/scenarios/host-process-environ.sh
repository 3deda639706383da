# another (host) process's environment
# expect: blocked
cat /proc/$HOST_PID/environ
