# taking a descriptor out of another process of the sandbox (pidfd_getfd, like ptrace)
# expect: blocked
"$PROBE" pidfd-getfd
