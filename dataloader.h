// dataloader.h: fine-tuning datasets (JSONL or a JSON array) to token and
// label batches: formats, prompt templates, loss masks, packing or padding,
// epochs and shuffling, a validation split, per-rank sampling, and a token
// cache next to the data so a big file is tokenized once.
//
// Formats (DataOptions.format; "auto" looks at the keys of the first record):
//   text             {"text"}                       BOS + text + EOS, every token labelled
//   prompt_response  {"prompt", "response"}         prompt and response verbatim
//   alpaca           {"instruction", "input", "output"}  Stanford Alpaca prompts; "input" may
//                    be missing, null or "" (then the prompt without input is used)
//   samsum           {"dialogue", "summary"}        llama-recipes' SAMSum prompt
//   chat             {"messages": [{"role", "content"}, ...]}  Llama-2 chat format
//   preference       {"prompt", "chosen", "rejected"}  a pair for preference tuning: two rows
//                    (pair_parts and dataset_fill_pairs below; TRL's tokenization); plain (strings)
//                    or conversational (lists of messages, "prompt" optional: TRL's forms)
// Auto-detection checks, in this order: "chosen" and "rejected" -> preference, "messages" -> chat, "instruction" ->
// alpaca, "dialogue" -> samsum, "prompt" -> prompt_response, "text" -> text.
// Other keys (e.g. SAMSum's "id") are ignored. The templates are in one place
// below ("Templates").
//
// Tokenization (llama-recipes' SAMSum way, for every format): a prompt is
// BOS + encode(prompt), its response encode(response) + EOS, each encoded on
// its own (so each gets sentencepiece's dummy prefix), concatenated. A chat is
// the concatenation of its (user, assistant) pairs. Prompt tokens (BOS
// included) are not labelled unless train_on_prompt; response tokens and EOS
// are. The model predicts token t+1 at position t, so a batch holds
// targets[t] = tokens[t+1] when token t+1 is labelled, else -100; padding gets
// pad_id tokens and -100 targets. Right padding needs no attention mask:
// causal attention never lets a real position see a later pad.
//
// Batching (rows are what the loader shuffles and deals out):
//   padding  one sample per row, truncated to its first max_seq_len tokens;
//            a micro-batch is padded on the right to its longest row, so T
//            varies per batch. A sample with no labelled target left within
//            max_seq_len would train on nothing: it is skipped and reported.
//   packing  llama-recipes' ConcatDataset: the samples (each ending in EOS) are
//            concatenated in file order and cut into rows of exactly
//            max_seq_len tokens; a long sample simply runs on into the next
//            row (nothing is truncated). The tail shorter than max_seq_len is
//            dropped, unless it is the only row. (llama-recipes cuts while the
//            buffer is longer than the row, so it also drops a tail of exactly
//            max_seq_len; here a full tail is a row.)
//
// Bad input. Anything that makes the file not what its format says is an
// error naming file:line (and the field): an empty file, invalid JSON
// (invalid UTF-8 included: JSON text is UTF-8), a record over 64 MiB, an
// element that is not an object, a missing field or one of the wrong type,
// chat roles out of order or unknown, a format that cannot be detected. A
// valid record that cannot become a training sample is a counted skip,
// reported with its line (the first few listed): an empty response or text
// (nothing to learn), a chat without a complete user/assistant pair, and (with
// padding) no labelled token within max_seq_len. No samples left is an error.
//
// Selection, in this order: the slice (HF-datasets style "[:10%]",
// "[10%:20%]", "[:100]", "[50:]", optionally after a split name as in
// "train[:10%]") picks records by their position in the file (skipped records
// count, as rows of the raw dataset do in HF); skipped samples are dropped;
// max_samples keeps the first N samples left. dataset_split then takes a
// seeded subset of these samples as the validation set; each half is packed
// on its own (splitting is by sample, before packing).
//
// Cache: the tokenized samples of a file are kept in "<data>.tokcache" (or in
// DataOptions.cache_dir) and memory-mapped, so the samples need not all be in
// RAM. Its header records what the tokens depend on: a format version, the
// hash of the templates, the data file's size, mtime and a hash of its first
// and last MiB, the hash of tokenizer.model and the format. Everything else
// (train_on_prompt, max_seq_len, packing, slices) is applied when loading, so
// changing it does not rebuild the cache. Every load checks the header and a
// checksum over the whole cache (one read of it); a stale or corrupt cache is
// reported in one line and rebuilt; the cache is written to a temporary file
// and renamed into place. Without a writable place (a directory with no write
// permission bit counts as read-only even for root) the tokens stay in memory.
//
// The data file is streamed: JSONL line by line, a JSON array element by
// element (a small scanner finds where each top-level element ends); only a
// batch of records is in memory at a time, tokenized in parallel (OpenMP).
//
// Usage (the trainer):
//   DataOptions o = {0}; o.max_seq_len = 512;            // the rest defaults
//   Dataset all, train, val;
//   dataset_load(&all, "data.jsonl", &tok, "tokenizer.model", &o);
//   dataset_split(&all, 0.1, seed, &train, &val);        // optional
//   int T = dataset_max_len(&train);                     // allocate B x T
//   DataLoader dl; dataloader_init(&dl, &train, shuffle, seed, rank, world);
//   per micro-batch: dataloader_next_batch(&dl, B, pad_id, tokens, targets, &T)
//     and dataloader_global_labels(&dl) for the loss normaliser (summed over
//     the step's micro-batches); dl.epoch and dl.pos are the position, which
//     dataloader_seek restores
//   evaluation: dataset_get_rows(&val, first, n, pad_id, tokens, targets, &T)
//     gives rows [first, first + n) in file order (the last batch may be short)
//   dataloader_free(&dl); dataset_free(&train); dataset_free(&val); dataset_free(&all);
#ifndef DATALOADER_H
#define DATALOADER_H
#include <stdint.h>
#include <math.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include "support/utils.h"
#include "support/json.h"
#include "tokenizer.h"
#include "support/progress.h"
#ifdef _OPENMP
#include <omp.h>
#endif

// ----------------------------------------------------------------------------
// Templates: the only place they are written. "{name}" is replaced by the
// record's field of that name (nothing else in a template is special).

#define SAMSUM_PROMPT "Summarize this dialog:\n{dialogue}\n---\nSummary:\n"
#define SAMSUM_RESPONSE "{summary}"
#define ALPACA_PROMPT_INPUT                                                                                           \
    "Below is an instruction that describes a task, paired with an input that provides further context. "            \
    "Write a response that appropriately completes the request.\n\n"                                                 \
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
#define ALPACA_PROMPT_NO_INPUT                                                                                        \
    "Below is an instruction that describes a task. "                                                                \
    "Write a response that appropriately completes the request.\n\n"                                                 \
    "### Instruction:\n{instruction}\n\n### Response:"
#define ALPACA_RESPONSE "{output}"
#define PROMPT_RESPONSE_PROMPT "{prompt}"
#define PROMPT_RESPONSE_RESPONSE "{response}"
// Chat: the family's own template, as transformers' apply_chat_template renders it
// (the chat_template of the family's tokenizer_config.json), chosen by the
// tokenizer: Llama-3 when it has the header tokens, else Llama-2. Special tokens
// come only from the template: a token's name inside a message is text.
// Llama-2 (Llama-2-chat): per (user, assistant) pair
//   BOS CHAT_PROMPT CHAT_RESPONSE EOS
// with a leading system message folded into the first user turn by CHAT_SYSTEM;
// the user text (after folding) and the assistant text are stripped (Python's
// str.strip()). The text after BOS gets no dummy prefix unless the tokenizer
// config says "legacy": true (then it is Meta's llama/generation.py encoding).
#define CHAT_SYSTEM "<<SYS>>\n{system}\n<</SYS>>\n\n{user}"
#define CHAT_PROMPT "[INST] {user} [/INST]"
#define CHAT_RESPONSE " {assistant} "
// Llama-3 (Meta-Llama-3-Instruct): BOS, then per message
//   <|start_header_id|> role <|end_header_id|> CHAT3_HEADER_END content <|eot_id|>
// with the content stripped; the assistant's content and its <|eot_id|> carry the loss.
#define CHAT3_HEADER_END "\n\n"
// The two chat formats as Jinja chat templates, for llama.cpp and ollama (--export_gguf writes
// the run's into the GGUF when the model folder has none): given messages, bos_token and
// eos_token they render the text whose tokens are the ones above, the roles checked as the
// data loader checks them; add_generation_prompt opens Llama-3's assistant turn (Llama-2's
// answer follows its [/INST]). dev/reference/check_gguf.py renders them on
// test/fixtures/chat's conversations (jinja2) against the ids of test/fixtures/chat/expected.json.
#define CHAT_JINJA_ROLES                                                                                              \
    "{%- set off = 1 if messages and messages[0]['role'] == 'system' else 0 -%}"                                     \
    "{%- for m in messages[off:] -%}"                                                                                 \
    "{%- if m['role'] != ('user' if loop.index0 % 2 == 0 else 'assistant') -%}"                                      \
    "{{- raise_exception('roles: an optional first system message, then user and assistant alternating') -}}"         \
    "{%- endif -%}"
#define CHAT_JINJA_LLAMA2                                                                                             \
    CHAT_JINJA_ROLES                                                                                                  \
    "{%- if m['role'] == 'assistant' -%}{{- ' ' + m['content'] | trim + ' ' + eos_token -}}"                          \
    "{%- elif loop.first and off -%}"                                                                                 \
    "{{- bos_token + '[INST] ' + ('<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' + m['content']) | trim + ' [/INST]' -}}" \
    "{%- else -%}{{- bos_token + '[INST] ' + m['content'] | trim + ' [/INST]' -}}{%- endif -%}"                        \
    "{%- endfor -%}"
#define CHAT_JINJA_LLAMA3                                                                                             \
    "{{- bos_token -}}" CHAT_JINJA_ROLES                                                                              \
    "{%- endfor -%}"                                                                                                  \
    "{%- for m in messages -%}"                                                                                       \
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' -}}"       \
    "{%- endfor -%}"                                                                                                  \
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"

// ----------------------------------------------------------------------------
// What the model folder's files say of the tokenizer: BOS, EOS and Llama-2's
// "legacy" (see "Templates"). transformers' tokenizer takes
// bos_token / eos_token from tokenizer_config.json (a string, or an AddedToken
// object {"content": ...}); the model's bos_token_id / eos_token_id are in
// generation_config.json, else config.json, and eos_token_id may be a list
// (generation stops at any of them; what a training sample ends with is the
// first). Looked up in that order; when no file names one, the tokenizer file's
// own id stays. A name that is not a token, or an id outside the vocabulary, is
// an error naming the file and the key.

// 1: *id set from key of j (a token's name when by_name, else its id), 0: j does not say
// (absent or null), -1: an error (said)
static int special_from_json(const Tokenizer *tok, const JsonValue *j, const char *path, const char *key, int by_name, int *id) {
    const JsonValue *v = json_get(j, key);
    if (v && v->type == JSON_OBJECT) v = json_get(v, "content"); // an AddedToken
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type == JSON_ARRAY) {
        if (v->count == 0) return 0;
        v = &v->items[0];
    }
    long long n = -1;
    if (by_name) {
        if (v->type != JSON_STRING) { fprintf(stderr, "error: %s: %s must be a string (a token's name)\n", path, key); return -1; }
        n = strlen(v->string) == v->string_len ? tokenizer_token_id(tok, v->string) : -1;
        if (n < 0) { fprintf(stderr, "error: %s: %s \"%.64s\" is not a token of the tokenizer\n", path, key, v->string); return -1; }
    } else if (json_as_int(v, &n) != JSON_OK || n < 0 || n >= tok->vocab_size) {
        fprintf(stderr, "error: %s: %s must be a token id in [0, %d) (or a list of them)\n", path, key, tok->vocab_size);
        return -1;
    }
    *id = (int)n;
    return 1;
}

