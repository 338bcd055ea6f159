#!/usr/bin/env bash
# Installs what the testbed needs on Debian 12: system packages (as root) and the Python package with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
APT_PACKAGES="mininet bridge-utils iproute2 ethtool iperf3 iputils-ping tcpdump protobuf-compiler protobuf-compiler-grpc"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=$(for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
    if [ -n "$missing" ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
else
    echo "note: not root or no apt-get: skipping system packages ($APT_PACKAGES); integration tests need them" >&2
fi
"$PYTHON" -m pip install -q --disable-pip-version-check -e ".[test]"
# Optional: PyTorch for the DDP communication hook and its tests. 2.13.0 installs from local disk on these
# machines; elsewhere it downloads, and without it the torch tests are skipped.
if [ "${INA_SKIP_TORCH:-0}" != 1 ] && ! "$PYTHON" -c "import torch" 2>/dev/null; then
    "$PYTHON" -m pip install -q --disable-pip-version-check "torch==2.13.0" \
        || echo "note: torch==2.13.0 not installed; the PyTorch hook tests will be skipped" >&2
fi
