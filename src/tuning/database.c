/* database.c: which parameters a kernel family gets on a device (the lookup
 * order is in tuning.h), tuning files, and the tuner's thread-local hook. */
#include "tuning.h"

#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ the hook */

static _Thread_local tune_hook *current_hook;

void tune_hook_set(tune_hook *h) { current_hook = h; }

tune_hook *tune_hook_get(const clnsa_context *ctx)
{
    return current_hook && current_hook->ctx == ctx ? current_hook : NULL;
}

/* ------------------------------------------------------------- matching */

const char *tune_vendor_key(clnsa_vendor v)
{
    switch (v) {
    case CLNSA_VENDOR_NVIDIA: return "nvidia";
    case CLNSA_VENDOR_AMD: return "amd";
    case CLNSA_VENDOR_INTEL: return "intel";
    case CLNSA_VENDOR_POCL: return "pocl";
    case CLNSA_VENDOR_MESA: return "mesa";
    default: return "other";
    }
}

static bool wild(const char *s) { return !s || !*s || strcmp(s, "*") == 0; }

/* Level of an entry that applies to the device: 0 device, 1 architecture,
 * 2 vendor; -1 when it does not apply. */
static int entry_level(const tune_entry *e, const clnsa_device_info *info)
{
    if (!wild(e->vendor) && strcmp(e->vendor, tune_vendor_key(info->vendor)) != 0) return -1;
    if (!wild(e->arch) && strcmp(e->arch, info->architecture) != 0) return -1;
    if (!wild(e->device) && strcmp(e->device, info->name) != 0) return -1;
    return !wild(e->device) ? 0 : !wild(e->arch) ? 1 : 2;
}

bool tune_entry_applies(const tune_entry *e, const clnsa_device_info *info) { return entry_level(e, info) >= 0; }

/* The other 16-bit type (f16 for bf16 and back), or CLNSA_DTYPE_INVALID:
 * the two take the same tensor-core instructions, registers and local
 * memory, so an entry tuned on one serves the other where none names it
 * (the H200's f16 forward at 64k took 31.6 ms on the safe defaults, 24.7
 * with the bf16 entries, 2026-11-30). */
static clnsa_dtype dtype_sibling(clnsa_dtype d)
{
    return d == CLNSA_DTYPE_F16 ? CLNSA_DTYPE_BF16 : d == CLNSA_DTYPE_BF16 ? CLNSA_DTYPE_F16 : CLNSA_DTYPE_INVALID;
}

/* Shape fields the entry names (0..5), or -1 when one disagrees. With
 * `sibling` only entries naming the problem's dtype_sibling match (their
 * dtype counted as named), the others not at all. */
static int shape_match(const tune_entry *e, const tune_problem *pb, bool sibling)
{
    const int have[4] = {e->dk, e->dv, e->g, e->block}, want[4] = {pb->dk, pb->dv, pb->g, pb->block};
    int n = 0;
    for (int i = 0; i < 4; ++i) {
        if (!have[i]) continue;
        if (have[i] != want[i]) return -1;
        ++n;
    }
    if (e->dtype == CLNSA_DTYPE_INVALID) return sibling ? -1 : n;
    return e->dtype == (sibling ? dtype_sibling(pb->dtype) : pb->dtype) ? n + 1 : -1;
}

/* How well an entry's window fits the problem's: 2 named alike, 1 not
 * named, 0 the other (tune_entry's window). */
static int window_rank(const tune_entry *e, const tune_problem *pb)
{
    return e->window == TUNE_WINDOW_ANY ? 1 : e->window == (pb->swa ? TUNE_WINDOW_ON : TUNE_WINDOW_OFF) ? 2 : 0;
}

/* Values of the family's parameters from an entry (false if one is missing). */
static bool entry_values(const tune_entry *e, const tune_family *f, int *v)
{
    for (int i = 0; i < f->nparams; ++i) {
        int j = 0;
        while (j < e->nparams && strcmp(e->names[j], f->params[i].name) != 0) ++j;
        if (j == e->nparams) return false;
        v[i] = e->values[j];
    }
    return true;
}

