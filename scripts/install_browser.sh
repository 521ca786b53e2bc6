#!/usr/bin/env bash
# A headless Chromium for the workbench's browser tests (tests/test_workbench.py), after scripts/install.sh --test:
# Playwright's own build if it can be downloaded, else the system's chromium package (Debian / Ubuntu, as root).
# Prints the browser it found; fails if neither way works.
set -euo pipefail
cd "$(dirname "$0")/.."
if .venv/bin/python -m playwright install chromium >/dev/null 2>&1; then
    echo "browser: Playwright's chromium"
    exit 0
fi
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
    else
        echo "no Chromium: run 'playwright install chromium' or install your system's chromium package" >&2
        exit 1
    fi
fi
echo "browser: $(command -v chromium || command -v chromium-browser)"
