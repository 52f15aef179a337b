// An output folder of checkpoints from arbitrary bytes, read as `--resume` reads
// it: checkpoint_list and checkpoint_resolve (checkpoint.h) over fuzzed folder
// and file names, then checkpoint_verify (the files' digests) and load_checkpoint
// (trainer/checkpoint.h: trainer_state.json, the resume checks against this run's
// options and data, optimizer.safetensors) on the checkpoint it picks.
// The input is up to five sections, separated by the line "=====":
//   0: names to create in the output folder, one a line: "d<name>" a folder,
//      "f<name>" an empty file
//   1: trainer_state.json of the picked checkpoint ("@DATA@" stands for the
//      data file's path, which is in a temporary folder)
//   2: its optimizer.safetensors, 3: adapter_model.safetensors, 4: adapter_config.json
// (a section that is not there is not written). The run's options are those of
// the seed corpus' run: --model test/fixtures/tiny_gqa, --lora_r 1, the data a
// copy of test/fixtures/data.jsonl with the modification time 1e9 s.
// Properties: the listed steps ascend and each names a checkpoint folder; a
// refusal says why, naming the folder or file; an accepted checkpoint gives a
// state in range with the moments read.
#define TESTING
#include "../../train_llama2.c"
#include "fuzz.h"

#define SEP "\n=====\n"
#define MAX_NAMES 16

// the next section of [*p, end) (up to SEP or the end); 0 when there is none
static int next_section(const uint8_t **p, const uint8_t *end, const uint8_t **s, size_t *n) {
    if (!*p) return 0;
    const uint8_t *at = (const uint8_t *)memmem(*p, (size_t)(end - *p), SEP, strlen(SEP));
    *s = *p;
    *n = (size_t)((at ? at : end) - *p);
    *p = at ? at + strlen(SEP) : NULL;
    return 1;
}

// writes a file where the names allow it (a folder of that name may be there already)
static void write_if_free(const char *path, const void *data, size_t n) {
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) return;
    fuzz_write(path, data, n);
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

FUZZ_TARGET(checkpoint) {
    static TrainConfig tc;
    static Optimizer opt;
    static Model model; // a LoRA run with its base weights whole: its moments come from optimizer.safetensors
    static char out[600], data_path[600]; // (short: gcc -O3 warns when a longer one could overflow a message)
    static int init = 0;
    if (!init) {
        size_t n;
        unsigned char *b = fuzz_slurp_fixture("test/fixtures/data.jsonl", &n);
        fuzz_path(data_path, sizeof data_path, "data.jsonl");
        fuzz_write(data_path, b, n);
        free(b);
        struct timespec t[2] = {{1000000000, 0}, {1000000000, 0}}; // the seed run's data had this mtime (the fingerprint)
        FUZZ_ASSERT(utimensat(AT_FDCWD, data_path, t, 0) == 0);
        char *argv[] = {"train_llama2", "--model", "test/fixtures/tiny_gqa", "--data", data_path, "--lora_r", "1",
                        "--max_seq_len", "24", "--batch_size", "2", NULL};
        FUZZ_ASSERT(parse_args(&tc, 11, argv) == 0);
        Config c;
        char dir[1024];
        int in[LORA_N_TARGETS], o[LORA_N_TARGETS];
        fuzz_fixture(dir, sizeof dir, "test/fixtures/tiny_gqa");
        FUZZ_ASSERT(config_load(&c, dir) == 0);
        lora_shapes(&c, in, o);
        opt.n = (size_t)c.n_layers * (in[0] + o[0] + in[2] + o[2]); // r = 1 on q_proj and v_proj (the default targets)
        opt.state[0] = (float *)malloc(opt.n * sizeof(float));
        opt.state[1] = (float *)malloc(opt.n * sizeof(float));
        model.host.use_lora = 1;
        fuzz_path(out, sizeof out, "out");
        init = 1;
    }
    const uint8_t *p = data, *end = data + size, *s;
    size_t n;
    FUZZ_ASSERT(remove_tree(out) == 0 && mkdir(out, 0755) == 0);
    char path[8192], dir[PATH_MAX];
    if (next_section(&p, end, &s, &n)) { // the names
        int count = 0;
        for (const uint8_t *line = s; line < s + n && count < MAX_NAMES; count++) {
            const uint8_t *nl = (const uint8_t *)memchr(line, '\n', (size_t)(s + n - line));
            size_t len = (size_t)((nl ? nl : s + n) - line);
            char name[256];
            if (len >= 2 && len < sizeof name && !memchr(line, 0, len) && !memchr(line, '/', len)) {
                memcpy(name, line + 1, len - 1);
                name[len - 1] = 0;
                snprintf(path, sizeof path, "%s/%s", out, name);
                if (strcmp(name, ".") && strcmp(name, "..")) {
                    if (line[0] == 'f') write_if_free(path, "", 0);
                    else mkdir(path, 0755);
                }
            }
            line = nl ? nl + 1 : s + n;
        }
    }
    int count;
    long *steps = checkpoint_list(out, &count);
    FUZZ_ASSERT(count >= 0);
    for (int i = 0; i < count; i++) {
        FUZZ_ASSERT(steps[i] >= 0 && (i == 0 || steps[i] > steps[i - 1]));
        snprintf(path, sizeof path, "%s/checkpoint-%ld", out, steps[i]);
        FUZZ_ASSERT(is_dir(path)); // what is listed is a checkpoint folder of that name
    }
    free(steps);

    fuzz_stderr_begin();
    int r = checkpoint_resolve(out, dir, sizeof dir);
    int said = fuzz_stderr_end(out);
    if (r != 0) {
        FUZZ_ASSERT(said && count == 0);
        return 0;
    }
    FUZZ_ASSERT(is_dir(dir));
    static const char *const files[] = {"trainer_state.json", "optimizer.safetensors", "adapter_model.safetensors", "adapter_config.json"};
    for (int f = 0; f < 4 && next_section(&p, end, &s, &n); f++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        if (f > 0) { write_if_free(path, s, n); continue; }
        // trainer_state.json: @DATA@ -> the data file's path
        char *text = (char *)malloc(n * (strlen(data_path) + 1) + 1), *t = text;
        FUZZ_ASSERT(text != NULL);
        for (size_t i = 0; i < n;) {
            if (n - i >= 6 && !memcmp(s + i, "@DATA@", 6)) { t += sprintf(t, "%s", data_path); i += 6; }
            else *t++ = (char)s[i++];
        }
        write_if_free(path, text, (size_t)(t - text));
        free(text);
    }
    fuzz_stderr_begin();
    r = checkpoint_verify(dir, 0, 1);
    said = fuzz_stderr_end(dir);
    if (r != 0) {
        FUZZ_ASSERT(said);
        return 0;
    }
    TrainState ts;
    memset(&ts, 0, sizeof ts);
    opt.t = -1;
    fuzz_stderr_begin();
    r = load_checkpoint(&tc, dir, 1, &model, &opt, &ts);
    said = fuzz_stderr_end(dir);
    if (r != 0) {
        FUZZ_ASSERT(said);
        return 0;
    }
    FUZZ_ASSERT(ts.step >= 0 && ts.opt_t >= 0 && ts.data_epoch >= 0 && ts.data_pos >= 0 && ts.bad_in_row >= 0 && opt.t == ts.opt_t);
    return 0;
}
