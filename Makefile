# llama2.tune
#   make train_llama2     CPU trainer (fp32, OpenMP when the compiler has it)
#   make train_llama2cu   CUDA trainer (nvcc, cuBLASLt; compiled, not yet run on a GPU)
#   make test             the quick tier: one test of each idea, build included (~2 minutes on
#                         2 cores); ends with "N passed, N failed"
#   make test-all         build and run every test (~14 minutes on 2 cores)
#   make run              the built-in default: LoRA on a small generated model and data (out/default/)
#   make test-all SANITIZE=1  the same tests built with ASan + UBSan (into build-san/; make test SANITIZE=1 the quick ones)
#   make fuzz             every parser's libFuzzer target for FUZZ_SECONDS each (clang)
# one build job per core (make test-all's build, the emulated CUDA programs above all, is two
# thirds of its time; the tests themselves run in its last recipe, RUN_JOBS at a time)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
CC ?= gcc
CFLAGS ?= -O3 -march=native
CFLAGS += -std=gnu11 -Wall -Wextra -Wno-unused-function -g
# (nothing reads errno after a math call; with it, sqrtf stops the optimizers' loops from vectorizing)
CFLAGS += -fno-math-errno
LDLIBS = -lm

# OpenMP if the compiler supports it (the trainer also builds and runs without it)
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
CFLAGS += $(OPENMP)
ifeq ($(OPENMP),)
$(info OpenMP not found: building single-threaded)
endif

# MPI (optional): with mpicc, the trainer and test/test_fsdp are built with it and
# -DUSE_MPI (mpirun -np W runs W ranks; alone, a world of one), and
# test/test_fsdp.sh runs the multi-process tests; without it everything builds
# and runs at world size 1. OMPI_CC / MPICH_CC keep $(CC) as the compiler.
MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
MPI_CC = OMPI_CC=$(CC) MPICH_CC=$(CC) $(MPICC) -DUSE_MPI
NVCC_MPI = -DUSE_MPI $(shell $(MPICC) --showme:compile 2>/dev/null)
NVCC_MPI_LIBS = $(shell $(MPICC) --showme:link 2>/dev/null)
else
MPI_CC = $(CC)
endif

# CUDA: the trainer, its test against the CPU twin, and the kernel checks in
# dev/cuda/ (each built with the CPU twins of train_llama2.c and its headers, dev/cuda/cpu_ref.o),
# for A100 (sm_80) and H100 (sm_90). cuBLASLt does the matmuls (cuBLAS the few it
# has no kernel for, support/matmul.cuh); with NCCL the trainer shards over one GPU per
# rank (-DFSDP_NCCL; NCCL's unique id goes over MPI under mpirun or srun, over
# TCP under torchrun or dev/launch.sh), without it it runs one process.
NVCC ?= nvcc
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/local/cuda/include/nccl.h /usr/include/nccl.h))
ifneq ($(NCCL_H),)
NVCC_FSDP = -DFSDP_NCCL $(NVCC_MPI)
NVCC_FSDP_LIBS = -lnccl $(NVCC_MPI_LIBS)
endif
# GPU_ARCH=75 (or 70, 86, ...) builds for that one architecture instead: a T4 (75)
# or V100 (70) has no bf16, so the trainer runs --precision fp16 there (it refuses
# bf16 at startup) and the attention's tensor cores run fp16
CUDA_ARCHS = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
ifdef GPU_ARCH
CUDA_ARCHS = -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH)
endif
# the host code's: --cpu_offload's optimizer step runs support/optimizer_cpu.h's loops on the
# host, vectorized with this machine's FMA (NVCC_HOST_ARCH= builds for any x86-64, slower)
NVCC_HOST_ARCH ?= -march=native
NVCCFLAGS_BASE = -O3 -std=c++17 --Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-fno-math-errno \
    $(if $(NVCC_HOST_ARCH),-Xcompiler $(NVCC_HOST_ARCH)) $(if $(OPENMP),-Xcompiler -fopenmp)
