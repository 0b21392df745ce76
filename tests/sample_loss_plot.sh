#!/usr/bin/env bash
# sample_loss_plot.sh SAMPLE — runs samples/train_mlp with --loss-plot and checks what it
# leaves beside the PNG path: FILE.dat with one "step loss" line per printed step, the losses
# those the sample printed, and, where gnuplot is installed, FILE.png (PNG magic); without
# gnuplot, a message that says so. Then the same with gnuplot hidden from PATH.
set -u
sample=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check_dat() { # $1: the .dat, $2: the sample's output
  local printed got
  printed=$(grep -E '^step ' <<<"$2" | awk '{print $2, $4}')
  got=$(awk '{printf "%d %.4f\n", $1, $2}' "$1")
  [ -n "$printed" ] && [ "$printed" = "$got" ] || {
    echo "FAIL: $1 holds"; echo "$got"; echo "the sample printed"; echo "$printed"; fail=1; }
}
out=$("$sample" 30 --loss-plot "$tmp/loss.png" 2>&1) || { echo "FAIL: the sample failed:"; echo "$out"; exit 1; }
[ -s "$tmp/loss.dat" ] || { echo "FAIL: no $tmp/loss.dat"; echo "$out"; exit 1; }
check_dat "$tmp/loss.dat" "$out"
if command -v gnuplot >/dev/null; then
  [ "$(head -c 4 "$tmp/loss.png" | od -An -c | tr -d ' ')" = "211PNG" ] || {
    echo "FAIL: $tmp/loss.png is not a PNG"; echo "$out"; fail=1; }
else
  echo "gnuplot is not installed here: the PNG is not checked"
fi
# gnuplot hidden: the .dat, and a message naming what is missing
mkdir "$tmp/bin"
out=$(PATH="$tmp/bin" "$sample" 30 --loss-plot "$tmp/hidden.png" 2>&1) || { echo "FAIL: the sample failed without gnuplot:"; echo "$out"; exit 1; }
check_dat "$tmp/hidden.dat" "$out"
grep -q "gnuplot is not installed" <<<"$out" || { echo "FAIL: no word on the missing gnuplot:"; echo "$out"; fail=1; }
[ ! -e "$tmp/hidden.png" ] || { echo "FAIL: a PNG without gnuplot"; fail=1; }
[ $fail -eq 0 ] && echo "loss plot: ok"
exit $fail
