# the host's password hashes
# expect: blocked
cat /etc/shadow
