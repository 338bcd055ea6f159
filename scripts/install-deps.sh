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
