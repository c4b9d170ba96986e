#!/usr/bin/env bash
# `make demo`: show a newcomer the library at work on this host.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== hcoll_info --build"
bin/hcoll_info --build
echo
echo "== host reduction kernels against this machine's memory bound"
bin/reduce_bench -s 32M -i 5
