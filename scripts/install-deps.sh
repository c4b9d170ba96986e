#!/usr/bin/env bash
# Install what hcoll's build and tests need from Debian's archive.
# Idempotent: when every package is present it only checks and exits (well
# under a second). Run as root, or with sudo available.
set -euo pipefail

pkgs=(
  build-essential     # gcc, make
  pkg-config          # hcoll.pc check, check's flags
  check               # unit test framework
  libibverbs-dev      # verbs transport (compiled; needs no device to build)
  librdmacm-dev       # RoCE address/route resolution
  openmpi-bin         # peer comparison (mpirun) in benchmarks
  libopenmpi-dev
  iproute2            # ip netns / veth / tc for the emulated cluster
  ethtool             # turning off offloads that distort tc shaping
  procps              # pgrep/pkill in test scripts
  binutils            # nm for the exported-symbol test
  gnuplot-nox         # hcoll_perf --plot
  python3             # JSON checks in the perf and cluster tests
  python3-torch       # torchrun (python3 -m torch.distributed.run) for tests/torchrun.test.sh:
                      # hcoll_comm_init_env under a real torchrun job (skipped without it)
  python3-numpy       # the Python binding's tests (tests/python.test.sh)
  libtorch-dev        # the c10d backend's C++ extension (python/hcoll/csrc)
  python3-pybind11
  python3-venv        # tests/python.test.sh: offline pip install into a venv
  python3-pip
  python3-setuptools
  clang               # make fuzz: libFuzzer targets (tests/fuzz), -fsanitize=fuzzer
  libgloo-dev         # bin/gloo_bench (bench/gloo_bench.cc), tests/gloo.test.sh: Gloo's all-reduce
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
