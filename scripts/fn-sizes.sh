#!/usr/bin/env bash
# Functions longer than N lines (default 120) in the given C files: counts
# the lines between a function's opening brace in column 0 and its closing
# brace in column 0 (the house style puts both there).
n=${N:-120}
awk -v max="$n" '
  FNR == 1 { prev = "" }
  /^\{/ { start = FNR; name = prev; next }
  /^\}/ && start { len = FNR - start - 1; if (len > max) printf "%s:%d: %s (%d lines)\n", FILENAME, start, name, len; start = 0 }
  { if ($0 !~ /^[ \t]*$/) prev = $0 }
' "$@"
