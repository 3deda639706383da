# a symlink in the project pointing at ~/.ssh
# expect: blocked
cat key-link
