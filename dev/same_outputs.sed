# dev/same_outputs.sh's filter of a log: what differs between two runs of the same binary
# a step's time, rate, FLOP/s, memory reading and ETA (fp16 runs print their loss scale among them)
s/ \| [0-9.]+ ms \| [0-9.]+ tok\/s \| [0-9.]+ TFLOP\/s( \| loss scale [0-9.e+]+)? \| [0-9.]+ MiB \| ETA [0-9hms]+$/ | TIMES\1/
# the peak resident memory measured at the end (and each rank's)
s/^peak resident memory [0-9.]+ MiB.*/peak resident memory N MiB/
# the token cache's name, which hashes the data file's path
s/\.[0-9a-f]{16}\.tokcache/.H.tokcache/g
