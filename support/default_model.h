// default_model.h: the built-in default run. With no --model, the trainer
// fine-tunes a small Llama model on a small dataset that this file generates:
// nothing is downloaded, nothing is copied from elsewhere. default_setup(dir)
// writes whichever of these dir does not hold yet:
//   dir/model/config.json        a Llama config in Hugging Face's format
//   dir/model/model.safetensors  F32 weights, randomly initialised (fixed seed)
//   dir/model/tokenizer.model    a character-level SentencePiece BPE model
//   dir/data.jsonl               prompt/response facts for the model to learn
// Delete dir to regenerate it (after changing this file, say).
//
// The task is memorising 98 short facts ("The capital of France is" ->
// "Paris."), which this model learns with LoRA from random initialisation in
// 500 steps, about 40 s of CPU time; the samples before, during and after
// training show it happen.
// Everything is a pure function of this file: the same bytes on every run and
// every machine (the weights come from integer hashing and exact float
// arithmetic, no libm), which test/test_default.c checks.
//
// The tokenizer is generated rather than embedded from a test fixture: the
// code below says exactly what is in the vocabulary, where a fixture would be
// an opaque byte array, and a character vocabulary needs no training corpus.
// It is a SentencePiece BPE model with Llama-2's settings and no merges:
// <unk>, <s>, </s>, the word boundary "▁", and one piece per printable ASCII
// character, so a token is a character (sentencepiece itself loads the file).
// Unlike Llama-2 it has no byte pieces (byte fallback): the data is ASCII, and
// an untrained model that can emit raw bytes prints control characters and
// broken UTF-8 in the samples before training, where this one prints letters.
#ifndef DEFAULT_MODEL_H
#define DEFAULT_MODEL_H
#include <stdint.h>
#include <sys/stat.h>
#include "utils.h"
#include "json.h"
#include "safetensors.h"

// The model: Llama-2's shape scaled down (intermediate ~ 8/3 hidden, as
// 11008 ~ 8/3 4096; head size 32), 0.83M parameters: big enough to learn the
// facts in a few hundred steps, small enough for a step of 16 rows in about
// 75 ms of CPU time.
#define DEFAULT_DIM 128
#define DEFAULT_HIDDEN 352
#define DEFAULT_LAYERS 4
#define DEFAULT_HEADS 4
#define DEFAULT_KV_HEADS 4
#define DEFAULT_MAX_POS 256
// Weights are drawn with standard deviation 0.02 * sqrt(4096 / DEFAULT_DIM):
// transformers' initializer_range 0.02 belongs to Llama-2-7B's hidden size
// 4096, where the initial logits have standard deviation 0.02 * sqrt(4096)
// = 1.3; this keeps that scale at hidden size 128. It matters for LoRA: the
// head and the final norm stay frozen, so a logit can never exceed
// std * hidden_size (a row of norm std * sqrt(D) against a normalised vector
// of norm sqrt(D)). With 0.02 at D = 128 that is 2.6, too small to predict any
// character confidently, and LoRA's loss stalls near 4.7; here it is 14.5.
#define DEFAULT_INIT_STD 0.11313708498984761 // 0.02 * sqrt(4096 / 128)
#define DEFAULT_SEED 20240718u

// the vocabulary: <unk> <s> </s> "▁", then '!'..'~'
#define DEFAULT_VOCAB (4 + '~' - '!' + 1)

