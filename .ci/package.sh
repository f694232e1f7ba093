#!/usr/bin/env bash
# The package as users receive it: build the sdist and the wheel, check them, install
# the wheel (not editable) in a fresh virtual environment, and run it from a folder
# outside the repository: first without extras (the library steps; a command names the
# extra it needs in one line), then with the experiments extra (the command line).
# Needs `build` and `twine` in the active environment (the test extra has them).
set -euo pipefail
start=$SECONDS
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"; echo "package: ended after $((SECONDS - start)) s (with the cleanup)"' EXIT
stage() { echo "package: [$((SECONDS - start)) s] $*"; }

stage "build"
python -m build --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
python -m twine check --strict "$work"/dist/*
wheel="$(ls "$work"/dist/*.whl)"
python - "$wheel" <<'PY'  # the package and its metadata, nothing else (tests, docs, results)
import sys, zipfile
stray = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if not n.startswith("stiefax")]
sys.exit(f"package: the wheel holds {stray}" if stray else 0)
PY
for f in "$work"/dist/*; do echo "package: $(basename "$f") $(du -k "$f" | cut -f1) KiB"; done

stage "install the wheel without extras in a fresh environment"
python -m venv "$work/venv"
bin="$work/venv/bin"
cd "$work"  # outside the repository: only the installed package can be imported

# Without extras: the library imports and steps; a command names the extra.
"$bin/pip" install -q "$wheel"
stage "the library without extras"
"$bin/python" "$repo/.ci/step.py"
if "$bin/stiefax" grok >"$work/out.txt" 2>"$work/err.txt"; then
  echo "package: stiefax grok ran without the experiments extra" >&2
  exit 1
fi
cat "$work/err.txt"
[ "$(wc -l <"$work/err.txt")" -eq 1 ] && grep -qF 'pip install "stiefax[experiments]"' "$work/err.txt"

# With the experiments extra: the command line.
stage "install the experiments extra"
"$bin/pip" install -q "stiefax[experiments] @ file://$wheel"
version="$("$bin/python" -c 'import importlib.metadata as m; print(m.version("stiefax"))')"
[ "$("$bin/stiefax" --version)" = "stiefax $version" ]
"$bin/stiefax" --help >/dev/null
stage "stiefax lm"
"$bin/stiefax" lm --arms A2,B2 --steps 5 --eval-every 5 --batch 2 --no-progress --out "$work/lm"
stage "stiefax grok"
"$bin/stiefax" grok --epochs 50 --out "$work/grok" 2>/dev/null  # stderr: progress bars
[ "$(ls "$work"/lm/*.json | wc -l)" -eq 2 ] && [ "$(ls "$work"/grok/*.json | wc -l)" -eq 2 ]
stage "all checks passed"
