# a direct TCP connection out of the sandbox (documentation address: never routed)
# expect: blocked
"$PROBE" connect 192.0.2.1 443
