# project files can be read
# expect: works
cat src/main.rs
