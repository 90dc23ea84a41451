#!/usr/bin/env bash
# The agora command end to end, as a user runs it: help, version, tokenizer training, tokenize,
# stats, and the errors a user sees. Usage: agora_cli_test.sh PATH/TO/agora
set -uo pipefail
agora="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
check() {  # check NAME COMMAND...: the command must succeed
  local name="$1"; shift
  if "$@" >"$work/out" 2>&1; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL: $name"; sed 's/^/  /' "$work/out"; fi
}
expect_error() {  # expect_error NAME PATTERN COMMAND...: must fail and print PATTERN
  local name="$1" pattern="$2"; shift 2
  # An empty pattern matches every output: the check could not fail.
  if [ -z "$pattern" ]; then failed=$((failed + 1)); echo "FAIL: $name (empty pattern)"
  elif "$@" >"$work/out" 2>&1; then failed=$((failed + 1)); echo "FAIL: $name (succeeded)"
  elif grep -q -- "$pattern" "$work/out"; then passed=$((passed + 1))
  else failed=$((failed + 1)); echo "FAIL: $name (no '$pattern')"; sed 's/^/  /' "$work/out"; fi
}

mkdir -p "$work/docs"
for i in $(seq 1 30); do
  for j in $(seq 1 20); do echo "Line $j of document $i: it's a test, isn't it? Ünïcödé ✓"; done \
    > "$work/docs/doc$i.txt"
done

check "help lists subcommands" bash -c "'$agora' --help | grep -q tokenize && '$agora' --help | grep -q stats"
check "version names libtorch" bash -c "'$agora' --version | grep -q 'libtorch'"
check "train a tokenizer" "$agora" tokenizer train --input "$work/docs" --vocab-size 320 --out "$work/t.model"
check "tokenize with it" "$agora" tokenize --tokenizer "$work/t.model" --input "$work/docs" --out "$work/sp" --val-fraction 0.1
check "train and val shards exist" test -s "$work/sp/train_000000.bin" -a -s "$work/sp/val_000000.bin"
check "stats" bash -c "'$agora' stats '$work/sp' | grep -q 'distinct tokens'"
check "tokenize with gpt2" "$agora" tokenize --tokenizer gpt2 --input "$work/docs" --out "$work/g"
check "encode/decode round trip" bash -c \
  "[ \"\$('$agora' tokenizer encode --text 'Hello world' | '$agora' tokenizer decode)\" = 'Hello world' ]"
check "gpt2 ids" bash -c "[ \"\$('$agora' tokenizer encode --text 'Hello world')\" = '15496 995' ]"
expect_error "refuses to overwrite" "pass --force" "$agora" tokenize --input "$work/docs" --out "$work/g"
check "overwrites with --force" "$agora" tokenize --input "$work/docs" --out "$work/g" --force
expect_error "missing input" "does not exist" "$agora" tokenize --input "$work/nope" --out "$work/x"
expect_error "bad fraction" "out of range" "$agora" tokenize --input "$work/docs" --out "$work/x" --val-fraction 2
expect_error "bad tokenizer" "no such file" "$agora" tokenize --tokenizer "$work/none.model" --input "$work/docs" --out "$work/x"
# JSON Lines, plain and compressed, give the shards the same texts give as files.
mkdir -p "$work/jl"
python3 - "$work/docs" "$work/jl/c.jsonl" <<'PY'
import json, os, sys
docs = sys.argv[1]
with open(sys.argv[2], "w") as out:
    for name in sorted(os.listdir(docs)):
        out.write(json.dumps({"id": name, "text": open(os.path.join(docs, name)).read()}) + "\n")
PY
gzip -k "$work/jl/c.jsonl" && zstd -q "$work/jl/c.jsonl" -o "$work/jl/c.jsonl.zst"
for form in c.jsonl c.jsonl.gz c.jsonl.zst; do
  check "tokenize $form" "$agora" tokenize --input "$work/jl/$form" --out "$work/jl-$form"
  check "$form gives the files' shards" bash -c \
    "cmp '$work/g/train_000000.bin' '$work/jl-$form/train_000000.bin' && cmp '$work/g/val_000000.bin' '$work/jl-$form/val_000000.bin'"
