#!/usr/bin/env bash
# Installs the `flowstate` Python package with pip — offline, without build isolation, into a
# fresh venv made with --system-site-packages (so it sees Debian's python3-torch and numpy) —
# and runs the pytest suite against the installed package, outside the source tree's PYTHONPATH.
#
#   scripts/test-pip.sh [BUILD_DIR]   # BUILD_DIR: a configured build tree to reuse (build/dev);
#                                     # without it, setup.py builds in build/pip (Release)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
export FLOWSTATE_BUILD_DIR=${1:-${FLOWSTATE_BUILD_DIR:-}}
if [[ -n $FLOWSTATE_BUILD_DIR ]]; then
  # The error-text test compares with the command's.
  bd=$FLOWSTATE_BUILD_DIR
  [[ $bd == /* ]] || bd=$root/$bd
  if [[ -x $bd/cli/flowstate ]]; then export FLOWSTATE_CLI=$bd/cli/flowstate; fi
else
  unset FLOWSTATE_BUILD_DIR
fi
"$work/venv/bin/pip" install --no-build-isolation --no-index --no-deps -q "$root"
unset PYTHONPATH
cd "$work"
where=$("$work/venv/bin/python" -c "import flowstate; print(flowstate.__file__)")
[[ $where == "$work/venv/"* ]] || { echo "test-pip: imported $where, not the venv's" >&2; exit 1; }
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python"
echo "test-pip: OK (flowstate from $where)"
