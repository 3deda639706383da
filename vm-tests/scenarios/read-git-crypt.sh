# a file git-crypt encrypts
# expect: blocked
cat vault/prod.yml
