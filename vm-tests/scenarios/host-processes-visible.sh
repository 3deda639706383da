# seeing the host's processes: the kernel's own threads (kthreadd, PID 2 on every host) are in
# no sandbox's PID namespace (a count of processes was flaky: a background git or a reaped
# child's sibling made 7)
# expect: blocked
cat /proc/[0-9]*/comm 2>/dev/null | grep -qx kthreadd
