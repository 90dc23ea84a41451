#!/usr/bin/env bash
# Checks that two agora binaries train the same numbers, bit for bit: the tool for a refactor
# that promises "behaviour unchanged". Each binary runs the same short runs (tiny preset, 20
# steps: AdamW, DeMo and DiLoCo with simulated peers, an uneven gradient accumulation, TST), and
# their final checkpoints (weights and optimizer state) are compared byte for byte.
#
#   scripts/same_numbers.sh OLD_AGORA NEW_AGORA      (from the repository root, after make data)
#
# Build the old binary from a worktree: git worktree add ../old REV && cmake -S ../old -B
# ../old/build -G Ninja && cmake --build ../old/build --target agora (it needs ../old/deps).
# Exits 1 when any run differs.
set -euo pipefail
old=$1 new=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cases=(
  "adamw|"
  "adamw_accumulate_3|--set train.batch_size=12"
  "demo_4_peers|--set optimizer.name=\"demo\" --simulate-peers 4"
  "demo_accumulate_3|--set optimizer.name=\"demo\" --set train.batch_size=24 --simulate-peers 2"
  "diloco_2_peers|--set optimizer.name=\"diloco\" --set diloco.inner_steps=5 --simulate-peers 2"
  "tst_bag_2|--set tst.bag=2 --set tst.fraction=0.5"
  "tst_bag_1_demo|--set tst.bag=1 --set tst.fraction=0.5 --set optimizer.name=\"demo\" --simulate-peers 2"
)
status=0
printf '%-22s %-10s %s\n' run weights "optimizer state"
for entry in "${cases[@]}"; do
  name=${entry%%|*}
  read -r -a extra <<< "${entry#*|}"
  for side in old new; do
    binary=$old; [ "$side" = new ] && binary=$new
    "$binary" train --config configs/tiny.toml --set train.steps=20 --set train.eval_interval=10 \
      --set "train.out_dir=\"$work/$side/$name\"" "${extra[@]}" > "$work/$side-$name.log" 2>&1 ||
      { echo "$name: the $side binary failed; see its log:"; tail -3 "$work/$side-$name.log"; exit 1; }
  done
  row=()
  for file in model.safetensors training_state.safetensors; do
    if cmp -s "$work/old/$name/checkpoint_000020/$file" "$work/new/$name/checkpoint_000020/$file"; then
      row+=(identical)
    else
      row+=(DIFFERENT); status=1
    fi
  done
  printf '%-22s %-10s %s\n' "$name" "${row[0]}" "${row[1]}"
done
exit $status