static void describe(const tune_entry *e, const char *origin, char *buf, size_t size)
{
    char dims[4][16];
    const int val[4] = {e->dk, e->dv, e->g, e->block};
    for (int i = 0; i < 4; ++i) snprintf(dims[i], sizeof dims[i], val[i] ? "%d" : "*", val[i]);
    static const char *const windows[] = {"", ", window off", ", window on"};
    snprintf(buf, size, "%s %s/%s/%s, shape D=%s DV=%s G=%s block=%s %s%s", origin, wild(e->vendor) ? "*" : e->vendor,
             wild(e->arch) ? "*" : e->arch, wild(e->device) ? "*" : e->device, dims[0], dims[1], dims[2], dims[3],
             e->dtype ? clnsa_dtype_name(e->dtype) : "*", windows[e->window + 1]);
}

/* The first entry of `entries` that applies and fits, best first: device
 * before architecture before vendor, then the most shape fields named
 * (with `sibling`, among the entries of the other 16-bit type only), then
 * the problem's window before none named; with `other_window`, among the
 * entries of the other window only (window_rank 0). */
static bool try_entries(const clnsa_context *ctx, const tune_entry *entries, size_t count, int family,
                        const tune_problem *pb, bool sibling, bool other_window, const char *origin, bool user,
                        tune_choice *out)
{
    const tune_family *f = &tune_families[family];
    for (int level = 0; level < 3; ++level)
        for (int rank = 5 * 2 + 1; rank >= 0; --rank)
            for (size_t i = 0; i < count; ++i) {
                const tune_entry *e = &entries[i];
                const int w = window_rank(e, pb);
                if (strcmp(e->family, f->name) != 0 || entry_level(e, &ctx->info) != level ||
                    (w == 0) != other_window || shape_match(e, pb, sibling) * 2 + (w == 2) != rank)
                    continue;
                int v[TUNE_MAX_PARAMS] = {0};
                if (!entry_values(e, f, v) || !tune_fits(&ctx->info, family, v, pb, false, NULL, 0)) continue;
                memcpy(out->v, v, sizeof v);
                out->source = user ? TUNE_SRC_USER : level == 0 ? TUNE_SRC_DEVICE : level == 1 ? TUNE_SRC_ARCH : TUNE_SRC_VENDOR;
                describe(e, origin, out->where, sizeof out->where);
                if (sibling) {
                    const size_t n = strlen(out->where);
                    snprintf(out->where + n, sizeof out->where - n, " (for %s)", clnsa_dtype_name(pb->dtype));
                }
                return true;
            }
    return false;
}

/* A family whose tiles do not follow the work-group size takes CLNSA_TUNE_WG
 * over the chosen work-group size only. */
static clnsa_status env_work_group(const clnsa_context *ctx, int family, const tune_problem *pb, tune_choice *out)
{
    if (!getenv("CLNSA_TUNE_WG")) return CLNSA_SUCCESS;
    out->v[0] = tune_default_wg(&ctx->info);
    const size_t n = strlen(out->where);
    snprintf(out->where + n, sizeof out->where - n, ", WG from CLNSA_TUNE_WG");
    return tune_fits(&ctx->info, family, out->v, pb, false, NULL, 0) ? CLNSA_SUCCESS : CLNSA_ERROR_UNSUPPORTED_DEVICE;
}

bool tune_env_overrides(void)
{
    if (getenv("CLNSA_TUNE_WG") || getenv("CLNSA_TUNE_TK") || device_limits_from_env()) return true;
    for (int i = 0; i < TF_COUNT; ++i)
        for (int j = 0; j < 2; ++j)
            if (tune_families[i].tile_env[j] && getenv(tune_families[i].tile_env[j])) return true;
    return false;
}

