#!/usr/bin/env bash
# expect_error.sh EXPECTED_SUBSTRING CMD...: passes when CMD exits with status 1 (a handled error,
# not a crash or a usage error) and its stderr contains EXPECTED_SUBSTRING.
set -u
want="$1"; shift
err=$("$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -ne 1 ]; then echo "expected exit status 1, got $rc; stderr: $err"; exit 1; fi
case "$err" in
  *"$want"*) exit 0 ;;
  *) echo "stderr lacks '$want': $err"; exit 1 ;;
esac
