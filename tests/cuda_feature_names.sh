#!/usr/bin/env bash
# The CUDA backend's lists of switches and opt-ins (cuda_backend.cpp kCudaSwitches, kCudaOptIns, which
# make_cuda_backend checks SPARROW_CUDA_DISABLE / SPARROW_CUDA_ENABLE against) hold exactly the names
# the sources ask cuda_feature_on / cuda_feature_enabled about, and the names gpu-check.sh and the
# bench scripts pass are in them (a stale name there would now stop the run on the GPU machine).
#   tests/cuda_feature_names.sh REPO
set -u
repo=$1
src=$repo/src/backends/cuda/cuda_backend.cpp
fail=0
# The quoted names of the array `name` in cuda_backend.cpp.
array() { sed -n "/constexpr std::string_view $1\[\] = {/,/};/p" "$src" | grep -oE '"[a-z0-9_]+"' | tr -d '"' | sort -u; }
asked() { grep -rhoE "$1\(\"[a-z0-9_]+\"\)" "$repo/src" "$repo/tests" "$repo/bench" | sed -E 's/.*\("(.*)"\)/\1/' | sort -u; }
switches=$(array kCudaSwitches) opt_ins=$(array kCudaOptIns)
[ -n "$switches" ] && [ -n "$opt_ins" ] || { echo "no kCudaSwitches / kCudaOptIns lists found in $src"; exit 1; }
compare() {  # compare WHAT LISTED ASKED
  local missing extra
  missing=$(comm -13 <(echo "$2") <(echo "$3")) extra=$(comm -23 <(echo "$2") <(echo "$3"))
  [ -z "$missing" ] || { echo "$1: asked about in the sources but not listed: $missing"; fail=1; }
  [ -z "$extra" ] || { echo "$1: listed but never asked about: $extra"; fail=1; }
}
compare "switches (cuda_feature_on)" "$switches" "$(asked cuda_feature_on)"
compare "opt-ins (cuda_feature_enabled)" "$opt_ins" "$(asked cuda_feature_enabled)"
# Names the scripts pass: SPARROW_CUDA_DISABLE=a,b and gpu-check's prev= / opt_in= lists.
# (Comment lines left out: they show the form with placeholders.)
passed() {
  grep -rhE "$1=" "$repo/scripts" "$repo/bench" --include=*.sh | grep -vE '^[[:space:]]*#' | grep -oE "$1=\"?[a-z0-9_,]+" |
    sed -E "s/^$1=\"?//" | tr ',' '\n' | grep -v '^$' | sort -u
}
for name in $( (passed SPARROW_CUDA_DISABLE; passed prev) | sort -u); do
  echo "$switches" | grep -qx "$name" || { echo "a script disables '$name', which is no switch"; fail=1; }
done
for name in $( (passed SPARROW_CUDA_ENABLE; passed opt_in) | sort -u); do
  echo "$opt_ins" | grep -qx "$name" || { echo "a script enables '$name', which is no opt-in"; fail=1; }
done
echo "switches $(echo "$switches" | wc -l), opt-ins $(echo "$opt_ins" | wc -l)"
exit $fail