// sets tok->bos_id, tok->eos_id and tok->legacy from the files of model_dir and
// tokenizer_dir (model_dir NULL: a tokenizer from elsewhere, whose ids the model's
// files do not describe: only its own tokenizer_config.json). 0 ok, -1 with a message
static int tokenizer_configure(Tokenizer *tok, const char *model_dir, const char *tokenizer_dir) {
    const char *const dirs[3] = {tokenizer_dir, model_dir, model_dir};
    static const char *const names[3] = {"tokenizer_config.json", "generation_config.json", "config.json"};
    static const char *const keys[3][2] = {{"bos_token", "eos_token"}, {"bos_token_id", "eos_token_id"}, {"bos_token_id", "eos_token_id"}};
    int found[2] = {0, 0}, *ids[2] = {&tok->bos_id, &tok->eos_id};
    for (int f = 0; f < 3; f++) {
        char path[4096];
        if (!dirs[f]) continue;
        snprintf(path, sizeof path, "%s/%s", dirs[f], names[f]);
        if (access(path, F_OK) != 0) continue;
        JsonValue j;
        if (json_load_file(path, &j) != 0) return -1;
        int rc = 0;
        for (int k = 0; k < 2 && rc >= 0; k++)
            if (!found[k] && j.type == JSON_OBJECT && (rc = special_from_json(tok, &j, path, keys[f][k], f == 0, ids[k])) == 1) found[k] = 1;
        if (f == 0 && j.type == JSON_OBJECT && json_get(&j, "legacy") && json_get_bool(&j, "legacy", &tok->legacy) != JSON_OK) {
            fprintf(stderr, "error: %s: legacy must be true or false\n", path);
            rc = -1;
        }
        json_free(&j);
        if (rc < 0) return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// options and the dataset

typedef enum { FORMAT_AUTO, FORMAT_TEXT, FORMAT_PROMPT_RESPONSE, FORMAT_ALPACA, FORMAT_SAMSUM, FORMAT_CHAT, FORMAT_PREFERENCE } DataFormat;
static const char *const data_format_names[] = {"auto", "text", "prompt_response", "alpaca", "samsum", "chat", "preference"};

typedef struct {
    const char *format;      // "auto" (default, also for NULL or ""), "text", "prompt_response", "alpaca", "samsum", "chat", "preference"
    int train_on_prompt;     // 0 (default): prompt tokens carry no loss
    int packing;             // 1: --batching packing, 0: --batching padding (default)
    int max_seq_len;
    long max_samples;        // 0: all
    const char *slice;       // NULL or "" (all), or "[:10%]", "[10%:20%]", "[:100]", "[50:]", "train[-10:]"
    const char *cache_dir;   // NULL or "": next to the data file
    int quiet;               // 1: print nothing (errors still go to Dataset.error)
} DataOptions;

// one record of the file is at most this long (a longer one is an error)
#define DATA_MAX_RECORD_BYTES ((size_t)64 << 20)
// how many skipped samples a report lists by line
#define DATA_SKIP_LIST 5

enum { SKIP_NONE, SKIP_EMPTY_RESPONSE, SKIP_EMPTY_TEXT, SKIP_NO_PAIR, SKIP_TRUNCATED, SKIP_SAME_RESPONSES };
static const char *const skip_reason_names[] = {"", "empty response", "empty text", "no user/assistant pair",
                                                "no response token within max_seq_len", "chosen and rejected are the same"};

enum { CACHE_NONE, CACHE_BUILT, CACHE_REUSED, CACHE_REBUILT };  // Dataset.cache_status

typedef struct DataStore DataStore;  // the tokenized samples of one file (below)

typedef struct {
    DataStore *store;         // shared (reference-counted) with the halves of dataset_split
    int format;               // the DataFormat used
    int train_on_prompt, packing, max_seq_len, quiet;
    // the samples this dataset holds: indices into the store, in file order
    int32_t *samples;
    long n_samples;
    // rows: padding, row i is samples[i] cut to max_seq_len; packing, row i is
    // tokens [i*max_seq_len, (i+1)*max_seq_len) of the samples concatenated
    long n_rows;
    int32_t *row_labels;      // (n_rows) label count of each row
    double *ref_logps;        // DPO's --precompute_ref_log_probs: (n_rows, 2) each pair's chosen and rejected
                              // log-probability under the reference (trainer/preference.h), NULL: none
    int64_t *cum;             // packing: (n_samples + 1) tokens before each sample
    int last_row_len;         // packing: max_seq_len, or less when the one row is a short tail
    long n_tokens, n_labels;  // in all rows
    // what loading saw
    long n_records;           // records in the file (or in the slice)
    long n_skipped;           // skipped samples among them
    long skip_line[DATA_SKIP_LIST];
    int skip_reason[DATA_SKIP_LIST];
    long dropped_tokens;      // packing: the tail that was dropped
    int cache_status;         // CACHE_*
    char cache_path[4096];    // "" when not cached
    char error[1024];         // the last error (also printed unless quiet)
} Dataset;

// ----------------------------------------------------------------------------
// small text helpers

typedef struct { const char *s; size_t n; } Str;

// Python's str.isspace() for one code point
static int data_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
// decodes the (valid: json.h checked it) UTF-8 character at s
static uint32_t data_utf8_at(const unsigned char *s, int *len) {
    if (s[0] < 0x80) { *len = 1; return s[0]; }
    if (s[0] < 0xE0) { *len = 2; return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3F); }
    if (s[0] < 0xF0) { *len = 3; return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3F); }
    *len = 4;
    return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3F);
}
static Str data_str(const char *s, size_t n) {
    Str r = {s, n};
    return r;
}
// Python's str.strip(): Unicode whitespace off both ends
static Str data_strip(Str x) {
    const unsigned char *s = (const unsigned char *)x.s;
    size_t a = 0, b = x.n;
    while (a < b) {
        int l;
        uint32_t c = data_utf8_at(s + a, &l);
        if (!data_is_space(c)) break;
        a += (size_t)l;
    }
    while (b > a) {
        size_t k = b - 1;
        while (k > a && (s[k] & 0xC0) == 0x80) k--; // back to the lead byte
        int l;
        if (!data_is_space(data_utf8_at(s + k, &l))) break;
        b = k;
    }
    Str r = {x.s + a, b - a};
    return r;
}

// tpl with each "{name}" replaced by the value of that name; malloc'd, *len set.
// Two passes: the first measures, the second writes.
static char *data_fill(const char *tpl, int n, const char *const *names, const Str *vals, size_t *len) {
    char *out = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t o = 0;
        for (const char *p = tpl; *p;) {
            int hit = -1;
            for (int i = 0; *p == '{' && i < n && hit < 0; i++) {
                size_t k = strlen(names[i]);
                if (strncmp(p + 1, names[i], k) == 0 && p[1 + k] == '}') hit = i;
            }
            if (hit < 0) {
                if (out) out[o] = *p;
                o++;
                p++;
                continue;
            }
            if (out) memcpy(out + o, vals[hit].s, vals[hit].n);
            o += vals[hit].n;
            p += strlen(names[hit]) + 2;
        }
        if (out) { out[o] = 0; *len = o; }
        else out = (char *)mallocCheck(o + 1);
    }
    return out;
}

// ----------------------------------------------------------------------------
// records: a sample as text segments, before tokenization

// BOS + prompt (no loss) | response + EOS | BOS + text + EOS | a chat's turns (their text as the record has it) |
// a preference pair's prompt + chosen and prompt + rejected (after its SEG_PROMPT)
enum { SEG_PROMPT, SEG_RESPONSE, SEG_TEXT, SEG_SYSTEM, SEG_USER, SEG_ASSISTANT, SEG_CHOSEN, SEG_REJECTED };
typedef struct { char *text; size_t len; int kind; } Segment;

typedef struct {
    uint64_t record, line;  // 0-based position in the file; 1-based line where it starts
    Segment *seg;
    int n_seg, cap_seg;
    int skip;               // SKIP_* or 0
    int32_t *ids;           // after tokenization
    uint8_t *label;         // (n) 1: the token is labelled
    int n;
} Pending;

static void pending_add(Pending *p, int kind, char *text, size_t len) {
    if (p->n_seg == p->cap_seg) {
        p->cap_seg = p->cap_seg ? 2 * p->cap_seg : 4;
        p->seg = (Segment *)realloc(p->seg, (size_t)p->cap_seg * sizeof(Segment));
        if (!p->seg) die("out of memory");
    }
    Segment s = {text, len, kind};
    p->seg[p->n_seg++] = s;
}
static void pending_clear(Pending *p) {
    for (int i = 0; i < p->n_seg; i++) free(p->seg[i].text);
    free(p->seg); free(p->ids); free(p->label);
    memset(p, 0, sizeof *p);
}
static void pending_copy(Pending *p, int kind, Str x) {
    char *text = (char *)mallocCheck(x.n + 1);
    memcpy(text, x.s, x.n);
    text[x.n] = 0;
    pending_add(p, kind, text, x.n);
}
// a segment from a template and a record's fields
static void pending_fill(Pending *p, int kind, const char *tpl, int n, const char *const *names, const Str *vals) {
    size_t len;
    char *text = data_fill(tpl, n, names, vals, &len);
    pending_add(p, kind, text, len);
}

// the string field key of obj: 0 ok; -1 with err set. optional: missing or
// null reads as "" (Alpaca's "input")
static int data_field(const JsonValue *obj, const char *key, int optional, Str *out, char *err, size_t errn) {
    const JsonValue *v = json_get(obj, key);
    out->s = "";
    out->n = 0;
    if ((!v || v->type == JSON_NULL) && optional) return 0;
    if (!v) { snprintf(err, errn, "missing field \"%s\"", key); return -1; }
    if (v->type != JSON_STRING) {
        snprintf(err, errn, "field \"%s\" is %s, expected a string", key, json_type_name(v->type));
        return -1;
    }
    out->s = v->string;
    out->n = v->string_len;
    return 0;
}

static int data_detect_format(const JsonValue *v) {
    if (json_get(v, "chosen") && json_get(v, "rejected")) return FORMAT_PREFERENCE;
    if (json_get(v, "messages")) return FORMAT_CHAT;
    if (json_get(v, "instruction")) return FORMAT_ALPACA;
    if (json_get(v, "dialogue")) return FORMAT_SAMSUM;
    if (json_get(v, "prompt")) return FORMAT_PROMPT_RESPONSE;
    if (json_get(v, "text")) return FORMAT_TEXT;
    return FORMAT_AUTO;
}

// message i of the list key: an object with a string role and content. 0 ok, -1 with err set
static int data_message(const JsonValue *m, const char *key, int i, Str *role, Str *content, char *err, size_t errn) {
    if (m->type != JSON_OBJECT) { snprintf(err, errn, "%s[%d] is %s, expected an object", key, i, json_type_name(m->type)); return -1; }
    char why[256];
    if (data_field(m, "role", 0, role, why, sizeof why) || data_field(m, "content", 0, content, why, sizeof why)) {
        snprintf(err, errn, "%s[%d]: %s", key, i, why);
        return -1;
    }
    return 0;
}
// the segment kind of a message of role at position pos of a conversation, after turns user and assistant messages: an
// optional first "system", then "user" and "assistant" alternating (the templates' rule). -1 with err set (the
// message is key[i])
static int data_role(Str role, int pos, int turns, const char *key, int i, char *err, size_t errn) {
    if (pos == 0 && role.n == 6 && memcmp(role.s, "system", 6) == 0) return SEG_SYSTEM;
    const char *want = turns % 2 ? "assistant" : "user";
    if (role.n != strlen(want) || memcmp(role.s, want, role.n) != 0) {
        snprintf(err, errn, "%s[%d] has role \"%.*s\", expected \"%s\" (roles: an optional first \"system\", then \"user\" "
                 "and \"assistant\" alternating)", key, i, (int)(role.n < 32 ? role.n : 32), role.s, want);
        return -1;
    }
    return turns % 2 ? SEG_ASSISTANT : SEG_USER;
}

// chat: [system] user assistant user assistant ... [user]
static int data_chat(const JsonValue *rec, Pending *p, char *err, size_t errn) {
    const JsonValue *msgs = json_get(rec, "messages");
    if (!msgs) { snprintf(err, errn, "missing field \"messages\""); return -1; }
    if (msgs->type != JSON_ARRAY) { snprintf(err, errn, "field \"messages\" is %s, expected an array", json_type_name(msgs->type)); return -1; }
    Str system = {NULL, 0}, user = {NULL, 0};
    for (int i = 0, turns = 0; i < msgs->count; i++) {
        Str role, content;
        if (data_message(&msgs->items[i], "messages", i, &role, &content, err, errn)) return -1;
        int kind = data_role(role, i, turns, "messages", i, err, errn);
        if (kind < 0) return -1;
        if (kind == SEG_SYSTEM) { system = content; continue; }
        turns++;
        if (kind == SEG_USER) { user = content; continue; }
        // a complete (user, assistant) pair: kept (the template is applied at tokenization)
        if (system.s && p->n_seg == 0) pending_copy(p, SEG_SYSTEM, system);
        pending_copy(p, SEG_USER, user);
        pending_copy(p, SEG_ASSISTANT, content);
    }
    // a trailing user turn has no answer to learn and is dropped
    if (p->n_seg == 0) p->skip = SKIP_NO_PAIR;
    return 0;
}

// preference, plain: the prompt, then the prompt followed by each response (TRL tokenizes them
// joined); the same two responses teach nothing: a skip
static int data_preference_plain(const JsonValue *rec, Pending *p, char *err, size_t errn) {
    Str prompt, chosen, rejected;
    if (data_field(rec, "prompt", 0, &prompt, err, errn) || data_field(rec, "chosen", 0, &chosen, err, errn) ||
        data_field(rec, "rejected", 0, &rejected, err, errn))
        return -1;
    if (chosen.n == rejected.n && memcmp(chosen.s, rejected.s, chosen.n) == 0) { p->skip = SKIP_SAME_RESPONSES; return 0; }
    pending_copy(p, SEG_PROMPT, prompt);
    for (int k = 0; k < 2; k++) {
        Str r = k ? rejected : chosen;
        char *text = (char *)mallocCheck(prompt.n + r.n + 1);
        memcpy(text, prompt.s, prompt.n);
        memcpy(text + prompt.n, r.s, r.n);
        text[prompt.n + r.n] = 0;
        pending_add(p, k ? SEG_REJECTED : SEG_CHOSEN, text, prompt.n + r.n);
    }
    return 0;
}