done
check "a tokenizer trained on JSON Lines (zstd) is the one trained on the files" bash -c \
  "'$agora' tokenizer train --input '$work/jl/c.jsonl.zst' --vocab-size 320 --out '$work/t-jl.model' && cmp '$work/t.model' '$work/t-jl.model'"
# The data hash, computed again by Python's hashlib from its definition (data/data_identity.h).
cat > "$work/identity.py" <<'PY'
import hashlib, os, sys
def b2(*parts):
    h = hashlib.blake2b(digest_size=32)
    for p in parts:
        h.update(p)
    return h.digest()
d = sys.argv[1]
names = sorted(n for n in os.listdir(d)
               if (n.startswith("train_") or n.startswith("val_")) and n.endswith(".bin"))
root = hashlib.blake2b(digest_size=32)
root.update(b"agora data identity v1")
for n in names:
    data = open(os.path.join(d, n), "rb").read()
    chunks = [b2(data[i:i + (1 << 20)]) for i in range(0, len(data), 1 << 20)]
    root.update(b2(n.encode() + b"\0", len(data).to_bytes(8, "little"), *chunks))
print(root.hexdigest())
PY
check "data hash is the definition's, and tokenize recorded it" bash -c \
  "h=\$('$agora' data hash '$work/g') && [ \"\$h\" = \"\$(python3 '$work/identity.py' '$work/g')\" ] && grep -q \"\$h\" '$work/g/meta.json'"
check "the same texts as JSON Lines have the same data hash" bash -c \
  "[ \"\$('$agora' data hash '$work/g')\" = \"\$('$agora' data hash '$work/jl-c.jsonl.zst')\" ]"
check "other tokens, another data hash" bash -c \
  "[ \"\$('$agora' data hash '$work/g')\" != \"\$('$agora' data hash '$work/sp')\" ]"
expect_error "a data hash of a folder without shards" "holds no shards" "$agora" data hash "$work/docs"
"$agora" keygen --out "$work/data-member.key" > /dev/null
expect_error "a peer given a copy and a cache" "not both" "$agora" peer \
  --coordinator tcp://127.0.0.1:9 --coordinator-key "$("$agora" keygen --out "$work/c.key")" \
  --key "$work/data-member.key" --data "$work/g" --data-cache "$work/cache"
expect_error "fetching the data needs the run's data hash" "needs its data.hash" "$agora" async work \
  --config "$(dirname "$0")/../../bench/async/async.toml" --set data.dir=/nonexistent/agora-data \
  --key "$work/data-member.key" --server tcp://127.0.0.1:9 --server-key "$("$agora" keygen --out "$work/s.key")"
printf '{"text": "kept"}\nnot json\n{"body": "x"}\n' > "$work/jl/mixed.jsonl"
check "bad lines are reported with file and line" bash -c \
  "'$agora' tokenize --input '$work/jl/mixed.jsonl' --out '$work/jl-mixed' | grep -q 'mixed.jsonl:2: not JSON'"
head -c 300 "$work/jl/c.jsonl.gz" > "$work/jl/cut.jsonl.gz"
expect_error "a truncated gzip file" "is truncated" "$agora" tokenize --input "$work/jl/cut.jsonl.gz" --out "$work/x"
expect_error "no line has the field" 'no "missing" field' "$agora" tokenize --input "$work/jl/mixed.jsonl" --field missing --out "$work/y"
expect_error "bad vocab size" "out of range" "$agora" tokenizer train --input "$work/docs" --vocab-size 5 --out "$work/y.model"
expect_error "bad token id" "out of range" "$agora" tokenizer decode 99999999
expect_error "not a token id" "is not a token id" "$agora" tokenizer decode abc
printf 'garbage' > "$work/g/train_000000.bin"
expect_error "corrupt shard" "train_000000.bin" "$agora" stats "$work/g"
expect_error "unknown subcommand" "A subcommand is required" "$agora" frobnicate

