/* tune_common.c: the tuning file as JSON values (see tune_common.h), and
 * `clnsa tune --merge`: folds tuning files into the repo's database folder,
 * one file per vendor, replacing each device's entry for a family and shape
 * class and recomputing each architecture's default: the configuration with
 * the least mean relative time (its time on a device over that device's
 * best) across the architecture's devices, among those measured on the most
 * devices. */
#include "cli_common.h"
#include "tune_common.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

js_value tune_params_json(const tune_family *f, const int *v)
{
    js_value o = {.type = JS_OBJECT};
    for (int i = 0; i < f->nparams; ++i) js_object_set(&o, f->params[i].name, js_make_number(v[i]));
    return o;
}

js_value tune_shape_json(const tune_problem *pb)
{
    js_value o = {.type = JS_OBJECT};
    js_object_set(&o, "dk", js_make_number(pb->dk));
    js_object_set(&o, "dv", js_make_number(pb->dv));
    js_object_set(&o, "g", js_make_number(pb->g));
    js_object_set(&o, "block", pb->block ? js_make_number(pb->block) : js_make_string("*"));
    js_object_set(&o, "dtype", js_make_string(clnsa_dtype_name(pb->dtype)));
    if (pb->block) js_object_set(&o, "window", js_make_string(pb->swa ? "on" : "off")); /* NSA: timed with it or without */
    return o;
}

const char *tune_params_str(const tune_family *f, const int *v, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < f->nparams && n < size; ++i)
        n += (size_t)(f->dispatch && v[i] == TUNE_SPLIT_NEVER
                          ? snprintf(buf + n, size - n, "%s%s=never", i ? " " : "", f->params[i].name)
                          : snprintf(buf + n, size - n, "%s%s=%d", i ? " " : "", f->params[i].name, v[i]));
    return buf;
}

int tune_write_file(const char *path, const js_value *entries)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "clnsa tune: %s: cannot write\n", tmp);
        return -1;
    }
    fputs("{\n  \"clnsa_tuning\": 1,\n  \"entries\": ", f);
    js_write(f, entries, 2);
    fputs("\n}\n", f);
    const bool ok = !ferror(f);
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        fprintf(stderr, "clnsa tune: %s: write failed\n", path);
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------- devices --params */

static void print_shape(const cli_env *env, const tune_problem *pb, const char *what)
{
    printf("  shape D=%d DV=%d G=%d block=%d %s, window %s (%s):\n", pb->dk, pb->dv, pb->g, pb->block,
           clnsa_dtype_name(pb->dtype), pb->swa ? "on" : "off", what);
    for (int f = 0; f < TF_COUNT; ++f) {
        tune_choice c;
        char p[96];
        if (tune_choose(env->ctx, f, pb, &c) != CLNSA_SUCCESS) {
            printf("    %-13s does not fit this device (%s)\n", tune_families[f].name, c.where);
            continue;
        }
        printf("    %-13s %-24s %s\n", tune_families[f].name, tune_params_str(&tune_families[f], c.v, p, sizeof p), c.where);
    }
}

static bool same_shape(const tune_problem *a, const tune_problem *b)
{
    return a->dk == b->dk && a->dv == b->dv && a->g == b->g && a->block == b->block && a->dtype == b->dtype &&
           a->swa == b->swa;
}

/* The shape classes the entries name for this device (wildcards from pb). */
static int add_shapes(const cli_env *env, const tune_entry *e, size_t n, const tune_problem *pb, tune_problem *shapes,
                      int count, int max)
{
    for (size_t i = 0; i < n && count < max; ++i) {
        if (!tune_entry_applies(&e[i], env->info)) continue;
        tune_problem s = *pb;
        if (e[i].dk) s.dk = e[i].dk;
        s.dv = e[i].dv ? e[i].dv : e[i].dk ? e[i].dk : pb->dv;
        if (e[i].g) s.g = e[i].g;
        if (e[i].block) s.block = s.cmp_block = s.cmp_stride = e[i].block;
        if (e[i].dtype) s.dtype = e[i].dtype;
        if (e[i].window != TUNE_WINDOW_ANY) s.swa = e[i].window == TUNE_WINDOW_ON;
        bool dup = same_shape(&s, pb);
        for (int j = 0; j < count && !dup; ++j) dup = same_shape(&s, &shapes[j]);
        if (!dup) shapes[count++] = s;
    }
    return count;
}

