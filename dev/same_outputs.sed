# dev/same_outputs.sh's filter of a log: what differs between two runs of the same binary
# a step's time, rate, FLOP/s, memory reading and ETA
s/ \| [0-9.]+ ms \| [0-9.]+ tok\/s \| [0-9.]+ TFLOP\/s( \| loss scale [0-9.e+]+)? \| [0-9.]+ MiB \| ETA [0-9hms]+$/ | TIMES\1/
# the peak resident memory measured at the end
s/^peak resident memory [0-9.]+ MiB(.*per rank, MiB:)?.*/peak resident memory N MiB//