NVCCFLAGS = $(NVCCFLAGS_BASE) $(CUDA_ARCHS)
CUDA_LDLIBS = -lcublasLt -lcublas -lm
CUDA_HEADERS = support/cuda_common.cuh layers.cuh peft/quant.cuh peft/quant.h support/matmul.cuh chunk.h attention.cuh lora.cuh peft/ia3.cuh peft/adaption_prompt.cuh peft/prefix.cuh lora.h offload.cuh support/act_offload.cuh support/utils.h dev/cuda/common.cuh dev/cuda/cpu_ref.h
CUDA_CHECKS = $(addprefix dev/cuda/,matmul attention embedding rmsnorm rope swiglu crossentropy adamw adamw8bit anyprecision sgd grad_norm elementwise lora adaption_prompt prefix dequant)
CUDA_TRAINER = train_llama2.cu $(HEADERS) support/cuda_common.cuh layers.cuh support/matmul.cuh attention.cuh lora.cuh peft/ia3.cuh peft/adaption_prompt.cuh peft/prefix.cuh peft/quant.cuh offload.cuh support/act_offload.cuh

# SANITIZE=1: the trainer and every test built with AddressSanitizer and
# UndefinedBehaviorSanitizer into build-san/ (B), so the two builds never mix.
# Errors abort (exit status >= 128), so the CLI tests cannot mistake them for
# the trainer's own error exits; dev/fuzz/lsan.supp says which leaks are not checked.
ifeq ($(SANITIZE),1)
B = build-san/
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
TEST_ENV = ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:$${ASAN_OPTIONS:-} \
    LSAN_OPTIONS=suppressions=$(CURDIR)/dev/fuzz/lsan.supp:print_suppressions=0:$${LSAN_OPTIONS:-} \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1:$${UBSAN_OPTIONS:-}
endif

HEADERS = support/utils.h support/vec.h support/matmul.h chunk.h attention.h peft/ia3.h peft/adaption_prompt.h peft/prefix.h support/optimizer.h support/optimizer_cpu.h support/optimizer_qmap.h support/json.h support/safetensors.h support/weights.h support/gguf.h support/kquants.h support/gguf_vocab.h tokenizer.h lora.h peft/quant.h model.h support/export_gguf.h dataloader.h support/checkpoint.h support/default_model.h trainer.h trainer/options.h trainer/load.h trainer/plan.h trainer/schedule.h trainer/checkpoint.h trainer/sample.h trainer/preference.h trainer/report.h support/progress.h fsdp.h support/tcp.h support/torch_zip.h support/tensorboard.h support/profile.h
TESTS = test/test_json test/test_safetensors test/test_tensorboard test/test_profile test/test_torch_zip test/test_tokenizer test/test_config test/test_llama2 test/test_attention test/test_chunked test/test_trainer test/test_dataloader test/test_progress test/test_default test/test_fuzz_replay test/test_quant \
    test/test_gguf test/test_optim test/test_emu_nccl

# the fuzz targets (dev/fuzz/fuzz_<name>.c); test/test_fuzz_replay runs them all over
# the committed seeds and crash regressions, as part of `make test`
FUZZ_TARGETS = json safetensors torch_zip st_index config model adapter tokenizer_load tokenizer_encode tokenizer_json tokenizer_bpe cli data tokcache checkpoint fsdp_index tcp_hello meta gguf_vocab
FUZZ_SRCS = $(FUZZ_TARGETS:%=dev/fuzz/fuzz_%.c)

.PHONY: all test test-all run clean cuda cuda-compile-check cuda-checks fuzz emu-test
all: train_llama2