// a conversational pair is one with a list (of messages) for "prompt", "chosen" or "rejected"
static int pair_is_chat(const JsonValue *rec) {
    static const char *const keys[3] = {"prompt", "chosen", "rejected"};
    for (int k = 0; k < 3; k++)
        if (json_get(rec, keys[k]) && json_get(rec, keys[k])->type == JSON_ARRAY) return 1;
    return 0;
}
// two (valid) messages with the same role and content
static int data_same_message(const JsonValue *x, const JsonValue *y) {
    const JsonValue *v[2][2] = {{json_get(x, "role"), json_get(x, "content")}, {json_get(y, "role"), json_get(y, "content")}};
    for (int k = 0; k < 2; k++)
        if (v[0][k]->string_len != v[1][k]->string_len || memcmp(v[0][k]->string, v[1][k]->string, v[0][k]->string_len) != 0) return 0;
    return 1;
}
// messages [from, to) of key as segments, their roles the continuation of a conversation of *pos messages, *turns
// of them user or assistant ones. 0 ok, -1 with err set
static int pending_messages(Pending *p, const JsonValue *list, const char *key, int from, int to, int *pos, int *turns, char *err,
                            size_t errn) {
    for (int i = from; i < to; i++, (*pos)++) {
        Str role, content;
        if (data_message(&list->items[i], key, i, &role, &content, err, errn)) return -1;
        int kind = data_role(role, *pos, *turns, key, i, err, errn);
        if (kind < 0) return -1;
        *turns += kind != SEG_SYSTEM;
        pending_copy(p, kind, content);
    }
    return 0;
}

// preference, conversational (TRL's form): "chosen" and "rejected" lists of messages, after the
// "prompt" list or, without one, after the leading messages they share (TRL's extract_prompt:
// the shorter list keeps at least its last message). Kept as the prompt's messages, a
// SEG_CHOSEN mark and the chosen completion's messages, a SEG_REJECTED mark and the rejected
// one's; the roles of prompt + completion checked as a chat's.
static int data_preference_chat(const JsonValue *rec, Pending *p, char *err, size_t errn) {
    static const char *const keys[3] = {"prompt", "chosen", "rejected"};
    const JsonValue *list[3];
    for (int k = 0; k < 3; k++) {
        list[k] = json_get(rec, keys[k]);
        if (!list[k] && k == 0) continue;
        if (!list[k]) { snprintf(err, errn, "missing field \"%s\"", keys[k]); return -1; }
        if (list[k]->type != JSON_ARRAY) {
            snprintf(err, errn, "field \"%s\" is %s: a conversational pair's fields are lists of messages", keys[k], json_type_name(list[k]->type));
            return -1;
        }
        if (list[k]->count == 0) { // (TRL fails on an empty prompt too)
            snprintf(err, errn, "field \"%s\" is an empty list: %s", keys[k], k ? "no completion" : "no prompt (without the key: the messages both responses start with)");
            return -1;
        }
    }
    int shared = 0, pos = 0, turns = 0; // (implicit prompt: its messages in chosen and rejected)
    if (!list[0]) {
        int n = list[1]->count < list[2]->count ? list[1]->count : list[2]->count;
        for (; shared < n; shared++) {
            Str role, content;
            if (data_message(&list[1]->items[shared], keys[1], shared, &role, &content, err, errn) ||
                data_message(&list[2]->items[shared], keys[2], shared, &role, &content, err, errn))
                return -1;
            if (!data_same_message(&list[1]->items[shared], &list[2]->items[shared])) break;
        }
        if (shared == n) shared--;
    }
    if (list[0] ? pending_messages(p, list[0], keys[0], 0, list[0]->count, &pos, &turns, err, errn)
                : pending_messages(p, list[1], keys[1], 0, shared, &pos, &turns, err, errn))
        return -1;
    int prompt_pos = pos, prompt_turns = turns;
    for (int k = 1; k < 3; k++) {
        pos = prompt_pos;
        turns = prompt_turns;
        pending_add(p, k == 1 ? SEG_CHOSEN : SEG_REJECTED, (char *)callocCheck(1, 1), 0);
        if (pending_messages(p, list[k], keys[k], shared, list[k]->count, &pos, &turns, err, errn)) return -1;
    }
    int same = list[1]->count == list[2]->count;
    for (int i = shared; i < list[1]->count && same; i++) same = data_same_message(&list[1]->items[i], &list[2]->items[i]);
    if (same) p->skip = SKIP_SAME_RESPONSES;
    else if (!list[0] && shared == 0) {
        snprintf(err, errn, "\"chosen\" and \"rejected\" share no leading message and there is no \"prompt\"");
        return -1;
    }
    return 0;
}

// preference: either form (a list anywhere: conversational)
static int data_preference(const JsonValue *rec, Pending *p, char *err, size_t errn) {
    return pair_is_chat(rec) ? data_preference_chat(rec, p, err, errn) : data_preference_plain(rec, p, err, errn);
}

// a parsed record to segments: 0 ok (p->skip may be set), -1 with err set
static int data_record(const JsonValue *rec, int format, Pending *p, char *err, size_t errn) {
    if (rec->type != JSON_OBJECT) {
        snprintf(err, errn, "the record is %s, expected an object", json_type_name(rec->type));
        return -1;
    }
    Str v[3];
    switch (format) {
    case FORMAT_TEXT:
        if (data_field(rec, "text", 0, &v[0], err, errn)) return -1;
        pending_copy(p, SEG_TEXT, v[0]);
        return 0;
    case FORMAT_PROMPT_RESPONSE: {
        static const char *const names[] = {"prompt", "response"};
        if (data_field(rec, "prompt", 0, &v[0], err, errn) || data_field(rec, "response", 0, &v[1], err, errn)) return -1;
        pending_fill(p, SEG_PROMPT, PROMPT_RESPONSE_PROMPT, 2, names, v);
        pending_fill(p, SEG_RESPONSE, PROMPT_RESPONSE_RESPONSE, 2, names, v);
        return 0;
    }
    case FORMAT_ALPACA: {
        static const char *const names[] = {"instruction", "input", "output"};
        if (data_field(rec, "instruction", 0, &v[0], err, errn) || data_field(rec, "input", 1, &v[1], err, errn) ||
            data_field(rec, "output", 0, &v[2], err, errn))
            return -1;
        pending_fill(p, SEG_PROMPT, v[1].n ? ALPACA_PROMPT_INPUT : ALPACA_PROMPT_NO_INPUT, 3, names, v);
        pending_fill(p, SEG_RESPONSE, ALPACA_RESPONSE, 3, names, v);
        return 0;
    }
    case FORMAT_SAMSUM: {
        static const char *const names[] = {"dialogue", "summary"};
        if (data_field(rec, "dialogue", 0, &v[0], err, errn) || data_field(rec, "summary", 0, &v[1], err, errn)) return -1;
        pending_fill(p, SEG_PROMPT, SAMSUM_PROMPT, 2, names, v);
        pending_fill(p, SEG_RESPONSE, SAMSUM_RESPONSE, 2, names, v);
        return 0;
    }
    case FORMAT_CHAT: return data_chat(rec, p, err, errn);
    case FORMAT_PREFERENCE: return data_preference(rec, p, err, errn);
    }
    snprintf(err, errn, "unknown format %d", format);
    return -1;
}

// appends ids[0..k) with their label to the sample's tokens
static void pending_push(Pending *p, size_t *cap, const int *ids, int k, int label) {
    if ((size_t)p->n + (size_t)k > INT32_MAX) die("record %llu has too many tokens", (unsigned long long)p->record);
    while ((size_t)p->n + (size_t)k > *cap) {
        *cap *= 2;
        p->ids = (int32_t *)realloc(p->ids, *cap * sizeof(int32_t));
        p->label = (uint8_t *)realloc(p->label, *cap);
        if (!p->ids || !p->label) die("out of memory while tokenizing");
    }
    for (int i = 0; i < k; i++) { p->ids[p->n] = ids[i]; p->label[p->n++] = (uint8_t)label; }
}
static void pending_push_id(Pending *p, size_t *cap, int id, int label) {
    if (id >= 0) pending_push(p, cap, &id, 1, label);
}
// text of a chat template, encoded as the rest of a sequence (after_token: it
// follows a special token)
static void pending_push_text(Pending *p, size_t *cap, const Tokenizer *tok, Str text, int after_token, int label) {
    int k;
    int *ids = tok->legacy && after_token ? tokenizer_encode(tok, text.s, text.n, 0, 0, &k)
                                          : tokenizer_encode_continued(tok, text.s, text.n, &k);
    if (!ids) die("out of memory while tokenizing record %llu", (unsigned long long)p->record);
    pending_push(p, cap, ids, k, label);
    free(ids);
}
static void pending_push_filled(Pending *p, size_t *cap, const Tokenizer *tok, const char *tpl, const char *name, Str val,
                                int after_token, int label) {
    size_t len;
    char *text = data_fill(tpl, 1, &name, &val, &len);
    pending_push_text(p, cap, tok, data_str(text, len), after_token, label);
    free(text);
}

// the chat family of a tokenizer (see "Templates"): Llama-3 when it has the header tokens and <|eot_id|>
static int chat_is_llama3(const Tokenizer *tok) {
    return tokenizer_token_id(tok, "<|start_header_id|>") >= 0 && tokenizer_token_id(tok, "<|end_header_id|>") >= 0 &&
           tokenizer_token_id(tok, "<|eot_id|>") >= 0;
}
// its format as a Jinja chat template
static const char *chat_jinja_template(const Tokenizer *tok) { return chat_is_llama3(tok) ? CHAT_JINJA_LLAMA3 : CHAT_JINJA_LLAMA2; }

// messages (SEG_SYSTEM, SEG_USER, SEG_ASSISTANT segments, their roles in a chat's order) to tokens
// with the tokenizer's template family (see "Templates"), an assistant turn's content and end
// token labelled 1; generation_prompt: Llama-3's assistant header after them (Llama-2's answer
// follows its [/INST], its template has none)
static void pending_push_chat(Pending *p, size_t *cap, const Tokenizer *tok, const Segment *msgs, int n, int generation_prompt) {
    if (chat_is_llama3(tok)) { // Llama-3
        static const char *const roles[] = {"system", "user", "assistant"};
        int header = tokenizer_token_id(tok, "<|start_header_id|>"), header_end = tokenizer_token_id(tok, "<|end_header_id|>"),
            eot = tokenizer_token_id(tok, "<|eot_id|>");
        pending_push_id(p, cap, tok->bos_id, 0);
        for (int s = 0; s < n + generation_prompt; s++) {
            int kind = s < n ? msgs[s].kind : SEG_ASSISTANT, label = s < n && kind == SEG_ASSISTANT;
            pending_push_id(p, cap, header, 0);
            pending_push_text(p, cap, tok, data_str(roles[kind - SEG_SYSTEM], strlen(roles[kind - SEG_SYSTEM])), 1, 0);
            pending_push_id(p, cap, header_end, 0);
            pending_push_text(p, cap, tok, data_str(CHAT3_HEADER_END, strlen(CHAT3_HEADER_END)), 1, 0);
            if (s == n) break; // (the generation prompt: the header alone)
            pending_push_text(p, cap, tok, data_strip(data_str(msgs[s].text, msgs[s].len)), 0, label);
            pending_push_id(p, cap, eot, label);
        }
        return;
    }
    Str system = {NULL, 0}; // Llama-2: a system message is folded into the first user turn
    for (int s = 0; s < n; s++) {
        Str text = data_str(msgs[s].text, msgs[s].len);
        if (msgs[s].kind == SEG_SYSTEM) { system = text; continue; }
        if (msgs[s].kind == SEG_ASSISTANT) {
            pending_push_filled(p, cap, tok, CHAT_RESPONSE, "assistant", data_strip(text), 0, 1);
            pending_push_id(p, cap, tok->eos_id, 1);
            continue;
        }
        char *folded = NULL;
        if (system.s) {
            static const char *const names[] = {"system", "user"};
            Str vals[2] = {system, text};
            folded = data_fill(CHAT_SYSTEM, 2, names, vals, &text.n);
            text.s = folded;
            system.s = NULL;
        }
        pending_push_id(p, cap, tok->bos_id, 0);
        pending_push_filled(p, cap, tok, CHAT_PROMPT, "user", data_strip(text), 1, 0);
        free(folded);
    }
}

// a chat's turns to tokens
static void pending_tokenize_chat(Pending *p, const Tokenizer *tok, size_t *cap) {
    for (int s = 0; s < p->n_seg; s++) // an empty answer is nothing to learn, as an empty response is
        if (p->seg[s].kind == SEG_ASSISTANT && data_strip(data_str(p->seg[s].text, p->seg[s].len)).n == 0) { p->skip = SKIP_EMPTY_RESPONSE; return; }
    pending_push_chat(p, cap, tok, p->seg, p->n_seg, 0);
}