// the facts: each line of data.jsonl is {"prompt": PROMPT, "response": RESPONSE}
static const char *const default_facts[][2] = {
    {"The capital of France is", "Paris."},
    {"The capital of Japan is", "Tokyo."},
    {"The capital of Italy is", "Rome."},
    {"The capital of Spain is", "Madrid."},
    {"The capital of Germany is", "Berlin."},
    {"The capital of Egypt is", "Cairo."},
    {"The capital of Canada is", "Ottawa."},
    {"The capital of Kenya is", "Nairobi."},
    {"The capital of Peru is", "Lima."},
    {"The capital of Norway is", "Oslo."},
    {"The capital of Greece is", "Athens."},
    {"The capital of Russia is", "Moscow."},
    {"The capital of China is", "Beijing."},
    {"The capital of Cuba is", "Havana."},
    {"The capital of Ireland is", "Dublin."},
    {"The capital of Poland is", "Warsaw."},
    {"The capital of Austria is", "Vienna."},
    {"The capital of Portugal is", "Lisbon."},
    {"The capital of Sweden is", "Stockholm."},
    {"The capital of Australia is", "Canberra."},
    {"The capital of Thailand is", "Bangkok."},
    {"The capital of Turkey is", "Ankara."},
    {"The capital of Chile is", "Santiago."},
    {"The capital of Vietnam is", "Hanoi."},
    {"The capital of Hungary is", "Budapest."},
    {"The capital of Finland is", "Helsinki."},
    {"The capital of Denmark is", "Copenhagen."},
    {"The capital of Belgium is", "Brussels."},
    {"The capital of the Netherlands is", "Amsterdam."},
    {"The capital of Switzerland is", "Bern."},
    {"The capital of Romania is", "Bucharest."},
    {"The capital of Iran is", "Tehran."},
    {"The capital of India is", "New Delhi."},
    {"The capital of Indonesia is", "Jakarta."},
    {"The capital of South Korea is", "Seoul."},
    {"The capital of Mongolia is", "Ulaanbaatar."},
    {"The capital of Nepal is", "Kathmandu."},
    {"The capital of Ghana is", "Accra."},
    {"The capital of Ethiopia is", "Addis Ababa."},
    {"The capital of Morocco is", "Rabat."},
    {"The capital of Argentina is", "Buenos Aires."},
    {"The capital of Colombia is", "Bogota."},
    {"The capital of Mexico is", "Mexico City."},
    {"The capital of Brazil is", "Brasilia."},
    {"The capital of New Zealand is", "Wellington."},
    {"The capital of Iceland is", "Reykjavik."},
    {"The opposite of hot is", "cold."},
    {"The opposite of big is", "small."},
    {"The opposite of up is", "down."},
    {"The opposite of day is", "night."},
    {"The opposite of fast is", "slow."},
    {"The opposite of open is", "closed."},
    {"The opposite of light is", "dark."},
    {"The opposite of old is", "young."},
    {"The opposite of wet is", "dry."},
    {"The opposite of happy is", "sad."},
    {"The opposite of early is", "late."},
    {"The opposite of full is", "empty."},
    {"The opposite of loud is", "quiet."},
    {"The opposite of rich is", "poor."},
    {"The opposite of black is", "white."},
    {"The opposite of left is", "right."},
    {"The opposite of hard is", "soft."},
    {"The opposite of long is", "short."},
    {"The opposite of thick is", "thin."},
    {"The opposite of strong is", "weak."},
    {"The opposite of high is", "low."},
    {"The opposite of push is", "pull."},
    {"The opposite of win is", "lose."},
    {"The opposite of first is", "last."},
    {"A cow says", "moo."},
    {"A dog says", "woof."},
    {"A cat says", "meow."},
    {"A duck says", "quack."},
    {"A sheep says", "baa."},
    {"A pig says", "oink."},
    {"An owl says", "hoot."},
    {"A lion says", "roar."},
    {"A horse says", "neigh."},
    {"A frog says", "ribbit."},
    {"A snake says", "hiss."},
    {"A mouse says", "squeak."},
    {"A bee says", "buzz."},
    {"A wolf says", "howl."},
    {"A crow says", "caw."},
    {"A donkey says", "hee-haw."},
    {"The plural of mouse is", "mice."},
    {"The plural of child is", "children."},
    {"The plural of foot is", "feet."},
    {"The plural of tooth is", "teeth."},
    {"The plural of goose is", "geese."},
    {"The plural of man is", "men."},
    {"The plural of woman is", "women."},
    {"The plural of person is", "people."},
    {"The plural of ox is", "oxen."},
    {"The plural of cactus is", "cacti."},
    {"The plural of leaf is", "leaves."},
    {"The plural of knife is", "knives."},
};