int tune_print_params(const char *spec, const tune_problem *pb)
{
    cli_env env;
    if (cli_open(&env, spec)) return -1;
    printf("device %d:%d  %s  (%s/%s)\n  tuning file: %s\n", env.plat_index, env.dev_index, env.info->name,
           tune_vendor_key(env.info->vendor), env.info->architecture,
           env.ctx->tuning ? env.ctx->tuning->path : "none (CLNSA_TUNING_FILE)");
    print_shape(&env, pb, "asked");
    tune_problem shapes[32];
    int n = add_shapes(&env, clnsa_tuning_db, clnsa_tuning_db_count, pb, shapes, 0, 32);
    const tune_file *uf = env.ctx->tuning;
    if (uf) n = add_shapes(&env, uf->entries, uf->count, pb, shapes, n, 32);
    for (int i = 0; i < n; ++i) print_shape(&env, &shapes[i], "named by a tuning entry for this device");
    cli_close(&env);
    return 0;
}

/* ----------------------------------------------------------------- merge */

static const char *str_or_wild(const js_value *e, const char *key)
{
    const char *s = js_str(js_get(e, key));
    return s && *s ? s : "*";
}

/* "K=V;..." of an object of numbers or strings, keys sorted: equal
 * parameter sets and shape classes give equal strings. */
static void canon(const js_value *o, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    if (!o || o->type != JS_OBJECT) return;
    const char *last = "";
    for (size_t k = 0; k < o->count; ++k) {
        const char *next = NULL;
        size_t at = 0;
        for (size_t i = 0; i < o->count; ++i)
            if (strcmp(o->keys[i], last) > 0 && (!next || strcmp(o->keys[i], next) < 0)) next = o->keys[i], at = i;
        if (!next) break;
        const js_value *v = &o->items[at];
        if (n < size) {
            if (v->type == JS_NUMBER) n += (size_t)snprintf(buf + n, size - n, "%s=%g;", next, v->number);
            else n += (size_t)snprintf(buf + n, size - n, "%s=%s;", next, js_str(v) ? js_str(v) : "?");
        }
        last = next;
    }
}

/* The group of an entry: vendor/architecture/family/shape. */
static void group_key(const js_value *e, char *buf, size_t size)
{
    char shape[256];
    canon(js_get(e, "shape"), shape, sizeof shape);
    snprintf(buf, size, "%s|%s|%s|%s", str_or_wild(e, "vendor"), str_or_wild(e, "architecture"), str_or_wild(e, "family"),
             shape);
}

static bool is_device_entry(const js_value *e) { return strcmp(str_or_wild(e, "device"), "*") != 0; }

static bool same_slot(const js_value *a, const js_value *b)
{
    char ka[512], kb[512];
    group_key(a, ka, sizeof ka);
    group_key(b, kb, sizeof kb);
    return strcmp(ka, kb) == 0 && strcmp(str_or_wild(a, "device"), str_or_wild(b, "device")) == 0;
}

static void remove_at(js_value *arr, size_t i)
{
    js_free(&arr->items[i]);
    memmove(&arr->items[i], &arr->items[i + 1], (arr->count - i - 1) * sizeof arr->items[0]);
    --arr->count;
}

/* The architecture default of one group, from its devices' results; false
 * when no device entry has results. */
