#!/usr/bin/env bash
# bench/ab_device.sh's three modes, with a stand-in for sparrow that prints the environment it was
# given (no GPU needed): SWITCH puts the name in SPARROW_CUDA_DISABLE on the "off" side only, ENABLE
# in SPARROW_CUDA_ENABLE on the "on" side only, KNOB=VAR sets VAR to OFF's value, then ON's; and the
# argument errors exit 2 with a message naming what is wrong; the sides swap their run order every
# round (off first in round 1, on first in round 2).
#   tests/ab_device_modes.sh REPO WORK_DIR
set -u
repo=$1 work=$2
rm -rf "$work" && mkdir -p "$work/bin/lib"
cat >"$work/bin/sparrow" <<'STUB'
#!/usr/bin/env bash
if [ "$1" = synth ]; then for a in "$@"; do p=$a; done; mkdir -p "$p" && echo '{}' >"$p/config.json"; exit 0; fi
echo "knob=${SPARROW_CUDA_W4A8_WARPGROUPS:-unset} disable=${SPARROW_CUDA_DISABLE:-} enable=${SPARROW_CUDA_ENABLE:-}"
echo "disable=${SPARROW_CUDA_DISABLE:-}" >>"$(dirname "$0")/calls.log"
STUB
chmod +x "$work/bin/sparrow"
fail=0
run() {  # run NAME EXPECT_OFF EXPECT_ON ENV...
  local name=$1 off=$2 on=$3; shift 3
  env "$@" BIN="$work/bin" MODEL="$work/model" OUT="$work/$name" ROUNDS=1 bash "$repo/bench/ab_device.sh" >"$work/$name.log" 2>&1
  local got_off got_on
  got_off=$(cat "$work/$name/ab-off-1.txt" 2>/dev/null) got_on=$(cat "$work/$name/ab-on-1.txt" 2>/dev/null)
  [ "$got_off" = "$off" ] || { echo "$name, off side: got '$got_off', want '$off'"; fail=1; }
  [ "$got_on" = "$on" ] || { echo "$name, on side: got '$got_on', want '$on'"; fail=1; }
}
run switch "knob=unset disable=pdl enable=" "knob=unset disable= enable=" SWITCH=pdl
run enable "knob=unset disable= enable=" "knob=unset disable= enable=kv_record" ENABLE=kv_record
run knob "knob=2 disable= enable=" "knob=4 disable= enable=" KNOB=SPARROW_CUDA_W4A8_WARPGROUPS OFF=2 ON=4
# Two rounds of SWITCH=pdl: the off side (pdl disabled) runs first in round 1, last in round 2.
rm -f "$work/bin/calls.log"
env SWITCH=pdl BIN="$work/bin" MODEL="$work/model" OUT="$work/order" ROUNDS=2 bash "$repo/bench/ab_device.sh" >"$work/order.log" 2>&1
order=$(tr '\n' ' ' <"$work/bin/calls.log" 2>/dev/null)
[ "$order" = "disable=pdl disable= disable= disable=pdl " ] || { echo "run order over two rounds: got '$order', want off, on, on, off"; fail=1; }
refuse() {  # refuse WANT_MESSAGE ENV...
  local want=$1; shift
  local msg
  msg=$(env "$@" BIN="$work/bin" MODEL="$work/model" OUT="$work/refused" bash "$repo/bench/ab_device.sh" 2>&1)
  local rc=$?
  [ "$rc" -eq 2 ] || { echo "$*: exit $rc, want 2"; fail=1; }
  echo "$msg" | grep -q "$want" || { echo "$*: message '$msg' lacks '$want'"; fail=1; }
}
refuse "is required" ROUNDS=1
refuse "one of them" SWITCH=pdl ENABLE=kv_record
refuse "one of them" SWITCH=pdl KNOB=SPARROW_X OFF=1 ON=2
refuse "needs OFF=<value> and ON=<value>" KNOB=SPARROW_CUDA_W4A8_WARPGROUPS OFF=2
refuse "must name a SPARROW_ variable" KNOB=PATH OFF=1 ON=2
exit $fail