clnsa_status tune_choose(clnsa_context *ctx, int family, const tune_problem *pb, tune_choice *out)
{
    memset(out, 0, sizeof *out);
    const tune_hook *h = tune_hook_get(ctx);
    if (h && h->family == family) {
        memcpy(out->v, h->v, sizeof out->v);
        out->source = TUNE_SRC_FORCED;
        snprintf(out->where, sizeof out->where, "forced by the tuner");
        return tune_fits(&ctx->info, family, out->v, pb, false, NULL, 0) ? CLNSA_SUCCESS : CLNSA_ERROR_UNSUPPORTED_DEVICE;
    }
    const tune_family *f = &tune_families[family];
    const bool tiles_fixed = f->tile_env[0] != NULL;
    const bool env = f->dispatch  ? false
                     : tiles_fixed ? getenv(f->tile_env[0]) || getenv(f->tile_env[1])
                                   : getenv("CLNSA_TUNE_WG") || getenv("CLNSA_TUNE_TK");
    if (!env) {
        const tune_file *uf = ctx->tuning;
        char origin[300] = "";
        bool found = false;
        if (uf) snprintf(origin, sizeof origin, "user file %s:", uf->path);
        /* the problem's window (or none named) in either source and dtype
         * before the other window's: tiles follow the window more than the
         * dtype or the device (tuning/README.md); then the problem's own
         * dtype in either source before the other 16-bit type's */
        for (int other = 0; other < 2 && !found; ++other)
            for (int sibling = 0; sibling < 2 && !found; ++sibling) {
                if (uf) found = try_entries(ctx, uf->entries, uf->count, family, pb, sibling, other, origin, true, out);
                if (!found)
                    found = try_entries(ctx, clnsa_tuning_db, clnsa_tuning_db_count, family, pb, sibling, other,
                                        "database", false, out);
            }
        if (found) return tiles_fixed ? env_work_group(ctx, family, pb, out) : CLNSA_SUCCESS;
    }
    out->source = env ? TUNE_SRC_ENV : TUNE_SRC_DEFAULT;
    snprintf(out->where, sizeof out->where, "%s",
             !env ? "safe default" : tiles_fixed ? "safe default from CLNSA_TUNE_BS_*" : "safe default from CLNSA_TUNE_WG / CLNSA_TUNE_TK");
    return tune_safe_default(&ctx->info, family, pb, out->v) ? CLNSA_SUCCESS : CLNSA_ERROR_UNSUPPORTED_DEVICE;
}

/* ---------------------------------------------------------- tuning files */

static const char *keep(tune_file *f, const char *s)
{
    if (!s) return NULL;
    char **more = realloc(f->strings, (f->nstrings + 1) * sizeof *more);
    if (!more) return NULL;
    f->strings = more;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (!d) return NULL;
    memcpy(d, s, n);
    f->strings[f->nstrings++] = d;
    return d;
}

static clnsa_dtype dtype_from_name(const char *s)
{
    if (!s || strcmp(s, "*") == 0) return CLNSA_DTYPE_INVALID;
    for (clnsa_dtype d = CLNSA_DTYPE_F32; d <= CLNSA_DTYPE_BF16; ++d)
        if (strcmp(s, clnsa_dtype_name(d)) == 0) return d;
    return (clnsa_dtype)-1;
}

/* A shape's "window" (absent or "*": any); false for anything else. */
static bool window_from_json(const js_value *w, int *out)
{
    const char *s = w ? js_str(w) : "*";
    if (!s) return false;
    *out = wild(s) ? TUNE_WINDOW_ANY : strcmp(s, "on") == 0 ? TUNE_WINDOW_ON : TUNE_WINDOW_OFF;
    return wild(s) || strcmp(s, "on") == 0 || strcmp(s, "off") == 0;
}

