#!/usr/bin/env bash
# Install everything the tests need (Debian packages as root, Python packages in .venv),
# run the linters and the whole test suite. CI runs exactly this, through .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(openmpi-bin openssh-server openssh-client iproute2 util-linux numactl graphviz slurmctld slurmd slurm-client munge libpmix-dev
                 prometheus prometheus-node-exporter)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # no daemon starts as a service (prometheus and its node exporter would): the tests start their own
    POLICY=/usr/sbin/policy-rc.d MADE=
    if [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$POLICY" && chmod 755 "$POLICY" && MADE=1
        trap '[ -z "$MADE" ] || rm -f "$POLICY"' EXIT  # also when apt-get fails
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${DEBIAN_PACKAGES[@]}" >/dev/null
    [ -z "$MADE" ] || rm -f "$POLICY"
fi

python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# editable_mode=compat: a plain path entry in a .pth, not setuptools' editable finder, which
# imports pathlib, re and urllib at every start of python (~7-10 ms of poprun's start-up)
.venv/bin/pip install -q -e '.[test]' --config-settings editable_mode=compat

.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports
POPRUN_CI=1 PATH="$PWD/.venv/bin:$PATH" .venv/bin/pytest -q
