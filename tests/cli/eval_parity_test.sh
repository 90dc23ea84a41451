#!/usr/bin/env bash
# agora eval's val_loss against an independent Hugging Face-style Llama forward pass in numpy
# (tests/parity/llama_reference.py) on the same checkpoint and shard: they must agree to 1e-4
# relative, for a plain model and for one with YaRN context extension.
# Usage: eval_parity_test.sh PATH/TO/agora SOURCE_DIR DATA_DIR
set -uo pipefail
agora="$1"; src="$2"; data="$3/tokens/sp8k"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f "$data/meta.json" ] || { echo "FAIL: $data is missing (run make data)"; exit 1; }
passed=0; failed=0
run_case() {  # run_case NAME --set ...: train briefly, then compare the two evaluations
  local name="$1"; shift
  if ! "$agora" train --config "$src/configs/tiny.toml" --quiet --set train.steps=6 \
       --set "train.out_dir=\"$work/$name\"" --set "data.dir=\"$data\"" "$@" > "$work/$name.log" 2>&1; then
    failed=$((failed + 1)); echo "FAIL: $name: training failed"; cat "$work/$name.log"; return
  fi
  local ours theirs
  ours=$("$agora" eval --checkpoint "$work/$name/latest" --data "$data/val_000000.bin" --max-windows 3 --json)
  theirs=$(/usr/bin/python3 "$src/tests/parity/llama_reference.py" "$work/$name/latest" "$data/val_000000.bin" 3)
  if python3 -c "
import json, sys
a = json.loads(sys.argv[1])['val_loss']; b = json.loads(sys.argv[2])['val_loss']
print(f'$name: agora {a:.7f}  reference {b:.7f}  relative difference {abs(a - b) / abs(b):.2e}')
sys.exit(0 if abs(a - b) <= 1e-4 * abs(b) else 1)" "$ours" "$theirs"; then
    passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $name"; fi
}
run_case plain
run_case untied_gqa --set model.tie_embeddings=false --set model.num_kv_heads=1
run_case yarn --set model.yarn_factor=2.0 --set model.yarn_original_max_seq_len=32
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
