#!/usr/bin/env bash
# plot_pipeline.sh — draws the model-parallel tutorial's two plots from bench_pipeline's or samples/pipeline_resnet50's
# JSON lines (one object per set-up: "setup", "schedule", "split_size", "seconds_mean",
# "seconds_std"; the sample adds "role": "experiment" for its three set-ups, "sweep" for the rest):
#   <out>/pipeline_setups.png  one device, model parallel and the pipeline as bars with the
#                              rounds' standard deviation: the "experiment" rows when there are
#                              any (the tutorial's split_size 20), else the best GPipe split
#   <out>/pipeline_split.png   time per step against split_size, GPipe and 1F1B, with error
#                              bars; one device and model parallel as horizontal lines
# Needs jq and gnuplot (Debian: apt-get install jq gnuplot-nox; scripts/deps.sh installs both).
#   POCL_DEVICES="basic basic" POCL_MAX_PTHREAD_COUNT=1 build/bench/bench_pipeline > pipe.jsonl
#   scripts/plot_pipeline.sh pipe.jsonl [out-dir]
#   build/samples/pipeline_resnet50 --json r50.json && scripts/plot_pipeline.sh r50.json [out-dir]
set -euo pipefail
if [ $# -lt 1 ] || [ ! -r "$1" ]; then
  echo "usage: $0 results.jsonl [out-dir]" >&2
  exit 2
fi
in=$1
out=${2:-.}
mkdir -p "$out"
for tool in jq gnuplot; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is not installed" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

rows=$(jq -s 'map(select(.bench == "pipeline"))' "$in")
[ "$(jq 'length' <<<"$rows")" -gt 0 ] || { echo "$0: no pipeline results in $in" >&2; exit 1; }
title=$(jq -r '.[0] | "\(.model)\(if .image_size then " 3x\(.image_size)x\(.image_size)" else "" end), batch \(.batch), \(.devices)"' <<<"$rows")

# bars: the sample's "experiment" rows, or the best GPipe split standing for "pipelined"
jq -r '
  (map(select(.role == "experiment"))) as $exp
  | (map(select(.setup == "pipeline" and .schedule == "GPipe")) | min_by(.seconds_mean)) as $best
  | (if ($exp | length) > 0 then $exp
     else map(select(.setup != "pipeline")) + (if $best then [$best] else [] end) end)[]
  | [(if .setup == "pipeline" then "pipelined (split \(.split_size))" else .setup end),
     .seconds_mean, .seconds_std] | @tsv' <<<"$rows" >"$tmp/bars.tsv"
for sched in GPipe 1F1B; do
  jq -r --arg s "$sched" 'map(select(.setup == "pipeline" and .schedule == $s
      and .role != "experiment"))
    | sort_by(.split_size)[] | [.split_size, .seconds_mean, .seconds_std] | @tsv' \
    <<<"$rows" >"$tmp/$sched.tsv"
done
unit=$(jq -r '.[0] | if .batches then "seconds per train() of \(.batches) batch\(if .batches > 1 then "es" else "" end)" else "seconds per step" end' <<<"$rows")
one=$(jq '[.[] | select(.setup == "one device")][0].seconds_mean // empty' <<<"$rows")
mp=$(jq '[.[] | select(.setup == "model parallel")][0].seconds_mean // empty' <<<"$rows")

gnuplot <<EOF
set terminal pngcairo size 800,500 noenhanced
set datafile separator "\t"
set output "$out/pipeline_setups.png"
set title "Time per training step: $title"
set ylabel "$unit (mean, std of rounds)"
set style data histogram
set style histogram errorbars gap 2 lw 1.5
set style fill solid 0.6 border -1
set yrange [0:*]
set key off
plot "$tmp/bars.tsv" using 2:3:xtic(1) lc rgb "#4477aa"
EOF

plots=()
[ -s "$tmp/GPipe.tsv" ] && plots+=("\"$tmp/GPipe.tsv\" using 1:2:3 with yerrorlines title \"pipeline, GPipe\"")
[ -s "$tmp/1F1B.tsv" ] && plots+=("\"$tmp/1F1B.tsv\" using 1:2:3 with yerrorlines title \"pipeline, 1F1B\"")
[ -n "$one" ] && plots+=("$one with lines dt 2 title \"one device\"")
[ -n "$mp" ] && plots+=("$mp with lines dt 3 title \"model parallel\"")
joined=$(IFS=,; echo "${plots[*]}")
gnuplot <<EOF
set terminal pngcairo size 800,500 noenhanced
set datafile separator "\t"
set output "$out/pipeline_split.png"
set title "Pipelined step time against split_size: $title"
set xlabel "split_size (rows per micro-batch)"
set ylabel "$unit"
set logscale x 2
set yrange [0:*]
set key top right
plot $joined
EOF
echo "$out/pipeline_setups.png $out/pipeline_split.png"
