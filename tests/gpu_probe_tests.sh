#!/usr/bin/env bash
# scripts/gpu-probe.sh's test options with stand-ins for sparrow_cuda_tests and compute-sanitizer
# (no GPU needed): TEST_REPEAT passes --gtest_repeat, TEST_TIMEOUT stops a run that hangs and names
# the test it hung in (and the round), SANITIZE runs each named tool and prints its summary, refuses
# a tool that does not exist, names the kernels racecheck's reports name, and names the test a
# sanitized run hung in.
#   tests/gpu_probe_tests.sh REPO WORK_DIR
set -u
repo=$1 work=$2
rm -rf "$work" && mkdir -p "$work/bin/lib" "$work/out"
# gtest's lines for tests S.A and S.B, --gtest_repeat=N times; STUB_HANG=S.B sleeps in that test in
# round STUB_HANG_ROUND (default 1); STUB_FAIL=S.A fails that test (and so its round).
cat >"$work/bin/sparrow_cuda_tests" <<'STUB'
#!/usr/bin/env bash
n=1
for a in "$@"; do case $a in --gtest_repeat=*) n=${a#--gtest_repeat=} ;; esac; done
for ((r = 1; r <= n; r++)); do
  [ "$n" -ne 1 ] && printf '\nRepeating all tests (iteration %d) . . .\n\n' "$r"
  for t in S.A S.B; do
    echo "[ RUN      ] $t"
    if [ "$t" = "${STUB_HANG:-}" ] && [ "$r" -eq "${STUB_HANG_ROUND:-1}" ]; then sleep 30; fi
    if [ "$t" = "${STUB_FAIL:-}" ]; then
      printf 'x.cpp:1: Failure\nExpected equality of these values:\n[  FAILED  ] %s (1 ms)\n' "$t"
    else
      echo "[       OK ] $t (1 ms)"
    fi
  done
  if [ -n "${STUB_FAIL:-}" ]; then echo "[  FAILED  ] 1 test, listed below:"; else echo "[  PASSED  ] 2 tests."; fi
done
STUB
cat >"$work/bin/compute-sanitizer" <<'STUB'
#!/usr/bin/env bash
[ "$1" = --tool ] || exit 9
shift 2
if [ -n "${STUB_RACE:-}" ]; then  # racecheck's two report forms, 2 + 1 lines naming k_a, 2 naming k_b
  echo "========= Error: Race reported between Read access at void ns::k_a<(int)8>(ns::Args)+0x3340"
  echo "=========     and Write access at void ns::k_a<(int)8>(ns::Args)+0x3710 [180544 hazards]"
  echo "========= Error: Potential WAR hazard detected at __shared__ 0xc90 in block (6,3,0) :"
  echo "=========     Read Thread (1,0,0) at void ns::k_b(ns::Args)+0x28b0"
  echo "=========     Write Thread (128,0,0) at void ns::k_b(ns::Args)+0x7650"
  echo "=========     Saved host backtrace up to driver entry point at kernel launch time"
  echo "========= Warning: Race reported between Write access at void ns::k_a<(int)8>(ns::Args)+0x1360"
fi
"$@" && echo "========= ERROR SUMMARY: 0 errors"
STUB
chmod +x "$work/bin/sparrow_cuda_tests" "$work/bin/compute-sanitizer"
fail=0
probe() {  # probe NAME ENV... : the script's output in $work/NAME.log
  local name=$1; shift
  env "$@" BIN="$work/bin" OUT="$work/out" COMPUTE_SANITIZER="$work/bin/compute-sanitizer" TESTS='S.*' bash "$repo/scripts/gpu-probe.sh" >"$work/$name.log" 2>&1
}
expect() {  # expect NAME LINE: the log of NAME holds LINE (a fixed string)
  grep -qF -- "$2" "$work/$1.log" || { echo "$1: no line '$2' in:"; cat "$work/$1.log"; fail=1; }
}
probe repeat TEST_REPEAT=3
expect repeat "tests rc=0"
expect repeat "rounds passed: 3"
probe failing STUB_FAIL=S.A TEST_REPEAT=2
expect failing "rounds passed: 0"
expect failing "x.cpp:1: Failure"
expect failing "[  FAILED  ] S.A (1 ms)"
probe hang STUB_HANG=S.B STUB_HANG_ROUND=2 TEST_REPEAT=3 TEST_TIMEOUT=2
expect hang "tests rc=124"
expect hang "tests stopped after 2 s in S.B (round 2)"
probe sanitize SANITIZE='racecheck bogus'
expect sanitize "racecheck: rc=0, ========= ERROR SUMMARY: 0 errors"
expect sanitize "SANITIZE: no compute-sanitizer tool 'bogus'"
probe race STUB_RACE=1 SANITIZE=racecheck
expect race "  racecheck names:       3 ns::k_a<(int)8>"
expect race "  racecheck names:       2 ns::k_b"
probe sanitize_hang STUB_HANG=S.A SANITIZE=synccheck TEST_TIMEOUT=2
expect sanitize_hang "synccheck: stopped after 2 s in S.A"
exit $fail
