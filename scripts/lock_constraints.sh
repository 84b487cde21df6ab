#!/usr/bin/env bash
# Write constraints/ci.txt: the exact version of every package a fresh `pip install -e '.[test]'` brings today, the
# versions `.ci/run` (its default mode) then installs with `pip install -c constraints/ci.txt -e '.[test]'`.
#
#   scripts/lock_constraints.sh [VENV]
#
# It makes a new virtualenv (VENV, or a temporary one that it removes), installs the project with its test extra
# there without constraints (the newest versions pyproject.toml allows, as `.ci/run --newest` does), and writes
# `pip freeze --all` of it, less the project itself and pip, under a header saying when and with what. Renew it
# when pyproject.toml's dependencies change, or to move CI to newer releases: run this, then `.ci/run` (or at least
# `.ci/run -m "not slow"`), and commit the new file with what changed. The first run compiles llama-cpp-python
# from source when pip has no wheel of its version cached (about ten minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ $# -gt 0 ]; then
    venv=$1
    rm -rf "$venv"
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    venv=$tmp/venv
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install -e '.[test]'
out=constraints/ci.txt
mkdir -p constraints
{
    echo "# The exact versions CI tests: every package \`pip install -e '.[test]'\` brought into a fresh virtualenv"
    echo "# on $(date -u +%Y-%m-%d) ($("$venv/bin/python" -c 'import platform, sys; print(f"Python {platform.python_version()}, {sys.platform} {platform.machine()}")'), $("$venv/bin/pip" --version | cut -d' ' -f1-2))."
    echo "# Made by scripts/lock_constraints.sh (pip freeze --all, less pip and the project); run it again to renew."
    echo "# Used by .ci/run: pip install -c constraints/ci.txt -e '.[test]'"
    "$venv/bin/pip" freeze --all --exclude-editable | grep -viE '^(pip|llm-job-runner|llm_job_runner)(==| @ )' \
        | LC_ALL=C sort -f
} > "$out.new"
mv "$out.new" "$out"
echo "wrote $out: $(grep -vc '^#' "$out") packages"
