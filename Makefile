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

HEADERS = utils.h json.h safetensors.h tokenizer.h lora.h dataloader.h
TESTS = test/test_json test/test_safetensors test/test_tokenizer test/test_llama2 test/test_chunked test/test_dataloader

.PHONY: all test run clean
all: train_llama2

train_llama2: train_llama2.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test/test_llama2 test/test_chunked: test/%: test/%.c train_llama2.c $(HEADERS) test/test_common.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test/%: test/%.c $(HEADERS) test/test_common.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/bench_tokenizer: dev/bench_tokenizer.c tokenizer.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

dev/bench_dataloader: dev/bench_dataloader.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test: train_llama2 $(TESTS)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} test/run.sh $(TESTS) test/test_cli.sh

run: train_llama2
	./train_llama2 --model test/fixtures/tiny_gqa --data test/fixtures/data.jsonl --max_seq_len 64 \
	    --batch_size 4 --max_steps 30 --lr 1e-2 --lora_r 8 --lora_target_modules all-linear \
	    --warmup_steps 3 --output_dir out/tiny_lora --metrics_file out/tiny_lora/metrics.jsonl

clean:
	rm -f train_llama2 $(TESTS) dev/bench_tokenizer