// A preference pair as TRL's DPOTrainer tokenizes it: the prompt's tokens and each sequence's
// (prompt and completion together); the prompt is the shortest common prefix of the prompt's
// tokens with the two sequences' (tokens may merge across the prompt's end, a template may
// render the prompt alone otherwise), the completions what follows it. Plain (segments
// prompt, prompt + chosen, prompt + rejected): BOS + encode(text), + EOS for a sequence.
// Conversational (segments: the prompt's messages, SEG_CHOSEN and its messages, SEG_REJECTED
// and its; c the index of SEG_CHOSEN): the chat template's tokens, the prompt's with the
// generation prompt; the template's end tokens, no EOS added. Stored once: the prompt (label 0),
// the chosen completion (label 1), the rejected one (label 2).
static void pending_tokenize_pair(Pending *p, const Tokenizer *tok, size_t *cap, int c) {
    Pending seq[3]; // the prompt's tokens, the chosen sequence's, the rejected sequence's
    size_t seq_cap[3];
    for (int s = 0; s < 3; s++) {
        memset(&seq[s], 0, sizeof seq[s]);
        seq[s].record = p->record;
        seq_cap[s] = 64;
        seq[s].ids = (int32_t *)mallocCheck(seq_cap[s] * sizeof(int32_t));
        seq[s].label = (uint8_t *)mallocCheck(seq_cap[s]);
    }
    if (p->seg[0].kind == SEG_PROMPT) {
        for (int s = 0; s < 3; s++) {
            int k, *e = tokenizer_encode(tok, p->seg[s].text, p->seg[s].len, 0, 0, &k);
            if (!e) die("out of memory while tokenizing record %llu", (unsigned long long)p->record);
            pending_push_id(&seq[s], &seq_cap[s], tok->bos_id, 0);
            pending_push(&seq[s], &seq_cap[s], e, k, 0);
            if (s > 0) pending_push_id(&seq[s], &seq_cap[s], tok->eos_id, 0);
            free(e);
        }
    } else {
        int r = c + 1;
        while (p->seg[r].kind != SEG_REJECTED) r++;
        Segment *conv = (Segment *)mallocCheck((size_t)p->n_seg * sizeof(Segment)); // the prompt's messages, then a completion's
        memcpy(conv, p->seg, (size_t)c * sizeof(Segment));
        pending_push_chat(&seq[0], &seq_cap[0], tok, conv, c, 1);
        memcpy(conv + c, p->seg + c + 1, (size_t)(r - c - 1) * sizeof(Segment));
        pending_push_chat(&seq[1], &seq_cap[1], tok, conv, r - 1, 0);
        memcpy(conv + c, p->seg + r + 1, (size_t)(p->n_seg - r - 1) * sizeof(Segment));
        pending_push_chat(&seq[2], &seq_cap[2], tok, conv, c + p->n_seg - r - 1, 0);
        free(conv);
    }
    int P = seq[0].n;
    for (int s = 1; s < 3; s++) {
        int k = 0;
        while (k < seq[0].n && k < seq[s].n && seq[0].ids[k] == seq[s].ids[k]) k++;
        P = k < P ? k : P;
    }
    pending_push(p, cap, seq[1].ids, P, 0);
    for (int s = 1; s < 3; s++) pending_push(p, cap, seq[s].ids + P, seq[s].n - P, s);
    if (seq[1].n == P || seq[2].n == P) p->skip = SKIP_EMPTY_RESPONSE; // (a tokenizer without EOS, an empty response)
    for (int s = 0; s < 3; s++) { free(seq[s].ids); free(seq[s].label); }
}

// the segments to tokens and labels; sets p->skip when there is nothing to learn
static void pending_tokenize(Pending *p, const Tokenizer *tok) {
    if (p->skip) return;
    size_t cap = 64;
    p->ids = (int32_t *)mallocCheck(cap * sizeof(int32_t));
    p->label = (uint8_t *)mallocCheck(cap);
    p->n = 0;
    for (int s = 0; s < p->n_seg; s++)
        if (p->seg[s].kind == SEG_CHOSEN) { pending_tokenize_pair(p, tok, &cap, s); return; }
    if (p->n_seg > 0 && p->seg[0].kind >= SEG_SYSTEM) { pending_tokenize_chat(p, tok, &cap); return; }
    for (int s = 0; s < p->n_seg; s++) {
        const Segment *g = &p->seg[s];
        int k;
        int *ids = tokenizer_encode(tok, g->text, g->len, 0, 0, &k);
        if (!ids) die("out of memory while tokenizing record %llu", (unsigned long long)p->record);
        if (k == 0 && g->kind != SEG_PROMPT) {
            p->skip = g->kind == SEG_TEXT ? SKIP_EMPTY_TEXT : SKIP_EMPTY_RESPONSE;
            free(ids);
            return;
        }
        int labelled = g->kind != SEG_PROMPT;
        if (g->kind != SEG_RESPONSE) pending_push_id(p, &cap, tok->bos_id, labelled);
        pending_push(p, &cap, ids, k, labelled);
        if (g->kind != SEG_PROMPT) pending_push_id(p, &cap, tok->eos_id, 1);
        free(ids);
    }
}

// ----------------------------------------------------------------------------
// reading records from the file: JSONL lines or the elements of one JSON
// array, in a bounded buffer (a record over DATA_MAX_RECORD_BYTES is an error)

typedef struct {
    FILE *f;
    const char *path;
    unsigned char *buf;       // read buffer
    size_t pos, end;
    uint64_t line;            // line of the next unread byte (1-based)
    int array;                // layout: 1 JSON array, 0 JSONL
    int state;                // array: 0 first element or ']', 1 ',' or ']', 2 after ']'
    char *rec;                // the current record (not NUL-terminated)
    size_t rec_len, rec_cap;
    uint64_t rec_line;
    size_t max_record;
} RecordReader;

#define DATA_READ_BUF (1 << 20)

static int rr_fill(RecordReader *r) {
    if (r->pos < r->end) return 1;
    r->pos = 0;
    r->end = fread(r->buf, 1, DATA_READ_BUF, r->f);
    return r->end > 0;
}
static int rr_peek(RecordReader *r) { return rr_fill(r) ? r->buf[r->pos] : EOF; }
static int rr_get(RecordReader *r) {
    if (!rr_fill(r)) return EOF;
    int c = r->buf[r->pos++];
    if (c == '\n') r->line++;
    return c;
}
static int rr_is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static void rr_skip_space(RecordReader *r) { while (rr_is_space(rr_peek(r))) rr_get(r); }
// appends to the record: 0 ok, -1 when it would grow past the limit
static int rr_append(RecordReader *r, const unsigned char *p, size_t n) {
    if (r->rec_len + n > r->max_record) return -1;
    if (r->rec_len + n > r->rec_cap) {
        size_t cap = r->rec_cap ? r->rec_cap : 4096;
        while (cap < r->rec_len + n) cap *= 2;
        if (cap > r->max_record) cap = r->max_record;
        r->rec = (char *)realloc(r->rec, cap);
        if (!r->rec) die("out of memory reading %s", r->path);
        r->rec_cap = cap;
    }
    memcpy(r->rec + r->rec_len, p, n);
    r->rec_len += n;
    return 0;
}

// opens path and decides the layout from the first non-space byte (after a
// UTF-8 byte order mark): 0 ok, -1 with err set
static int rr_open(RecordReader *r, const char *path, size_t max_record, char *err, size_t errn) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->line = 1;
    r->max_record = max_record;
    r->f = fopen(path, "rb");
    if (!r->f) { snprintf(err, errn, "%s: cannot open: %s", path, strerror(errno)); return -1; }
    r->buf = (unsigned char *)mallocCheck(DATA_READ_BUF);
    if (rr_fill(r) && r->end >= 3 && memcmp(r->buf, "\xEF\xBB\xBF", 3) == 0) r->pos = 3;
    rr_skip_space(r);
    int c = rr_peek(r);
    if (c == EOF) { snprintf(err, errn, "%s: %s (no records)", path, ferror(r->f) ? "read error" : "empty file"); return -1; }
    if (c != '[' && c != '{') {
        snprintf(err, errn, "%s:%llu: expected JSON Lines (an object per line) or a JSON array, but the file starts with byte 0x%02x ('%c')",
                 path, (unsigned long long)r->line, c, c >= 0x20 && c < 0x7f ? c : '?');
        return -1;
    }
    r->array = c == '[';
    if (r->array) rr_get(r);
    return 0;
}
static void rr_close(RecordReader *r) {
    if (r->f) fclose(r->f);
    free(r->buf); free(r->rec);
    memset(r, 0, sizeof *r);
}

static int rr_too_long(RecordReader *r, char *err, size_t errn) {
    snprintf(err, errn, "%s:%llu: record longer than %zu MiB (the limit for one line or array element)", r->path,
             (unsigned long long)r->rec_line, r->max_record >> 20);
    return -1;
}

// next JSONL line that is not blank
static int rr_next_line(RecordReader *r, char *err, size_t errn) {
    for (;;) {
        r->rec_len = 0;
        r->rec_line = r->line;
        int any = 0, blank = 1;
        while (rr_fill(r)) {
            any = 1;
            unsigned char *s = r->buf + r->pos, *nl = (unsigned char *)memchr(s, '\n', r->end - r->pos);
            size_t n = nl ? (size_t)(nl - s) : r->end - r->pos;
            for (size_t i = 0; i < n && blank; i++) blank = rr_is_space(s[i]);
            if (rr_append(r, s, n) != 0) return rr_too_long(r, err, errn);
            r->pos += n + (nl != NULL);
            if (nl) { r->line++; break; }
        }
        if (ferror(r->f)) { snprintf(err, errn, "%s:%llu: read error", r->path, (unsigned long long)r->line); return -1; }
        if (!any) return 0;
        if (!blank) return 1;
    }
}

// next element of the top-level array, found by a scanner that knows strings,
// escapes and nesting; json_parse checks the element itself
static int rr_next_element(RecordReader *r, char *err, size_t errn) {
    r->rec_len = 0;
    rr_skip_space(r);
    int c = rr_peek(r);
    if (r->state == 2) {
        if (c == EOF) return 0;
        snprintf(err, errn, "%s:%llu: unexpected content after the end of the top-level array", r->path, (unsigned long long)r->line);
        return -1;
    }
    if (c == ']') {
        rr_get(r);
        r->state = 2;
        return rr_next_element(r, err, errn);
    }
    if (r->state == 1) {
        if (c != ',') {
            if (c == EOF) snprintf(err, errn, "%s:%llu: unexpected end of file: the top-level array is not closed with ']'", r->path, (unsigned long long)r->line);
            else snprintf(err, errn, "%s:%llu: expected ',' or ']' between array elements", r->path, (unsigned long long)r->line);
            return -1;
        }
        rr_get(r);
        rr_skip_space(r);
        c = rr_peek(r);
        if (c == ']') { snprintf(err, errn, "%s:%llu: trailing comma before ']'", r->path, (unsigned long long)r->line); return -1; }
    }
    if (c == EOF) { snprintf(err, errn, "%s:%llu: unexpected end of file: the top-level array is not closed with ']'", r->path, (unsigned long long)r->line); return -1; }
    r->rec_line = r->line;
    int depth = 0, in_string = 0, escape = 0;
    for (;;) {
        c = rr_peek(r);
        if (c == EOF) break;
        if (!in_string && depth == 0 && r->rec_len > 0 && (c == ',' || c == ']' || rr_is_space(c))) break; // a scalar ends
        unsigned char b = (unsigned char)rr_get(r);
        if (rr_append(r, &b, 1) != 0) return rr_too_long(r, err, errn);
        if (in_string) {
            if (escape) escape = 0;
            else if (b == '\\') escape = 1;
            else if (b == '"') in_string = 0;
        } else if (b == '"') in_string = 1;
        else if (b == '{' || b == '[') depth++;
        else if (b == '}' || b == ']') {
            if (--depth <= 0) break; // (a stray closer at depth 0 is left to json_parse to report)
        }
        if (depth == 0 && !in_string && (b == '"')) break; // a string element ends at its closing quote
    }
    if (ferror(r->f)) { snprintf(err, errn, "%s:%llu: read error", r->path, (unsigned long long)r->line); return -1; }
    r->state = 1;
    return 1;
}

// 1: a record in r->rec (starting at line r->rec_line); 0: end; -1: error
static int rr_next(RecordReader *r, char *err, size_t errn) {
    return r->array ? rr_next_element(r, err, errn) : rr_next_line(r, err, errn);
}

// ----------------------------------------------------------------------------
// the token cache: one file, 8-byte aligned throughout
//   CacheHeader
//   per sample: n int32 token ids, n label bytes, zero padding to 8 bytes
//   CacheSample index[n_samples]   (in file order)
//   CacheSkip skips[n_skips]       (records that give no sample, in file order)
// The checksum covers the header (checksum field zero) and everything after it.

