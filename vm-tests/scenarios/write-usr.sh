# writing to the system
# expect: blocked
echo x > /usr/escape
