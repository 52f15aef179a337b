// dev/make_default: writes the built-in default model and dataset
// (default_model.h) into a folder, for looking at them or training on them
// with explicit options:
//   make dev/make_default && dev/make_default out/default
//   ./train_llama2 --model out/default/model --data out/default/data.jsonl ...
#include "../support/default_model.h"

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s DIR\n", argv[0]); return 2; }
    char model_dir[4096], data_path[4096];
    if (default_setup(argv[1], model_dir, sizeof model_dir, data_path, sizeof data_path) != 0) return 1;
    printf("model: %s\ndata:  %s\n", model_dir, data_path);
    return 0;
}
