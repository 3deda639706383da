#!/bin/sh
# Installs what building and running aisb needs on Debian, and nothing else: git (the project
# scan, named sandboxes' clones), bubblewrap (the bwrap backend), uidmap (newuidmap, for
# rootless libcontainer) and a C compiler (one dependency, ring, compiles C). What only the
# tests use is scripts/setup-tests.sh's.
# Safe to run again: installs only what is missing.
set -eu
need=""
command -v git >/dev/null 2>&1 || need="$need git"
command -v bwrap >/dev/null 2>&1 || need="$need bubblewrap"
command -v newuidmap >/dev/null 2>&1 || need="$need uidmap"
command -v cc >/dev/null 2>&1 || need="$need gcc libc6-dev"
command -v cargo >/dev/null 2>&1 || {
    echo "setup: cargo not found; install Rust 1.85 or newer first (https://rustup.rs)" >&2
    exit 1
}
if [ -n "$need" ]; then
    if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "setup: missing:$need — install them (as root: apt-get install$need)" >&2; exit 1
    fi
    echo "setup: installing$need" >&2
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $need >/dev/null
fi
exit 0
