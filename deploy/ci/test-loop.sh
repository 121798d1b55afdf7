#!/usr/bin/env bash
# test-loop.sh N: runs `make test` N times back to back beside a CPU-heavy
# process (one busy loop per core, at the same priority), and reports each
# run's verdict and time; exits 1 when any run failed. A test that waits on
# time instead of a signal fails here first.
set -uo pipefail
runs=${1:?runs}
hogs=()
for _ in $(seq "$(nproc)"); do
	(while :; do :; done) &
	hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
echo "test-loop: $runs runs of make test beside ${#hogs[@]} busy loops"
failed=0 verdicts=()
for i in $(seq "$runs"); do
	start=$(date +%s)
	if make test >"test-loop-$i.log" 2>&1; then
		verdict=PASS
	else
		verdict="FAIL ($(grep -E -m3 '^(--- FAIL|FAIL)' "test-loop-$i.log" | tr '\n' ' '))"
		failed=$((failed + 1))
	fi
	line="run $i: $verdict, $(($(date +%s) - start)) s (test-loop-$i.log)"
	echo "$line"
	verdicts+=("$line")
done
echo
echo "test-loop: $((runs - failed)) of $runs green"
printf '  %s\n' "${verdicts[@]}"
[ "$failed" -eq 0 ]
