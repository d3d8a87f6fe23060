#!/usr/bin/env bash
# A user's core install: `pip install .` alone (no extras), then pack -> verify -> inspect on the
# demo data.  verify without torch must say in one line what the model stage needs.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-core}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# from a copy of the sources: a build in the tree writes packshard.egg-info and build/ there, and
# CI runs this beside `make install`, whose editable build writes the same files
mkdir "$WORK/src"
tar -c --no-wildcards-match-slash --exclude='./.*' --exclude='*.egg-info' --exclude='./build' \
  --exclude='__pycache__' --exclude='./*out' . | tar -x -C "$WORK/src"
"$VENV/bin/python" -m pip install -q --no-compile "$WORK/src"
# compile on every core (pip would on one)
"$VENV/bin/python" -m compileall -q -j 0 \
  "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null 2>&1 || true
BIN="$VENV/bin/packshard"
DATA=packshard/data/demo_chat.jsonl
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "core install check: torch is installed in $VENV, but a core install must not bring it" >&2
  exit 1
fi

"$VENV/bin/python" -m packshard.demo "$WORK/tok" >/dev/null
"$BIN" pack "$DATA" -t "$WORK/tok" --template chatml --max-seq-len 512 -o "$WORK/out" --no-progress
"$BIN" verify "$WORK/out" --model none
"$BIN" inspect "$WORK/out" --row 0 >/dev/null

set +e
"$BIN" verify "$WORK/out" >"$WORK/verify.out" 2>&1
status=$?
set -e
if grep -q "Traceback" "$WORK/verify.out"; then
  cat "$WORK/verify.out" >&2
  echo "core install check: verify without torch printed a traceback" >&2
  exit 1
fi
if [ "$status" -ne 2 ] || ! grep -q "pip install 'packshard\[torch\]'" "$WORK/verify.out"; then
  cat "$WORK/verify.out" >&2
  echo "core install check: verify without torch must exit 2 and name the torch extra" >&2
  exit 1
fi
grep "pip install 'packshard\[torch\]'" "$WORK/verify.out"
echo "core install check: pack, verify --model none and inspect work without extras"