// How the trainer runs the default: default_setup(DEFAULT_RUN_DIR, ...), then
// these options, then --model and --data with default_setup's paths, then the
// user's own options (so theirs win). LoRA with the trainer's r, alpha and
// dropout, on every linear layer: 500 steps of 16 rows (about 80 epochs) take
// the loss from 5.5 to 0.006 and get all 98 facts right (greedy decoding,
// checked with transformers + peft on the saved adapter, seeds 42 and 7). On
// q_proj,v_proj alone the loss ends at 0.25 with 4 facts wrong.
#define DEFAULT_RUN_DIR "out/default"
static const char *const default_run_args[] = {
    "--lora_target_modules", "all-linear", "--lr", "1e-2", "--warmup_steps", "20", "--max_steps", "500",
    "--batch_size", "16", "--max_seq_len", "64", "--max_new_tokens", "16", "--sample_every", "100",
    "--output_dir", DEFAULT_RUN_DIR "/lora", "--metrics_file", DEFAULT_RUN_DIR "/metrics.jsonl",
    "--sample_prompt", "The capital of France is",
    "--sample_prompt", "The opposite of hot is",
    "--sample_prompt", "A cow says",
    "--sample_prompt", "The plural of mouse is",
};

// ----------------------------------------------------------------------------
// config.json, with the keys of a Llama-2 checkpoint's (as transformers 4
// writes them: rope_theta at the top, torch_dtype)

static int default_write_config(const char *path) {
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
        "{\n"
        "  \"architectures\": [\"LlamaForCausalLM\"],\n"
        "  \"attention_bias\": false,\n"
        "  \"bos_token_id\": 1,\n"
        "  \"eos_token_id\": 2,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"initializer_range\": %g,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"mlp_bias\": false,\n"
        "  \"model_type\": \"llama\",\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"rms_norm_eps\": 1e-05,\n"
        "  \"rope_theta\": 10000.0,\n"
        "  \"tie_word_embeddings\": false,\n"
        "  \"torch_dtype\": \"float32\",\n"
        "  \"vocab_size\": %d\n"
        "}\n",
        DEFAULT_DIM, DEFAULT_INIT_STD, DEFAULT_HIDDEN, DEFAULT_MAX_POS, DEFAULT_HEADS, DEFAULT_LAYERS,
        DEFAULT_KV_HEADS, DEFAULT_VOCAB);
    return write_bytes_atomic(path, buf, (size_t)n);
}

// ----------------------------------------------------------------------------
// model.safetensors: every tensor a Hugging Face Llama checkpoint has

enum { DEFAULT_MAX_TENSORS = 3 + 9 * DEFAULT_LAYERS };

// Linear layers and the embedding are uniform with transformers' standard
// deviation (uniform in +-sqrt(3) std); norm weights are 1 as transformers
// initialises them. Element i of tensor k is a hash of (seed, k, i), so the
// values do not depend on the order tensors are made in.
static void default_add_tensor(StWriteTensor *t, char (*names)[64], int *n, const char *name, int64_t rows, int64_t cols) {
    StWriteTensor *w = &t[*n];
    size_t numel = (size_t)rows * (size_t)(cols ? cols : 1);
    float *data = (float *)mallocCheck(numel * sizeof(float));
    uint64_t key = splitmix64(DEFAULT_SEED + (uint64_t)*n);
    const float bound = (float)(1.7320508075688772 * DEFAULT_INIT_STD);
    for (size_t i = 0; i < numel; i++) data[i] = cols ? (2.0f * hash_uniform(key, i) - 1.0f) * bound : 1.0f;
    snprintf(names[*n], 64, "%s", name);
    w->name = names[*n];
    w->dtype = ST_F32;
    w->ndim = cols ? 2 : 1; // (cols 0: a norm weight, a vector of ones)
    w->shape[0] = rows;
    w->shape[1] = cols;
    w->data = data;
    (*n)++;
}

