# io_uring: I/O the seccomp filter would never see (ENOSYS, as on a kernel without it)
# expect: blocked
"$PROBE" io-uring
