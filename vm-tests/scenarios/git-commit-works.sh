# git inside still adds and commits (objects, refs, index and logs stay writable)
# expect: works
echo more >> src/main.rs && git add src/main.rs && git -c user.name=a -c user.email=a@a commit -qm inside
