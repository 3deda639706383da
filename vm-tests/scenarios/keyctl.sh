# the kernel keyring
# expect: blocked
"$PROBE" keyctl
