# a secret-looking variable passed through
# expect: blocked
env | grep -q ghp_leaked
