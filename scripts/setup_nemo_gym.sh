#!/usr/bin/env bash
# Sets up real NeMo Gym (nemo-gym on PyPI) in its own virtualenv, cached outside the repo
# and keyed by version, so a second run takes a second. nemo-gym declares Python >= 3.13.14;
# a 3.13.x older than that runs it too, so this takes the 3.13 it finds (find_python) and
# installs with --ignore-requires-python; only without one does it ask uv for one. `ng_run`
# builds one venv per server with `uv` and makes the same Python check, which the
# uv.toml written here turns off; uv finds that Python on PATH only, not inside a venv.
# The last lines it prints are NEMO_GYM_PATH=... (put it before PATH: nemo-gym's commands,
# uv and the base Python), NEMO_GYM_CACHE=... (for ng_run's +uv_venv_dir and +cache_dir)
# and UV_CONFIG_FILE=..., for the integration tests and for users:
#
#   eval "$(scripts/setup_nemo_gym.sh | sed 's/^/export /')"
#   PATH=$NEMO_GYM_PATH:$PATH ng_run "+config_paths=[...]" +uv_venv_dir=$NEMO_GYM_CACHE/venvs
#
#   scripts/setup_nemo_gym.sh            # or: make nemo-gym
#   AUTOTUNE_CACHE=/big/disk scripts/setup_nemo_gym.sh
set -euo pipefail

VERSION=0.7.0
CACHE="${AUTOTUNE_CACHE:-$HOME/.cache/autotune}/nemo-gym-$VERSION"
VENV="$CACHE/venv"
UV_VENV="$CACHE/uv"
NEED_GB=5

# One set-up at a time: two test runs, or a test run and `make nemo-gym`, may ask at once.
mkdir -p "$CACHE"
exec 9>"$CACHE/.setup.lock"
flock 9

# Quiet pip, without the warnings this machine's pip.conf makes for index folders it lacks.
pip_q() {
    local venv=$1
    shift
    "$venv/bin/python" -m pip -q "$@" 2> >(grep -v "is ignored: it is neither a file" >&2)
}

# A Python 3.13: NEMO_GYM_PYTHON, else pyenv's newest 3.13, else python3.13 on PATH, else one
# uv installs in the cache (that download comes from GitHub, not PyPI).
find_python() {
    local pyenv_root found
    pyenv_root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    found=$(ls -d "$pyenv_root"/versions/3.13*/bin/python3.13 2>/dev/null | sort -V | tail -n 1)
    if [ -n "${NEMO_GYM_PYTHON:-}" ]; then
        echo "$NEMO_GYM_PYTHON"
    elif [ -n "$found" ]; then
        echo "$found"
    elif python3.13 -c "" 2>/dev/null; then
        command -v python3.13
    else
        echo "setup_nemo_gym: no Python 3.13 here; installing one with uv" >&2
        if [ ! -x "$UV_VENV/bin/uv" ]; then
            rm -rf "$UV_VENV"
            python3 -m venv "$UV_VENV"
            pip_q "$UV_VENV" install uv >&2
        fi
        UV_PYTHON_INSTALL_DIR="$CACHE/python" "$UV_VENV/bin/uv" python install 3.13 >&2
        UV_PYTHON_INSTALL_DIR="$CACHE/python" "$UV_VENV/bin/uv" python find --managed-python 3.13
    fi
}

if [ ! -f "$VENV/.ready" ]; then
    mkdir -p "$CACHE"
    free_gb=$(df -Pk "$CACHE" | awk 'NR==2 {print int($4 / 1048576)}')
    if [ "$free_gb" -lt "$NEED_GB" ]; then
        echo "setup_nemo_gym: only ${free_gb} GiB free under $CACHE; NeMo Gym and its server" \
             "venvs need about ${NEED_GB} GiB: free some space or set AUTOTUNE_CACHE to a larger disk." >&2
        exit 1
    fi
    started=$(date +%s)
    PYTHON=$(find_python)
    echo "setup_nemo_gym: installing nemo-gym==$VERSION with $PYTHON into $VENV (1 to 3 minutes)" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    pip_q "$VENV" install --upgrade pip
    pip_q "$VENV" install --ignore-requires-python "nemo-gym==$VERSION" uv
    "$VENV/bin/python" -c "import nemo_gym"
    touch "$VENV/.ready"
    echo "setup_nemo_gym: venv ready in $(( $(date +%s) - started )) s" >&2
fi

# ng_run's uv refuses nemo-gym's own Python check on a 3.13 older than 3.13.14 without this.
printf '[pip]\npython-version = "3.13.14"\n' > "$CACHE/uv.toml"
BASE_BIN=$(dirname "$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')")

echo "NEMO_GYM_PATH=$VENV/bin:$BASE_BIN"
echo "NEMO_GYM_CACHE=$CACHE"
echo "UV_CONFIG_FILE=$CACHE/uv.toml"
