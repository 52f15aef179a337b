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

// the step of a folder named checkpoint-<step> (exactly), else -1
static long checkpoint_step(const char *name) {
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11]) return -1;
    char *end;
    errno = 0;
    long step = strtol(name + 11, &end, 10);
    return *end || errno || step < 0 || name[11] == '-' || name[11] == '+' ? -1 : step;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}
// the steps of the complete checkpoints in out_dir, ascending (malloc'd); *n = how many, -1 if unreadable
static long *checkpoint_list(const char *out_dir, int *n) {
    *n = -1;
    DIR *d = opendir(out_dir);
    if (!d) return NULL;
    int cap = 16;
    long *steps = (long *)mallocCheck(cap * sizeof(long));
    *n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        long s = checkpoint_step(e->d_name);
        if (s < 0) continue;
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
        if (had_old) rename(old, dir);
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
