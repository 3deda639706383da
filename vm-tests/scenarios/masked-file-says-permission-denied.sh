# a masked file fails loudly, not as an empty read
# expect: works
cat .env 2>&1 | grep -q "Permission denied"
