#!/usr/bin/env bash
# Installs the Debian packages mlx4x builds, tests and runs with, and unpacks
# the source tree of exactly the installed UCX version (UCT's internal headers
# are not shipped by libucx-dev; see docs/design-notes.md, "Build against
# Debian's UCX").
#
# usage: contrib/install-deps.sh [UCX_SRC_PARENT_DIR]   (default: ./.deps)
set -euo pipefail

deps_dir=${1:-$(pwd)/.deps}
packages=(
    build-essential autoconf automake libtool pkg-config dpkg-dev
    libucx-dev ucx-utils libucx0
    openmpi-bin libopenmpi-dev
    libhwloc-dev hwloc
    googletest libgtest-dev
    gnuplot-nox                 # plots of contrib/bench/run-bench.sh (pngcairo)
    iproute2                    # ss: the tests wait for a server to listen
    groff-base                  # test_install.sh renders the manual pages
    debhelper fakeroot          # the Debian package (debian/, test_deb.sh)
    tshark                      # test_dump.sh decodes mlx4x-dump's captures
    ethtool                     # test_roce_hosts.sh: veths that cut GSO batches for a capture
    iptables python3            # test_hosts.sh: netem's faults where the kernel lacks netem
)

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    sudo_if_needed apt-get update -qq
    # wireshark-common asks whether non-root users may capture: no, and
    # without a question (nothing waits for an answer).
    echo "wireshark-common wireshark-common/install-setuid boolean false" |
        sudo_if_needed debconf-set-selections
    DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The UCX source tree must match the installed binary exactly.
ucx_version=$(dpkg-query -W -f='${Version}' libucx0)      # e.g. 1.13.1-1
upstream=${ucx_version%-*}; upstream=${upstream#*:}
src_dir="$deps_dir/ucx-$upstream"
if [ ! -f "$src_dir/src/uct/base/uct_iface.h" ]; then
    # apt-get source needs a deb-src line for the suite the binary came from.
    if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo "install-deps: adding a deb-src entry for apt-get source"
        sudo_if_needed tee /etc/apt/sources.list.d/mlx4x-deb-src.sources >/dev/null <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $(. /etc/os-release; echo "$VERSION_CODENAME")
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
        sudo_if_needed apt-get update -qq
    fi
    mkdir -p "$deps_dir"
    (cd "$deps_dir" && apt-get source -qq --download-only "ucx=$ucx_version" \
        && dpkg-source -x "ucx_${ucx_version#*:}.dsc" "ucx-$upstream" >/dev/null)
fi
# config.h of the installed binary (stats, asserts, ... change struct layouts).
# Rewritten only when it changed: the build depends on it, and a run of
# this script from a test (contrib/run-ucx-gtest) must not make the built
# plugin out of date.
mkdir -p "$src_dir/mlx4x-cfg"
ucx_info -b > "$src_dir/mlx4x-cfg/config.h.new"
if cmp -s "$src_dir/mlx4x-cfg/config.h.new" "$src_dir/mlx4x-cfg/config.h"; then
    rm -f "$src_dir/mlx4x-cfg/config.h.new"
else
    mv "$src_dir/mlx4x-cfg/config.h.new" "$src_dir/mlx4x-cfg/config.h"
fi
echo "install-deps: UCX $upstream source at $src_dir"
