// Training checkpoints: OUTPUT_DIR/checkpoint-<step>/ folders.
//
// The trainer writes a checkpoint's files (the adapter or the model, the
// optimizer state, trainer_state.json) into OUTPUT_DIR/checkpoint-<step>.tmp,
// then checkpoint_commit fsyncs them, renames the folder into place and fsyncs
// the parent. So a checkpoint-<step> folder is always complete: a crash or a
// full disk at any moment leaves the previous checkpoints as they were, and a
// leftover .tmp folder is removed by the next attempt.
#ifndef CHECKPOINT_H
#define CHECKPOINT_H
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <sys/stat.h>
#include "utils.h"

// rm -rf path (a missing path is fine); symbolic links are removed, not followed
static int remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    int rc = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        rc |= remove_tree(sub);
    }
    closedir(d);
    return rc | rmdir(path);
}

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

// the step of a folder named checkpoint-<step> (exactly, as the trainer writes
// it: no sign, no leading zero), else -1
static long checkpoint_step(const char *name) {
    if (strncmp(name, "checkpoint-", 11) != 0 || name[11] < '0' || name[11] > '9' || (name[11] == '0' && name[12])) return -1;
    char *end;
    errno = 0;
    long step = strtol(name + 11, &end, 10);
    return *end || errno ? -1 : step;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}
