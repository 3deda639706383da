# network: transparent
# plain HTTP to an allowed name, no proxy variable read: through the init's relay and the proxy
# expect: works
"$PROBE" http-get allowed.test 80 /hello.txt