$(B)train_llama2: train_llama2.c $(HEADERS)
	@mkdir -p $(@D)
	$(MPI_CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the trainer without MPI, where the one above has it: test/test_sharded.sh checks that it
# launches by the environment with the same bits, and refuses to be mpirun's several processes
$(B)test/train_llama2_nompi: train_llama2.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# fsdp.h's tests (test/test_fsdp.sh runs them alone and under mpirun)
$(B)test/test_fsdp: test/test_fsdp.c fsdp.h train_llama2.c $(HEADERS) test/test_common.h
	@mkdir -p $(@D)
	$(MPI_CC) $(CFLAGS) -o $@ $< $(LDLIBS)

$(addprefix $(B),test/test_config test/test_llama2 test/test_attention test/test_chunked test/test_trainer test/test_default test/test_gguf test/test_optim): $(B)test/%: test/%.c train_llama2.c $(HEADERS) test/test_common.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)
$(B)test/test_default: support/default_model.h
$(B)test/test_trainer: test/random_model.h

# (-O1: it replays small inputs in under a second; -O3 took twice as long to build, a minute)
$(B)test/test_fuzz_replay: test/test_fuzz_replay.c $(FUZZ_SRCS) dev/fuzz/fuzz.h train_llama2.c $(HEADERS) test/test_common.h fsdp.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 -DFUZZ_REPLAY -D'FUZZ_LIST(X)=$(foreach t,$(FUZZ_TARGETS),X($(t)))' -o $@ test/test_fuzz_replay.c $(FUZZ_SRCS) $(LDLIBS)

# the emulated build's NCCL (dev/emu/nccl.h) on its own, in C++ as the execution layer is
$(B)test/test_emu_nccl: test/test_emu_nccl.cc dev/emu/nccl.h dev/emu/types.h test/test_common.h test/stderr_of.h
	@mkdir -p $(@D)
	$(CXX) $(filter-out -std=gnu11 -fopenmp,$(CFLAGS)) -std=c++17 -Idev/emu -o $@ $<

$(B)test/%: test/%.c $(HEADERS) test/test_common.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/bench_tokenizer: dev/bench_tokenizer.c tokenizer.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# peak memory of rank-local loading (dev/bench_fsdp.sh)
dev/bench_fsdp: dev/bench_fsdp.c fsdp.h train_llama2.c $(HEADERS)
	$(MPI_CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/bench_dataloader: dev/bench_dataloader.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/bench_attention: dev/bench_attention.c train_llama2.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the optimizers' host loops, built as the CPU trainer and as nvcc builds train_llama2cu's host code
dev/bench_optimizer: dev/bench_optimizer.c support/optimizer_cpu.h support/optimizer.h support/optimizer_qmap.h dev/bench_optimizer_nvcc
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)
dev/bench_optimizer_nvcc: dev/bench_optimizer.c support/optimizer_cpu.h support/optimizer.h support/optimizer_qmap.h
	$(NVCC) $(NVCCFLAGS_BASE) -Xcompiler -Wno-unused-function -x cu -o $@ $< $(LDLIBS)

# the built-in default run's model and data (support/default_model.h), written into a folder
dev/make_default: dev/make_default.c support/default_model.h support/utils.h support/json.h support/safetensors.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/cuda/cpu_ref.o: dev/cuda/cpu_ref.c dev/cuda/cpu_ref.h train_llama2.c $(HEADERS)
	$(CC) $(CFLAGS) -c -o $@ $<

$(CUDA_CHECKS): dev/cuda/%: dev/cuda/%.cu dev/cuda/cpu_ref.o $(CUDA_HEADERS)
	$(NVCC) $(NVCCFLAGS) -o $@ $< dev/cuda/cpu_ref.o $(CUDA_LDLIBS)

# the CUDA trainer: its backend and every host header it shares with train_llama2.c,
# compiled as C++17 with warnings as errors
train_llama2cu: $(CUDA_TRAINER)
	$(NVCC) $(NVCCFLAGS) $(NVCC_FSDP) -o $@ $< $(CUDA_LDLIBS) $(NVCC_FSDP_LIBS)

