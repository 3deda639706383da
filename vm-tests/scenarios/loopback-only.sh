# no network interface but lo
# expect: works
test "$(tail -n +3 /proc/net/dev | wc -l)" -eq 1
