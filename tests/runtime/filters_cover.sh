#!/bin/sh
# filters_cover.sh BINARY "F1:F2:...": checks that the GoogleTest filters F1, F2, ... (one per
# ctest entry of BINARY, joined with ':') together select every test of BINARY, each once.
set -eu
bin=$1
filters=$2
all=$("$bin" --gtest_list_tests | awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}' | sort)
selected=""
IFS=':'
for f in $filters; do
  [ -n "$f" ] || continue
  selected="$selected
$("$bin" --gtest_list_tests --gtest_filter="$f" | awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}')"
done
unset IFS
selected=$(printf '%s\n' "$selected" | sed '/^$/d' | sort)
if [ "$all" != "$(printf '%s\n' "$selected" | sort -u)" ]; then
  echo "tests selected by no filter:"
  printf '%s\n' "$all" | grep -vxF "$(printf '%s\n' "$selected")" || true
  exit 1
fi
dups=$(printf '%s\n' "$selected" | uniq -d)
if [ -n "$dups" ]; then
  echo "tests selected by more than one filter:"
  printf '%s\n' "$dups"
  exit 1
fi
echo "$(printf '%s\n' "$all" | wc -l) tests, each selected once"
