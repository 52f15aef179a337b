#!/usr/bin/env bash
# make test-all's runs of the CUDA binaries, after dev/cuda/compile_check.sh built
# them (without nvcc there are none: SKIP).
# 1. train_llama2cu --dry_run touches no GPU, so it runs here and in CI: it must
#    print the configuration and the memory plan, train nothing and exit 0 (LoRA,
#    full fine-tuning in chunks, and a resume from a CPU checkpoint); in
#    --precision fp32 its base weights and KV carry must be the CPU trainer's
#    (the same bytes, counted by train_llama2.c's allocations), and
#    --activation_checkpointing must save it the activation bytes it saves the CPU trainer;
#    --precision fp16 plans the bytes of bf16.
#    --collectives: auto (the default, shown in --help), nccl and host run; another
#    value is refused naming the option; two ranks (dev/launch.sh 2) plan with host.
#    --context_parallel 2 plans each rank's own positions in its carries and one gathered
#    layer; what it has not been tested with yet is refused (--cpu_offload).
#    --quantize (QLoRA) plans the 4-bit runs and a one-projection scratch, and over two
#    ranks each rank's shards of the runs (Llama-2-70B's at 2048 tokens under a 24 GB card's 22.5 GiB); --trainable_params embed,norm plans its trained copies;
#    --pure_bf16 plans Llama-2-7B's bf16 weights, gradients and state (8 bytes a parameter, 10 with
#    Kahan summation, 12 in chunks) and is refused with --precision fp32;
# 2. test_llama2cu, the CUDA trainer against the CPU twin, where it is built; without a GPU it says SKIP.
cd "$(dirname "$0")/.."
if [ ! -x train_llama2cu ]; then
    echo "SKIP train_llama2cu --dry_run, test_llama2cu: not built (no nvcc; see the cuda compile check)"
    exit 0
