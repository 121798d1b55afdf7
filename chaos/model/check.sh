#!/usr/bin/env bash
# chaos/model/check.sh: checks the protocol's Promela model (chaos/model/protocol.pml)
# with Spin, exhaustively at the bounds the model states (docs/model.md):
#
#   - every property holds in each row of the protocol: the safety ones
#     (assertions) in one search per row, the liveness ones (LTL, pan -a -f:
#     acceptance cycles under weak fairness) in one search each;
#   - every crash window of the model is reached in its row's search (a
#     window no run reaches would be a crash the model never tries);
#   - every control fails, with the error its property gives (a named
#     assertion, or an acceptance cycle), and its counterexample is replayed
#     with spin -t -p: <run>/trail.txt in full, <run>/steps.txt its narrated
#     steps, numbered.
#
# It exits non-zero if a property fails, a search does not complete, a
# window is not reached, or a control passes. `make model` runs it.
#
#   MODEL_OUT=dir  where the runs and their trails go (default chaos/model/out, git-ignored)
#   MODEL_JOBS=n   searches at once (default 2)
#   MODEL_MEM=MB   memory limit of each search (default 4096)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
model=$here/protocol.pml
out=${MODEL_OUT:-$here/out}
jobs=${MODEL_JOBS:-2}
mem=${MODEL_MEM:-4096}
cc=${CC:-gcc}

command -v spin >/dev/null || { echo "model: spin is not installed (Debian: apt-get install spin)"; exit 2; }
command -v "$cc" >/dev/null || { echo "model: $cc is not installed"; exit 2; }

# The failover searches' bounds: one lossy failover; row 1 without the
# other faults (each alone multiplies its states by ten and more), row 2
# with one crash (a kill between a commit and its ack, beside the failover).
FAILOVER1="-DMAXCRASH=0 -DMAXPAUSE=0 -DMAXEXPIRE=0 -DMAXRELEASE=0 -DMAXPUBFAIL=0"
FAILOVER2="-DMAXCRASH=1 -DMAXDUP=0 -DMAXDBFAIL=0"

# name | spin -D flags | search | expected
#   search:   safety (every assertion, invalid end states), or live:PROP (pan -a -f -N PROP)
#   expected: pass, or the error pan must report
RUNS=(
	"row1|-DROW=1|safety|pass"
	"row1-published|-DROW=1|live:published|pass"
	"row2|-DROW=2|safety|pass"
	"row2-delivered|-DROW=2|live:delivered|pass"
	"row3|-DROW=3|safety|pass"
	"row3-captured|-DROW=3|live:captured|pass"

	"inbox-off-once|-DROW=2 -DINBOX_OFF -DCHECK=P_once|safety|assertion violated  !(twice)"
	"inbox-off-conflict|-DROW=2 -DINBOX_OFF -DCHECK=P_conflict|safety|assertion violated  !(conflict_applied)"
	"commit-before-tx|-DROW=2 -DCOMMIT_BEFORE_TX -DCHECK=0|live:delivered|acceptance cycle"
	"parallel-relays|-DROW=1 -DPARALLEL_RELAYS -DCHECK=P_order|safety|assertion violated  !(order_bad)"
	"no-effect-key|-DROW=3 -DNO_EFFECT_KEY -DCHECK=P_capture|safety|assertion violated  !(captured_twice)"
	"unfenced-lease|-DROW=1 -DUNFENCED_LEASE -DCHECK=P_order|safety|assertion violated  !(order_bad)"
	"guard-off|-DROW=2 -DGUARD_OFF -DCHECK=P_guard|safety|assertion violated  !(decided_twice)"
	"mark-before-publish|-DROW=1 -DMARK_BEFORE_PUBLISH -DCHECK=0|live:published|acceptance cycle"
	"no-effect-lease|-DROW=3 -DNO_EFFECT_LEASE -DCHECK=0|live:captured|acceptance cycle"

	# A lossy failover (FAILOVER1, FAILOVER2: the bounds below): synchronous
	# replication and pkg/standby's gate on asynchronous replication hold
	# every property; asynchronous replication without the gate must fail.
	"failover-sync-row1|-DROW=1 -DFAILOVER -DSYNC_REPL $FAILOVER1|safety|pass"
	"failover-gate-row1|-DROW=1 -DFAILOVER -DSTANDBY_GATE $FAILOVER1|safety|pass"
	"failover-sync-row2|-DROW=2 -DFAILOVER -DSYNC_REPL $FAILOVER2|safety|pass"
	"failover-gate-row2|-DROW=2 -DFAILOVER -DSTANDBY_GATE $FAILOVER2|safety|pass"
	"failover-async-ghost|-DROW=1 -DFAILOVER -DCHECK=P_ghost $FAILOVER1|safety|assertion violated  !(ghost)"
	"failover-async-answer|-DROW=1 -DFAILOVER -DCHECK=P_answer $FAILOVER1|safety|assertion violated  !(answer_lost)"
	"failover-async-lost|-DROW=2 -DFAILOVER -DCHECK=P_lost $FAILOVER2|safety|assertion violated  !(lost)"
)

