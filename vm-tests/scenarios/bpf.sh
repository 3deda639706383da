# loading BPF programs
# expect: blocked
"$PROBE" bpf