# agora inspect payload, on a committed fuzz seed beside this script and on garbage.
# The seed is committed: a missing one is a broken checkout, not a reason to skip the check.
seed="$(dirname "$0")/../fuzz/corpus/payload_fuzz/demo_one_bit"
check "payload seed exists" test -s "$seed"
check "inspect payload" bash -c "'$agora' inspect payload '$seed' | grep -q '\"kind\": \"demo\"'"
# Four simulated DeMo peers on the small shards, saving their payloads; one of them inspected.
config="$(dirname "$0")/../../configs/tiny.toml"
check "train with simulated peers" bash -c "'$agora' train --config '$config' --quiet \
  --set data.dir='$work/sp' --set data.seq_len=16 --set train.steps=3 --set schedule.warmup_steps=1 --set train.out_dir='$work/run' \
  --set optimizer.name=demo --set demo.topk=4 --set demo.one_bit=true \
  --simulate-peers 4 --save-payloads '$work/payloads' | grep -q 'on all 4 simulated peers'"
check "inspect a saved payload" bash -c \
  "'$agora' inspect payload '$work/payloads/step_000002_peer-003.agp' | grep -q '\"value_type\": \"one_bit\"'"
expect_error "peers must divide the batch" "does not divide train.batch_size" "$agora" train \
  --config "$config" --set data.dir="$work/sp" --set train.out_dir="$work/run2" --simulate-peers 3
printf 'garbage' > "$work/garbage.payload"
expect_error "inspect malformed payload" "payload: magic" "$agora" inspect payload "$work/garbage.payload"

# The swarm simulation: its summary, and the errors of a bad layout.
check "swarm-sim runs" bash -c "'$agora' swarm-sim --sim-seconds 300 --rebalance 60 | tail -1 | \
  python3 -c 'import json,sys; j=json.load(sys.stdin); assert j[\"event\"] == \"summary\" and j[\"micro_batches\"] > 0 and j[\"kills\"] == 5, j'"
expect_error "swarm-sim speed not a number" "'x' is not a number" "$agora" swarm-sim --speeds '1,x;1'
expect_error "swarm-sim empty stage" "an empty speed" "$agora" swarm-sim --speeds '1;;1'
expect_error "swarm-sim zero speed" "allowed > 0" "$agora" swarm-sim --speeds '1;0'
expect_error "swarm-sim costs per stage" "2 costs for 3 stages" "$agora" swarm-sim --speeds '1;1;1' --costs 1,1

# Asynchronous data parallelism across processes (docs/async.md): the errors a user sees before
# anything listens or connects (tests/integration/async_network_test.py runs it).
async_config="$(cd "$(dirname "$0")/../../bench/async" && pwd)/async.toml"
check "async keygen" "$agora" keygen --out "$work/async.key"
expect_error "async unknown method" "async method 'fast' is not known" "$agora" async serve \
  --config "$async_config" --key "$work/async.key" --open --method fast
expect_error "async workers split the batch" "async workers = 5 must be >= 1 and divide train.batch_size = 32" \
  "$agora" async serve --config "$async_config" --key "$work/async.key" --open --workers 5
# Every serving role says who may connect (docs/security.md): an allowlist or --open, not neither
# and not both.
for role in "async serve --config $async_config" "rl serve --checkpoint $work" \
            "swarm serve --config $(dirname "$async_config")/../../configs/swarm.toml \
             --set model.vocab_size=512"; do
  expect_error "${role%% *} serve without admission" "who may connect is not said: set --allowlist" \
    "$agora" $role --key "$work/async.key"
  expect_error "${role%% *} serve with both admissions" "both --allowlist ($work/none.txt) and --open" \
    "$agora" $role --key "$work/async.key" --allowlist "$work/none.txt" --open
done
expect_error "async worker behaviour" "behave lazy is not known" "$agora" async work \
  --config "$async_config" --key "$work/async.key" --server tcp://127.0.0.1:1 \
  --server-key "$(printf '0%.0s' $(seq 1 64))" --behave lazy

# The swarm across processes (docs/swarm.md section 4): the errors a user sees before anything
# listens (tests/integration/swarm_network_test.py runs it).
swarm_configs="$(cd "$(dirname "$0")/../../configs" && pwd)"
expect_error "swarm needs a pipeline" "pipeline.stages is 1 (allowed: 2 or more" "$agora" swarm serve \
  --config "$swarm_configs/tiny.toml" --key "$work/async.key"
expect_error "swarm whole micro-batches" "train.batch_size = 32 is not a multiple of train.micro_batch_size = 3" \
  "$agora" swarm peer --config "$swarm_configs/swarm.toml" --set train.micro_batch_size=3 \
  --key "$work/async.key" --coordinator tcp://127.0.0.1:1 --coordinator-key "$(printf '0%.0s' $(seq 1 64))" \
  --listen tcp://127.0.0.1:1
