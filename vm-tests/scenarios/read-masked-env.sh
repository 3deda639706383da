# a .env file in the project
# expect: blocked
cat .env
