# seeing the host's processes
# expect: blocked
test "$(ls /proc | grep -c "^[0-9]")" -gt 6