# test_llama2cu: the CUDA trainer and the CPU twin (test/cpu_twin.o) in one process.
# A whole trainer in a test leaves some of its functions unused, which is no error
# here (as -Wno-unused-function in CFLAGS for the C tests).
test/cpu_twin.o: test/cpu_twin.c test/twin.h test/cpu_twin.h train_llama2.c $(HEADERS)
	$(CC) $(CFLAGS) -c -o $@ $<
test/test_llama2cu: test/test_llama2cu.cu test/cpu_twin.o test/twin.h test/cpu_twin.h test/test_common.h \
    test/random_model.h $(CUDA_TRAINER)
	$(NVCC) $(NVCCFLAGS) $(NVCC_FSDP) -diag-suppress 177 -Xcompiler -Wno-unused-function -o $@ $< test/cpu_twin.o \
	    $(CUDA_LDLIBS) $(NVCC_FSDP_LIBS)

# fsdp.h's NCCL backend against plain loops, on one GPU per rank (mpirun -np N, dev/launch.sh N);
# support/utils.h's helpers are static functions that not every program uses
dev/cuda/fsdp_nccl: dev/cuda/fsdp_nccl.cu fsdp.h support/tcp.h support/utils.h support/json.h support/safetensors.h
	$(NVCC) $(NVCCFLAGS) -Xcompiler -Wno-unused-function -DFSDP_NCCL $(NVCC_MPI) -o $@ $< -lnccl $(NVCC_MPI_LIBS)
# the same without MPI, whose host side is TCP alone (what a build without mpicc gets)
dev/cuda/fsdp_nccl_tcp: dev/cuda/fsdp_nccl.cu fsdp.h support/tcp.h support/utils.h support/json.h support/safetensors.h
	$(NVCC) $(NVCCFLAGS) -Xcompiler -Wno-unused-function -DFSDP_NCCL -o $@ $< -lnccl

# the trainer for Volta (sm_70; CUDA 12 or older: 13 dropped it) and Turing (sm_75),
# compiled only (make train_llama2cu GPU_ARCH=75 builds the one to run): their build
# leaves out the bf16 tensor-core kernels
build-arch/train_llama2cu_sm%: $(CUDA_TRAINER)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS_BASE) -gencode arch=compute_$*,code=sm_$* $(NVCC_FSDP) -o $@ $< $(CUDA_LDLIBS) $(NVCC_FSDP_LIBS)

# every CUDA target (fsdp_nccl where nccl.h is); cuda-compile-check (CI, no GPU
# needed) builds the trainer for sm_80 and sm_90 (test_llama2cu and the kernel checks for sm_90), and for sm_75 (and sm_70
# where nvcc has it: dev/cuda/compile_check.sh), with warnings as errors; dev/gpu_check.sh
# runs them on a GPU
cuda: $(CUDA_CHECKS) train_llama2cu test/test_llama2cu $(if $(NCCL_H),dev/cuda/fsdp_nccl dev/cuda/fsdp_nccl_tcp)
# The check builds the kernel checks for sm_90 alone, apart (build-arch/sm90/): the kernels
# they share with the trainer are compiled for both architectures with it, and the checks'
# second architecture took half of the step's 3.5 minutes.
$(CUDA_CHECKS:%=build-arch/sm90/%): build-arch/sm90/dev/cuda/%: dev/cuda/%.cu dev/cuda/cpu_ref.o $(CUDA_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS_BASE) -gencode arch=compute_90,code=sm_90 -o $@ $< dev/cuda/cpu_ref.o $(CUDA_LDLIBS)
# test_llama2cu too (its kernels are the trainer's, compiled for both architectures there;
# its second took 35 of the check's CPU seconds)
build-arch/sm90/test/test_llama2cu: test/test_llama2cu.cu test/cpu_twin.o test/twin.h test/cpu_twin.h test/test_common.h \
    test/random_model.h $(CUDA_TRAINER)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS_BASE) -gencode arch=compute_90,code=sm_90 $(NVCC_FSDP) -diag-suppress 177 -Xcompiler -Wno-unused-function \
	    -o $@ $< test/cpu_twin.o $(CUDA_LDLIBS) $(NVCC_FSDP_LIBS)
