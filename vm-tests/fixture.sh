#!/bin/sh
# Build the isolation fixture under $1: a home with secrets, a git project with masked files,
# a sibling project. Owned by $2 (uid:gid) when given. The probe binary $3 is copied into the
# project so the sandbox can run it.
set -eu
root=$1; owner=${2:-}; probe=$3
rm -rf "$root"
mkdir -p "$root/home/.ssh" "$root/home/.aws" "$root/proj/src" "$root/proj/vault" "$root/proj/bin" "$root/sibling" "$root/cache"
echo "PRIVATE KEY" > "$root/home/.ssh/id_ed25519"
echo "aws_secret" > "$root/home/.aws/credentials"
echo "other project" > "$root/sibling/notes.txt"
cd "$root/proj"
echo "ignored.txt" > .gitignore
echo "vault/* filter=git-crypt" > .gitattributes
echo "API_KEY=1" > .env
echo "ignored" > ignored.txt
echo "crypted" > vault/prod.yml
echo "fn main() {}" > src/main.rs
ln -s "$root/home/.ssh/id_ed25519" key-link
cp "$probe" bin/aisb-probe
git init -q
git -c user.name=t -c user.email=t@t add -A
git -c user.name=t -c user.email=t@t commit -qm init
chmod 755 "$root"
if [ -n "$owner" ]; then chown -R "$owner" "$root"; fi
