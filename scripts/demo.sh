#!/usr/bin/env bash
# The demo: profile -> pack -> inspect -> verify on the embedded chat data, fully offline.
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-demo-out}
BIN="$(dirname "$PY")/packshard"
DATA=packshard/data/demo_chat.jsonl
LEN=512

rm -rf "$OUT"
mkdir -p "$OUT"
echo "== building the demo tokenizer (byte-level BPE trained offline on the demo data)"
"$PY" -m packshard.demo "$OUT/tokenizer"

echo
echo "== packshard profile"
"$BIN" profile "$DATA" -t "$OUT/tokenizer" --template chatml --max-seq-len "$LEN" \
  --json "$OUT/profile.json" --html "$OUT/profile.html"

echo
echo "== packshard pack"
"$BIN" pack "$DATA" -t "$OUT/tokenizer" --template chatml --max-seq-len "$LEN" -o "$OUT/packed"

echo
echo "== packshard inspect (row 0)"
"$BIN" inspect "$OUT/packed" --row 0 --html "$OUT/row0.html"
echo
echo "== packshard verify"
"$BIN" verify "$OUT/packed" --json "$OUT/verify.json"
echo
echo "demo outputs are in $OUT/ (profile.html, packed/, row0.html, verify.json)"
