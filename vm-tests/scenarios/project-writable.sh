# project files can be written
# expect: works
echo new > src/new.txt && test -s src/new.txt
