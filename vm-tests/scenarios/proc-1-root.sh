# the host's root through /proc/1/root
# expect: blocked
cat /proc/1/root/etc/shadow
