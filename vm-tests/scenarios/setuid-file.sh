# no setuid file can be made inside (it would run as its owner on the host later)
# expect: blocked
cp /bin/true ./suid-true && chmod u+s ./suid-true
