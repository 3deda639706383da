# a file git ignores
# expect: blocked
cat ignored.txt
