# the project's .git renamed away, to put one with the sandbox's config in its place
# expect: blocked
mv .git .git-old