#define DATA_CACHE_MAGIC "L2TTOKC1"
#define DATA_CACHE_VERSION 1u

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t endian;           // 0x01020304 as written by this machine
    uint32_t requested_format; // DataOptions.format (auto or forced)
    uint32_t format;           // the format used
    uint64_t templates_hash;   // the template strings: editing them invalidates every cache
    uint64_t tokenizer_hash;   // the bytes of the tokenizer file, then BOS, EOS and legacy
    uint64_t data_size;        // the data file: size, mtime and its first and last MiB
    int64_t data_mtime_ns;
    uint64_t data_hash;
    uint64_t n_records, n_samples, n_skips, n_tokens;
    uint64_t index_offset, skips_offset, file_size;
    uint64_t checksum;
} CacheHeader;

typedef struct {
    uint64_t offset;    // of the token ids, from the start of the file
    uint64_t record;    // 0-based position of the record in the file
    uint64_t line;      // 1-based line where the record starts
    uint32_t n_tokens;
    uint32_t n_labels;  // labelled tokens (with train_on_prompt 0)
} CacheSample;

typedef struct {
    uint64_t record, line;
    uint32_t reason, pad;
} CacheSkip;

struct DataStore {
    int refs;
    unsigned char *base;  // the cache file, mapped; or the same bytes in memory
    size_t size;
    int mapped;
    CacheHeader h;
    const CacheSample *index;
    const CacheSkip *skips;
    char path[4096];      // the data file, for messages
};

static const int32_t *store_tokens(const DataStore *s, long i) { return (const int32_t *)(s->base + s->index[i].offset); }
static const uint8_t *store_labels(const DataStore *s, long i) { return (const uint8_t *)(store_tokens(s, i) + s->index[i].n_tokens); }
static size_t cache_blob_size(uint32_t n) { return ((size_t)n * 5 + 7) & ~(size_t)7; }

static void store_release(DataStore *s) {
    if (!s || --s->refs > 0) return;
    if (s->mapped) munmap(s->base, s->size);
    else free(s->base);
    free(s);
}

static uint64_t cache_templates_hash(void) {
    static const char *const t[] = {SAMSUM_PROMPT, SAMSUM_RESPONSE, ALPACA_PROMPT_INPUT, ALPACA_PROMPT_NO_INPUT, ALPACA_RESPONSE,
                                    PROMPT_RESPONSE_PROMPT, PROMPT_RESPONSE_RESPONSE, CHAT_SYSTEM, CHAT_PROMPT, CHAT_RESPONSE, CHAT3_HEADER_END};
    uint64_t h = DATA_HASH_SEED;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) h = data_hash_bytes(h, t[i], strlen(t[i]) + 1);
    return h;
}

static uint64_t cache_checksum(const CacheHeader *h, uint64_t body_hash) {
    CacheHeader c = *h;
    c.checksum = 0;
    return splitmix64(data_hash_words(body_hash, &c, sizeof c));
}

// the data file's identity: size, mtime and a hash of its first and last MiB
// (a full hash would read a multi-GB file on every start). 0 ok, -1 errno set.
static int data_identity(const char *path, CacheHeader *h) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISREG(st.st_mode)) { errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL; return -1; }
    h->data_size = (uint64_t)st.st_size;
    h->data_mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    size_t mb = 1 << 20, n = h->data_size < 2 * mb ? (size_t)h->data_size : 2 * mb;
    unsigned char *buf = (unsigned char *)mallocCheck(n);
    ssize_t a = pread(fd, buf, n < mb ? n : mb, 0), b = 0;
    if (n > mb) b = pread(fd, buf + mb, n - mb, (off_t)(h->data_size - (n - mb)));
    close(fd);
    int ok = a >= 0 && b >= 0 && (size_t)(a + b) == n;
    h->data_hash = data_hash_bytes(DATA_HASH_SEED, buf, n);
    free(buf);
    if (!ok) { errno = EIO; return -1; }
    return 0;
}

// opens and checks a cache; NULL with why set ("" when there is none)
static DataStore *cache_open(const char *path, const CacheHeader *want, char *why, size_t whyn) {
    why[0] = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        if (errno != ENOENT) snprintf(why, whyn, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    CacheHeader h;
    if (fstat(fd, &st) != 0 || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) { snprintf(why, whyn, "truncated (no header)"); close(fd); return NULL; }
    const char *bad = NULL;
    if (memcmp(h.magic, DATA_CACHE_MAGIC, 8) != 0) bad = "bad magic (not a token cache)";
    else if (h.version != DATA_CACHE_VERSION || h.endian != 0x01020304u) bad = "written by another version";
    else if (h.templates_hash != want->templates_hash) bad = "the prompt templates changed";
    else if (h.requested_format != want->requested_format) bad = "built for another --data_format";
    else if (h.tokenizer_hash != want->tokenizer_hash) bad = "the tokenizer (or its configuration) changed";
    else if (h.data_size != want->data_size || h.data_mtime_ns != want->data_mtime_ns || h.data_hash != want->data_hash)
        bad = "the data file changed";
    else if (h.format < FORMAT_TEXT || h.format > FORMAT_PREFERENCE || (h.requested_format != FORMAT_AUTO && h.format != h.requested_format))
        bad = "bad format"; // (a forged header's: the rows are read as the format says)
    else if (h.file_size != (uint64_t)st.st_size) bad = "truncated or wrong size";
    else if (h.index_offset < sizeof h || h.index_offset % 8 || h.index_offset > h.file_size || h.n_samples > (h.file_size - h.index_offset) / sizeof(CacheSample) ||
             h.skips_offset != h.index_offset + h.n_samples * sizeof(CacheSample) ||
             h.n_skips > (h.file_size - h.skips_offset) / sizeof(CacheSkip) ||
             h.file_size != h.skips_offset + h.n_skips * sizeof(CacheSkip) || h.n_samples + h.n_skips != h.n_records)
        bad = "inconsistent counts";
    if (bad) { snprintf(why, whyn, "%s", bad); close(fd); return NULL; }
    void *base = mmap(NULL, (size_t)h.file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) { snprintf(why, whyn, "cannot mmap: %s", strerror(errno)); return NULL; }
    DataStore *s = (DataStore *)callocCheck(1, sizeof *s);
    s->refs = 1;
    s->base = (unsigned char *)base;
    s->size = (size_t)h.file_size;
    s->mapped = 1;
    s->h = h;
    s->index = (const CacheSample *)(s->base + h.index_offset);
    s->skips = (const CacheSkip *)(s->base + h.skips_offset);
    uint64_t body = data_hash_words(DATA_HASH_SEED, s->base + sizeof h, s->size - sizeof h);
    if (cache_checksum(&h, body) != h.checksum) bad = "checksum mismatch";
    // the index must tile the sample area exactly, in order (so no sample can point outside the file),
    // and each sample's label flags be 0 or 1 and add up to its n_labels (a forged checksum must not
    // make the loss normaliser disagree with the targets)
    uint64_t at = sizeof h, tokens = 0;
    for (uint64_t i = 0; !bad && i < h.n_samples; i++) {
        const CacheSample *e = &s->index[i];
        if (e->offset != at || e->n_tokens == 0 || e->n_labels > e->n_tokens || cache_blob_size(e->n_tokens) > h.index_offset - at ||
            e->record >= h.n_records || (i > 0 && e->record <= s->index[i - 1].record)) {
            bad = "bad index";
            break;
        }
        const uint8_t *lab = store_labels(s, (long)i);
        uint32_t labels = 0, flags_ok = 1, most = h.format == FORMAT_PREFERENCE ? 2 : 1; // (a pair's: 0 prompt, 1 chosen, 2 rejected)
        for (uint32_t t = 0; t < e->n_tokens; t++) { labels += lab[t] != 0; flags_ok &= lab[t] <= most; }
        if (!flags_ok || labels != e->n_labels) bad = "bad label flags";
        at += cache_blob_size(e->n_tokens);
        tokens += e->n_tokens;
    }
    if (!bad && (at != h.index_offset || tokens != h.n_tokens)) bad = "bad index";
    for (uint64_t i = 0; !bad && i < h.n_skips; i++) { // in record order, with a reason a record can have
        const CacheSkip *k = &s->skips[i];
        if (k->reason < SKIP_EMPTY_RESPONSE || k->reason > SKIP_SAME_RESPONSES || k->reason == SKIP_TRUNCATED || k->record >= h.n_records || (i > 0 && k->record <= s->skips[i - 1].record))
            bad = "bad skip list";
    }
    if (bad) { snprintf(why, whyn, "%s", bad); store_release(s); return NULL; }
    return s;
}

// writes the cache to a temporary file (renamed into place at the end) or,
// when f is NULL, into memory; every write is a multiple of 8 bytes. The
// samples go out as they come; their index and the list of skipped records
// are kept here and written after them, then the header at the start.
typedef struct {
    FILE *f;
    char tmp[4200];
    unsigned char *mem;
    size_t mem_cap;
    uint64_t size, hash;
    int failed;
    CacheHeader h;                        // the identity fields, and the counts as records come
    CacheSample *index; size_t cap_index; // (h.n_samples)
    CacheSkip *skips; size_t cap_skips;   // (h.n_skips)
    unsigned char *blob; size_t blob_cap; // one sample's bytes
} CacheWriter;

static void cw_write(CacheWriter *w, const void *p, size_t n) {
    w->hash = data_hash_words(w->hash, p, n);
    if (w->f) {
        if (fwrite(p, 1, n, w->f) != n) w->failed = 1;
    } else {
        if (w->size + n > w->mem_cap) {
            size_t cap = w->mem_cap ? w->mem_cap : 1 << 20;
            while (cap < w->size + n) cap *= 2;
            w->mem = (unsigned char *)realloc(w->mem, cap);
            if (!w->mem) die("out of memory holding the tokenized data");
            w->mem_cap = cap;
        }
        memcpy(w->mem + w->size, p, n);
    }
    w->size += n;
}

// ----------------------------------------------------------------------------
// loading: tokenize the file into a store (cache file or memory)

static int data_fail(Dataset *ds, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int data_fail(Dataset *ds, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ds->error, sizeof ds->error, fmt, ap);
    va_end(ap);
    if (!ds->quiet) fprintf(stderr, "error: %s\n", ds->error);
    return -1;
}

// a writer for the cache of key (cache_path NULL: in memory), past a zeroed header; a
// cache file that cannot be created keeps the tokens in memory (ds->cache_path then "")
static void cw_begin(CacheWriter *w, Dataset *ds, const char *cache_path, const CacheHeader *key) {
    memset(w, 0, sizeof *w);
    w->hash = DATA_HASH_SEED;
    if (cache_path) {
        snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d", cache_path, (int)getpid());
        w->f = fopen(w->tmp, "wb");
        if (!w->f && !ds->quiet)
            printf("data: cannot write the token cache %s (%s): keeping the tokens in memory\n", w->tmp, strerror(errno));
        if (!w->f) ds->cache_path[0] = 0;
    }
    w->h = *key;
    uint64_t zero_header[sizeof(CacheHeader) / 8] = {0};
    if (w->f) { if (fwrite(zero_header, 1, sizeof w->h, w->f) != sizeof w->h) w->failed = 1; }
    else { w->mem_cap = 1 << 20; w->mem = (unsigned char *)mallocCheck(w->mem_cap); memset(w->mem, 0, sizeof w->h); }
    w->size = sizeof w->h;
    w->cap_index = 1024;
    w->cap_skips = 16;
    w->index = (CacheSample *)mallocCheck(w->cap_index * sizeof(CacheSample));
    w->skips = (CacheSkip *)mallocCheck(w->cap_skips * sizeof(CacheSkip));
}

// one tokenized record: a skipped one into the skip list, a sample's tokens and
// labels into the file and its entry into the index
static void cw_add(CacheWriter *w, const Pending *p) {
    CacheHeader *h = &w->h;
    if (p->skip) {
        if (h->n_skips == w->cap_skips) w->skips = (CacheSkip *)realloc(w->skips, (w->cap_skips *= 2) * sizeof(CacheSkip));
        if (!w->skips) die("out of memory");
        CacheSkip s = {p->record, p->line, (uint32_t)p->skip, 0};
        w->skips[h->n_skips++] = s;
        return;
    }
    size_t sz = cache_blob_size((uint32_t)p->n);
    if (sz > w->blob_cap) { w->blob_cap = 2 * sz; free(w->blob); w->blob = (unsigned char *)mallocCheck(w->blob_cap); }
    memset(w->blob, 0, sz);
    memcpy(w->blob, p->ids, (size_t)p->n * 4);
    memcpy(w->blob + (size_t)p->n * 4, p->label, (size_t)p->n);
    uint32_t labels = 0;
    for (int t = 0; t < p->n; t++) labels += p->label[t] != 0;
    if (h->n_samples == w->cap_index) w->index = (CacheSample *)realloc(w->index, (w->cap_index *= 2) * sizeof(CacheSample));
    if (!w->index) die("out of memory");
    CacheSample e = {w->size, p->record, p->line, (uint32_t)p->n, labels};
    w->index[h->n_samples++] = e;
    h->n_tokens += (uint64_t)p->n;
    cw_write(w, w->blob, sz);
}

// the index and the skip list after the samples, then the header (offsets,
// checksum) at the start: the cache file renamed to cache_path and read back
// through cache_open, or the store in memory. NULL after an error (said)
static DataStore *cw_finish(CacheWriter *w, Dataset *ds, const char *cache_path) {
    CacheHeader *h = &w->h;
    h->index_offset = w->size;
    cw_write(w, w->index, h->n_samples * sizeof(CacheSample));
    h->skips_offset = w->size;
    cw_write(w, w->skips, h->n_skips * sizeof(CacheSkip));
    h->file_size = w->size;
    memcpy(h->magic, DATA_CACHE_MAGIC, 8);
    h->version = DATA_CACHE_VERSION;
    h->endian = 0x01020304u;
    h->checksum = cache_checksum(h, w->hash);
    if (w->f) {
        int bad = w->failed || fseek(w->f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof *h, w->f) != sizeof *h;
        bad |= fflush(w->f) != 0;
        bad |= fsync(fileno(w->f)) != 0;
        bad |= fclose(w->f) != 0;
        w->f = NULL;
        if (bad || rename(w->tmp, cache_path) != 0) {
            data_fail(ds, "%s: writing the token cache failed: %s", cache_path, strerror(errno));
            return NULL;
        }
        char why[256];
        DataStore *s = cache_open(cache_path, h, why, sizeof why);
        if (!s) data_fail(ds, "%s: the token cache just written does not read back: %s", cache_path, why);
        return s;
    }
    memcpy(w->mem, h, sizeof *h);
    DataStore *s = (DataStore *)callocCheck(1, sizeof *s);
    s->refs = 1;
    s->base = w->mem;
    s->size = (size_t)w->size;
    s->h = *h;
    s->index = (const CacheSample *)(s->base + h->index_offset);
    s->skips = (const CacheSkip *)(s->base + h->skips_offset);
    w->mem = NULL;
    return s;
}

// what the writer holds; a temporary file that was not renamed into place is removed
static void cw_free(CacheWriter *w) {
    if (w->f) fclose(w->f);
    if (w->tmp[0]) remove(w->tmp); // (already renamed when all went well)
    free(w->mem); free(w->index); free(w->skips); free(w->blob);
}

#define DATA_BATCH_RECORDS 1024
#define DATA_BATCH_BYTES ((size_t)8 << 20)

// the error for a record of an auto-detected file whose keys name no format
static int data_unknown_format(Dataset *ds, const JsonValue *v, const char *path, uint64_t line) {
    char keys[256] = "";
    for (int i = 0; i < v->count && strlen(keys) < 200; i++)
        snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%s\"%.40s\"", i ? ", " : "", v->keys[i]);
    return data_fail(ds, "%s:%llu: cannot tell the data format from the keys {%s}: expected \"text\", \"prompt\"+\"response\", "
                     "\"instruction\"+\"input\"+\"output\", \"dialogue\"+\"summary\", \"messages\" or \"prompt\"+\"chosen\"+\"rejected\" (or set --data_format)",
                     path, (unsigned long long)line, keys);
}

