# writing to /etc
# expect: blocked
echo x > /etc/escape
