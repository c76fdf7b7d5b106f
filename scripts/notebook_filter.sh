#!/usr/bin/env bash
# Keeps notebook outputs out of git: nbstripout becomes this clone's git filter for *.ipynb
# (.git/config and .git/info/attributes; nothing tracked changes), so git stores every notebook
# without outputs, execution counts, widget state or the kernel's version details, while the files
# in the working tree keep them. `git status` stays clean after a sitting, and `git pull` does not
# conflict. Cell ids are kept: the course's notebooks name their cells. `make course` runs this
# every time (it is idempotent), so a rebuilt environment is picked up:
#     bash scripts/notebook_filter.sh .venv/bin/python
set -euo pipefail

# Absolute, since git runs the filter from wherever it is called.
PYTHON="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
# What Jupyter adds to a notebook's metadata when it runs (language_info's name is committed).
KERNEL_DETAILS="codemirror_mode file_extension mimetype nbconvert_exporter pygments_lexer version"

if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "Not a git clone, or git refuses this folder's owner: notebook outputs are not filtered." >&2
    exit 0
fi
"$PYTHON" -m nbstripout --install --python "$PYTHON"
STRIP="\"$PYTHON\" -m nbstripout --keep-id"
git config filter.nbstripout.clean "$STRIP"
git config diff.ipynb.textconv "$STRIP -t"
git config filter.nbstripout.extrakeys "$(printf "metadata.language_info.%s " $KERNEL_DETAILS | sed 's/ $//')"
