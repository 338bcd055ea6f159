#!/usr/bin/env bash
# Installs what the testbed needs: Debian/Ubuntu system packages (as root), then a virtual environment in the
# checkout (.venv/, or $VENV) holding the project and its test extras, so any Python 3.11+ works, including
# a stock Debian 12 or Ubuntu 24.04 python3 that refuses system-wide pip installs (PEP 668).
#   PYTHON=/usr/bin/python3   the interpreter that creates the environment (default: python3)
#   VENV=.venv                where the environment goes (default: .venv in the checkout)
#   INA_SKIP_TORCH=1          skip the optional PyTorch install
#   TORCH_INDEX_URL=URL       where pip finds torch (e.g. PyTorch's CPU-only wheel index)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_VERSION=2.13.0
# chromium and chromium-driver: the results page's browser test (selenium drives them by path, downloads nothing)
APT_PACKAGES="mininet bridge-utils iproute2 ethtool iperf3 iputils-ping tcpdump protobuf-compiler protobuf-compiler-grpc python3-venv make chromium chromium-driver"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=$(for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
    if [ -n "$missing" ]; then
        echo "install: apt-get install $(echo $missing)" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
else
    echo "install: not root or no apt-get: skipping system packages ($APT_PACKAGES); the integration tests and experiments need them" >&2
fi

if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "install: $PYTHON cannot create a virtual environment (needs Python >= 3.11 with venv and ensurepip; on Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
    echo "install: creating $VENV with $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')" >&2
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" -e ".[test]"

# Optional: PyTorch for the DDP communication hook and its tests; without it those tests are skipped.
if [ "${INA_SKIP_TORCH:-0}" != 1 ] && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "${PIP[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION" \
        || echo "install: torch==$TORCH_VERSION not installed; the PyTorch hook tests will be skipped" >&2
fi
touch "$VENV/.installed"
echo "install: done; commands are in $VENV/bin (source $VENV/bin/activate, or call them by path)" >&2
