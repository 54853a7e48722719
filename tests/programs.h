/* programs.h: for the tests linked with the library's internals (see
 * meson.build): which kernel files a context has built, to assert that a
 * case took the path it was meant for (the tensor-core kernels, a tuning
 * file's tiles where tune_env_overrides() leaves the file in force). */
#ifndef CLNSA_TESTS_PROGRAMS_H
#define CLNSA_TESTS_PROGRAMS_H

#include "internal.h"
#include "tuning/tuning.h"

#include <stdbool.h>
#include <string.h>

/* Did it build a program whose key (files and defines) holds all of a, b
 * and c (c may be NULL)? */
static inline bool program_built_with(clnsa_context *ctx, const char *a, const char *b, const char *c)
{
    bool found = false;
    pthread_mutex_lock(&ctx->lock);
    for (const program_entry *e = ctx->programs; e; e = e->next)
        found = found || (e->key && strstr(e->key, a) && strstr(e->key, b) && (!c || strstr(e->key, c)));
    pthread_mutex_unlock(&ctx->lock);
    return found;
}

/* Did the context build a program of this kernel file? */
static inline bool program_built(clnsa_context *ctx, const char *file) { return program_built_with(ctx, file, "", NULL); }

#endif