static bool arch_default(const js_value *entries, const char *key, js_value *out, char *summary, size_t ssize)
{
    const js_value *devs[64];
    double best[64];
    int nd = 0;
    for (size_t i = 0; i < entries->count && nd < 64; ++i) {
        const js_value *e = &entries->items[i];
        char k[512];
        group_key(e, k, sizeof k);
        const js_value *res = js_get(e, "results");
        if (strcmp(k, key) != 0 || !is_device_entry(e) || !res || res->type != JS_ARRAY || !res->count) continue;
        best[nd] = 1e300;
        for (size_t r = 0; r < res->count; ++r) {
            const js_value *ms = js_get(&res->items[r], "ms");
            if (ms && ms->type == JS_NUMBER && ms->number > 0 && ms->number < best[nd]) best[nd] = ms->number;
        }
        if (best[nd] < 1e300) devs[nd++] = e;
    }
    if (!nd) return false;
    const js_value *choice = NULL;
    int choice_cover = 0;
    double choice_rel = 0;
    for (int d = 0; d < nd; ++d) { /* every configuration any device measured */
        const js_value *res = js_get(devs[d], "results");
        for (size_t r = 0; r < res->count; ++r) {
            const js_value *params = js_get(&res->items[r], "params");
            char pk[256];
            canon(params, pk, sizeof pk);
            int cover = 0;
            double rel = 0;
            for (int d2 = 0; d2 < nd; ++d2) {
                const js_value *res2 = js_get(devs[d2], "results");
                for (size_t r2 = 0; r2 < res2->count; ++r2) {
                    char pk2[256];
                    const js_value *ms = js_get(&res2->items[r2], "ms");
                    canon(js_get(&res2->items[r2], "params"), pk2, sizeof pk2);
                    if (strcmp(pk, pk2) != 0 || !ms || ms->type != JS_NUMBER) continue;
                    ++cover;
                    rel += ms->number / best[d2];
                    break;
                }
            }
            rel /= cover ? cover : 1;
            if (!choice || cover > choice_cover || (cover == choice_cover && rel < choice_rel))
                choice = params, choice_cover = cover, choice_rel = rel;
        }
    }
    js_value e = {.type = JS_OBJECT}, params, shape, names = {.type = JS_ARRAY};
    js_object_set(&e, "vendor", js_make_string(str_or_wild(devs[0], "vendor")));
    js_object_set(&e, "architecture", js_make_string(str_or_wild(devs[0], "architecture")));
    js_object_set(&e, "device", js_make_string("*"));
    js_object_set(&e, "family", js_make_string(str_or_wild(devs[0], "family")));
    if (js_copy(js_get(devs[0], "shape"), &shape)) js_object_set(&e, "shape", shape);
    if (js_copy(choice, &params)) js_object_set(&e, "params", params);
    js_object_set(&e, "relative_time", js_make_number((double)(long)(choice_rel * 1000 + 0.5) / 1000));
    js_object_set(&e, "measured_on", js_make_number(choice_cover));
    for (int d = 0; d < nd; ++d) js_array_push(&names, js_make_string(str_or_wild(devs[d], "device")));
    js_object_set(&e, "devices", names);
    *out = e;
    char pk[256];
    canon(choice, pk, sizeof pk);
    snprintf(summary, ssize, "%s  (mean relative time %.3f over %d of %d devices)", pk, choice_rel, choice_cover, nd);
    return true;
}

static int cmp_entries(const void *a, const void *b)
{
    const js_value *x = a, *y = b;
    char kx[600], ky[600];
    group_key(x, kx, sizeof kx);
    group_key(y, ky, sizeof ky);
    int c = strcmp(kx, ky);
    return c ? c : strcmp(str_or_wild(x, "device"), str_or_wild(y, "device"));
}

static int merge_vendor(const char *dir, const char *vendor, const js_value *inputs)
{
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s.json", dir, vendor);
    js_value doc, entries = {.type = JS_ARRAY};
    if (access(path, F_OK) == 0) {
        if (!js_parse_file(path, &doc, err, sizeof err)) {
            fprintf(stderr, "clnsa tune --merge: %s\n", err);
            return -1;
        }
        const js_value *old = js_get(&doc, "entries");
        if (old && old->type == JS_ARRAY) js_copy(old, &entries);
        js_free(&doc);
    }
    int added = 0;
    for (size_t i = 0; i < inputs->count; ++i) {
        const js_value *e = &inputs->items[i];
        if (strcmp(str_or_wild(e, "vendor"), vendor) != 0) continue;
        for (size_t j = entries.count; j-- > 0;)
            if (same_slot(&entries.items[j], e)) remove_at(&entries, j);
        js_value c;
        if (js_copy(e, &c)) js_array_push(&entries, c), ++added;
    }
    /* drop the architecture defaults recomputed below, then one default per
     * group of device entries with results */
    for (size_t j = entries.count; j-- > 0;) {
        const js_value *e = &entries.items[j];
        char key[512], summary[400];
        js_value d;
        group_key(e, key, sizeof key);
        if (is_device_entry(e) || strcmp(str_or_wild(e, "architecture"), "*") == 0 ||
            !arch_default(&entries, key, &d, summary, sizeof summary))
            continue;
        js_free(&d);
        remove_at(&entries, j);
    }
    const size_t n = entries.count;
    for (size_t i = 0; i < n; ++i) {
        char key[512], summary[400];
        group_key(&entries.items[i], key, sizeof key);
        bool seen = false;
        for (size_t j = 0; j < i && !seen; ++j) {
            char k2[512];
            group_key(&entries.items[j], k2, sizeof k2);
            seen = is_device_entry(&entries.items[j]) && strcmp(k2, key) == 0;
        }
        js_value d;
        if (seen || !is_device_entry(&entries.items[i]) || !arch_default(&entries, key, &d, summary, sizeof summary))
            continue;
        js_array_push(&entries, d);
        printf("%s: architecture default for %s: %s\n", path, key, summary);
    }
    qsort(entries.items, entries.count, sizeof entries.items[0], cmp_entries);
    int rc = tune_write_file(path, &entries);
    if (!rc) printf("%s: %d entries merged, %zu in the file\n", path, added, entries.count);
    js_free(&entries);
    return rc;
}