static bool load_entry(tune_file *f, const js_value *e, tune_entry *out, char *msg, size_t size)
{
    memset(out, 0, sizeof *out);
    const char *family = js_str(js_get(e, "family"));
    const int fi = family ? tune_family_find(family) : -1;
    if (fi < 0) {
        snprintf(msg, size, "unknown family '%s'", family ? family : "(none)");
        return false;
    }
    out->family = tune_families[fi].name;
    const char *strs[3] = {js_str(js_get(e, "vendor")), js_str(js_get(e, "architecture")), js_str(js_get(e, "device"))};
    const char **dst[3] = {&out->vendor, &out->arch, &out->device};
    for (int i = 0; i < 3; ++i)
        if (!wild(strs[i]) && !(*dst[i] = keep(f, strs[i]))) {
            snprintf(msg, size, "out of host memory");
            return false;
        }
    const js_value *shape = js_get(e, "shape");
    const char *keys[4] = {"dk", "dv", "g", "block"};
    int *dims[4] = {&out->dk, &out->dv, &out->g, &out->block};
    for (int i = 0; i < 4; ++i) {
        const js_value *x = js_get(shape, keys[i]);
        long n;
        if (!x || (js_str(x) && strcmp(js_str(x), "*") == 0)) continue;
        if (!js_int(x, 1, 65536, &n)) {
            snprintf(msg, size, "shape.%s: expected an integer or \"*\"", keys[i]);
            return false;
        }
        *dims[i] = (int)n;
    }
    const js_value *dt = js_get(shape, "dtype");
    out->dtype = dt ? dtype_from_name(js_str(dt)) : CLNSA_DTYPE_INVALID;
    if ((int)out->dtype < 0) {
        snprintf(msg, size, "shape.dtype: expected f32, f16, bf16 or \"*\"");
        return false;
    }
    if (!window_from_json(js_get(shape, "window"), &out->window)) {
        snprintf(msg, size, "shape.window: expected \"on\", \"off\" or \"*\"");
        return false;
    }
    const js_value *params = js_get(e, "params");
    const tune_family *fam = &tune_families[fi];
    if (!params || params->type != JS_OBJECT) {
        snprintf(msg, size, "params: expected an object");
        return false;
    }
    for (size_t i = 0; i < params->count; ++i) {
        long n;
        const int pi = tune_param_find(fam, params->keys[i]), most = tune_param_max(fam);
        if (pi < 0 || !js_int(&params->items[i], 1, most, &n)) {
            if (pi < 0) snprintf(msg, size, "params.%s: not a parameter of this family", params->keys[i]);
            else snprintf(msg, size, "params.%s: expected an integer in 1..%d", params->keys[i], most);
            return false;
        }
        out->names[out->nparams] = fam->params[pi].name;
        out->values[out->nparams++] = (int)n;
    }
    int v[TUNE_MAX_PARAMS];
    if (!entry_values(out, fam, v)) {
        snprintf(msg, size, "params: expected every parameter of %s", fam->name);
        return false;
    }
    return true;
}

void tune_file_free(tune_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->nstrings; ++i) free(f->strings[i]);
    free(f->strings);
    free(f->entries);
    free(f->path);
    free(f);
}

clnsa_status tune_file_load(const char *path, tune_file **out, char *msg, size_t msg_size)
{
    *out = NULL;
    js_value doc;
    char err[400];
    if (!js_parse_file(path, &doc, err, sizeof err)) {
        snprintf(msg, msg_size, "tuning file: %s", err);
        return CLNSA_ERROR_INVALID_ARGUMENT;
    }
    tune_file *f = calloc(1, sizeof *f);
    const js_value *entries = js_get(&doc, "entries");
    long version = 0;
    clnsa_status st = CLNSA_SUCCESS;
    if (!f || !(f->path = malloc(strlen(path) + 1))) {
        snprintf(msg, msg_size, "out of host memory");
        st = CLNSA_ERROR_OUT_OF_HOST_MEMORY;
    } else if (memcpy(f->path, path, strlen(path) + 1), !js_int(js_get(&doc, "clnsa_tuning"), 1, 1, &version) || !entries || entries->type != JS_ARRAY) {
        snprintf(msg, msg_size, "tuning file: %s: expected {\"clnsa_tuning\": 1, \"entries\": [...]}", path);
        st = CLNSA_ERROR_INVALID_ARGUMENT;
    } else if (entries->count && !(f->entries = calloc(entries->count, sizeof *f->entries))) {
        snprintf(msg, msg_size, "out of host memory");
        st = CLNSA_ERROR_OUT_OF_HOST_MEMORY;
    }
    for (size_t i = 0; st == CLNSA_SUCCESS && i < entries->count; ++i) {
        char why[200];
        if (load_entry(f, &entries->items[i], &f->entries[i], why, sizeof why)) continue;
        snprintf(msg, msg_size, "tuning file: %s: entry %zu: %s", path, i, why);
        st = CLNSA_ERROR_INVALID_ARGUMENT;
    }
    const size_t count = entries ? entries->count : 0;
    js_free(&doc);
    if (st != CLNSA_SUCCESS) {
        tune_file_free(f);
        return st;
    }
    f->count = count;
    *out = f;
    return CLNSA_SUCCESS;
}
