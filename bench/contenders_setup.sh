#!/usr/bin/env bash
# The virtualenvs of bench/contenders.py's foreign contenders, each apart from the project's own .venv because
# their dependencies clash with the project's pins:
#
#   bash bench/contenders_setup.sh            # makes both
#   bash bench/contenders_setup.sh curator    # or one
#
# Where: CONTENDERS_DIR (default /tmp/contenders), or CURATOR_VENV / LITELLM_VENV for each. Which interpreter
# makes them: PYTHON (default python3). The tools' versions are pinned exactly (the newest that installed here
# when the comparison was made); their dependencies are not, so each venv's `pip freeze` is written beside it
# (freeze.txt) for the results. Nothing here is fetched but packages from the package index.
#
# The cookbook's script and Curator count tokens with tiktoken's cl100k_base, which tiktoken downloads on first use
# (no network here); litellm, in both venvs, ships that file (litellm_core_utils/tokenizers/, named as tiktoken's
# cache names it), so it is copied from the venv just made into TIKTOKEN_CACHE (default
# $CONTENDERS_DIR/tiktoken-cache), the folder bench/contenders.py hands those children as TIKTOKEN_CACHE_DIR.
set -euo pipefail

DIR="${CONTENDERS_DIR:-/tmp/contenders}"
PYTHON="${PYTHON:-python3}"
CURATOR_VENV="${CURATOR_VENV:-$DIR/venv-curator}"
LITELLM_VENV="${LITELLM_VENV:-$DIR/venv-litellm}"
CURATOR_PIN="bespokelabs-curator==0.1.31"
LITELLM_PIN="litellm==1.110.2"
TIKTOKEN_CACHE="${TIKTOKEN_CACHE:-$DIR/tiktoken-cache}"
#: tiktoken's cache name of cl100k_base (the SHA-1 of its download address)
CL100K="9b5ad71b2ce5302211f9c61530b329a4922fc6a4"

make_venv() {  # make_venv FOLDER PACKAGE...
    local venv="$1"
    shift
    if [ ! -x "$venv/bin/python" ]; then
        "$PYTHON" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
    "$venv/bin/python" -m pip freeze --disable-pip-version-check > "$venv/freeze.txt"
    echo "$venv/bin/python: $* ($(wc -l < "$venv/freeze.txt") packages, see $venv/freeze.txt)"
    mkdir -p "$TIKTOKEN_CACHE"
    cp "$(find "$venv" -path "*/litellm_core_utils/tokenizers/$CL100K" | head -n 1)" "$TIKTOKEN_CACHE/"
}

mkdir -p "$DIR"
for which in "${@:-curator litellm}"; do
    for one in $which; do
        case "$one" in
            curator) make_venv "$CURATOR_VENV" "$CURATOR_PIN" ;;
            litellm) make_venv "$LITELLM_VENV" "$LITELLM_PIN" aiohttp ;;
            *) echo "unknown contender: $one (curator, litellm)" >&2; exit 2 ;;
        esac
    done
done
echo "$TIKTOKEN_CACHE/$CL100K: tiktoken's cl100k_base, from litellm's package"