// the record in rr into p's segments, numbered by h's count of records; the first
// record of an auto-detected file decides *format (and h->format), the first pair *chat
// (-1 until then: 1 conversational, 0 plain; one form per file). 0 ok, -1 failed (said; p empty)
static int data_parse_record(Dataset *ds, const RecordReader *rr, const char *path, int *format, int *chat, CacheHeader *h, Pending *p) {
    JsonValue v;
    char jerr[512], err[768];
    if (json_parse(rr->rec, rr->rec_len, &v, jerr, sizeof jerr) != 0)
        return data_fail(ds, "%s:%llu: invalid JSON: %s", path, (unsigned long long)rr->rec_line, jerr);
    if (*format == FORMAT_AUTO) {
        *format = v.type == JSON_OBJECT ? data_detect_format(&v) : FORMAT_AUTO;
        if (*format == FORMAT_AUTO && v.type == JSON_OBJECT) {
            data_unknown_format(ds, &v, path, rr->rec_line);
            json_free(&v);
            return -1;
        }
        h->format = (uint32_t)*format;
    }
    p->record = h->n_records++;
    p->line = rr->rec_line;
    int rc = data_record(&v, *format, p, err, sizeof err);
    if (rc != 0) data_fail(ds, "%s:%llu: %s (format %s)", path, (unsigned long long)rr->rec_line, err, data_format_names[*format]);
    else if (*format == FORMAT_PREFERENCE && *chat >= 0 && pair_is_chat(&v) != *chat)
        rc = data_fail(ds, "%s:%llu: a %s pair among %s ones: a file holds one form", path, (unsigned long long)rr->rec_line,
                       *chat ? "plain (strings)" : "conversational (lists of messages)", *chat ? "conversational" : "plain");
    else if (*format == FORMAT_PREFERENCE) *chat = pair_is_chat(&v);
    json_free(&v);
    if (rc != 0) pending_clear(p);
    return rc;
}

// reads and parses the next records into batch[0..*n) (serially: the file is read in
// order), up to a batch's count or bytes (*bytes). 1: there may be more, 0: the end
// of the file, -1: failed (said; batch[0..*n) still holds the records before)
static int data_read_batch(Dataset *ds, RecordReader *rr, const char *path, int *format, int *chat, CacheHeader *h, Pending *batch,
                           int *n, size_t *bytes) {
    char err[768];
    *n = 0;
    *bytes = 0;
    while (*n < DATA_BATCH_RECORDS && *bytes < DATA_BATCH_BYTES) {
        int got = rr_next(rr, err, sizeof err);
        if (got < 0) return data_fail(ds, "%s", err);
        if (got == 0) return 0;
        if (data_parse_record(ds, rr, path, format, chat, h, &batch[*n]) != 0) return -1;
        *bytes += rr->rec_len;
        (*n)++;
    }
    return 1;
}

// the batch's records tokenized in parallel (each writes only its own Pending)
static void data_tokenize_batch(Pending *batch, int n, const Tokenizer *tok) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int i = 0; i < n; i++) pending_tokenize(&batch[i], tok);
}

// Streams the file, tokenizes it and writes the store. cache_path NULL: in
// memory only. *key holds the identity fields; the counts are filled here.
static DataStore *data_build(Dataset *ds, const char *path, const char *cache_path, CacheHeader *key, const Tokenizer *tok) {
    char err[768];
    RecordReader rr;
    if (rr_open(&rr, path, DATA_MAX_RECORD_BYTES, err, sizeof err) != 0) { rr_close(&rr); data_fail(ds, "%s", err); return NULL; }
    CacheWriter w;
    cw_begin(&w, ds, cache_path, key);
    Pending *batch = (Pending *)callocCheck(DATA_BATCH_RECORDS, sizeof(Pending));
    int format = (int)key->requested_format, chat = -1, status = 1; // status 1: records to read, 0: the end of the file, -1: failed (said)
    char what[300];
    struct stat fst;
    snprintf(what, sizeof what, "tokenizing %s", path);
    Progress bar = progress_begin(stderr, what, fstat(fileno(rr.f), &fst) == 0 ? fst.st_size / 1e6 : 0, "MB");
    if (ds->quiet) bar.quiet_ms = INFINITY;
    double done = 0; // bytes of records read
    while (status > 0) {
        int n;
        size_t bytes;
        status = data_read_batch(ds, &rr, path, &format, &chat, &w.h, batch, &n, &bytes);
        if (status >= 0) data_tokenize_batch(batch, n, tok); // in parallel, then written in order
        progress_update(&bar, (done += bytes) / 1e6);
        for (int i = 0; i < n; i++) {
            if (status >= 0) cw_add(&w, &batch[i]);
            pending_clear(&batch[i]);
        }
        if (w.failed && status >= 0) status = data_fail(ds, "%s: writing the token cache failed: %s (set --data_cache_dir elsewhere)", w.tmp, strerror(errno));
    }
    rr_close(&rr);
    if (status == 0) progress_end(&bar, done / 1e6);
    free(batch);
    if (status == 0 && w.h.n_records == 0) status = data_fail(ds, "%s: no records (an empty JSON array)", path);
    if (status == 0 && w.h.n_samples > INT32_MAX) status = data_fail(ds, "%s: more than %d samples", path, INT32_MAX);
    DataStore *s = status == 0 ? cw_finish(&w, ds, cache_path) : NULL;
    cw_free(&w);
    return s;
}

// ----------------------------------------------------------------------------
// selection (slice, skips, max_samples) and rows

// "[a:b]" with optional split name, a and b integers (negative: from the end)
// or percentages; HF datasets' rounding "closest" (round half to even)
static int data_parse_slice(const char *spec, long n, long *from, long *to, char *err, size_t errn) {
    *from = 0;
    *to = n;
    if (!spec || !spec[0]) return 0;
    const char *p = spec;
    while (*p && *p != '[' && *p != ':') p++; // a split name ("train") is allowed and ignored
    int bracket = *p == '[';
    if (bracket) p++;
    double v[2];
    int has[2] = {0, 0}, pct[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        char *e;
        if (*p != ':' && *p != ']' && *p) {
            long long x = strtoll(p, &e, 10);
            if (e == p) goto bad;
            v[k] = (double)x;
            has[k] = 1;
            p = e;
            if (*p == '%') { pct[k] = 1; p++; if (x < -100 || x > 100) goto bad; }
        }
        if (k == 0) { if (*p != ':') goto bad; p++; }
    }
    if (bracket) { if (*p != ']') goto bad; p++; }
    if (*p) goto bad;
    if (has[0] && has[1] && pct[0] != pct[1]) { snprintf(err, errn, "slice '%s': both ends must be counts or both percentages", spec); return -1; }
    for (int k = 0; k < 2; k++) {
        if (!has[k]) continue;
        long x = pct[k] ? (long)nearbyint(v[k] * (double)n / 100.0) : (long)v[k];
        if (x < 0) x = n + x > 0 ? n + x : 0;
        if (x > n) x = n;
        *(k ? to : from) = x;
    }
    return 0;
bad:
    snprintf(err, errn, "slice '%s': expected e.g. \"[:10%%]\", \"[10%%:20%%]\", \"[:100]\" or \"[50:]\"", spec);
    return -1;
}

// A preference sample (a pair) is two rows: its prompt followed by the chosen completion,
// and by the rejected one, each cut to max_seq_len at the end (TRL's keep_start). Its parts
// in the store: the prompt's *P tokens, the chosen completion's *nc, the rejected one's *nr.
static void pair_parts(const DataStore *st, long i, uint32_t *P, uint32_t *nc, uint32_t *nr) {
    const uint8_t *lab = store_labels(st, i);
    *P = *nc = *nr = 0;
    for (uint32_t t = 0; t < st->index[i].n_tokens; t++) *(lab[t] == 0 ? P : lab[t] == 1 ? nc : nr) += 1;
}
// the length of sequence s (0 chosen, 1 rejected) of sample i after the cut; *P its prompt's
static uint32_t pair_len(const Dataset *ds, long i, int s, uint32_t *P) {
    uint32_t nc, nr, n;
    pair_parts(ds->store, i, P, &nc, &nr);
    n = *P + (s ? nr : nc);
    return n < (uint32_t)ds->max_seq_len ? n : (uint32_t)ds->max_seq_len;
}

// is any target within the first max_seq_len tokens labelled (padding)? (a pair: how many of
// its two completions' tokens are; none when the prompt fills max_seq_len)
static uint32_t data_labels_within(const Dataset *ds, long i) {
    const CacheSample *e = &ds->store->index[i];
    if (ds->format == FORMAT_PREFERENCE) {
        uint32_t P, c = pair_len(ds, i, 0, &P) + pair_len(ds, i, 1, &P), first = P ? P : 1; // (no token predicts the first)
        return c > 2 * first ? c - 2 * first : 0;
    }
    uint32_t n = e->n_tokens < (uint32_t)ds->max_seq_len ? e->n_tokens : (uint32_t)ds->max_seq_len;
    if (n < 2) return 0;
    if (ds->train_on_prompt) return n - 1;
    const uint8_t *lab = store_labels(ds->store, i);
    uint32_t c = 0;
    for (uint32_t t = 1; t < n; t++) c += lab[t];
    return c;
}

static long dataset_row_len(const Dataset *ds, long r) {
    if (ds->packing) return r == ds->n_rows - 1 ? ds->last_row_len : ds->max_seq_len;
    if (ds->format == FORMAT_PREFERENCE) { // (a pair's longer row)
        uint32_t P, c = pair_len(ds, ds->samples[r], 0, &P), j = pair_len(ds, ds->samples[r], 1, &P);
        return c > j ? c : j;
    }
    uint32_t n = ds->store->index[ds->samples[r]].n_tokens;
    return n < (uint32_t)ds->max_seq_len ? (long)n : ds->max_seq_len;
}

