#!/usr/bin/env bash
# sample_train_gpt.sh SAMPLE — samples/train_gpt in a tiny configuration (2 layers, 2 heads, 32
# wide, block 16, batch 4, 30 iterations): the training loss of the last iteration is below the
# first's, the validation loss at 30 below that at 15, a text sample and the --loss-plot data
# (one line per iteration) come out; then a run stopped after iteration 15 and resumed from its
# checkpoint prints the same losses, to the last bit (%.9g of a float), as the uninterrupted run;
# and --data-parallel and --pipeline end within 1e-4 of the one-device loss. Each run ends with
# one line of peak memory per category on stderr for each device it used, parameters over 0.
set -u
sample=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--iters 30 --layers 2 --heads 2 --width 32 --block 16 --batch 4 --warmup 5
      --eval-interval 15 --eval-batches 4 --log-interval 1)
fail=0
mem='peak memory on .*: parameters [0-9.]+ MiB, gradients [0-9.]+ MiB, optimizer [0-9.]+ MiB, '
mem+='activations [0-9.]+ MiB, communication [0-9.]+ MiB, workspace [0-9.]+ MiB, total [0-9.]+ MiB$'
# memory_lines FILE N: FILE has N lines of peak memory (at least N when N ends with +), each
# with parameters and a total over 0
memory_lines() {
  local n
  n=$(grep -cE "$mem" "$1")
  if [ "${2%+}" != "$2" ]; then [ "$n" -ge "${2%+}" ]; else [ "$n" -eq "$2" ]; fi || {
    echo "FAIL: $n lines of peak memory in $1, want $2:"; cat "$1"; return 1; }
  ! grep -E "$mem" "$1" | grep -qE 'parameters 0\.00 MiB|total 0\.00 MiB' || {
    echo "FAIL: no memory counted in $1:"; grep -E "$mem" "$1"; return 1; }
  grep -E "$mem" "$1" | head -2
}
full=$("$sample" "${args[@]}" --ckpt "$tmp/full.safetensors" --sample-len 40 \
  --loss-plot "$tmp/loss.png" 2>"$tmp/full.err") || {
  echo "FAIL: the sample failed:"; cat "$tmp/full.err"; exit 1; }
first=$(awk '/^iter 1\/30:/ {sub(",", "", $4); print $4}' "$tmp/full.err")
last=$(awk '/^iter 30 train loss/ {print $5}' <<<"$full")
val15=$(awk '/^iter 15 val loss/ {print $5}' <<<"$full")
val30=$(awk '/^iter 30 val loss/ {print $5}' <<<"$full")
echo "train loss $first -> $last, validation loss $val15 -> $val30"
[ -n "$first" ] && [ -n "$last" ] && [ -n "$val15" ] && [ -n "$val30" ] || {
  echo "FAIL: losses missing from:"; echo "$full"; cat "$tmp/full.err"; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a)}' || {
  echo "FAIL: the training loss did not decrease"; fail=1; }
awk -v a="$val15" -v b="$val30" 'BEGIN {exit !(b < a)}' || {
  echo "FAIL: the validation loss did not decrease"; fail=1; }
text=$(grep -v '^iter ' <<<"$full" | tr -d '\n')
[ ${#text} -ge 30 ] || { echo "FAIL: no text sample (got '$text')"; fail=1; }
[ "$(wc -l <"$tmp/loss.dat")" -eq 30 ] || { echo "FAIL: loss.dat has not 30 lines"; fail=1; }
memory_lines "$tmp/full.err" 1 || fail=1
# Interrupted after iteration 15, then resumed: the same numbers as the uninterrupted run.
"$sample" "${args[@]}" --ckpt "$tmp/part.safetensors" --sample-len 0 --stop-at 15 \
  >"$tmp/part.out" 2>"$tmp/part.err" || { echo "FAIL: the run to 15 failed:"; cat "$tmp/part.err"; exit 1; }
resumed=$("$sample" "${args[@]}" --ckpt "$tmp/part.safetensors" --sample-len 0 --resume \
  2>"$tmp/resumed.err") || { echo "FAIL: the resumed run failed:"; cat "$tmp/resumed.err"; exit 1; }
grep -q "resumed from .* after iteration 15" "$tmp/resumed.err" || {
  echo "FAIL: the run did not resume at 15:"; cat "$tmp/resumed.err"; fail=1; }
want=$(grep '^iter 30 ' <<<"$full")
got=$(grep '^iter 30 ' <<<"$resumed")
echo "uninterrupted: $(tr '\n' ' ' <<<"$want")"
echo "resumed:       $(tr '\n' ' ' <<<"$got")"
[ "$want" = "$got" ] || { echo "FAIL: the resumed run ends elsewhere"; fail=1; }
# DataParallel over every selected device: the same training within float rounding.
dp=$("$sample" "${args[@]}" --ckpt "$tmp/dp.safetensors" --sample-len 0 --data-parallel \
  2>"$tmp/dp.err") || { echo "FAIL: --data-parallel failed:"; cat "$tmp/dp.err"; exit 1; }
dplast=$(awk '/^iter 30 train loss/ {print $5}' <<<"$dp")
echo "--data-parallel: train loss at 30 $dplast"
awk -v a="$last" -v b="$dplast" 'BEGIN {d = a - b; exit !(b != "" && d * d < 1e-8)}' || {
  echo "FAIL: --data-parallel ends at '$dplast', one device at $last"; fail=1; }
memory_lines "$tmp/dp.err" 1+ || fail=1
# Two pipeline stages (1F1B, 4 micro-batches) on the first two selected devices: the same too.
pp=$("$sample" "${args[@]}" --ckpt "$tmp/pp.safetensors" --sample-len 0 --pipeline \
  2>"$tmp/pp.err") || { echo "FAIL: --pipeline failed:"; cat "$tmp/pp.err"; exit 1; }
pplast=$(awk '/^iter 30 train loss/ {print $5}' <<<"$pp")
echo "--pipeline: train loss at 30 $pplast ($(grep -o 'on .*stages)' "$tmp/pp.err"))"
awk -v a="$last" -v b="$pplast" 'BEGIN {d = a - b; exit !(b != "" && d * d < 1e-8)}' || {
  echo "FAIL: --pipeline ends at '$pplast', one device at $last"; fail=1; }
memory_lines "$tmp/pp.err" 2 || fail=1
[ $fail -eq 0 ] && echo "train_gpt: ok"
exit $fail
