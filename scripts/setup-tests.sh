#!/bin/sh
# Installs, on top of what running aisb needs (scripts/setup.sh, run first), what its tests
# need on Debian: runc (the OCI cross-check test), python3, curl and openssl (the isolation
# and network suites' probes and servers), tmux (real terminals for tests/terminal.rs), the
# VM testbed's tools, the image tests' registry, fish, and the real agent clients.
# scripts/test.sh runs it. Safe to run again: installs only what is missing.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
need=""
command -v curl >/dev/null 2>&1 || need="$need curl"
command -v openssl >/dev/null 2>&1 || need="$need openssl"
command -v runc >/dev/null 2>&1 || need="$need runc"
[ -x /usr/bin/python3 ] || need="$need python3"
command -v tmux >/dev/null 2>&1 || need="$need tmux"
# The VM testbed (testbed/): QEMU, a static busybox for the guest, kmod (depmod) and xz for
# the kernels' modules.
command -v qemu-system-x86_64 >/dev/null 2>&1 || need="$need qemu-system-x86"
[ -x /bin/busybox ] || need="$need busybox-static"
command -v depmod >/dev/null 2>&1 || [ -x /usr/sbin/depmod ] || [ -x /sbin/depmod ] || need="$need kmod"
command -v xz >/dev/null 2>&1 || need="$need xz-utils"
# Images (tests/images.rs): debootstrap makes the Debian base once, docker-registry serves it
# on a loopback port, skopeo pushes it there.
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need="$need debootstrap"
command -v docker-registry >/dev/null 2>&1 || need="$need docker-registry"
command -v skopeo >/dev/null 2>&1 || need="$need skopeo"
# fish: named sandboxes give fish users fish (seed 004), tested for real.
command -v fish >/dev/null 2>&1 || need="$need fish"
# node + npm: the real agent clients (Claude Code, Codex) the agent tests run inside presets.
command -v npm >/dev/null 2>&1 || need="$need nodejs npm"
# pytest: the workload tests (tests/workloads.rs) prove a test runner still works in the sandbox.
/usr/bin/python3 -c 'import pytest' 2>/dev/null || need="$need python3-pytest"
# jsonschema: tests/editors.rs validates the exported .vscode/tasks.json against the tasks
# schema (and tests/k8s.rs the agent-sandbox CRDs); neovim: tests/lsp.rs drives `aisb lsp` from
# Neovim's built-in LSP client, headless.
/usr/bin/python3 -c 'import jsonschema' 2>/dev/null || need="$need python3-jsonschema"
command -v nvim >/dev/null 2>&1 || need="$need neovim"
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || need="$need python3-venv"
# git-crypt and git-lfs: real repository shapes work inside (tests/git_private.rs).
command -v git-crypt >/dev/null 2>&1 || need="$need git-crypt"
command -v git-lfs >/dev/null 2>&1 || need="$need git-lfs"
if [ -n "$need" ]; then
    if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "setup-tests: missing:$need — install them (as root: apt-get install$need)" >&2; exit 1
    fi
    echo "setup-tests: installing$need" >&2
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $need >/dev/null
    # docker-registry's package starts a registry on *:5000 where an init system runs it; the
    # tests start their own on a loopback port, so that one is stopped and disabled.
    case "$need" in *docker-registry*)
        $sudo systemctl disable --now docker-registry >/dev/null 2>&1 ||
            $sudo service docker-registry stop >/dev/null 2>&1 || true ;;
    esac
fi
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
# The agent clients the agent tests run inside their presets (tests/agents.rs): four from npm,
# aider from PyPI in its own venv on Debian's python3 (visible inside the sandbox, unlike a
# python under a home directory), linked into /usr/local/bin.
npm_missing=""
for pair in claude:@anthropic-ai/claude-code codex:@openai/codex opencode:opencode-ai gemini:@google/gemini-cli; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || npm_missing="$npm_missing ${pair#*:}"
done
if [ -n "$npm_missing" ]; then
    echo "setup-tests: installing the agent clients$npm_missing (npm)" >&2
    $sudo npm install -g --silent $npm_missing >/dev/null 2>&1 ||
        echo "setup-tests: npm could not install$npm_missing; tests/agents.rs will fail in CI" >&2
fi
if ! [ -x /opt/aider-venv/bin/aider ]; then
    /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || {
        $sudo apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    }
    echo "setup-tests: installing the agent client aider (PyPI aider-chat, /opt/aider-venv)" >&2
    $sudo rm -rf /opt/aider-venv
    { $sudo /usr/bin/python3 -m venv /opt/aider-venv &&
        $sudo /opt/aider-venv/bin/pip install -q aider-chat >/dev/null 2>&1; } ||
        echo "setup-tests: pip could not install aider-chat; tests/agents.rs will fail in CI" >&2
fi
[ -x /opt/aider-venv/bin/aider ] && ! command -v aider >/dev/null 2>&1 &&
    $sudo ln -sf /opt/aider-venv/bin/aider /usr/local/bin/aider
# kubernetes-validate (PyPI): tests/k8s.rs checks `aisb export k8s` against Kubernetes' own
# OpenAPI schemas, strictly, for the version named there.
if ! command -v kubernetes-validate >/dev/null 2>&1; then
    echo "setup-tests: installing kubernetes-validate (PyPI, /opt/k8s-validate-venv)" >&2
    $sudo rm -rf /opt/k8s-validate-venv
    { $sudo /usr/bin/python3 -m venv /opt/k8s-validate-venv &&
        $sudo /opt/k8s-validate-venv/bin/pip install -q kubernetes-validate==1.34.1 >/dev/null 2>&1 &&
        $sudo ln -sf /opt/k8s-validate-venv/bin/kubernetes-validate /usr/local/bin/kubernetes-validate; } ||
        echo "setup-tests: pip could not install kubernetes-validate; tests/k8s.rs will fail in CI" >&2
fi
exit 0