expect_error "swarm without look-ahead" "demo.lookahead is not available in a swarm" "$agora" swarm serve \
  --config "$swarm_configs/swarm.toml" --set demo.lookahead=true --key "$work/async.key"

# RL post-training end to end (docs/rl.md): a corpus of problems, its tokenizer, one problem per
# document, a base model of a few steps, held-out accuracy, and GRPO with a cheating worker.
configs="$(cd "$(dirname "$0")/../../configs" && pwd)"
rl="$work/rl"
check "rl problems" bash -c "'$agora' rl problems --task countdown --count 3 | grep -q -- ' -> '"
check "rl corpus" "$agora" rl corpus --problems 3000 --out "$rl/problems.txt"
check "rl corpus has a problem per line" bash -c "[ \$(wc -l < '$rl/problems.txt') -eq 3000 ]"
check "rl tokenizer from a small alphabet" bash -c "'$agora' tokenizer train --input '$rl/problems.txt' \
  --vocab-size 320 --out '$rl/t.model' | grep -q 'trained a 2[0-9][0-9]-piece vocabulary'"
check "rl tokenize a line per document" bash -c "'$agora' tokenize --lines --tokenizer '$rl/t.model' \
  --input '$rl/problems.txt' --out '$rl/tokens' --val-fraction 0.05 | grep -q 'train: 2[0-9][0-9][0-9] documents'"
check "rl base model" "$agora" train --config "$configs/rl-base.toml" --quiet --set data.dir="$rl/tokens" \
  --set train.steps=6 --set schedule.warmup_steps=2 --set train.eval_interval=3 --set train.eval_windows=2 \
  --set train.out_dir="$rl/base"
check "rl eval" bash -c "'$agora' rl eval --checkpoint '$rl/base/latest' --problems 8 | grep -q '8 held-out arithmetic problems'"
check "rl train with a cheating worker" bash -c "'$agora' rl train --checkpoint '$rl/base/latest' \
  --steps 3 --prompts 4 --group 4 --eval-problems 4 --workers honest,fabricate --out '$rl/run' \
  | grep -q 'strikes: worker-0-honest 0 worker-1-fabricate [1-9]'"
check "rl rows" python3 -c "
import json
rows = [json.loads(l) for l in open('$rl/run/rl.jsonl')]
steps = [r for r in rows if r['event'] == 'rl_step']
assert [r['step'] for r in steps] == [0, 1, 2, 3], steps
assert rows[-1]['event'] == 'rl_intake' and rows[-1]['verdicts']['mismatch'] >= 1, rows[-1]
assert 'held_out_accuracy' in steps[0] and 'held_out_accuracy' in steps[-1]"
check "rl checkpoint opens" bash -c "'$agora' rl eval --checkpoint '$rl/run/latest' --problems 2 | grep -q accuracy"
check "rl sapo" bash -c "'$agora' rl sapo --checkpoint '$rl/base/latest' --nodes 2 --rounds 2 --own 2 \
  --shared 2 --group 4 --eval-problems 4 --out '$rl/sapo' | grep -q 'cumulative reward'"
check "rl sapo rows" python3 -c "
import json
rows = [json.loads(l) for l in open('$rl/sapo/sapo.jsonl')]
assert [r['round'] for r in rows if r['event'] == 'sapo_round'] == [1, 2], rows
assert rows[-1]['event'] == 'sapo_summary' and len(rows[-1]['accuracy']) == 2, rows[-1]"
expect_error "rl sapo of one node" "sapo nodes 1 is invalid" "$agora" rl sapo --checkpoint "$rl/base/latest" --nodes 1
expect_error "rl unknown task" "unknown rl task 'chess'" "$agora" rl problems --task chess
expect_error "rl unknown worker" "unknown rl worker behaviour 'lazy'" "$agora" rl train \
  --checkpoint "$rl/base/latest" --workers honest,lazy
expect_error "rl group of one" "rl group size 1 is invalid" "$agora" rl train --checkpoint "$rl/base/latest" --group 1
expect_error "rl lag past the window" "exceeds max off-policy steps" "$agora" rl train \
  --checkpoint "$rl/base/latest" --workers honest --policy-lag 3 --max-off-policy 2

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