# sm_70 too where this nvcc still has Volta (CUDA 12 and older; 13 dropped it)
CUDA_VOLTA = $(if $(shell $(NVCC) --list-gpu-arch 2>/dev/null | grep -x compute_70),build-arch/train_llama2cu_sm70)
# test_optim as nvcc builds the trainer's host code: --cpu_offload's step runs these loops
# there, and must give torch's bits there too (make test-all runs it where nvcc is)
build-arch/test/test_optim: test/test_optim.c support/optimizer_cpu.h support/optimizer.h support/optimizer_qmap.h test/test_common.h
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS_BASE) -Xcompiler -Wno-unused-function -x cu -o $@ $< -lm
CUDA_COMPILE_CHECK = train_llama2cu build-arch/sm90/test/test_llama2cu $(if $(NCCL_H),dev/cuda/fsdp_nccl dev/cuda/fsdp_nccl_tcp) \
    $(CUDA_CHECKS:%=build-arch/sm90/%) build-arch/train_llama2cu_sm75 $(CUDA_VOLTA) build-arch/test/test_optim
cuda-compile-check: $(CUDA_COMPILE_CHECK)
# the kernel checks' names, for the scripts that run each of them (test/test_emu_cuda.sh, dev/gpu_check.sh)
cuda-checks:
	@echo $(notdir $(CUDA_CHECKS))

# ----------------------------------------------------------------------------
# The emulated build (dev/emu/, docs/cuda.md): the CUDA sources compiled by the host
# C++ compiler and run on the CPU with CUDA's semantics. Every source is first
# mirrored into build-emu/src/<same path> by dev/emu/rewrite.pl (launches and
# __shared__ declarations; `#line` keeps every report on the original file and
# line); build-emu/<path> is then the program of build-emu/src/<path>.cu, built
# with AddressSanitizer and UBSan, and build-emu-tsan/<path> the same with
# ThreadSanitizer (the race check, with clang where there is one). EMU_PRELUDE is
# force-included first, as nvcc does CUDA's own cuda_runtime.h.
# -rdynamic: launches name their kernel by its symbol (dladdr).
EMU = build-emu
EMU_CXX ?= g++
EMU_FLAGS = -std=c++17 -g -O2 -march=native -fno-strict-aliasing -fno-omit-frame-pointer -D__CUDACC__ -Wall -Wextra \
    -Wno-unused-function -Wno-unknown-pragmas -Idev/emu -rdynamic
