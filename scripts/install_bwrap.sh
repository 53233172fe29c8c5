#!/usr/bin/env bash
# Best effort: installs bubblewrap (bwrap), the sandbox that runs model-written code
# (mindspeed_rl/tools/sandbox.py), with apt-get as root or through password-less sudo. Never fails: without
# bwrap, sandbox_problem() says what to do and the sandbox tests fail (unless MSRL_ALLOW_NO_SANDBOX=1).
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
NEED="the code sandbox needs it; see docs/features/multi_turn.md"
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install: bubblewrap (bwrap) is missing and there is no apt-get:" \
        "install bubblewrap with the system's package manager ($NEED)"
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    RUN=(env DEBIAN_FRONTEND=noninteractive)
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    RUN=(sudo -n env DEBIAN_FRONTEND=noninteractive)
else
    echo "install: bubblewrap (bwrap) is missing: run \`sudo apt-get install bubblewrap\` ($NEED)"
    exit 0
fi
echo "install: installing bubblewrap (bwrap) for the code sandbox: apt-get install -y -q bubblewrap"
# a fresh image may have no package lists yet: then update once and try again
if out=$("${RUN[@]}" apt-get install -y -q bubblewrap 2>&1) \
        || out=$("${RUN[@]}" apt-get update -q 2>&1 && "${RUN[@]}" apt-get install -y -q bubblewrap 2>&1); then
    exit 0
fi
echo "install: apt-get could not install bubblewrap ($(printf '%s\n' "$out" | tail -n 1)):" \
    "run \`apt-get install bubblewrap\` yourself ($NEED)"
exit 0
