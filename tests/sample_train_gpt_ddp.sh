#!/usr/bin/env bash
# sample_train_gpt_ddp.sh SAMPLE MPIEXEC [MPIEXEC FLAGS...] — samples/train_gpt in the tiny
# configuration of sample_train_gpt.sh, on one process and with --ddp on 2 ranks (each its share
# of every batch): the ranks' mean training loss at 30 within 1e-4 of the one-process loss, and
# only rank 0 prints (one validation line per evaluation, one text sample); each rank prints its
# device's peak memory per category on stderr.
set -u
sample=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--iters 30 --layers 2 --heads 2 --width 32 --block 16 --batch 4 --warmup 5
      --eval-interval 15 --eval-batches 4 --log-interval 10 --sample-len 20)
fail=0
one=$("$sample" "${args[@]}" --ckpt "$tmp/one.safetensors" 2>"$tmp/one.err") || {
  echo "FAIL: the one-process run failed:"; cat "$tmp/one.err"; exit 1; }
ddp=$("$@" -np 2 "$sample" "${args[@]}" --ckpt "$tmp/ddp.safetensors" --ddp 2>"$tmp/ddp.err") || {
  echo "FAIL: the --ddp run failed:"; cat "$tmp/ddp.err"; exit 1; }
a=$(awk '/^iter 30 train loss/ {print $5}' <<<"$one")
b=$(awk '/^iter 30 train loss/ {print $5}' <<<"$ddp")
echo "train loss at 30: one process $a, --ddp on 2 ranks $b"
awk -v a="$a" -v b="$b" 'BEGIN {d = a - b; exit !(a != "" && b != "" && d * d < 1e-8)}' || {
  echo "FAIL: --ddp ends at '$b', one process at '$a'"; fail=1; }
[ "$(grep -c '^iter 30 val loss' <<<"$ddp")" -eq 1 ] || {
  echo "FAIL: not one validation line at 30:"; echo "$ddp"; fail=1; }
for rank in 0 1; do
  grep -qE "^rank $rank: peak memory on .*: parameters [0-9.]+ MiB, gradients [0-9.]+ MiB, .*, total [0-9.]+ MiB$" "$tmp/ddp.err" || {
    echo "FAIL: no peak memory line from rank $rank:"; cat "$tmp/ddp.err"; fail=1; }
done
[ -s "$tmp/ddp.safetensors" ] || { echo "FAIL: no checkpoint from rank 0"; fail=1; }
[ $fail -eq 0 ] && echo "train_gpt --ddp: ok"
exit $fail
