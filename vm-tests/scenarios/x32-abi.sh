# a system call through the x32 numbering (only the filter says EPERM; a kernel without x32
# says ENOSYS, which the probe reports as "could not run")
# expect: blocked
"$PROBE" x32