# The controls search without the failures the model has for the chaos
# runs' traces (a failed publish, transaction or provider call; the
# protocol's searches have them): each control isolates its one flaw, and
# its counterexample (docs/model.md) stays the shortest story of it.
CONTROL_FLAGS="-DMAXPUBFAIL=0 -DMAXDBFAIL=0 -DMAXPFAIL=0"

rm -rf "$out"
mkdir -p "$out"

echo "== chaos/model/protocol.pml: bounds"
sed -n 's/^#define \(MAX[A-Z]*\|BATCH\|NRELAY\|NSHARD\|NORD\|NROWS\|NRUNNER\|MAXATT\|LOGMAX\) *\([0-9]*\) *\/\* *\(.*\) \*\/$/  \1 = \2: \3/p' "$model"
echo "  messages: rows 0 (order 0), 1 (order 1), 2 (order 0) committed in that order; hostile: id 0 with another payload, a poison message, a second decision for order 0"
echo "  failover searches: MAXFAILOVER = 1; row 1: $FAILOVER1; row 2: $FAILOVER2"
echo

# run NAME FLAGS SEARCH EXPECTED: one search in $out/NAME; writes $out/NAME/result
run() {
	local name=$1 flags=$2 search=$3 expect=$4
	[[ $expect == pass ]] || flags+=" $CONTROL_FLAGS"
	local d=$out/$name cflags pargs depths="1000000"
	mkdir -p "$d"
	cp "$model" "$d/protocol.pml"
	cd "$d"
	# shellcheck disable=SC2086
	if ! spin $flags -a protocol.pml >spin.txt 2>&1; then
		echo "FAIL|spin -a failed: $(tail -1 spin.txt)" >result
		return
	fi
	case $search in
	safety)
		cflags="-DSAFETY -DNOCLAIM"
		pargs=""
		# a control's counterexample: breadth first, so the trail is a shortest one
		[[ $expect == pass ]] || cflags+=" -DBFS"
		;;
	live:*)
		cflags="-DNFAIR=3"
		pargs="-a -N ${search#live:}"
		if [[ $expect == pass ]]; then
			# every run, fair or not (see docs/model.md); MODEL_FAIR=1: under weak fairness too
			[[ ${MODEL_FAIR:-0} == 0 ]] || pargs+=" -f"
		else
			# under weak fairness, so no counterexample starves a process;
			# depth-first within growing depth bounds, for a short one
			pargs+=" -f"
			depths="20 30 40 50 60 70 80 100 130 170 220 1000000"
		fi
		;;
	esac
	# shellcheck disable=SC2086
	if ! "$cc" -w -O2 -DMEMLIM="$mem" -DCOLLAPSE $cflags -o pan pan.c >cc.txt 2>&1; then
		echo "FAIL|$cc failed: $(tail -1 cc.txt)" >result
		return
	fi
	local m errors states depth secs stats
	for m in $depths; do
		# shellcheck disable=SC2086
		./pan $pargs -m"$m" -w24 >pan.txt 2>&1 || true
		errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.txt | tail -1)
		[[ ${errors:-0} == 0 ]] || break
	done
	states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' pan.txt | tail -1)
	depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' pan.txt | tail -1)
	secs=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\) seconds/\1/p' pan.txt | tail -1)
	stats="${states:-?} states, depth ${depth:-?}, ${secs:-?} s"
	if [[ -z $errors ]]; then
		echo "FAIL|pan did not finish ($stats): $(tail -1 pan.txt)" >result
		return
	fi
	if [[ $errors == 0 ]] && grep -q -e 'Search not completed' -e 'reached -DMEMLIM' -e 'max search depth too small' pan.txt; then
		echo "FAIL|search incomplete ($stats): $(grep -m1 -e 'Search not completed' -e 'MEMLIM' -e 'depth too small' pan.txt)" >result
		return
	fi
	if [[ $expect == pass ]]; then
		if [[ $errors == 0 ]]; then
			echo "ok|holds: $stats" >result
		else
			# shellcheck disable=SC2086
			spin $flags -t -p protocol.pml >trail.txt 2>&1 || true
			echo "FAIL|$(grep -m1 -e 'violated' -e 'cycle' -e 'invalid end' pan.txt || echo "$errors errors") ($stats; trail in $d/trail.txt)" >result
		fi
		return
	fi
	if [[ $errors == 0 ]]; then
		echo "FAIL|the control passed: the property cannot see its violation ($stats)" >result
		return
	fi
	if ! grep -qF -- "$expect" pan.txt; then
		echo "FAIL|failed, but not with '$expect': $(grep -m1 -e 'violated' -e 'cycle' -e 'invalid end' pan.txt) ($stats)" >result
		return
	fi
	# The counterexample: every step in trail.txt, the narrated ones
	# (the model's "MSC:" lines) numbered in steps.txt.
	# shellcheck disable=SC2086
	spin $flags -t -p protocol.pml >trail.txt 2>&1 || true
	{
		sed -n '/^ *MSC: crash in window /{s/^ *MSC: crash in window //; s/_/-/g; s/^/crash in window /p; d}; s/^ *MSC: //p; s/^spin: text of failed assertion: \(.*\)/the property fails: \1/p; s/^ *<<<<<START OF CYCLE>>>>>.*/from here the run repeats forever without the property becoming true/p' trail.txt
		if [[ $search == live:* ]] && ! grep -q 'START OF CYCLE' trail.txt; then
			echo "no process can move any more, and ${search#live:} never became true"
		fi
	} | awk '{ printf "%2d. %s\n", NR, $0 }' >steps.txt
	echo "ok|fails as it must: $expect; $(grep -c . steps.txt) narrated steps, $(sed -n 's/^spin: trail ends after \([0-9]*\) steps/\1/p' trail.txt) Spin steps ($stats)" >result
}