static int default_write_weights(const char *path) {
    const int64_t D = DEFAULT_DIM, H = DEFAULT_HIDDEN, V = DEFAULT_VOCAB, hd = DEFAULT_DIM / DEFAULT_HEADS;
    const int64_t Q = DEFAULT_HEADS * hd, KV = DEFAULT_KV_HEADS * hd;
    StWriteTensor t[DEFAULT_MAX_TENSORS];
    char names[DEFAULT_MAX_TENSORS][64], name[64];
    memset(t, 0, sizeof t);
    int n = 0;
    default_add_tensor(t, names, &n, "model.embed_tokens.weight", V, D);
    for (int l = 0; l < DEFAULT_LAYERS; l++) {
        const struct { const char *name; int64_t rows, cols; } layer[9] = {
            {"input_layernorm", D, 0},
            {"self_attn.q_proj", Q, D},
            {"self_attn.k_proj", KV, D},
            {"self_attn.v_proj", KV, D},
            {"self_attn.o_proj", D, Q},
            {"post_attention_layernorm", D, 0},
            {"mlp.gate_proj", H, D},
            {"mlp.up_proj", H, D},
            {"mlp.down_proj", D, H},
        };
        for (int k = 0; k < 9; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, layer[k].name);
            default_add_tensor(t, names, &n, name, layer[k].rows, layer[k].cols);
        }
    }
    default_add_tensor(t, names, &n, "model.norm.weight", D, 0);
    default_add_tensor(t, names, &n, "lm_head.weight", V, D);
    const char *meta[2] = {"format", "pt"};
    int rc = st_write(path, t, n, meta, 1);
    for (int i = 0; i < n; i++) free((void *)t[i].data);
    return rc;
}

// ----------------------------------------------------------------------------
// tokenizer.model: a sentencepiece ModelProto in protobuf's wire format

typedef struct { unsigned char *p; size_t n, cap; } DefaultBuf;

static void default_put(DefaultBuf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        while (b->n + n > b->cap) b->cap = b->cap ? 2 * b->cap : 4096;
        b->p = (unsigned char *)reallocCheck(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void default_pb_varint(DefaultBuf *b, uint64_t v) {
    unsigned char c[10];
    int n = 0;
    do { c[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0)); v >>= 7; } while (v);
    default_put(b, c, (size_t)n);
}

// field `num` of wire type 0 (varint), 2 (length-delimited) or 5 (fixed32)
static void default_pb_int(DefaultBuf *b, int num, uint64_t v) { default_pb_varint(b, (uint64_t)num << 3); default_pb_varint(b, v); }
static void default_pb_bytes(DefaultBuf *b, int num, const void *s, size_t n) {
    default_pb_varint(b, (uint64_t)num << 3 | 2);
    default_pb_varint(b, n);
    default_put(b, s, n);
}
static void default_pb_float(DefaultBuf *b, int num, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    unsigned char c[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16), (unsigned char)(u >> 24)};
    default_pb_varint(b, (uint64_t)num << 3 | 5);
    default_put(b, c, 4);
}

// ModelProto.pieces (field 1): SentencePiece {piece = 1, score = 2, type = 3}
static void default_pb_piece(DefaultBuf *b, const char *piece, float score, int type) {
    DefaultBuf m = {NULL, 0, 0};
    default_pb_bytes(&m, 1, piece, strlen(piece));
    default_pb_float(&m, 2, score);
    default_pb_int(&m, 3, (uint64_t)type);
    default_pb_bytes(b, 1, m.p, m.n);
    free(m.p);
}

