# network: transparent
# a name the allowlist does not name gets NXDOMAIN
# expect: blocked
"$PROBE" resolve other.test
