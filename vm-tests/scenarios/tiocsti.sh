# pushing input into a terminal (TIOCSTI)
# expect: blocked
"$PROBE" tiocsti
