# a private key in the caller's home
# expect: blocked
cat "$HOME/.ssh/id_ed25519"
