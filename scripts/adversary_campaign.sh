#!/bin/bash
# The adversary campaign: every attack of the test-only adversary (tests/adversary/) against real
# coordinator and peer processes, longer than `make test` runs them (docs/security.md, "Try the
# attacks yourself"). Each line is one run; a summary at the end. Takes 20-40 minutes on 2 cores.
#
#   scripts/adversary_campaign.sh [BUILD_DIR]       (default: build; needs agora and the adversary)
#
# AGORA and AGORA_ADVERSARY override the binaries; DATA the token folder (default data/tokens/sp8k);
# ONLY=REGEX runs only the runs whose line matches (ONLY=flood, ONLY='^steps$').
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
agora=${AGORA:-$build/apps/agora/agora}
adversary=${AGORA_ADVERSARY:-$build/tests/adversary/agora_adversary}
data=${DATA:-data/tokens/sp8k}
for f in "$agora" "$adversary"; do
  [ -x "$f" ] || { echo "missing $f: build first (make build)"; exit 2; }
done
test=tests/integration/adversary_test.py
log=${CAMPAIGN_LOG:-out/adversary-campaign}
export AGORA_TEST_KEEP=1  # each run's processes' logs stay in /tmp; its output names the folder
mkdir -p "$log"

# The grouped scenarios, long, then one attack per run with its variants.
runs=(
  "steps" "values" "unavailable" "coordinator" "witnesses"
  "single -- --attack wrong-step --claim-step 0"
  "single -- --attack replay --replay-source own --from-round 3"
  "single -- --attack replay --replay-source honest --from-round 2"
  "single -- --attack garbage"
  "single -- --attack scale --factor 1e6"
  "single -- --attack scale --factor 3e38"
  "single -- --attack scale --factor=-3e38"
  "single -- --attack scale --factor=-1e6"
  "single -- --attack sign-flip"
  "single -- --attack sign-flip --one-bit"
  "single -- --attack noise"
  "single -- --attack zero"
  "single -- --attack zero --one-bit"
  "single -- --attack withhold"
  "single -- --attack steal-endpoint"
  "single -- --attack forged-state --state-mode huge"
  "single -- --attack forged-state --state-mode evict"
  "single -- --attack forged-state --state-mode empty"
  "single -- --attack forged-state --state-mode fake"
  "single -- --attack flood --flood-kind heartbeat --flood-seconds 30"
  "single -- --attack flood --flood-kind state-report --flood-seconds 20"
  "single -- --attack flood --flood-kind commit --flood-seconds 20"
  "single -- --attack flood --flood-kind witness --rate 200 --flood-seconds 20"
  "single -- --attack flood --flood-kind get-finalized --flood-seconds 20"
  "single -- --attack flood --flood-kind join --rate 500 --flood-seconds 20"
  "single -- --attack flood --flood-kind get-blob --flood-seconds 20"
  "single -- --attack flood --flood-kind get-tensor --flood-seconds 20"
  "single -- --attack oversized --target coordinator --bytes 1049000"
  "single -- --attack oversized --target peers --bytes 1073000000 --flood-seconds 5"
  "single -- --attack lying-witness"
  "single -- --attack silent-witness"
)
passed=0; failed=()
total=0
for r in "${runs[@]}"; do
  [[ -n "${ONLY:-}" && ! "$r" =~ ${ONLY} ]] && continue
  total=$((total + 1))
  name=$(echo "$r" | sed -e 's/^single -- --attack //' -e 's/ --/_/g' -e 's/[ =]/_/g')
  start=$(date +%s)
  scenario=${r%% *}
  extra=()
  [ "$scenario" = single ] && read -r -a extra <<< "${r#single }"
  if python3 "$test" "$agora" "$adversary" "$data" "$scenario" --long "${extra[@]}" \
      > "$log/$name.txt" 2>&1; then
    passed=$((passed + 1)); verdict=ok
  else
    failed+=("$r"); verdict="FAIL ($(grep -m1 '^FAIL' "$log/$name.txt" | cut -c1-160))"
  fi
  echo "$(printf '%-70s' "$r") $(( $(date +%s) - start )) s  $verdict"
done
echo
echo "$passed of $total runs passed; logs in $log/"
for r in "${failed[@]}"; do echo "  failed: $r"; done
[ ${#failed[@]} -eq 0 ]
