# exit codes are exact
# expect: works
sh -c "exit 3"; test $? -eq 3
