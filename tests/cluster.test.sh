#!/usr/bin/env bash
# The emulated cluster (tests/cluster/), small version: network namespaces
# as nodes, veth as NICs, one bridge per rail, tc as line rate. Needs root;
# skipped (exit 77, "SKIP: reason") otherwise. `make test-cluster` runs the
# full version.
set -u
cd "$(dirname "$0")/.." || exit 1
exec bash tests/cluster/cluster-test.sh --small