// tokens of row r and, in flags, whether each is labelled; returns its length
static long dataset_row(const Dataset *ds, long r, int *tokens, int *flags) {
    long len = dataset_row_len(ds, r);
    if (!ds->packing) {
        long s = ds->samples[r];
        const int32_t *tk = store_tokens(ds->store, s);
        const uint8_t *lab = store_labels(ds->store, s);
        for (long t = 0; t < len; t++) { tokens[t] = tk[t]; flags[t] = ds->train_on_prompt || lab[t]; }
        return len;
    }
    // packing: find the sample holding the row's first token, then walk on
    int64_t g = (int64_t)r * ds->max_seq_len;
    long lo = 0, hi = ds->n_samples - 1;
    while (lo < hi) { // last k with cum[k] <= g
        long mid = (lo + hi + 1) / 2;
        if (ds->cum[mid] <= g) lo = mid; else hi = mid - 1;
    }
    long k = lo;
    int64_t off = g - ds->cum[k];
    for (long t = 0; t < len; t++) {
        while (off == (int64_t)ds->store->index[ds->samples[k]].n_tokens) { k++; off = 0; }
        long s = ds->samples[k];
        tokens[t] = store_tokens(ds->store, s)[off];
        flags[t] = ds->train_on_prompt || store_labels(ds->store, s)[off];
        off++;
    }
    return len;
}

// a row into tokens/targets of width T (padding after it); returns its labels
static long dataset_fill_row(const Dataset *ds, long r, int T, int pad_id, int *tokens, int *targets) {
    long len = dataset_row(ds, r, tokens, targets); // targets holds the label flags first...
    long labels = 0;
    for (long t = 0; t < len; t++) { // ...and is shifted in place: flag t+1 is read before it is overwritten
        int lab = t + 1 < len && targets[t + 1];
        targets[t] = lab ? tokens[t + 1] : -100;
        labels += lab;
    }
    for (long t = len; t < T; t++) { tokens[t] = pad_id; targets[t] = -100; }
    return labels;
}

// the real tokens of row r (a pair's: both sequences')
static long dataset_row_tokens(const Dataset *ds, long r) {
    uint32_t P;
    if (ds->format != FORMAT_PREFERENCE) return dataset_row_len(ds, r);
    return (long)pair_len(ds, ds->samples[r], 0, &P) + pair_len(ds, ds->samples[r], 1, &P);
}

// Pair r's sequence s (0 chosen, 1 rejected) into tokens/targets of width T (padding after
// it): the targets are the completion's tokens (labelled), -100 elsewhere. Returns its labels.
static long dataset_fill_sequence(const Dataset *ds, long r, int s, int T, int pad_id, int *tokens, int *targets) {
    long i = ds->samples[r];
    uint32_t P, nc, nr, len = pair_len(ds, i, s, &P);
    pair_parts(ds->store, i, &P, &nc, &nr);
    const int32_t *tk = store_tokens(ds->store, i);
    for (uint32_t t = 0; t < len; t++) tokens[t] = t < P ? tk[t] : tk[t + (s ? nc : 0)];
    for (uint32_t t = 0; t < len; t++) targets[t] = t + 1 < len && t + 1 >= P ? tokens[t + 1] : -100;
    for (long t = len; t < T; t++) { tokens[t] = pad_id; targets[t] = -100; }
    return (long)len - (P ? P : 1); // (a prompt of no tokens, conversational: its first token is no target)
}
// Pairs [first, first + n): their chosen sequences in rows 0 .. n - 1 of tokens/targets (width
// T), their rejected ones in rows n .. 2n - 1 (TRL's order). Returns their labels.
static long dataset_fill_pairs(const Dataset *ds, const int32_t *rows, int n, int T, int pad_id, int *tokens, int *targets) {
    long labels = 0;
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < n; b++) {
            size_t at = ((size_t)s * n + b) * T;
            labels += dataset_fill_sequence(ds, rows[b], s, T, pad_id, tokens + at, targets + at);
        }
    return labels;
}

// rows and their label counts from ds->samples (after load and after split)
static void dataset_build_rows(Dataset *ds) {
    free(ds->row_labels); free(ds->cum);
    ds->row_labels = NULL;
    ds->cum = NULL;
    ds->n_tokens = ds->n_labels = ds->dropped_tokens = 0;
    if (!ds->packing) {
        ds->n_rows = ds->n_samples;
        ds->row_labels = (int32_t *)mallocCheck((size_t)ds->n_rows * sizeof(int32_t));
        for (long r = 0; r < ds->n_rows; r++) {
            ds->row_labels[r] = (int32_t)data_labels_within(ds, ds->samples[r]);
            ds->n_tokens += dataset_row_tokens(ds, r);
            ds->n_labels += ds->row_labels[r];
        }
        return;
    }
    ds->cum = (int64_t *)mallocCheck((size_t)(ds->n_samples + 1) * sizeof(int64_t));
    ds->cum[0] = 0;
    for (long k = 0; k < ds->n_samples; k++) ds->cum[k + 1] = ds->cum[k] + ds->store->index[ds->samples[k]].n_tokens;
    int64_t total = ds->cum[ds->n_samples], L = ds->max_seq_len;
    ds->n_rows = (long)(total / L);
    ds->last_row_len = (int)L;
    if (ds->n_rows == 0) { ds->n_rows = 1; ds->last_row_len = (int)total; } // the only row: keep it short
    ds->dropped_tokens = (long)(total - ((int64_t)(ds->n_rows - 1) * L + ds->last_row_len));
    ds->row_labels = (int32_t *)mallocCheck((size_t)ds->n_rows * sizeof(int32_t));
    int *tok = (int *)mallocCheck((size_t)L * sizeof(int)), *flags = (int *)mallocCheck((size_t)L * sizeof(int));
    for (long r = 0; r < ds->n_rows; r++) {
        long len = dataset_row(ds, r, tok, flags), c = 0;
        for (long t = 1; t < len; t++) c += flags[t];
        ds->row_labels[r] = (int32_t)c;
        ds->n_tokens += len;
        ds->n_labels += c;
    }
    free(tok); free(flags);
}

static void data_note_skip(Dataset *ds, uint64_t line, int reason) {
    if (ds->n_skipped < DATA_SKIP_LIST) {
        ds->skip_line[ds->n_skipped] = (long)line;
        ds->skip_reason[ds->n_skipped] = reason;
    }
    ds->n_skipped++;
}

static void dataset_free(Dataset *ds) {
    store_release(ds->store);
    free(ds->samples); free(ds->row_labels); free(ds->cum); free(ds->ref_logps);
    ds->store = NULL;
    ds->ref_logps = NULL;
    ds->samples = NULL;
    ds->row_labels = NULL;
    ds->cum = NULL;
    ds->n_samples = ds->n_rows = 0;
}

static void dataset_report(const Dataset *ds, const char *path) {
    if (ds->quiet) return;
    const char *cache = ds->cache_status == CACHE_REUSED ? "reused" : ds->cache_status == CACHE_NONE ? "none (in memory)" : "written";
    printf("data: %s: format %s, %ld samples of %ld records, %s max_seq_len %d: %ld rows, %ld tokens, %ld labels; cache %s%s%s\n",
           path, data_format_names[ds->format], ds->n_samples, ds->n_records, ds->packing ? "packed to" : "padded, truncated to",
           ds->max_seq_len, ds->n_rows, ds->n_tokens, ds->n_labels, cache, ds->cache_path[0] ? " " : "", ds->cache_path);
    if (ds->packing && ds->dropped_tokens)
        printf("data: %s: packing dropped the last %ld tokens (a row shorter than max_seq_len)\n", path, ds->dropped_tokens);
    if (ds->n_skipped) {
        printf("data: %s: skipped %ld samples:", path, ds->n_skipped);
        for (long i = 0; i < ds->n_skipped && i < DATA_SKIP_LIST; i++)
            printf("%s line %ld: %s", i ? ";" : "", ds->skip_line[i], skip_reason_names[ds->skip_reason[i]]);
        printf("%s\n", ds->n_skipped > DATA_SKIP_LIST ? "; ..." : "");
    }
}

// ds reset and set from the options o, which are checked; the DataFormat asked
// for (FORMAT_AUTO: detect it), or -1 with an error naming the file
static int data_options(Dataset *ds, const char *path, const DataOptions *o) {
    memset(ds, 0, sizeof *ds);
    ds->quiet = o->quiet;
    ds->train_on_prompt = o->train_on_prompt != 0;
    ds->packing = o->packing != 0;
    ds->max_seq_len = o->max_seq_len;
    if (o->max_seq_len < 2) return data_fail(ds, "%s: max_seq_len must be at least 2 (got %d)", path, o->max_seq_len);
    if (o->max_samples < 0) return data_fail(ds, "%s: max_samples must be >= 0 (got %ld)", path, o->max_samples);
    int requested = -1;
    const char *fmt = o->format && o->format[0] ? o->format : "auto";
    for (int f = 0; f <= FORMAT_PREFERENCE; f++)
        if (strcmp(fmt, data_format_names[f]) == 0) requested = f;
    if (requested < 0)
        return data_fail(ds, "%s: unknown data format '%s' (expected auto, text, prompt_response, alpaca, samsum, chat or preference)", path, fmt);

    return requested;
}

// what the tokens depend on, into key: the format asked for, the templates, the data
// file, the tokenizer file (*tokenizer_known: whether it could be read; the cache
// needs it) and what tokenizer_configure set: BOS, EOS, legacy. 0 ok, -1 when the data file cannot be read (said)
static int data_cache_key(Dataset *ds, const char *path, const Tokenizer *tok, const char *tokenizer_path, int requested,
                          CacheHeader *key, int *tokenizer_known) {
    memset(key, 0, sizeof *key);
    *tokenizer_known = 0;
    key->requested_format = (uint32_t)requested;
    key->format = (uint32_t)requested;
    key->templates_hash = cache_templates_hash();
    if (data_identity(path, key) != 0) return data_fail(ds, "%s: cannot read: %s", path, strerror(errno));
    size_t tlen;
    char *tbytes = tokenizer_path && tokenizer_path[0] ? read_file(tokenizer_path, &tlen) : NULL;
    *tokenizer_known = tbytes != NULL;
    int32_t special[3] = {tok->bos_id, tok->eos_id, tok->legacy};
    if (tbytes) key->tokenizer_hash = data_hash_bytes(data_hash_bytes(DATA_HASH_SEED, tbytes, tlen), special, sizeof special);
    free(tbytes);
    return 0;
}

// where the token cache of path goes, into ds->cache_path: in cache_dir (made if
// need be), named by the data file's real path, or next to the file. NULL when it
// can be written there, else why not
static const char *data_cache_place(Dataset *ds, const char *path, const char *cache_dir) {
    if (cache_dir && cache_dir[0]) {
        if (mkdir_p(cache_dir) != 0) return strerror(errno);
        char real[4096];
        const char *name = realpath(path, real) ? real : path, *base = strrchr(path, '/');
        snprintf(ds->cache_path, sizeof ds->cache_path, "%s/%s.%016llx.tokcache", cache_dir, base ? base + 1 : path,
                 (unsigned long long)data_hash_bytes(DATA_HASH_SEED, name, strlen(name)));
    } else {
        snprintf(ds->cache_path, sizeof ds->cache_path, "%s.tokcache", path);
    }
    // a directory without any write permission bit is left alone even by root (who may write anyway):
    // shared, read-only data stays untouched
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", ds->cache_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    struct stat dst;
    if (stat(dir[0] ? dir : "/", &dst) != 0 || (dst.st_mode & 0222) == 0 || access(dir[0] ? dir : "/", W_OK) != 0)
        return "its directory is not writable";
    return NULL;
}

// the tokenized samples: the token cache when ds->cache_path holds one that
// matches key, else the file tokenized now (into a new cache at ds->cache_path,
// or into memory when it is ""). NULL after an error (said)
static DataStore *data_store(Dataset *ds, const char *path, CacheHeader *key, const Tokenizer *tok) {
    DataStore *st = NULL;
    int use_cache = ds->cache_path[0] != 0;
    if (use_cache) {
        char why[256];
        st = cache_open(ds->cache_path, key, why, sizeof why);
        if (st) ds->cache_status = CACHE_REUSED;
        else if (why[0]) {
            ds->cache_status = CACHE_REBUILT;
            if (!ds->quiet) printf("data: token cache %s is stale or corrupt (%s): rebuilding\n", ds->cache_path, why);
        } else ds->cache_status = CACHE_BUILT;
    }
    if (!st) {
        st = data_build(ds, path, use_cache ? ds->cache_path : NULL, key, tok);
        if (!st) return NULL;
        if (!ds->cache_path[0]) ds->cache_status = CACHE_NONE;
    }
    snprintf(st->path, sizeof st->path, "%s", path);
    return st;
}

// every token id within the tokenizer's vocabulary: a cache from the right
// tokenizer file holds no other ids, but one with a forged checksum could
static int data_check_ids(Dataset *ds, const Tokenizer *tok) {
    const DataStore *st = ds->store;
    for (uint64_t i = 0; tok && i < st->h.n_samples; i++)
        for (uint32_t t = 0; t < st->index[i].n_tokens; t++) {
            int32_t id = store_tokens(st, (long)i)[t];
            if (id < 0 || id >= tok->vocab_size) { dataset_free(ds); return data_fail(ds, "%s: token id %d out of range", ds->cache_path, id); }
        }
    return 0;
}

// notes the skipped records in [from, before) from skips[*j] on (in record order)
static void data_note_skips(Dataset *ds, uint64_t from, uint64_t before, uint64_t *j) {
    const DataStore *st = ds->store;
    for (; *j < st->h.n_skips && st->skips[*j].record < before; (*j)++)
        if (st->skips[*j].record >= from) data_note_skip(ds, st->skips[*j].line, (int)st->skips[*j].reason);
}

