# network: transparent
# plain HTTP to a raw IP (no name to learn): refused by the proxy
# expect: blocked
"$PROBE" http-get 192.0.2.1 80 /hello.txt