EMU_ASAN = -fsanitize=address,undefined -fno-sanitize-recover=all
EMU_TSAN = -fsanitize=thread
# clang's TSan runtime (14: "v3") creates a fiber in ~0.5 us; GCC 12's in ~500 us
EMU_TSAN_CXX ?= $(if $(shell command -v clang++),clang++,$(EMU_CXX))
EMU_PRELUDE = -include dev/emu/cuda_runtime.h
EMU_SRCS = $(wildcard *.h *.cu *.cuh trainer/*.h support/*.h support/*.cuh peft/*.h peft/*.cuh dev/cuda/*.h dev/cuda/*.cu dev/cuda/*.cuh \
    test/*.h test/*.cu test/emu_planted/*.cu)
EMU_HEADERS = $(wildcard dev/emu/*.h)
EMU_PLANTED = $(basename $(wildcard test/emu_planted/*.cu))
EMU_TESTS = $(EMU)/test/test_emu_device $(EMU)/test/test_emu_blas $(EMU)/test/test_emu_runtime $(EMU)-tsan/test/test_emu_runtime \
    $(EMU_PLANTED:%=$(EMU)/%) $(filter $(EMU)-tsan/test/emu_planted/race_%,$(EMU_PLANTED:%=$(EMU)-tsan/%))
$(EMU)/src/%: % dev/emu/rewrite.pl
	@mkdir -p $(@D)
	perl dev/emu/rewrite.pl $< $@
$(EMU)/%: $(EMU)/src/%.cu $(EMU_SRCS:%=$(EMU)/src/%) $(EMU_HEADERS)
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_FLAGS) $(EMU_ASAN) $(OPENMP) $(EMU_DEFS) $(EMU_PRELUDE) -o $@ -x c++ $< -x none $(EMU_OBJS)
$(EMU)-tsan/%: $(EMU)/src/%.cu $(EMU_SRCS:%=$(EMU)/src/%) $(EMU_HEADERS)
	@mkdir -p $(@D)
	$(EMU_TSAN_CXX) $(EMU_FLAGS) $(EMU_TSAN) $(EMU_PRELUDE) -o $@ -x c++ $< -x none $(EMU_OBJS)
# the planted bugs need ASan and the execution layer's own checks only (no UBSan check is
# planted), and no speed: unoptimized, they build in 40% of the time (9.2 -> 3.7 s each)
$(EMU_PLANTED:%=$(EMU)/%): EMU_ASAN = -fsanitize=address
$(EMU_PLANTED:%=$(EMU)/%): EMU_FLAGS += -O0
# dev/emu/blas.h (cuBLAS and cuBLASLt) on its own, against products worked out by hand
# from cuBLAS's documentation: plain C++ (no kernels, so no rewrite), with
# dev/emu/blas_test_prelude.h standing in for the runtime (it holds enqueued work
# until the test runs it, and emu::fail throws so the test sees a check fire)
$(EMU)/test/test_emu_blas: test/test_emu_blas.cu test/stderr_of.h dev/emu/blas.h dev/emu/blas_test_prelude.h dev/emu/library_types.h \
    dev/emu/cuda_bf16.h dev/emu/cuda_fp16.h dev/emu/types.h test/test_common.h
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_FLAGS) $(EMU_ASAN) -include dev/emu/blas_test_prelude.h -o $@ -x c++ $<
# the rewritten sources are inputs of the programs, not leftovers
.SECONDARY: $(EMU_SRCS:%=$(EMU)/src/%)
# the kernel checks of dev/cuda/, emulated: each against its CPU twin (--quick: the small shapes, no timing)
EMU_CHECKS = $(CUDA_CHECKS:%=$(EMU)/%)
$(EMU_CHECKS): EMU_OBJS = dev/cuda/cpu_ref.o
# (-O1: their small shapes run in seconds; the attention check builds in 43 s instead of 59
# and runs in 34 s instead of 27)
$(EMU_CHECKS): EMU_FLAGS += -O1
$(EMU_CHECKS): dev/cuda/cpu_ref.o
# The CUDA trainer and its test against the CPU twin, emulated: NCCL's calls for one
# rank (dev/emu/nccl.h), MPI where mpicc is (several ranks take --collectives host)
$(EMU)/train_llama2 $(EMU)/test/test_llama2cu $(EMU)/dev/cuda/fsdp_nccl: EMU_DEFS = -DFSDP_NCCL $(NVCC_MPI)
$(EMU)/train_llama2 $(EMU)/dev/cuda/fsdp_nccl: EMU_OBJS = $(NVCC_MPI_LIBS)
$(EMU)/test/test_llama2cu: EMU_OBJS = test/cpu_twin.o $(NVCC_MPI_LIBS)
# the planted leak beside MPI's (test_emu_checkers.sh), with MPI as the trainer has it
$(EMU)/test/emu_planted/mpi_leak: EMU_DEFS = $(NVCC_MPI)
$(EMU)/test/emu_planted/mpi_leak: EMU_OBJS = $(NVCC_MPI_LIBS)
$(EMU)/test/test_llama2cu: test/cpu_twin.o
# test_llama2cu's ~750 checks without the sanitizers, which made them 3x slower (17 of make
# test's 29 minutes): device memory keeps its own checks (every allocation its own mapping,
# a guard page after it, closed to the host between launches), and the ASan build of the
# trainer runs in test_llama2cu_sharded.sh
$(EMU)/test/test_llama2cu: EMU_ASAN =
# The emulated trainer with ASan alone: UBSan took its build from 116 to 173 CPU seconds,
# make test's longest. Every kernel still runs under both in its dev/cuda/ check, and the
# host code it shares with train_llama2.c under both in `make test-all SANITIZE=1`.
$(EMU)/train_llama2: EMU_ASAN = -fsanitize=address
train_llama2cu_emu: $(EMU)/train_llama2
	cp $< $@
emu-test: $(EMU_TESTS)
	test/run.sh $(EMU)/test/test_emu_device $(EMU)/test/test_emu_blas $(EMU)/test/test_emu_runtime \
	    $(EMU)-tsan/test/test_emu_runtime test/test_emu_checkers.sh

# (the CUDA compile check belongs to the plain build: SANITIZE=1 leaves it out). Where nvcc
# is, its programs are built here with the others, so that they share the cores (run as a
# test of its own, after the build, the compile check kept two cores 64% busy: 337 CPU
# seconds in 262); dev/cuda/compile_check.sh then reports what was built.
RUN_TESTS = $(addprefix $(B),$(filter-out $(SAN_SKIP),$(TESTS)))
# the tests run two at a time, the longest first: the multi-process ones spend much of
# their time waiting for each other (test_sharded.sh: 81 CPU seconds in 105), so one at a
# time left a third of the two cores idle (RUN_JOBS=1: one at a time, each test's output as it comes).
# test_sharded.sh goes first, beside test_emu_cuda.sh's kernel checks (one process): its many
# short runs of 2-4 ranks (70 s alone) wait on each other, and beside test_emu_cuda.sh's two
# trainer processes, as third in the list, its MPI ranks polled for 163-328 s. Measured on 2
# cores, the same build: the tests took 394 s against 439 (the whole make test-all ~1000 s).
RUN_JOBS ?= 2
# make test, the quick tier: one test of each idea, in an eighth of make test-all's CPU time (202
# CPU seconds against 1585 from a clean clone, builds included, 2026-12-07). The CPU trainer against
# transformers + peft (test_llama2 whole: 7 CPU seconds), attention, chunked == whole (LoRA), the tokenizers and the dataloader, the
# parsers (their malformed inputs, the fuzzers' seeds and crashes, the CLI's refusals),
# checkpoint formats and resume, GGUF export, the optimizers against torch, W = 2 FULL_SHARD ==
# one process under mpirun and dev/launch.sh, context parallelism == one process, and the
# emulated CUDA trainer against its CPU twin (test_llama2cu --quick: its build, without the
# sanitizers, is less than half the emulated trainer's, which make test leaves out with the
# kernel checks and the compile check).
# The emulated trainer's runs in the scripts are skipped (EMU_TRAINER, EMU_BIN: none, not one
# left by an earlier make test-all). The emulated program goes first, its build the longest.
# Its two processes take both cores while the other tests run beside them, whose OpenMP threads
# then wait passively: spinning, they took 2-5 times their CPU time (test_attention 15 s, not 3).
QUICK_TESTS = test/test_llama2 test/test_attention test/test_chunked test/test_tokenizer test/test_dataloader \
    test/test_json test/test_safetensors test/test_torch_zip test/test_fuzz_replay test/test_quant test/test_gguf test/test_optim
test: $(if $(B),,$(EMU)/test/test_llama2cu) $(B)train_llama2 $(addprefix $(B),$(QUICK_TESTS)) $(B)test/test_fsdp $(B)test/st_compare
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} RUN_JOBS=$(RUN_JOBS) BIN=./$(B)train_llama2 \
	    EMU_TRAINER= EMU_BIN= $(TEST_ENV) test/run.sh $(if $(B),,"test/test_emu_cuda.sh --quick") $(B)test/test_llama2 \
	    $(B)test/test_attention "test/test_sharded.sh --quick" test/test_context_parallel.sh test/test_resume.sh "$(B)test/test_chunked lora" \
	    $(addprefix $(B),$(filter-out test/test_llama2 test/test_attention test/test_chunked,$(QUICK_TESTS))) \
	    test/test_cli.sh test/test_preference.sh test/test_gguf.sh test/test_checkpoints.sh test/test_docs.sh \
	    "test/test_activation_offload.sh --quick"
# make test-all: every test. The programs are listed longest build first, so that no long build
# starts last while the other core waits: the emulated trainer alone takes 3 minutes.
NVCC_FOUND := $(shell command -v $(NVCC) 2>/dev/null)
test-all: $(if $(B),,train_llama2cu_emu $(EMU)/test/test_llama2cu $(if $(NVCC_FOUND),$(CUDA_COMPILE_CHECK)) \
    $(EMU)/dev/cuda/fsdp_nccl $(EMU_CHECKS) $(EMU_TESTS)) \
    $(B)train_llama2 $(RUN_TESTS) $(B)test/test_fsdp $(B)test/st_compare $(if $(MPICC),$(B)test/train_llama2_nompi)
	@$(foreach t,$(SAN_SKIP),echo "SKIP $(t) under SANITIZE=1 (see SAN_SKIP in the Makefile)";)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} RUN_JOBS=$(RUN_JOBS) BIN=./$(B)train_llama2 EMU_TRAINER=$(if $(B),,./train_llama2cu_emu) $(TEST_ENV) test/run.sh \
	    test/test_sharded.sh test/test_context_parallel.sh $(if $(B),,test/test_emu_cuda.sh test/test_llama2cu_sharded.sh test/test_llama2cu_context.sh test/test_offload.sh test/test_base_offload.sh test/test_activation_offload.sh test/test_llama2cu_preference.sh) $(RUN_TESTS) \
	    test/test_fsdp.sh test/test_batch.sh test/test_cli.sh test/test_preference.sh test/test_gguf.sh test/test_checkpoints.sh test/test_tensorboard.sh test/test_profile.sh test/test_resume.sh test/test_faults.sh test/test_real_data.sh test/test_docs.sh \
	    $(if $(B),,dev/cuda/compile_check.sh $(if $(NVCC_FOUND),build-arch/test/test_optim) test/test_llama2cu.sh $(EMU)/test/test_emu_device $(EMU)/test/test_emu_blas \
	    $(EMU)/test/test_emu_runtime $(EMU)-tsan/test/test_emu_runtime test/test_emu_checkers.sh)

# libFuzzer builds: clang with -fsanitize=fuzzer (Debian: clang and libclang-rt-14-dev)
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS = -g -O1 -std=gnu11 -Wall -Wextra -Wno-unused-function \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
build-fuzz/fuzz_%: dev/fuzz/fuzz_%.c dev/fuzz/fuzz.h train_llama2.c $(HEADERS) fsdp.h
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< -lm

fuzz: $(FUZZ_TARGETS:%=build-fuzz/fuzz_%)
	FUZZ_SECONDS=$(FUZZ_SECONDS) dev/fuzz/run.sh $(FUZZ_TARGETS)

run: train_llama2
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} ./train_llama2

clean:
	rm -f train_llama2 train_llama2cu train_llama2cu_emu $(TESTS) test/test_fsdp test/st_compare test/train_llama2_nompi dev/bench_tokenizer dev/make_default $(CUDA_CHECKS) dev/cuda/cpu_ref.o \
	    test/test_llama2cu test/cpu_twin.o dev/cuda/fsdp_nccl dev/cuda/fsdp_nccl_tcp dev/bench_fsdp dev/bench_optimizer dev/bench_optimizer_nvcc
	rm -rf build-san build-fuzz build-vg build-arch $(EMU) $(EMU)-tsan
