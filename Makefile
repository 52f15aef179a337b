# llama2.tune
#   make train_llama2     CPU trainer (fp32, OpenMP when the compiler has it)
#   make test             build and run every test; ends with "N passed, N failed"
#   make run              a short LoRA run on the tiny model shipped in test/fixtures
CC ?= gcc
CFLAGS ?= -O3 -march=native
CFLAGS += -std=gnu11 -Wall -Wextra -Wno-unused-function -g
LDLIBS = -lm

# OpenMP if the compiler supports it (the trainer also builds and runs without it)
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
CFLAGS += $(OPENMP)
ifeq ($(OPENMP),)
$(info OpenMP not found: building single-threaded)
endif

# CUDA: the kernel checks in dev/cuda/ (each built with the CPU twins of
# train_llama2.c, dev/cuda/cpu_ref.o), for A100 (sm_80) and H100 (sm_90)
NVCC ?= nvcc
CUDA_ARCHS = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
NVCCFLAGS = -O3 -std=c++17 $(CUDA_ARCHS) --Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror $(if $(OPENMP),-Xcompiler -fopenmp)
CUDA_LDLIBS = -lcublasLt -lm
CUDA_HEADERS = cuda_common.cuh layers.cuh matmul.cuh attention.cuh dev/cuda/common.cuh dev/cuda/cpu_ref.h
CUDA_CHECKS = $(addprefix dev/cuda/,matmul attention embedding rmsnorm rope swiglu crossentropy adamw grad_norm)

HEADERS = utils.h json.h safetensors.h tokenizer.h lora.h dataloader.h checkpoint.h
TESTS = test/test_json test/test_safetensors test/test_tokenizer test/test_llama2 test/test_chunked test/test_trainer test/test_dataloader

.PHONY: all test run clean cuda cuda-compile-check
all: train_llama2

train_llama2: train_llama2.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test/test_llama2 test/test_chunked test/test_trainer: test/%: test/%.c train_llama2.c $(HEADERS) test/test_common.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test/%: test/%.c $(HEADERS) test/test_common.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/bench_tokenizer: dev/bench_tokenizer.c tokenizer.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/bench_dataloader: dev/bench_dataloader.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/cuda/cpu_ref.o: dev/cuda/cpu_ref.c dev/cuda/cpu_ref.h train_llama2.c $(HEADERS)
	$(CC) $(CFLAGS) -c -o $@ $<

$(CUDA_CHECKS): dev/cuda/%: dev/cuda/%.cu dev/cuda/cpu_ref.o $(CUDA_HEADERS)
	$(NVCC) $(NVCCFLAGS) -o $@ $< dev/cuda/cpu_ref.o $(CUDA_LDLIBS)

# every CUDA target; cuda-compile-check (CI, no GPU needed) builds them all for
# sm_80 and sm_90 with warnings as errors; dev/gpu_check.sh runs them on a GPU
cuda: $(CUDA_CHECKS)
cuda-compile-check: cuda

test: train_llama2 $(TESTS)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} test/run.sh $(TESTS) test/test_cli.sh test/test_resume.sh test/test_real_data.sh dev/cuda/compile_check.sh

run: train_llama2
	./train_llama2 --model test/fixtures/tiny_gqa --data test/fixtures/data.jsonl --max_seq_len 64 \
	    --batch_size 4 --max_steps 30 --lr 1e-2 --lora_r 8 --lora_target_modules all-linear \
	    --warmup_steps 3 --output_dir out/tiny_lora --metrics_file out/tiny_lora/metrics.jsonl

clean:
	rm -f train_llama2 $(TESTS) dev/bench_tokenizer $(CUDA_CHECKS) dev/cuda/cpu_ref.o
