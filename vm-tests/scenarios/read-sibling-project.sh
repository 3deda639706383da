# a project beside this one
# expect: blocked
cat ../sibling/notes.txt
