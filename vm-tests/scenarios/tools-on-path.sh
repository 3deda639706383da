# tools on PATH run
# expect: works
git --version
