#!/usr/bin/env bash
# colocated.sh: weightcast's colocated sync (one sender and its receivers as
# processes sharing one GPU, the ipc transport) against the two plain-PyTorch
# peers of torch_peers.py, 8 GiB of bf16 in 300 tensors, printing one table.
#
#   python/benchmarks/colocated.sh [--quick] [--demo PATH] [--out DIR]
#
# Rows: the demo with 1 and 3 receivers, 1 GiB and 256 MiB buckets, checksums
# on and off, receivers reading the sender's tensors in place (--direct, the
# default) and taking buckets (--direct=false), three receivers in place
# also without turns (--turns=false, the copies of all receivers at once),
# 1 GiB in place with a group secret under each bucket MAC (--bucket-mac
# blake3, poly1305-aes); then each peer with 1 and 3 receivers. Every figure is GB/s per receiver, the median of rounds 2..N.
# --quick keeps the 1 GiB rows and 3 rounds (about half the time; the full
# run took 9 minutes on one H200 before the four rows with a secret came). The raw JSON of every run goes to DIR
# (default: a new temporary directory, named at the end).
#
# Needs the demo binary (make gpu-bins, or go build -o .gpu/demo ./cmd/demo;
# --demo or $DEMO, else .gpu/demo, the demo beside .gpu/python, or demo on
# PATH) and a Python with torch ($PYTHON, default python3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
demo=${DEMO:-}
out=""
quick=0
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) quick=1 ;;
	--demo) demo=$2; shift ;;
	--out) out=$2; shift ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; exit 0 ;;
	*) echo "colocated.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
	esac
	shift
done
if [ -z "$demo" ]; then
	# In the repository (.gpu/demo), or in the .gpu folder make gpu-bins
	# packs, whose python/benchmarks holds this script (../../demo).
	for d in "$root/.gpu/demo" "$root/demo" "$(command -v demo || true)"; do
		if [ -n "$d" ] && [ -x "$d" ]; then demo=$d; break; fi
	done
fi
[ -x "$demo" ] || { echo "colocated.sh: no demo binary: build it with 'go build -o .gpu/demo ./cmd/demo' or pass --demo PATH" >&2; exit 2; }
py=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
[ -n "$out" ] || out=$(mktemp -d -t colocated.XXXXXX)
mkdir -p "$out"

size=8GiB
tensors=300
rounds=5
buckets="1GiB 256MiB"
if [ "$quick" = 1 ]; then rounds=3; buckets=1GiB; fi

rows=() # "label<TAB>json file"

# demo ranks bucket checksum direct [turns]: one run of the demo, its JSON
# kept.
run_demo() {
	local ranks=$1 bucket=$2 sum=$3 direct=$4 turns=${5:-true}
	local f="$out/demo-r$ranks-$bucket-sum$sum-direct$direct-turns$turns.json"
	echo "demo: $((ranks - 1)) receivers, $bucket buckets, checksum $sum, direct $direct, turns $turns" >&2
	"$demo" --transport ipc --devices 0 --size "$size" --tensors "$tensors" --rounds "$rounds" \
		--ranks "$ranks" --bucket "$bucket" --checksum="$sum" --direct="$direct" --turns="$turns" --json >"$f" 2>"$f.stderr" || true
	rows+=("weightcast, $((ranks - 1)) recv, $bucket, checksum $sum, $([ "$direct" = true ] && echo 'in place' || echo buckets)$([ "$turns" = true ] || echo ', no turns')	$f")
}

# secret ranks mac: one run of the demo, 1 GiB buckets in place, with a
# group secret and the bucket MAC mac, its JSON kept.
secret="$out/secret"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret"
chmod 600 "$secret"
run_secret() {
	local ranks=$1 mac=$2
	local f="$out/demo-r$ranks-1GiB-secret-$mac.json"
	echo "demo: $((ranks - 1)) receivers, 1GiB buckets, group secret, $mac" >&2
	"$demo" --transport ipc --devices 0 --size "$size" --tensors "$tensors" --rounds "$rounds" \
		--ranks "$ranks" --bucket 1GiB --secret-file "$secret" --bucket-mac "$mac" --json >"$f" 2>"$f.stderr" || true
	rows+=("weightcast, $((ranks - 1)) recv, 1GiB, group secret ($mac), in place	$f")
}

# peer mode receivers: one run of a plain-PyTorch peer, its JSON kept.
run_peer() {
	local mode=$1 recv=$2
	local f="$out/torch-$mode-r$recv.json"
	echo "torch $mode peer: $recv receivers" >&2
	"$py" "$here/torch_peers.py" --mode "$mode" --receivers "$recv" --size "$size" --tensors "$tensors" \
		--bucket 1GiB --rounds "$rounds" >"$f" 2>"$f.stderr" || true
	rows+=("torch $mode peer, $recv recv$([ "$mode" = bucket ] && echo ', 1GiB' || true)	$f")
}

for ranks in 4 2; do
	for bucket in $buckets; do
		for sum in true false; do
			run_demo "$ranks" "$bucket" "$sum" true
		done
		[ "$ranks" = 2 ] || run_demo "$ranks" "$bucket" true true false
	done
	for sum in true false; do
		run_demo "$ranks" 1GiB "$sum" false
	done
	for mac in blake3 poly1305-aes; do
		run_secret "$ranks" "$mac"
	done
done
for recv in 3 1; do
	run_peer direct "$recv"
	run_peer bucket "$recv"
done

printf '%s\n' "${rows[@]}" | "$py" -c '
import json, sys
rows = []
for line in sys.stdin:
    label, path = line.rstrip("\n").split("\t")
    try:
        with open(path) as f:
            d = json.load(f)  # the demo prints one indented object, the peers one line
    except Exception:
        rows.append((label, None, "no result: see " + path + ".stderr"))
        continue
    gbps = d.get("gbps")
    note = ""
    if "per_rank" in d:  # the demo
        if d.get("error"):
            note = "failed: " + d["error"][:80]
        else:
            r0 = next((r for r in d["per_rank"] if r.get("rank") == 0), None)
            if r0 and r0.get("rounds"):
                last = r0["rounds"][-1]
                note = "%d of %d buckets in place" % (last.get("direct_buckets", 0), last.get("buckets", 0))
                if last.get("turn_buckets"):
                    note += ", turns of %d buckets" % last["turn_buckets"]
    rows.append((label, gbps, note))
print("| run | GB/s per receiver | note |")
print("| --- | --- | --- |")
for label, gbps, note in rows:
    print("| %s | %s | %s |" % (label, "%.1f" % gbps if gbps is not None else "—", note))
'
echo "raw results: $out" >&2