start=$SECONDS
for r in "${RUNS[@]}"; do
	IFS='|' read -r name flags search expect <<<"$r"
	(run "$name" "$flags" "$search" "$expect") &
	while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
done
wait

failed=0
echo "== the protocol: every property must hold"
for r in "${RUNS[@]}"; do
	IFS='|' read -r name flags search expect <<<"$r"
	[[ $expect == pass ]] || continue
	IFS='|' read -r verdict text <"$out/$name/result"
	printf '  %-5s %-22s %-16s %s\n' "$verdict" "$name" "$search" "$text"
	[[ $verdict == ok ]] || failed=1
done

# A statement is reached when its row's protocol search (safety, complete)
# does not list its line among the unreached ones.
unreached() { # unreached ROW LINE: the row's search lists a printf of LINE as unreached
	unreached_in "row$1" "$2"
}
unreached_in() { # unreached_in RUN LINE: RUN's search lists a printf of LINE as unreached
	grep -qE "protocol\.pml:$2, state [0-9]+, \"printf\('MSC:" "$out/$1/pan.txt"
}
row_of() { # row_of LINE: the row whose processes hold the model's line LINE
	local proc
	proc=$(awk -v n="$1" '/^proctype /{ p = $2; sub(/\(.*/, "", p) } NR == n { print p; exit }' "$model")
	case $proc in
	Producer | Relay) echo 1 ;;
	Broker | Hostile | Consumer) echo 2 ;;
	Enqueuer | Runner) echo 3 ;;
	*) echo "?" ;;
	esac
}