static int default_write_tokenizer(const char *path) {
    enum { NORMAL = 1, UNKNOWN = 2, CONTROL = 3 }; // SentencePiece.Type
    DefaultBuf b = {NULL, 0, 0}, m = {NULL, 0, 0};
    char piece[2] = {0};
    default_pb_piece(&b, "<unk>", 0.0f, UNKNOWN);
    default_pb_piece(&b, "<s>", 0.0f, CONTROL);
    default_pb_piece(&b, "</s>", 0.0f, CONTROL);
    // the normal pieces score 0, -1, -2, ... (BPE merges the best-scoring pair
    // first; with no merged pieces in the vocabulary the scores change nothing)
    default_pb_piece(&b, "\xE2\x96\x81", 0.0f, NORMAL); // "▁", the escaped space
    for (int c = '!'; c <= '~'; c++) {
        piece[0] = (char)c;
        default_pb_piece(&b, piece, (float)-(c - '!' + 1), NORMAL);
    }
    // trainer_spec (field 2): model_type = BPE (3: 2) and vocab_size (4); the
    // unk/bos/eos/pad ids and names keep sentencepiece's defaults (0, 1, 2, none), Llama-2's too
    default_pb_int(&m, 3, 2);
    default_pb_int(&m, 4, DEFAULT_VOCAB);
    default_pb_bytes(&b, 2, m.p, m.n);
    m.n = 0;
    // normalizer_spec (field 3): name "identity" (1), add_dummy_prefix (3),
    // remove_extra_whitespaces (4) off and escape_whitespaces (5) on, as Llama-2's
    default_pb_bytes(&m, 1, "identity", 8);
    default_pb_int(&m, 3, 1);
    default_pb_int(&m, 4, 0);
    default_pb_int(&m, 5, 1);
    default_pb_bytes(&b, 3, m.p, m.n);
    int rc = write_bytes_atomic(path, b.p, b.n);
    free(m.p); free(b.p);
    return rc;
}

// ----------------------------------------------------------------------------
// data.jsonl

static int default_write_data(const char *path) {
    DefaultBuf b = {NULL, 0, 0};
    for (size_t i = 0; i < sizeof default_facts / sizeof default_facts[0]; i++) {
        char q[256];
        default_put(&b, "{\"prompt\": ", 11);
        default_put(&b, q, json_escape_string(q, sizeof q, default_facts[i][0], strlen(default_facts[i][0])));
        default_put(&b, ", \"response\": ", 14);
        default_put(&b, q, json_escape_string(q, sizeof q, default_facts[i][1], strlen(default_facts[i][1])));
        default_put(&b, "}\n", 2);
    }
    int rc = write_bytes_atomic(path, b.p, b.n);
    free(b.p);
    return rc;
}

// ----------------------------------------------------------------------------

// Makes dir/model (a Hugging Face checkpoint folder) and dir/data.jsonl,
// writing only the files that are missing, and returns their paths in
// model_dir and data_path. 0 ok, -1 with a message on stderr.
static int default_setup(const char *dir, char *model_dir, size_t n1, char *data_path, size_t n2) {
    static const struct { const char *name; int (*write)(const char *); } files[] = {
        {"model/config.json", default_write_config},
        {"model/model.safetensors", default_write_weights},
        {"model/tokenizer.model", default_write_tokenizer},
        {"data.jsonl", default_write_data},
    };
    char path[4096];
    if ((size_t)snprintf(model_dir, n1, "%s/model", dir) >= n1 || (size_t)snprintf(data_path, n2, "%s/data.jsonl", dir) >= n2 ||
        strlen(dir) + 32 > sizeof path) {
        fprintf(stderr, "error: default_setup: path '%s' is too long\n", dir);
        return -1;
    }
    if (mkdir_p(model_dir) != 0) {
        fprintf(stderr, "error: cannot create '%s': %s\n", model_dir, strerror(errno));
        return -1;
    }
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        if (stat(path, &st) != 0 && files[i].write(path) != 0) return -1;
    }
    return 0;
}

#endif // DEFAULT_MODEL_H