fi
CPU=${BIN:-./train_llama2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ARGS=(--model test/fixtures/tiny_gqa --data test/fixtures/data.jsonl --max_seq_len 24 --threads 1)
fails=0
check() { # check NAME CONDITION-EXIT-CODE DETAIL
    if [ "$2" -eq 0 ]; then echo "ok train_llama2cu --dry_run: $1"; else echo "FAIL train_llama2cu --dry_run: $1: $3"; fails=$((fails + 1)); fi
}
dry() { # dry NAME ARGS...: exit 0, the configuration and the plan printed, no step, no CUDA call failed
    local name=$1; shift
    ./train_llama2cu "${ARGS[@]}" --dry_run --output_dir "$TMP/out" "$@" >"$TMP/$name.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] && grep -q "lr_scheduler" "$TMP/$name.log" && grep -q "memory plan (GPU memory" "$TMP/$name.log" &&
        ! grep -qE "^step 1|CUDA ERROR|cuBLAS ERROR" "$TMP/$name.log"
    check "$name" $? "exit $rc: $(tail -3 "$TMP/$name.log")"
}
plan_line() { grep -E "^  ($2) " "$1"; } # plan_line LOG NAME: that line of the memory plan

dry "LoRA, bf16, without a GPU" --batch_size 64
dry "full fine-tuning in chunks (recompute), without a GPU" --full_finetune --chunk_size 8 --chunk_memory recompute
# 0.5 MiB of weights and 1.5 MiB of carry (B = 64): whole multiples of the 256 bytes the GPU rounds each buffer to
dry "LoRA, fp32" --batch_size 64 --precision fp32
dry "full fine-tuning with --freeze_layers 1, without a GPU" --full_finetune --freeze_layers 1
grep -q "^training all weights but the embedding and the first 1 layer(s)" "$TMP/full fine-tuning with --freeze_layers 1, without a GPU.log"
check "--freeze_layers 1 says what trains" $? "$(grep '^training' "$TMP/full fine-tuning with --freeze_layers 1, without a GPU.log")"
# --batch_size auto with --memory_limit: a dry run takes the limit alone (no GPU asked what is free)
dry "--batch_size auto --memory_limit 0.01, without a GPU" --batch_size auto --memory_limit 0.01
grep -qE "^--batch_size auto: [0-9]+ rows per micro-batch" "$TMP/--batch_size auto --memory_limit 0.01, without a GPU.log"
check "--batch_size auto picks a batch under --memory_limit" $? "$(tail -3 "$TMP/--batch_size auto --memory_limit 0.01, without a GPU.log")"
# fp16: the same plan as bf16 (2-byte weights, activations and carry), named fp16
dry "LoRA, fp16" --batch_size 64 --precision fp16
for line in "base weights \((bf|fp)16\)" "KV and dKV carry" "activations and scratch"; do
    f16=$(plan_line "$TMP/LoRA, fp16.log" "$line" | sed 's/.* \([0-9.]*\) MiB.*/\1/')
    b16=$(plan_line "$TMP/LoRA, bf16, without a GPU.log" "$line" | sed 's/.* \([0-9.]*\) MiB.*/\1/')
    [ -n "$f16" ] && [ "$f16" = "$b16" ]
    check "fp16 plan's '${line//\\/}' is bf16's" $? "fp16 '$f16', bf16 '$b16'"
done
grep -q "base weights (fp16)" "$TMP/LoRA, fp16.log"
check "fp16 plan names its weights fp16" $? "$(plan_line "$TMP/LoRA, fp16.log" "base weights.*")"
# the long context by plan (docs/memory.md): Llama-3.1-8B (8 KV heads) LoRA over 131072 tokens in chunks
# of 1024 with recompute fits in 80e9 bytes, and Llama-2-7B (32 KV heads, 4x the carry) does not
plan=$(dev/plan_long_context.sh test/fixtures/configs/llama-3.1-8b test/fixtures/configs/llama-2-7b 2>&1)
grep -q "^| llama-3.1-8b | 131072 | 1024 | .* | yes |$" <<<"$plan" && grep -q "^| llama-2-7b | 131072 | 1024 | .* | no |$" <<<"$plan"
check "Llama-3.1-8B LoRA at 131072 tokens in chunks fits 80 GB by plan; Llama-2-7B does not" $? "$(grep 131072 <<<"$plan")"
# QLoRA's plans (docs/quantization.md): Llama-2-7B at 2048 tokens under 10 GB; Llama-2-70B at 2048 in
# chunks of 512 with recompute on one 80 GB GPU; and over two ranks on 48 GB GPUs (GiB: 10e9, 80e9
# and 48e9 bytes are 9.3, 74.5 and 44.7 GiB)
plan=$(dev/plan_qlora.sh 2>&1)
under() { grep "^| $1 | $2 | $3 |" <<<"$plan" | awk -F'|' -v lim="$4" '{ t = $10 + 0 } END { exit !(NR == 1 && t > 0 && t <= lim) }'; }
under llama-2-7b 1 activation_checkpointing 9.3 && under llama-2-70b 1 "chunk_size 512 chunk_memory recompute" 74.5 &&
    under llama-2-70b 2 "chunk_size 512 chunk_memory recompute" 44.7
check "QLoRA by plan: Llama-2-7B at 2048 under 10 GB, Llama-2-70B on one 80 GB GPU and over two 48 GB ones" $? "$plan"
"$CPU" "${ARGS[@]}" --batch_size 64 --dry_run --output_dir "$TMP/out" >"$TMP/cpu.log" 2>&1
for line in "base weights \(fp32\)" "KV and dKV carry"; do
    gpu=$(plan_line "$TMP/LoRA, fp32.log" "$line") cpu=$(plan_line "$TMP/cpu.log" "$line")
    [ -n "$gpu" ] && [ "$gpu" = "$cpu" ]
    check "fp32 plan's '${line//\\/}' is the CPU trainer's" $? "gpu '$gpu', cpu '$cpu'"
done
# --activation_checkpointing keeps one layer's worth of activations instead of one per layer and
# chunk: in fp32 the same arrays on both trainers (B = 64, chunks of 8: every layer's slice a whole
# multiple of the 256 bytes the GPU aligns it to), so the plans must shrink by the same bytes, to
# the plan's printed resolution (each total is rounded to 0.1 MiB, so their difference to +-0.1)
act_mb() { plan_line "$1" "activations and scratch" | awk '{print $4}'; }
for ck in 0 1; do
    dry "LoRA, fp32, chunks of 8 (keep), --activation_checkpointing=$ck" --batch_size 64 --precision fp32 \
        --chunk_size 8 --activation_checkpointing=$ck
    "$CPU" "${ARGS[@]}" --batch_size 64 --chunk_size 8 --activation_checkpointing=$ck --dry_run --output_dir "$TMP/out" \
        >"$TMP/cpu_ck$ck.log" 2>&1
done
gpu0=$(act_mb "$TMP/LoRA, fp32, chunks of 8 (keep), --activation_checkpointing=0.log")
gpu1=$(act_mb "$TMP/LoRA, fp32, chunks of 8 (keep), --activation_checkpointing=1.log")
cpu0=$(act_mb "$TMP/cpu_ck0.log") cpu1=$(act_mb "$TMP/cpu_ck1.log")
awk -v g0="$gpu0" -v g1="$gpu1" -v c0="$cpu0" -v c1="$cpu1" \
    'BEGIN { d = (g0 - g1) - (c0 - c1); exit !(g0 != "" && c0 != "" && g1 < g0 && d <= 0.1001 && d >= -0.1001) }'
check "--activation_checkpointing saves the activations the CPU trainer's saves" $? \
    "GPU $gpu0 -> $gpu1 MiB, CPU $cpu0 -> $cpu1 MiB"
# a checkpoint of the CPU trainer (the format is shared): read back, nothing uploaded
"$CPU" "${ARGS[@]}" --batch_size 4 --max_steps 1 --save_every 1 --output_dir "$TMP/ckpt" >"$TMP/ckpt.log" 2>&1
check "a CPU checkpoint to resume from" $? "$(tail -3 "$TMP/ckpt.log")"
dry "resume from a CPU checkpoint, without a GPU" --batch_size 4 --resume "$TMP/ckpt"

# --collectives: the values it takes, the default --help shows, a bad one refused; two ranks without a GPU
./train_llama2cu --help | grep -qE -- "--collectives .*\(default: auto\)"
check "--help lists --collectives with its default, auto" $? "$(./train_llama2cu --help | grep -- --collectives)"
for c in host nccl auto; do dry "--collectives $c" --collectives $c; done
./train_llama2cu "${ARGS[@]}" --dry_run --output_dir "$TMP/out" --collectives bogus >"$TMP/bogus.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q -- "--collectives: 'bogus' is not one this trainer runs (auto, nccl, host)" "$TMP/bogus.log"
check "--collectives bogus is refused, naming the option" $? "exit $rc: $(tail -2 "$TMP/bogus.log")"
./train_llama2cu "${ARGS[@]}" --dry_run --output_dir "$TMP/out" --full_finetune --pure_bf16 1 --optimizer anyprecision \
    --precision fp32 >"$TMP/pb.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q -- "--pure_bf16 keeps the weights in bf16 on the GPU: give it with --precision bf16" "$TMP/pb.log"
check "--pure_bf16 with --precision fp32 is refused, naming the precision it needs" $? "exit $rc: $(tail -2 "$TMP/pb.log")"

# --context_parallel: what the CUDA trainer has not been tested with yet is refused before anything is loaded
# (test_llama2cu_context.sh runs what it has been)
./train_llama2cu "${ARGS[@]}" --dry_run --output_dir "$TMP/out" --context_parallel 2 --cpu_offload 1 >"$TMP/cp.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q -- "--context_parallel with --cpu_offload is not supported yet by this trainer" "$TMP/cp.log"
check "--context_parallel with --cpu_offload is refused: not supported yet" $? "exit $rc: $(tail -2 "$TMP/cp.log")"
# QLoRA's plan of Llama-2-7B in bf16: the layers' runs (3187.0 MiB, as test_cli.sh works them out
# for the CPU trainer), one projection to dequantize into (the biggest, (11008, 4096), and a place
# for each of the 2 norms of 4096: 45096960 elements, 86.0 MiB; a whole layer's would be 202383360,
# 386.0 MiB), and the rest in bf16 (the embedding and lm_head, (32000, 4096) each, and the final
# norm: 262148096 elements, 500.0 MiB): 3773.0 MiB, not the 12852.5 of bf16
mkdir -p "$TMP/7b"; cp test/fixtures/configs/llama-2-7b/config.json "$TMP/7b/"
# --context_parallel 2 (dev/launch.sh 2; docs/long_context.md): each rank's carries hold its own positions.
# Llama-2-7B LoRA in bf16, the data's longest row of 49 tokens padded to 52 (a multiple of 2P): the
# carries 4 L (52 / 2) NKV hd = 4 x 32 x 26 x 4096 bf16 (26.0 MiB), one layer's gathered K, V, dK, dV
# 4 x 52 x 4096 bf16 (1.625 MiB) and the collectives' fp32 stages (52 + 26) x 4096 (1.22 MiB): 28.8 MiB,
# against one process's 4 x 32 x 49 x 4096 bf16, 49.0 MiB
for P in 1 2; do
    dev/launch.sh $P ./train_llama2cu --model "$TMP/7b" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model \
        --data test/fixtures/data.jsonl --max_seq_len 4096 --batch_size 1 --context_parallel $P --collectives host --dry_run \
        --output_dir "$TMP/out" >"$TMP/cp$P.log" 2>&1
done
plan_line "$TMP/cp1.log" "KV and dKV carry" | grep -qE " 49\.0 MiB" && plan_line "$TMP/cp2.log" "KV and dKV carry" | grep -qE " 28\.8 MiB" &&
    grep -q "context-parallel pieces of 13" "$TMP/cp2.log"
check "--context_parallel 2 plans each rank's own positions and one gathered layer: 28.8 MiB of carries, one process's 49.0" $? \
    "$(plan_line "$TMP/cp1.log" "KV and dKV carry"); $(plan_line "$TMP/cp2.log" "KV and dKV carry")"
QARGS=(--model "$TMP/7b" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model --data test/fixtures/data.jsonl
       --max_seq_len 24 --quantize nf4 --lora_target_modules all-linear --dry_run --output_dir "$TMP/out")
./train_llama2cu "${QARGS[@]}" >"$TMP/qlora.log" 2>&1
rc=$?
[ $rc -eq 0 ] && plan_line "$TMP/qlora.log" "base weights \(bf16\)" | grep -qE " 3773\.0 MiB" &&
    grep -qE "of which 4-bit layers +3187\.0 MiB" "$TMP/qlora.log" &&
    grep -qE "of which dequantize scratch +86\.0 MiB +\(one projection, bf16\)" "$TMP/qlora.log"
check "--quantize nf4 plans Llama-2-7B's weights as 4-bit runs, one bf16 projection and the rest in bf16" $? \
    "exit $rc: $(grep -A2 'base weights' "$TMP/qlora.log"; tail -2 "$TMP/qlora.log")"
# and over two ranks, per rank: its halves of the embedding and the head unit in bf16 (131074048
# elements, 250.0 MiB) and its halves of the 32 runs (104431984 bytes each, 52216000 a rank: half,
# rounded up to 16 bytes; 1593.5 MiB); the two slots the units take in turn (FULL_SHARD, untied),
# each as big as the biggest unit it holds: the embedding's 250.0 MiB and the head's 250.0 MiB, more
# than a run's 99.6; the bf16 projection to dequantize into (86.0 MiB): 2429.5 MiB
dev/launch.sh 2 ./train_llama2cu "${QARGS[@]}" --collectives host >"$TMP/qlora_w2.log" 2>&1
rc=$?
[ $rc -eq 0 ] && plan_line "$TMP/qlora_w2.log" "base weights \(bf16\)" | grep -qE " 2429\.5 MiB" &&
    grep -qE "of which 4-bit layers +1593\.5 MiB +\(nf4, double quantization, blocks of 64; this rank's shards\)" "$TMP/qlora_w2.log"
check "--quantize nf4 over two ranks plans a rank's shards of the runs and the slots that gather them" $? \
    "exit $rc: $(grep -A2 'base weights' "$TMP/qlora_w2.log"; tail -2 "$TMP/qlora_w2.log")"
# issue 51's target: Llama-2-70B QLoRA (r 8 on every linear layer) on two 24 GB GPUs at 2048 tokens
# without offload, a card's 22.5 GiB after the reserve (23040 MiB): FULL_SHARD, batch 1, chunks of 512
# recomputed, activation checkpointing. A rank's base weights: its halves of the runs (16840.5 MiB), of
# the embedding and of the head unit (250.0 MiB each), the two slots (the embedding's 500.0 MiB and the
# head's, each more than a run's 421.0) and one projection to dequantize into ((28672, 8192) and the
# norms' places: 448.0 MiB; a whole layer's would be 1632.0): 18788.5 MiB, 22866.0 MiB in all
mkdir -p "$TMP/70b"; cp test/fixtures/configs/llama-2-70b/config.json "$TMP/70b/"
awk 'BEGIN { printf "{\"text\": \""; for (i = 0; i < 3000; i++) printf "the cat sat on a mat "; print "\"}" }' >"$TMP/long.jsonl"
dev/launch.sh 2 ./train_llama2cu --model "$TMP/70b" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model \
    --data "$TMP/long.jsonl" --data_format text --batching packing --max_seq_len 2048 --batch_size 1 --lora_r 8 \
    --lora_target_modules all-linear --quantize nf4 --chunk_size 512 --chunk_memory recompute --activation_checkpointing \
    --collectives host --dry_run --output_dir "$TMP/out" >"$TMP/q70.log" 2>&1
rc=$?
[ $rc -eq 0 ] && plan_line "$TMP/q70.log" "base weights \(bf16\)" | grep -qE " 18788\.5 MiB" &&
    grep -qE "of which dequantize scratch +448\.0 MiB +\(one projection, bf16\)" "$TMP/q70.log" &&
    awk '/^memory plan/ { on = 1 } on && $1 == "total" { exit !($2 == 22866.0 && $2 <= 23040) }' "$TMP/q70.log"
check "Llama-2-70B QLoRA r 8 over two ranks at 2048 tokens plans 22866.0 MiB a rank, under a 24 GB card's 23040" $? \
    "exit $rc: $(grep -A7 '^memory plan' "$TMP/q70.log"; tail -2 "$TMP/q70.log")"
# the host's memory: Llama-2-7B full fine-tuning's plan made on a host with 4 GiB of address space
# (ulimit -v), one process and two ranks (FULL_SHARD): a dry run allocates nothing of the model's
# size (neither the weights nor the optimizer state, which stays on the GPU alone). The host plan:
# one process streams the base from the files to the GPU (model_stream_base) and saves it back a
# staging buffer at a time, so it holds a piece of 2^24 fp32 elements, 64.0 MiB, not the fp32 model
# (6738415616 x 4 bytes = 25705.0 MiB), and its whole plan stays under 1 GiB (the piece, the
# checkpoint staging buffer of 256.0 MiB, the tokens); so does a rank of two, and of four
# (FULL_SHARD), whose shard streams the same way, where it held its shard (3369207808 x 4 =
# 12852.5 MiB, and a quarter of the model, 6.3 GiB). Then the run itself with --cpu_offload 1 (whose host masters, gradients and
# AdamW's moments take 16 bytes a parameter: 100.7 GiB) and --host_memory_limit 20 (GiB): refused before any
# weight is loaded (still under the 4 GiB), with its plan.
FARGS=(--model "$TMP/7b" --random_init --tokenizer test/fixtures/tiny_gqa/tokenizer.model --data test/fixtures/data.jsonl
       --max_seq_len 512 --batch_size 1 --full_finetune --activation_checkpointing --output_dir "$TMP/out")
plan4g() { (ulimit -v 4194304; ./train_llama2cu "${@:2}" --dry_run) >"$1" 2>&1; } # plan4g LOG ARGS: a plan in 4 GiB
plan4g "$TMP/full7b.log" "${FARGS[@]}"
rc=$?
host_total=$(awk '/^host memory plan/ { h = 1 } h && /^  total/ { print $2; exit }' "$TMP/full7b.log")
[ $rc -eq 0 ] && plan_line "$TMP/full7b.log" "base weights \(fp32: held, or streamed\)" | grep -qE " 64\.0 MiB" &&
    plan_line "$TMP/full7b.log" "checkpoint staging" | grep -qE " 256\.0 MiB" && grep -q "^host memory plan" "$TMP/full7b.log" &&
    awk -v t="$host_total" 'BEGIN { exit !(t + 0 > 0 && t + 0 < 1024) }'
check "Llama-2-7B full fine-tuning planned in 4 GiB of address space: the host plan ($host_total MiB) holds a streamed piece and the staging buffer, not the fp32 model" $? \
    "exit $rc: $(grep -A5 '^host memory' "$TMP/full7b.log"; tail -2 "$TMP/full7b.log")"
for w in 2 4; do
    (ulimit -v 4194304; dev/launch.sh $w ./train_llama2cu "${FARGS[@]}" --dry_run --collectives host) >"$TMP/full7b_w$w.log" 2>&1
    rc=$?
    host_total=$(awk '/^host memory plan/ { h = 1 } h && /^  total/ { print $2; exit }' "$TMP/full7b_w$w.log")
    [ $rc -eq 0 ] && plan_line "$TMP/full7b_w$w.log" "base weights \(fp32: held, or streamed\)" | grep -qE " 64\.0 MiB" &&
        awk -v t="$host_total" 'BEGIN { exit !(t + 0 > 0 && t + 0 < 1024) }'
    check "the same over $w ranks (FULL_SHARD) in 4 GiB: rank 0's host plan ($host_total MiB) holds a streamed piece of its shard, not the shard" $? \
        "exit $rc: $(grep -A5 '^host memory' "$TMP/full7b_w$w.log"; tail -2 "$TMP/full7b_w$w.log")"
done
# LoRA's frozen base goes from the files to the GPU a piece at a time (model_stream_base): the host
# plan holds one piece of 2^24 fp32 elements, 64.0 MiB, where it held the whole model, and LoRA's
# (all-linear, r = 8: 19988480 parameters) weights and gradients, 152.5 MiB
plan4g "$TMP/lora7b.log" "${FARGS[@]/--full_finetune/--activation_checkpointing}" --lora_target_modules all-linear
rc=$?
[ $rc -eq 0 ] && plan_line "$TMP/lora7b.log" "base weights \(fp32: held, or streamed\)" | grep -qE " 64\.0 MiB" &&
    plan_line "$TMP/lora7b.log" "LoRA weights and grads" | grep -qE " 152\.5 MiB"
check "Llama-2-7B LoRA: the host plan holds a piece of the base, which streams to the GPU, not the model" $? \
    "exit $rc: $(grep -A5 '^host memory' "$TMP/lora7b.log"; tail -2 "$TMP/lora7b.log")"
# --trainable_params embed,norm on Llama-2-7B (LoRA q, v at r 8: 4194304; the embedding, 32000 x 4096, and 65
# norms of 4096: 135532544 trainable), planned without a GPU: on the GPU each takes an fp32 master and
# gradient, AdamW's two fp32 moments and the bf16 copy the forward reads, 18 bytes (2326.6 MiB); on the
# host LoRA's weights and gradients, 8 bytes (1034.0 MiB), the base still a streamed piece (64.0 MiB);
# in 4 GiB of address space, as a dry run allocates none of them
plan4g "$TMP/tp7b.log" "${FARGS[@]/--full_finetune/--activation_checkpointing}" --trainable_params embed,norm
rc=$?
[ $rc -eq 0 ] && grep -q "^training LoRA with the embedding and the norms: 135532544 trainable parameters" "$TMP/tp7b.log" &&
    plan_line "$TMP/tp7b.log" "trainable weights, grads, AdamW" | grep -qE " 2326\.6 MiB" &&
    plan_line "$TMP/tp7b.log" "LoRA weights and grads" | grep -qE " 1034\.0 MiB" &&
    plan_line "$TMP/tp7b.log" "base weights \(fp32: held, or streamed\)" | grep -qE " 64\.0 MiB"
check "Llama-2-7B LoRA with --trainable_params embed,norm: the plans count the trained copies (GPU 18 bytes each, host 8)" $? \
    "exit $rc: $(grep -A12 '^training' "$TMP/tp7b.log"; tail -2 "$TMP/tp7b.log")"
# --pure_bf16 1 --optimizer anyprecision on Llama-2-7B: on the GPU 8 bytes a parameter, the bf16 weights
# themselves (the parameters), their bf16 gradient and two bf16 moments: 6738415616 x 8 = 51410.0 MiB;
# plus one unit's fp32 gradient at a time (the embedding's, 32000 x 4096 x 4 = 500.0 MiB, and the largest
# other's, a layer's 202383360 x 4 = 772.0 MiB) and the 64 MiB upload stage saves go through: 52746.1 MiB
# (alignment: 0.1); --kahan_summation 1, 2 bytes more (+ 12852.5 = 65598.6); in chunks the micro-batch's
# fp32 gradient, 4 bytes, instead of the units' (+ 25705.0 - 1272.0 = 77179.0)
for c in "0 0 52746.1" "1 0 65598.6" "0 16 77179.0"; do
    set -- $c
    plan4g "$TMP/pure7b.log" "${FARGS[@]}" --pure_bf16 1 --optimizer anyprecision --kahan_summation $1 --chunk_size $2
    rc=$?
    [ $rc -eq 0 ] && plan_line "$TMP/pure7b.log" "trainable weights, grads, AnyPrecision" | grep -qE " $3 MiB" &&
        plan_line "$TMP/pure7b.log" "weights \(bf16, no fp32 copy\)" | grep -qE " 0\.0 MiB"
    check "Llama-2-7B --pure_bf16, Kahan $1, chunks of $2 (0: whole): the plan's trainable state is $3 MiB" $? \
        "exit $rc: $(grep -A3 '^memory plan' "$TMP/pure7b.log"; tail -2 "$TMP/pure7b.log")"
done
(ulimit -v 4194304; ./train_llama2cu "${FARGS[@]}" --cpu_offload 1 --max_steps 1 --host_memory_limit 20) >"$TMP/refused.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "^error: the host memory plan (100.7 GiB) exceeds the 20.0 GiB of --host_memory_limit" "$TMP/refused.log" &&
    grep -q "^host memory plan" "$TMP/refused.log" && ! grep -q "out of memory" "$TMP/refused.log"
check "a run whose host plan exceeds --host_memory_limit is refused with the plan, before loading" $? "exit $rc: $(tail -3 "$TMP/refused.log")"
dev/launch.sh 2 ./train_llama2cu "${ARGS[@]}" --dry_run --output_dir "$TMP/out" --collectives host >"$TMP/w2.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "^2 ranks, FULL_SHARD" "$TMP/w2.log" && grep -q "memory plan (GPU memory" "$TMP/w2.log" &&
    ! grep -qE "CUDA ERROR|^error" "$TMP/w2.log"
check "two ranks (dev/launch.sh 2), --collectives host, without a GPU" $? "exit $rc: $(tail -3 "$TMP/w2.log")"

# (make test-all's compile check builds it apart, build-arch/sm90/; make cuda or make test/test_llama2cu, for this machine's GPU)
rc=0
if [ -x test/test_llama2cu ]; then
    test/test_llama2cu
    rc=$?
else
    echo "SKIP test_llama2cu: not built (make test/test_llama2cu; it needs a GPU to run)"
fi
[ $fails -eq 0 ] && exit $rc
exit 1
