# cloud credentials in the caller's home
# expect: blocked
cat "$HOME/.aws/credentials"
