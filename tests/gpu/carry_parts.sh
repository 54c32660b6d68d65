#!/usr/bin/env bash
# Moves a file larger than one device call may carry (the working tree travels in at most
# 64 MiB) to the GPU machine in parts, one part per call on the same warm machine, e.g. the
# real models of the long-context tables (250-1000 MB GGUFs).
#
#   here:   tests/gpu/carry_parts.sh split FILE        parts into .carry/NAME.NN (ignored) and
#                                                     NAME.meta (bytes, sha256, part size);
#                                                     prints what each call carries
#   there:  tests/gpu/carry_parts.sh join NAME DIR     appends the carried part to DIR/NAME,
#                                                     checks the sha256 after the last part
#
# PART_MIB (56, split only; join reads it from NAME.meta): part size, leaving room for the
# rest of the tree with the big tracked files hidden (56 MiB parts beside a 3.7 MiB tree
# travelled; 60 MiB parts were refused). The part appended is the one DIR/NAME's
# length asks for, whatever else an earlier call left in .carry/, so a call out of turn is
# an error, not a corrupt file; the sha256 of the whole is checked after the last part.
set -euo pipefail
here=.carry part_mib=${PART_MIB:-56}
usage() { sed -n '2,16p' "$0"; exit 2; }
[ $# -ge 2 ] || usage
case $1 in
split)
  file=$2 name=$(basename "$2")
  [ -f "$file" ] || { echo "carry_parts: no file $file" >&2; exit 1; }
  git check-ignore -q "$here/x" 2>/dev/null || {
    echo "carry_parts: $here/ is not ignored: add /$here/ to .git/info/exclude" >&2; exit 1; }
  mkdir -p "$here"
  rm -f "$here/$name".[0-9][0-9] "$here/$name.meta"
  split -b "${part_mib}M" -d -a 2 "$file" "$here/$name."
  echo "$(stat -c %s "$file") $(sha256sum <"$file" | cut -d' ' -f1) $part_mib" >"$here/$name.meta"
  n=$(ls "$here/$name".[0-9][0-9] | wc -l)
  echo "$name: $n parts of at most $part_mib MiB in $here/"
  for p in "$here/$name".[0-9][0-9]; do
    echo "  carry [\"$p\", \"$here/$name.meta\"], run: bash tests/gpu/carry_parts.sh join $name /tmp/models"
  done
  ;;
join)
  [ $# -eq 3 ] || usage
  name=$2 dir=$3 out=$3/$2
  mkdir -p "$dir"
  [ -f "$here/$name.meta" ] || { echo "carry_parts: $here/$name.meta was not carried" >&2; exit 1; }
  read -r total sum part_mib <"$here/$name.meta"
  have=$(stat -c %s "$out" 2>/dev/null || echo 0)
  unit=$((part_mib * 1048576))
  if [ "$have" -ge "$total" ]; then
    echo "carry_parts: $out is already complete ($have bytes)" >&2; exit 1
  elif [ $((have % unit)) -ne 0 ]; then
    echo "carry_parts: $out holds $have bytes, not whole parts of $part_mib MiB (an append" \
      "was cut short?): remove it and start again from part 00" >&2; exit 1
  fi
  # the part that goes next, by the length so far
  idx=$((have / unit)) part=$here/$name.$(printf %02d $idx)
  [ -f "$part" ] || { echo "carry_parts: $out holds $have bytes: carry $part next" >&2; exit 1; }
  size=$(stat -c %s "$part")
  cat "$part" >>"$out"
  have=$((have + size))
  echo "$name: part $idx appended, $have of $total bytes"
  if [ "$have" -eq "$total" ]; then
    [ "$(sha256sum <"$out" | cut -d' ' -f1)" = "$sum" ] || {
      echo "carry_parts: $out is complete but its sha256 differs" >&2; exit 1; }
    echo "$name: complete, sha256 matches"
  fi
  ;;
*) usage ;;
esac
