# a socket to the hypervisor (AF_VSOCK)
# expect: blocked
"$PROBE" vsock
