# network: transparent
# an allowed name on a port the allowlist does not name: refused
# expect: blocked
"$PROBE" http-get allowed.test 8080 /hello.txt