/* A result whose search --max-seconds cut short is refused: a candidate it
 * never reached may be the best. --partial merges it, with a word. */
static bool cut_short_refused(const char *file, const js_value *e, bool partial)
{
    long skipped;
    if (!js_int(js_get(js_get(e, "tuned_with"), "skipped"), 1, 1L << 30, &skipped)) return false;
    fprintf(stderr, "clnsa tune --merge: %s: %s on %s: %ld candidates were not reached (--max-seconds)%s\n", file,
            str_or_wild(e, "family"), str_or_wild(e, "device"), skipped,
            partial ? "; merged from those timed (--partial)" : ": refused (tune again with more time, or --partial)");
    return !partial;
}

int tune_merge(int argc, char **argv)
{
    const char *dir = NULL;
    js_value inputs = {.type = JS_ARRAY};
    int rc = 0;
    bool partial = false;
    for (int i = 3; i < argc; ++i) partial = partial || strcmp(argv[i], "--partial") == 0;
    for (int i = 3; i < argc && rc == 0; ++i) {
        if (strcmp(argv[i], "--into") == 0) {
            if (i + 1 >= argc) break;
            dir = argv[++i];
            continue;
        }
        if (strcmp(argv[i], "--partial") == 0) continue;
        js_value doc;
        char err[512];
        if (!js_parse_file(argv[i], &doc, err, sizeof err)) {
            fprintf(stderr, "clnsa tune --merge: %s\n", err);
            rc = -1;
            break;
        }
        const js_value *e = js_get(&doc, "entries");
        long version;
        if (!js_int(js_get(&doc, "clnsa_tuning"), 1, 1, &version) || !e || e->type != JS_ARRAY) {
            fprintf(stderr, "clnsa tune --merge: %s: expected {\"clnsa_tuning\": 1, \"entries\": [...]}\n", argv[i]);
            rc = -1;
        }
        for (size_t j = 0; rc == 0 && j < e->count; ++j) {
            const js_value *x = &e->items[j];
            js_value c;
            if (!is_device_entry(x)) continue; /* defaults are recomputed from the devices' results */
            if (tune_family_find(str_or_wild(x, "family")) < 0 || !js_get(x, "params") || !js_get(x, "shape")) {
                fprintf(stderr, "clnsa tune --merge: %s: entry %zu: expected family, shape and params\n", argv[i], j);
                rc = -1;
            } else if (cut_short_refused(argv[i], x, partial)) {
                rc = -1;
            } else if (js_copy(x, &c)) {
                js_array_push(&inputs, c);
            }
        }
        js_free(&doc);
    }
    if (rc == 0 && (!dir || !inputs.count)) {
        fprintf(stderr, "usage: clnsa tune --merge a.json [b.json ...] --into DIR [--partial] (with at least one device entry)\n");
        js_free(&inputs);
        return CLI_USAGE;
    }
    if (rc == 0 && cli_mkdirs(dir)) rc = -1;
    const char *vendors[] = {"nvidia", "amd", "intel", "pocl", "mesa", "other"};
    for (size_t v = 0; rc == 0 && v < sizeof vendors / sizeof vendors[0]; ++v) {
        bool any = false;
        for (size_t i = 0; i < inputs.count && !any; ++i) any = strcmp(str_or_wild(&inputs.items[i], "vendor"), vendors[v]) == 0;
        if (!any) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.json", dir, vendors[v]);
        const bool fresh = access(path, F_OK) != 0;
        rc = merge_vendor(dir, vendors[v], &inputs);
        if (rc == 0 && fresh) printf("%s is new: list it in %s/meson.build\n", path, dir);
    }
    js_free(&inputs);
    return rc ? CLI_FAIL : CLI_OK;
}
