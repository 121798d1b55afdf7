#!/usr/bin/env bash
# seeds.sh PROFILE N: runs bin/chaos's PROFILE N times, each on a fresh seed,
# and reports each seed's verdict; exits 1 when any run failed. A run's
# output is kept in chaos-seeds/<seed>.log, its report in <seed>.json.
set -uo pipefail
profile=${1:?profile} runs=${2:?runs}
mkdir -p chaos-seeds
verdicts=() failed=0
for i in $(seq 1 "$runs"); do
	seed=$(od -An -N4 -tu4 /dev/urandom | awk '{print $1 % 1000000}')
	echo "== run $i of $runs: profile $profile, seed $seed =="
	start=$(date +%s)
	if ./bin/chaos -profile "$profile" -seed "$seed" -report "chaos-seeds/$seed.json" >"chaos-seeds/$seed.log" 2>&1; then
		verdict=PASS
	else
		verdict="FAIL ($(tail -1 "chaos-seeds/$seed.log" | cut -c1-400))"
		failed=$((failed + 1))
	fi
	line="seed $seed: $verdict, $(($(date +%s) - start)) s"
	echo "$line"
	verdicts+=("$line")
done
echo
echo "chaos-seeds: profile $profile, $((runs - failed)) of $runs green"
printf '  %s\n' "${verdicts[@]}"
[ "$failed" -eq 0 ]
