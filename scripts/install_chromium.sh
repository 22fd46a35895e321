#!/usr/bin/env bash
# Installs Debian's Chromium for the browser tests of the HTML reports (tests/browser.py).
# Idempotent: does nothing when `chromium` is already on PATH. Runs as root (CI); no sudo.
# Never downloads a test tool's own browser: the machine's network reaches only registries.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(chromium --version 2>/dev/null || echo unknown version)"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends chromium
chromium --version