echo "== the crash windows: each reached in its row's search"
while read -r line window; do
	row=$(row_of "$line")
	if [[ $row != "?" ]] && ! unreached "$row" "$line"; then
		printf '  ok    %-30s row %s, line %s\n' "${window//_/-}" "$row" "$line"
	else
		printf '  FAIL  %-30s row %s, line %s: its search never crashes there\n' "${window//_/-}" "$row" "$line"
		failed=1
	fi
done < <(grep -n 'CRASH(' "$model" | grep -v -e '#define' -e '^[0-9]*:[[:space:]]*\*' | sed -n 's/^\([0-9]*\):.*CRASH(\([a-z_]*\),.*/\1 \2/p')

# The scenarios the properties are about, each reached in its row's search:
# a property that held only because its threat never happened would prove
# nothing.
SCENARIOS=(
	"1|already paid: nothing written"
	"1|paused: the fence ends its session"
	"1|cannot commit: the fence ended its session"
	"1|finds shard %d taken"
	"1|gives shard 0 back"
	"1|the lease of shard 0 expires"
	"2|again at offset"
	"2|is a duplicate"
	"2|conflicts: quarantined"
	"2|dead-lettered"
	"2|guard refuses"
	"3|replays the stored response"
	"3|was recorded already"
	"3|expires under its runner"
	"1|fails (the broker is down)"
	"2|transaction of message %d fails"
	"2|the message is delivered again"
	"2|a transaction of its own"
	"3|the provider fails before doing anything"
	"3|the answer is lost"
)
# reached RUN TEXT...: each scenario, the text of a narrated step
# ("RUN|text"), is reached in RUN's search.
reached() {
	local sc run text line
	for sc in "$@"; do
		IFS='|' read -r run text <<<"$sc"
		line=$(grep -n -F "${text}" "$model" | grep -F 'printf("MSC:' | head -1 | cut -d: -f1 || true)
		if [[ -n $line ]] && ! unreached_in "$run" "$line"; then
			printf '  ok    %-56s %s, line %s\n' "$text" "$run" "$line"
		else
			printf '  FAIL  %-56s %s, line %s: never reached\n' "$text" "$run" "${line:-?}"
			failed=1
		fi
	done
}
echo "== the scenarios: each reached in its row's search"
reached "${SCENARIOS[@]/#/row}"

# The failover's scenarios, each reached in the gate's search of its row:
# the gate must have met a promotion under a wait, not only waits that end
# well.
FAILOVER_SCENARIOS=(
	"failover-gate-row1|failover: the standby is promoted"
	"failover-gate-row1|before the standby held order %d's payment: 503"
	"failover-gate-row1|the primary changed before the standby held its rows"
	"failover-gate-row1|the standby holds its rows"
	"failover-gate-row2|not acknowledged, delivered again"
	"failover-gate-row2|its session died with the old primary"
	"failover-gate-row2|the standby holds message %d's transaction"
)
echo "== the failover's scenarios: each reached in the gate's search"
reached "${FAILOVER_SCENARIOS[@]}"

echo "== the controls: each must fail, with its counterexample"
for r in "${RUNS[@]}"; do
	IFS='|' read -r name flags search expect <<<"$r"
	[[ $expect != pass ]] || continue
	IFS='|' read -r verdict text <"$out/$name/result"
	printf '  %-5s %-20s %s\n' "$verdict" "$name" "$text"
	[[ $verdict == ok ]] || failed=1
done
for r in "${RUNS[@]}"; do
	IFS='|' read -r name flags search expect <<<"$r"
	[[ $expect != pass && -s $out/$name/steps.txt ]] || continue
	echo
	echo "-- $name ($flags), its counterexample:"
	cat "$out/$name/steps.txt"
done

echo
echo "model: $((SECONDS - start)) s, runs and trails in $out"
if ((failed)); then
	echo "model: FAILED"
	exit 1
fi
echo "model: every property holds, every window is reached, every control fails"
