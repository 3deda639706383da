# a system call through the i386 ABI (int 0x80): the process is killed (SIGSYS)
# expect: blocked
"$PROBE" foreign-abi
