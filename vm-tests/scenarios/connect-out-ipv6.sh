# a direct IPv6 connection out of the sandbox (documentation address: never routed)
# expect: blocked
"$PROBE" connect "[2001:db8::1]" 443