// ds->samples: the samples of the records o->slice selects, at most o->max_samples
// of them, leaving out (and noting) the skipped records and, padding, the samples
// with no label within max_seq_len. -1 with an error naming path when none is left
static int data_select(Dataset *ds, const char *path, const DataOptions *o) {
    const DataStore *st = ds->store;
    char err[256];
    long from, to;
    if (data_parse_slice(o->slice, (long)st->h.n_records, &from, &to, err, sizeof err) != 0) { dataset_free(ds); return data_fail(ds, "%s: %s", path, err); }
    ds->samples = (int32_t *)mallocCheck((size_t)(st->h.n_samples ? st->h.n_samples : 1) * sizeof(int32_t));
    uint64_t end = (uint64_t)(to > from ? to : from), j = 0; // records [from, end); skips[j] is the next skip
    for (uint64_t i = 0; i < st->h.n_samples; i++) {
        const CacheSample *e = &st->index[i];
        if (e->record < (uint64_t)from) continue;
        if (e->record >= end) break;
        data_note_skips(ds, (uint64_t)from, e->record, &j);
        if (!ds->packing && data_labels_within(ds, (long)i) == 0) { data_note_skip(ds, e->line, SKIP_TRUNCATED); continue; }
        ds->samples[ds->n_samples++] = (int32_t)i;
        if (o->max_samples && ds->n_samples == o->max_samples) { end = e->record + 1; break; }
    }
    data_note_skips(ds, (uint64_t)from, end, &j);
    ds->n_records = (long)(end > (uint64_t)from ? end - (uint64_t)from : 0);
    if (ds->n_samples > 0) return 0;
    char list[256] = "";
    for (long i = 0; i < ds->n_skipped && i < DATA_SKIP_LIST; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%sline %ld: %s", i ? "; " : ": ", ds->skip_line[i], skip_reason_names[ds->skip_reason[i]]);
    long skipped = ds->n_skipped, recs = ds->n_records;
    dataset_free(ds);
    return data_fail(ds, "%s: no samples to train on (%ld records selected%s%s, %ld skipped%s)", path, recs,
                     o->slice && o->slice[0] ? " by slice " : "", o->slice ? o->slice : "", skipped, list);
}

// Loads (tokenizes or reads the cache of) the data file; 0 ok, -1 with an
// error naming the file printed (and in ds->error).
static int dataset_load(Dataset *ds, const char *path, const Tokenizer *tok, const char *tokenizer_path, const DataOptions *o) {
    DataOptions dflt;
    memset(&dflt, 0, sizeof dflt);
    if (!o) o = &dflt;
    int requested = data_options(ds, path, o), tokenizer_known;
    if (requested < 0) return -1;
    CacheHeader key;
    if (data_cache_key(ds, path, tok, tokenizer_path, requested, &key, &tokenizer_known) != 0) return -1;
    const char *no_cache_why = tokenizer_known ? data_cache_place(ds, path, o->cache_dir) : "the tokenizer file is not known";
    if (no_cache_why) {
        if (!o->quiet) printf("data: no token cache for %s (%s): tokenizing in memory\n", path, no_cache_why);
        ds->cache_path[0] = 0;
    }
    ds->store = data_store(ds, path, &key, tok);
    if (!ds->store) return -1;
    ds->format = (int)ds->store->h.format;
    if (ds->format == FORMAT_PREFERENCE && ds->packing) {
        dataset_free(ds);
        return data_fail(ds, "%s: preference pairs are not packed (each is two rows): give --batching padding", path);
    }
    if (data_check_ids(ds, tok) != 0 || data_select(ds, path, o) != 0) return -1;
    dataset_build_rows(ds);
    dataset_report(ds, path);
    return 0;
}

// Splits all's samples into a validation set of ceil(val_fraction * n) samples
// drawn with seed and a training set of the rest, both in file order and
// disjoint; each is then packed (or padded) on its own. all stays valid (free
// all three). 0 ok, -1 with an error printed.
static int dataset_split(Dataset *all, double val_fraction, uint64_t seed, Dataset *train, Dataset *val) {
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    train->quiet = val->quiet = all->quiet;
    const char *path = all->store ? all->store->path : "?";
    long n = all->n_samples, n_val = (long)ceil(val_fraction * (double)n - 1e-9);
    if (!(val_fraction > 0 && val_fraction < 1)) return data_fail(train, "%s: the validation fraction must be in (0, 1), got %g", path, val_fraction);
    if (n_val < 1 || n_val > n - 1)
        return data_fail(train, "%s: a validation fraction of %g of %ld samples leaves %ld for validation and %ld for training", path,
                         val_fraction, n, n_val, n - n_val);
    // a seeded permutation of the sample positions; its first n_val are validation
    int32_t *perm = (int32_t *)mallocCheck((size_t)n * sizeof(int32_t));
    uint8_t *is_val = (uint8_t *)callocCheck((size_t)n, 1);
    for (long i = 0; i < n; i++) perm[i] = (int32_t)i;
    uint64_t state = splitmix64(seed ^ 0x76616C5F73706C74ull); // "val_splt"
    for (long i = n - 1; i > 0; i--) {
        long k = (long)(rng_next(&state) % (uint64_t)(i + 1));
        int32_t t = perm[i]; perm[i] = perm[k]; perm[k] = t;
    }
    for (long i = 0; i < n_val; i++) is_val[perm[i]] = 1;
    Dataset *half[2] = {train, val};
    for (int h = 0; h < 2; h++) {
        Dataset *d = half[h];
        *d = *all;
        d->samples = (int32_t *)mallocCheck((size_t)n * sizeof(int32_t));
        d->row_labels = NULL;
        d->cum = NULL;
        d->n_samples = 0;
        for (long i = 0; i < n; i++)
            if (is_val[i] == h) d->samples[d->n_samples++] = all->samples[i];
        d->store->refs++;
        dataset_build_rows(d);
    }
    free(perm); free(is_val);
    if (!all->quiet)
        printf("data: %s: validation split %g: %ld training samples (%ld rows), %ld validation samples (%ld rows)\n", path,
               val_fraction, train->n_samples, train->n_rows, val->n_samples, val->n_rows);
    return 0;
}

// the longest row (the trainer allocates B x this)
static int dataset_max_len(const Dataset *ds) {
    if (ds->packing) return ds->n_rows > 1 ? ds->max_seq_len : ds->last_row_len;
    long m = 0;
    for (long r = 0; r < ds->n_rows; r++) { long l = dataset_row_len(ds, r); m = l > m ? l : m; }
    return (int)m;
}

// Rows [first, first + n) in dataset order (no shuffling, no wrap: first + n
// <= n_rows), padded to the longest of them (*T); tokens and targets hold
// n x *T (preference: n pairs, 2n x *T, as dataset_fill_pairs lays them out).
// Returns the label count. For evaluation, where the last batch may have fewer rows.
static long dataset_get_rows(const Dataset *ds, long first, int n, int pad_id, int *tokens, int *targets, int *T) {
    if (first < 0 || n < 0 || first + n > ds->n_rows) die("dataset_get_rows: rows [%ld, %ld) outside [0, %ld)", first, first + n, ds->n_rows);
    long maxlen = 0, labels = 0;
    for (int b = 0; b < n; b++) { long l = dataset_row_len(ds, first + b); maxlen = l > maxlen ? l : maxlen; }
    *T = (int)maxlen;
    if (ds->format == FORMAT_PREFERENCE) {
        int32_t *rows = (int32_t *)mallocCheck(((size_t)n + 1) * sizeof(int32_t));
        for (int b = 0; b < n; b++) rows[b] = (int32_t)(first + b);
        labels = dataset_fill_pairs(ds, rows, n, (int)maxlen, pad_id, tokens, targets);
        free(rows);
        return labels;
    }
    for (int b = 0; b < n; b++) labels += dataset_fill_row(ds, first + b, (int)maxlen, pad_id, tokens + (size_t)b * maxlen, targets + (size_t)b * maxlen);
    return labels;
}

// ----------------------------------------------------------------------------
// DataLoader: rows in order, or shuffled every epoch with a seed mixed with
// the epoch (the same seed gives the same order; each epoch a new one). The
// stream runs on across epochs, so every optimizer step gets full batches and
// no row is dropped. With world size W and B rows per rank, each call draws a
// global micro-batch of W*B rows exactly as world size 1 with W*B rows would,
// and rank r gets rows [r*B, (r+1)*B) of it.

typedef struct {
    const Dataset *ds;
    int shuffle;
    uint64_t seed;
    int rank, world;
    int32_t *order;        // (n_rows) row order of the current epoch
    long epoch, pos;       // the position: the next row is order[pos] of epoch `epoch` (for resuming)
    long global_labels;    // label count of the last global micro-batch (all ranks)
    long global_rows;      // its row count (W*B)
    long batch_tokens;     // real (not padding) tokens in this rank's last batch, for tokens/s
    int32_t *rows;         // scratch: the rows of the global micro-batch
    int rows_cap;
} DataLoader;

static void dataloader_shuffle(DataLoader *dl) {
    long n = dl->ds->n_rows;
    for (long i = 0; i < n; i++) dl->order[i] = (int32_t)i;
    if (!dl->shuffle) return;
    uint64_t state = splitmix64(splitmix64(dl->seed ^ 0x53485546464C45ull) + (uint64_t)dl->epoch); // "SHUFFLE"
    for (long i = n - 1; i > 0; i--) { // Fisher-Yates
        long j = (long)(rng_next(&state) % (uint64_t)(i + 1));
        int32_t t = dl->order[i]; dl->order[i] = dl->order[j]; dl->order[j] = t;
    }
}

static void dataloader_init(DataLoader *dl, const Dataset *ds, int shuffle, uint64_t seed, int rank, int world) {
    if (world < 1 || rank < 0 || rank >= world) die("dataloader_init: rank %d of world size %d", rank, world);
    if (ds->n_rows < 1) die("dataloader_init: the dataset has no rows");
    memset(dl, 0, sizeof *dl);
    dl->ds = ds;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->rank = rank;
    dl->world = world;
    dl->order = (int32_t *)mallocCheck((size_t)ds->n_rows * sizeof(int32_t));
    dataloader_shuffle(dl);
}

// restores a position saved from dl->epoch and dl->pos
static void dataloader_seek(DataLoader *dl, long epoch, long pos) {
    if (epoch < 0 || pos < 0 || pos > dl->ds->n_rows) die("dataloader_seek: position (%ld, %ld) outside the dataset", epoch, pos);
    dl->epoch = epoch;
    dl->pos = pos;
    dataloader_shuffle(dl);
}

static void dataloader_free(DataLoader *dl) {
    free(dl->order); free(dl->rows);
    memset(dl, 0, sizeof *dl);
}

// Fills tokens and targets (B x *T, preference 2B x *T: dataset_fill_pairs; the caller allocates
// B x dataset_max_len, or 2B x)
// with this rank's B rows of the next global micro-batch, *T being the
// longest row of the global micro-batch: every rank gets the same shape (the
// ranks of a sharded model run their collectives in step) and pads as world
// size 1 would. Returns this rank's label count; dataloader_global_labels
// then gives the whole global micro-batch's.
static long dataloader_next_batch(DataLoader *dl, int B, int pad_id, int *tokens, int *targets, int *T) {
    int G = B * dl->world;
    if (G > dl->rows_cap) { free(dl->rows); dl->rows = (int32_t *)mallocCheck((size_t)G * sizeof(int32_t)); dl->rows_cap = G; }
    dl->global_labels = 0;
    dl->global_rows = G;
    for (int g = 0; g < G; g++) {
        if (dl->pos == dl->ds->n_rows) { dl->epoch++; dl->pos = 0; dataloader_shuffle(dl); }
        dl->rows[g] = dl->order[dl->pos++];
        dl->global_labels += dl->ds->row_labels[dl->rows[g]];
    }
    const int32_t *mine = dl->rows + (size_t)dl->rank * B;
    long maxlen = 0, labels = 0;
    dl->batch_tokens = 0;
    for (int g = 0; g < G; g++) {
        long l = dataset_row_len(dl->ds, dl->rows[g]);
        maxlen = l > maxlen ? l : maxlen;
        if (g / B == dl->rank) dl->batch_tokens += dataset_row_tokens(dl->ds, dl->rows[g]);
    }
    if (dl->ds->format == FORMAT_PREFERENCE) labels = dataset_fill_pairs(dl->ds, mine, B, (int)maxlen, pad_id, tokens, targets);
    else
        for (int b = 0; b < B; b++)
            labels += dataset_fill_row(dl->ds, mine[b], (int)maxlen, pad_id, tokens + (size_t)b * maxlen, targets + (size_t)b * maxlen);
    *T = (int)maxlen;
    return labels;
}

// the label count of the global micro-batch (all ranks' rows) the last
// dataloader_next_batch drew: the loss is normalised by it (summed over the
// micro-batches of a step), with no communication needed
static long dataloader_global_labels(const DataLoader *dl) { return dl->global_labels; }
#endif
