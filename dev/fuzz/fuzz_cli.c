// The command line from arbitrary bytes: the input split at NUL bytes into
// argv[1..] (argv[0] is "train_llama2"), then parse_args (trainer/options.h). It
// must return 0, 1 (--help) or -1 with a message ("error: ..." on stderr), and
// never exit the process (libFuzzer reports an exit as a crash). What it
// accepts must be in range.
#define TESTING
#include "../../train_llama2.c"
#include "fuzz.h"

#define MAX_ARGS 256

FUZZ_TARGET(cli) {
    char *buf = (char *)malloc(size + 1);
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    FUZZ_ASSERT(buf != NULL);
    memcpy(buf, data, size);
    buf[size] = 0;
    argv[argc++] = (char *)"train_llama2";
    for (size_t i = 0; i <= size && argc <= MAX_ARGS;) { // each NUL ends an argument
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    if (size == 0) argc = 1; // no input: no arguments
    argv[argc] = NULL;
    fuzz_stderr_begin();
    TrainConfig tc;
    memset(&tc, 0, sizeof tc);
    int r = parse_args(&tc, argc, argv);
    int said = fuzz_stderr_end(NULL);
    FUZZ_ASSERT(r == 0 || r == 1 || r == -1);
    if (r == -1) FUZZ_ASSERT(said); // a refusal says why
    if (r == 0) {
        unsigned mask;
        FUZZ_ASSERT(tc.model && tc.model[0] && tc.data && tc.data[0]);
        FUZZ_ASSERT(lora_parse_targets(tc.lora_target_modules, "--lora_target_modules", &mask) == 0 && mask != 0);
        FUZZ_ASSERT(!strcmp(tc.lr_scheduler, "constant") || !strcmp(tc.lr_scheduler, "linear") || !strcmp(tc.lr_scheduler, "cosine"));
        // batch_size 0: auto, grad_accum 0: derived (both settled once the model and world size are known)
        FUZZ_ASSERT(tc.max_seq_len >= 2 && tc.batch_size >= 0 && tc.grad_accum >= 0 && tc.num_epochs >= 1);
        FUZZ_ASSERT(tc.lora_r >= 1 && tc.lora_dropout >= 0 && tc.lora_dropout < 1);
        // (--adam_beta2 0.99999999 once became 1.0f: test/fuzz_regress/cli/)
        FUZZ_ASSERT(tc.lr >= 0 && tc.lr <= 1e3f && tc.optim.beta1 >= 0 && tc.optim.beta1 < 1 && tc.optim.beta2 >= 0 && tc.optim.beta2 < 1);
        FUZZ_ASSERT(!(tc.full_finetune && tc.from_peft_checkpoint[0]));
    }
    free(buf);
    return 0;
}
