# network: transparent
# an allowed name resolves (the sandbox's DNS stub: a synthetic address) for a tool that reads no proxy variable
# expect: works
"$PROBE" resolve allowed.test
