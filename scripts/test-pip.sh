#!/usr/bin/env bash
# Installs the `flowstate` Python package with pip — offline, without build isolation, into a
# fresh venv made with --system-site-packages (so it sees Debian's python3-torch and numpy) —
# and runs the pytest suite against the installed package, outside the source tree's PYTHONPATH:
# its version, the `flowstate` command pip puts on the venv's PATH (which the suite then runs),
# the typed stubs and the declared requirements are checked first.
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
[[ -n $FLOWSTATE_BUILD_DIR ]] || unset FLOWSTATE_BUILD_DIR
"$work/venv/bin/pip" install --no-build-isolation --no-index --no-deps -q "$root"
unset PYTHONPATH
cd "$work"
where=$("$work/venv/bin/python" -c "import flowstate; print(flowstate.__file__)")
[[ $where == "$work/venv/"* ]] || { echo "test-pip: imported $where, not the venv's" >&2; exit 1; }
fail() { echo "test-pip: $*" >&2; exit 1; }
# The one version (CMakeLists.txt's project VERSION): the package's, the command's, pip's.
version=$(sed -nE 's/^project\(flowstate VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
got=$("$work/venv/bin/python" -c "import flowstate; print(flowstate.__version__)")
[[ $got == "$version" ]] || fail "flowstate.__version__ is '$got', not '$version'"
# The command, installed on the venv's PATH with the package.
[[ -x $work/venv/bin/flowstate ]] || fail "pip did not install the flowstate command"
got=$(PATH="$work/venv/bin:$PATH" flowstate --version)
[[ $got == "flowstate $version" ]] || fail "flowstate --version says '$got'"
export FLOWSTATE_CLI=$work/venv/bin/flowstate  # the suite runs the installed command
# The typed stubs, and the requirements pip records.
pkg=$(dirname "$where")
[[ -f $pkg/__init__.pyi && -f $pkg/py.typed ]] || fail "no __init__.pyi / py.typed in $pkg"
"$work/venv/bin/python" - "$version" <<'PY' || fail "the installed metadata"
import importlib.metadata as m, sys
assert m.version("flowstate") == sys.argv[1], m.version("flowstate")
requires = {r.split(";")[0].split(">")[0].split("=")[0].strip() for r in m.requires("flowstate")}
assert {"numpy", "torch"} <= requires, requires
PY
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python"
echo "test-pip: OK (flowstate from $where)"