// the steps of the complete checkpoints (folders) in out_dir, ascending (malloc'd); *n = how many, -1 if unreadable
static long *checkpoint_list(const char *out_dir, int *n) {
    *n = -1;
    DIR *d = opendir(out_dir);
    if (!d) return NULL;
    int cap = 16;
    long *steps = (long *)mallocCheck(cap * sizeof(long));
    *n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        long s = checkpoint_step(e->d_name);
        char path[2 * PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
        if (s < 0 || stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (*n == cap) steps = (long *)reallocCheck(steps, (cap *= 2) * sizeof(long));
        steps[(*n)++] = s;
    }
    closedir(d);
    qsort(steps, *n, sizeof(long), cmp_long);
    return steps;
}

// makes an empty OUT_DIR/checkpoint-<step>.tmp for the trainer to fill; 0 ok, -1 with a message
static int checkpoint_begin(const char *out_dir, long step, char *tmp, size_t n) {
    snprintf(tmp, n, "%s/checkpoint-%ld.tmp", out_dir, step);
    if (remove_tree(tmp) != 0 || mkdir_p(tmp) != 0) {
        fprintf(stderr, "error: cannot create checkpoint folder '%s': %s\n", tmp, strerror(errno));
        return -1;
    }
    return 0;
}

// Makes the filled .tmp folder the checkpoint of its step (replacing an older
// one of the same step), then removes all but the newest `keep` checkpoints
// (keep <= 0: keep all). 0 ok, -1 with a message; the .tmp is removed on failure.
static int checkpoint_commit(const char *out_dir, long step, int keep) {
    char tmp[PATH_MAX], dir[PATH_MAX], old[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s/checkpoint-%ld.tmp", out_dir, step);
    snprintf(dir, sizeof dir, "%s/checkpoint-%ld", out_dir, step);
    snprintf(old, sizeof old, "%s.old", dir);
    DIR *d = opendir(tmp);
    int bad = d == NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char f[PATH_MAX + 256];
        snprintf(f, sizeof f, "%s/%s", tmp, e->d_name);
        bad |= fsync_path(f) != 0;
    }
    if (d) closedir(d);
    bad = bad || fsync_path(tmp) != 0;
    // an existing checkpoint of this step moves aside until the new one is in place
    struct stat st;
    int had_old = !bad && stat(dir, &st) == 0;
    if (had_old) bad = remove_tree(old) != 0 || rename(dir, old) != 0;
    if (bad || rename(tmp, dir) != 0 || fsync_path(out_dir) != 0) {
        fprintf(stderr, "error: could not complete checkpoint '%s': %s (the previous checkpoints are intact)\n", dir,
                strerror(errno));
        remove_tree(tmp);
        if (had_old && rename(old, dir) != 0) // (the old checkpoint of this step is still whole, under its .old name)
            fprintf(stderr, "error: could not move '%s' back to '%s': %s\n", old, dir, strerror(errno));
        return -1;
    }
    if (had_old) remove_tree(old);
    int n;
    long *steps = keep > 0 ? checkpoint_list(out_dir, &n) : NULL;
    for (int i = 0; steps && i + keep < n; i++) {
        snprintf(old, sizeof old, "%s/checkpoint-%ld", out_dir, steps[i]);
        if (remove_tree(old) != 0) fprintf(stderr, "warning: could not remove old checkpoint '%s'\n", old);
    }
    free(steps);
    return 0;
}

// A checkpoint's trainer_state.json lists the other files of the folder with
// their size and a hash of their bytes ("files"), and a resume checks them
// before reading anything: a file damaged or changed after it was saved
// (flipped bytes, a truncation, a copy that did not finish) is refused, not
// trained on.

// "<size>:<hash>" of a file's bytes; 0 ok, -1 with errno set
static int checkpoint_file_digest(const char *path, char *out, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t block = 1 << 20, got;
    unsigned char *buf = (unsigned char *)mallocCheck(block);
    uint64_t h = DATA_HASH_SEED, size = 0;
    while ((got = fread(buf, 1, block, f)) > 0) { h = data_hash_bytes(h, buf, got); size += got; }
    int err = ferror(f) ? (errno ? errno : EIO) : 0; // e.g. EISDIR
    fclose(f);
    free(buf);
    if (err) { errno = err; return -1; }
    snprintf(out, n, "%llu:%016llx", (unsigned long long)size, (unsigned long long)h);
    return 0;
}

// The files of checkpoint folder dir but trainer_state.json, in name order:
// *n names into names (room for CHECKPOINT_MAX_FILES: the trainer writes four,
// or a sharded checkpoint a file per shard and the index). 0 ok, -1 with a message.
#define CHECKPOINT_MAX_FILES 1024
#define CHECKPOINT_DIGEST 64 // "<size>:<hash>" and its NUL fit
typedef char CheckpointName[256];
typedef char CheckpointDigest[CHECKPOINT_DIGEST];
static int cmp_name(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }
static int checkpoint_files(const char *dir, CheckpointName *names, int *n) {
    DIR *d = opendir(dir);
    if (!d) { fprintf(stderr, "error: cannot list checkpoint folder '%s': %s\n", dir, strerror(errno)); return -1; }
    int rc = 0;
    *n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "trainer_state.json")) continue;
        if (*n == CHECKPOINT_MAX_FILES) { fprintf(stderr, "error: checkpoint folder '%s' has more than %d files\n", dir, *n); rc = -1; break; }
        snprintf(names[(*n)++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    qsort(names, *n, sizeof names[0], cmp_name);
    return rc;
}

// digests[i] = the digest of dir/names[i] for the i of one part of parts (i %
// parts == part: each rank of a sharded save its share); 0 ok, -1 with a message
static int checkpoint_digest_part(const char *dir, CheckpointName *names, CheckpointDigest *digests, int n, int part, int parts) {
    char path[2 * PATH_MAX];
    for (int i = part; i < n; i += parts) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (checkpoint_file_digest(path, digests[i], sizeof digests[i]) != 0) {
            fprintf(stderr, "error: cannot read back '%s': %s\n", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

// writes the JSON object {"<file>": "<digest>", ...} of the n files
static void checkpoint_write_digests(FILE *json, CheckpointName *names, CheckpointDigest *digests, int n) {
    fprintf(json, "{");
    for (int i = 0; i < n; i++) {
        fprintf(json, "%s\n    ", i ? "," : "");
        json_write_string(json, names[i]);
        fprintf(json, ": \"%s\"", digests[i]);
    }
    fprintf(json, "\n  }");
}

// checks the files that dir/trainer_state.json lists against their digests, those
// of index i % parts == part (each rank of a sharded resume its share; 0 of 1:
// all of them); 0 ok, -1 with a message naming the file
static int checkpoint_verify(const char *dir, int part, int parts) {
    char path[2 * PATH_MAX], digest[CHECKPOINT_DIGEST];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    JsonValue st;
    if (json_load_file(path, &st) != 0) return -1;
    const JsonValue *files = json_get(&st, "files");
    int rc = 0;
    if (!files || files->type != JSON_OBJECT || files->count == 0) {
        fprintf(stderr, "error: %s: no \"files\" object listing the checkpoint's files and their digests\n", path);
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < files->count; i++) {
        const char *name = files->keys[i];
        const JsonValue *want = &files->items[i];
        if (!name[0] || strlen(name) != files->key_lens[i] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..") ||
            want->type != JSON_STRING) {
            fprintf(stderr, "error: %s: \"files\" entry %d is not a file name with a digest string\n", path, i);
            rc = -1;
            break;
        }
        if (i % parts != part) continue;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (checkpoint_file_digest(path, digest, sizeof digest) != 0) {
            fprintf(stderr, "error: %s: cannot read: %s (the checkpoint is incomplete)\n", path, strerror(errno));
            rc = -1;
        } else if (strcmp(digest, want->string) != 0) {
            fprintf(stderr, "error: %s: its size or contents are not what trainer_state.json recorded when the checkpoint was "
                    "saved (%s now, %s then): it was damaged or changed since; not resuming from it\n", path, digest, want->string);
            rc = -1;
        }
    }
    json_free(&st);
    return rc;
}

// --resume PATH: a checkpoint folder (it has trainer_state.json), or an output
// folder, meaning its newest complete checkpoint. 0 ok, -1 with a message.
static int checkpoint_resolve(const char *path, char *dir, size_t n) {
    char state[PATH_MAX + 32];
    struct stat st;
    snprintf(state, sizeof state, "%s/trainer_state.json", path);
    if (stat(state, &st) == 0) { snprintf(dir, n, "%s", path); return 0; }
    int count;
    long *steps = checkpoint_list(path, &count);
    if (count > 0) snprintf(dir, n, "%s/checkpoint-%ld", path, steps[count - 1]);
    free(steps);
    if (count > 0) return 0;
    fprintf(stderr, "error: --resume '%s': neither a checkpoint (no trainer_state.json) nor a folder with checkpoint-<step> folders\n", path);
    return -1;
}
#endif
