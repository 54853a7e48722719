/* cli_common.c: see cli_common.h. */
#include "cli_common.h"

#include "fp16.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ------------------------------------------------------------- options */

static const cli_opt *find_opt(const cli_opt *opts, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; ++i)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0) return &opts[i];
    return NULL;
}

static int choice_index(const char *choices, const char *value)
{
    int idx = 0;
    size_t vl = strlen(value);
    for (const char *p = choices; *p; ++idx) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == vl && strncmp(p, value, len) == 0) return idx;
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

static int set_value(const char *cmd, const cli_opt *o, const char *v)
{
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < o->lo || x > o->hi) {
            fprintf(stderr, "clnsa %s: %s: expected an integer in %ld..%ld, got '%s'\n", cmd, o->name, o->lo, o->hi, v);
            return CLI_USAGE;
        }
        *(int *)o->dst = (int)x;
        return 0;
    }
    case OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !(x == x)) {
            fprintf(stderr, "clnsa %s: %s: expected a number, got '%s'\n", cmd, o->name, v);
            return CLI_USAGE;
        }
        *(double *)o->dst = x;
        return 0;
    }
    case OPT_STRING:
        *(const char **)o->dst = v;
        return 0;
    case OPT_CHOICE: {
        int idx = choice_index(o->choices, v);
        if (idx < 0) {
            fprintf(stderr, "clnsa %s: %s: expected one of %s, got '%s'\n", cmd, o->name, o->choices, v);
            return CLI_USAGE;
        }
        *(int *)o->dst = idx;
        return 0;
    }
    case OPT_FLAG:
        break;
    }
    return CLI_USAGE;
}

int cli_parse(const char *cmd, int argc, char **argv, int first, const cli_opt *opts, size_t n, bool *seen)
{
    for (int i = first; i < argc; ++i) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return -1;
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "clnsa %s: unexpected argument '%s' (see clnsa %s --help)\n", cmd, a, cmd);
            return CLI_USAGE;
        }
        const char *eq = strchr(a, '=');
        const cli_opt *o = find_opt(opts, n, a, eq ? (size_t)(eq - a) : strlen(a));
        if (!o) {
            fprintf(stderr, "clnsa %s: unknown option '%s' (see clnsa %s --help)\n", cmd, a, cmd);
            return CLI_USAGE;
        }
        if (seen) seen[o - opts] = true;
        if (o->kind == OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "clnsa %s: %s takes no value\n", cmd, o->name);
                return CLI_USAGE;
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "clnsa %s: %s needs a value\n", cmd, o->name);
                return CLI_USAGE;
            }
            v = argv[++i];
        }
        int rc = set_value(cmd, o, v);
        if (rc) return rc;
    }
    return 0;
}

void cli_print_opts(FILE *f, const cli_opt *opts, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        char left[64];
        const char *arg = opts[i].kind == OPT_FLAG ? "" : opts[i].kind == OPT_CHOICE ? opts[i].choices : opts[i].arg;
        snprintf(left, sizeof left, "%s%s%s", opts[i].name, *arg ? " " : "", arg);
        fprintf(f, "  %-24s %s\n", left, opts[i].help);
    }
}

clnsa_dtype cli_dtype_from_choice(int index)
{
    static const clnsa_dtype d[] = {CLNSA_DTYPE_F32, CLNSA_DTYPE_F16, CLNSA_DTYPE_BF16};
    return index >= 0 && index < 3 ? d[index] : CLNSA_DTYPE_INVALID;
}

/* ------------------------------------------------------------- devices */

#define MAX_PLATFORMS 32
#define MAX_DEVICES 64

static cl_uint platforms(cl_platform_id *p)
{
    cl_uint n = 0;
    if (clGetPlatformIDs(MAX_PLATFORMS, p, &n) != CL_SUCCESS) return 0;
    return n < MAX_PLATFORMS ? n : MAX_PLATFORMS;
}

static cl_uint devices(cl_platform_id p, cl_device_id *d)
{
    cl_uint n = 0;
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, MAX_DEVICES, d, &n) != CL_SUCCESS) return 0;
    return n < MAX_DEVICES ? n : MAX_DEVICES;
}

int cli_get_device(int p, int d, cl_platform_id *platform, cl_device_id *device)
{
    cl_platform_id plats[MAX_PLATFORMS];
    cl_device_id devs[MAX_DEVICES];
    cl_uint np = platforms(plats);
    if (p < 0 || (cl_uint)p >= np) {
        fprintf(stderr, "clnsa: no OpenCL platform %d (there are %u; see clnsa devices)\n", p, np);
        return -1;
    }
    cl_uint nd = devices(plats[p], devs);
    if (d < 0 || (cl_uint)d >= nd) {
        fprintf(stderr, "clnsa: platform %d has no device %d (it has %u; see clnsa devices)\n", p, d, nd);
        return -1;
    }
    *platform = plats[p];
    *device = devs[d];
    return 0;
}

int cli_parse_device(const char *spec, int *p, int *d)
{
    char tail;
    if (sscanf(spec, "%d:%d%c", p, d, &tail) != 2 || *p < 0 || *d < 0) {
        fprintf(stderr, "clnsa: device '%s': expected P:D (platform and device index, see clnsa devices)\n", spec);
        return -1;
    }
    return 0;
}

static bool is_pocl_cpu(cl_platform_id p, cl_device_id d)
{
    char name[256] = "";
    cl_device_type type = 0;
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof name, name, NULL);
    name[sizeof name - 1] = '\0';
    clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    return (strstr(name, "Portable Computing Language") || strstr(name, "PoCL")) && (type & CL_DEVICE_TYPE_CPU);
}

int cli_default_device(int *p, int *d)
{
    const char *env = getenv("CLNSA_DEVICE");
    if (env && *env) return cli_parse_device(env, p, d);
    cl_platform_id plats[MAX_PLATFORMS];
    cl_device_id devs[MAX_DEVICES];
    cl_uint np = platforms(plats);
    int first_p = -1, first_d = -1, pocl_p = -1, pocl_d = -1;
    for (cl_uint i = 0; i < np; ++i) {
        cl_uint nd = devices(plats[i], devs);
        for (cl_uint j = 0; j < nd; ++j) {
            cl_device_type type = 0;
            clGetDeviceInfo(devs[j], CL_DEVICE_TYPE, sizeof type, &type, NULL);
            if (type & CL_DEVICE_TYPE_GPU) {
                *p = (int)i;
                *d = (int)j;
                return 0;
            }
            if (first_p < 0) first_p = (int)i, first_d = (int)j;
            if (pocl_p < 0 && is_pocl_cpu(plats[i], devs[j])) pocl_p = (int)i, pocl_d = (int)j;
        }
    }
    if (pocl_p >= 0) first_p = pocl_p, first_d = pocl_d;
    if (first_p < 0) {
        fprintf(stderr, "clnsa: no OpenCL device found (install an OpenCL driver, e.g. pocl-opencl-icd for the CPU)\n");
        return -1;
    }
    *p = first_p;
    *d = first_d;
    return 0;
}

const char *cli_cl_error(cl_int err)
{
    static _Thread_local char buf[32];
    switch (err) {
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_PROFILING_INFO_NOT_AVAILABLE: return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_EVENT: return "CL_INVALID_EVENT";
    case CL_INVALID_OPERATION: return "CL_INVALID_OPERATION";
    default: snprintf(buf, sizeof buf, "OpenCL error %d", (int)err); return buf;
    }
}

int cli_open(cli_env *env, const char *spec)
{
    memset(env, 0, sizeof *env);
    int p, d;
    if (spec ? cli_parse_device(spec, &p, &d) : cli_default_device(&p, &d)) return -1;
    if (cli_get_device(p, d, &env->platform, &env->device)) return -1;
    env->plat_index = p;
    env->dev_index = d;
    cl_int err;
    env->cl = clCreateContext(NULL, 1, &env->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clnsa: device %d:%d: clCreateContext failed: %s\n", p, d, cli_cl_error(err));
        return -1;
    }
    env->queue = clCreateCommandQueue(env->cl, env->device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clnsa: device %d:%d: clCreateCommandQueue failed: %s\n", p, d, cli_cl_error(err));
        cli_close(env);
        return -1;
    }
    char msg[1024] = "";
    clnsa_status st = clnsa_context_create(env->cl, env->device, NULL, &env->ctx, msg, sizeof msg);
    if (st != CLNSA_SUCCESS) {
        fprintf(stderr, "clnsa: device %d:%d: clnsa_context_create: %s: %s\n", p, d, clnsa_status_string(st), msg);
        cli_close(env);
        return -1;
    }
    env->info = clnsa_context_device_info(env->ctx);
    return 0;
}

static void hold_release(void);

void cli_close(cli_env *env)
{
    hold_release();
    if (env->ctx) clnsa_context_destroy(env->ctx);
    if (env->queue) clReleaseCommandQueue(env->queue);
    if (env->cl) clReleaseContext(env->cl);
    memset(env, 0, sizeof *env);
}

void cli_report(const cli_env *env, const char *what, clnsa_status st)
{
    const char *msg = env && env->ctx ? clnsa_last_error(env->ctx) : "";
    fprintf(stderr, "clnsa: %s: %s%s%s\n", what, clnsa_status_string(st), *msg ? ": " : "", msg);
}

/* ------------------------------------------------------ host <-> device */

void *cli_malloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fprintf(stderr, "clnsa: out of host memory (%zu bytes)\n", bytes);
    return p;
}

cl_mem cli_buffer(const cli_env *env, size_t bytes, const void *host)
{
    cl_int err;
    cl_mem m = clCreateBuffer(env->cl, CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes ? bytes : 4,
                              bytes ? (void *)host : NULL, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clnsa: clCreateBuffer(%zu bytes) failed: %s\n", bytes, cli_cl_error(err));
        return NULL;
    }
    return m;
}

float cli_round(float x, clnsa_dtype dt)
{
    if (dt == CLNSA_DTYPE_F16) return fp16_to_f32(fp16_from_f32(x));
    if (dt == CLNSA_DTYPE_BF16) return bf16_to_f32(bf16_from_f32(x));
    return x;
}

static void encode(float f, clnsa_dtype dt, unsigned char *dst)
{
    if (dt == CLNSA_DTYPE_F32) {
        memcpy(dst, &f, 4);
    } else {
        uint16_t h = dt == CLNSA_DTYPE_F16 ? fp16_from_f32(f) : bf16_from_f32(f);
        memcpy(dst, &h, 2);
    }
}

cl_mem cli_upload_f32(const cli_env *env, const float *x, size_t n, clnsa_dtype dt)
{
    size_t es = clnsa_dtype_size(dt);
    if (dt == CLNSA_DTYPE_F32) return cli_buffer(env, n * 4, n ? x : NULL);
    unsigned char *buf = cli_malloc(n * es);
    if (!buf) return NULL;
    for (size_t i = 0; i < n; ++i) encode(x[i], dt, buf + es * i);
    cl_mem m = cli_buffer(env, n * es, n ? buf : NULL);
    free(buf);
    return m;
}

cl_mem cli_fill(const cli_env *env, size_t n, clnsa_dtype dt, float value)
{
    size_t es = clnsa_dtype_size(dt);
    unsigned char *buf = cli_malloc(n * es);
    if (!buf) return NULL;
    for (size_t i = 0; i < n; ++i) encode(value, dt, buf + es * i);
    cl_mem m = cli_buffer(env, n * es, n ? buf : NULL);
    free(buf);
    return m;
}

cl_mem cli_upload_i32(const cli_env *env, const int32_t *x, size_t n) { return cli_buffer(env, n * 4, n ? x : NULL); }

static int read_buffer(const cli_env *env, cl_mem m, size_t bytes, void *out)
{
    if (!bytes) return 0;
    cl_int err = clEnqueueReadBuffer(env->queue, m, CL_TRUE, 0, bytes, out, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clnsa: clEnqueueReadBuffer(%zu bytes) failed: %s\n", bytes, cli_cl_error(err));
        return -1;
    }
    return 0;
}

int cli_download_f32(const cli_env *env, cl_mem m, size_t n, clnsa_dtype dt, float *out)
{
    if (dt == CLNSA_DTYPE_F32) return read_buffer(env, m, n * 4, out);
    uint16_t *buf = cli_malloc(n * 2);
    if (!buf || read_buffer(env, m, n * 2, buf)) {
        free(buf);
        return -1;
    }
    for (size_t i = 0; i < n; ++i) out[i] = dt == CLNSA_DTYPE_F16 ? fp16_to_f32(buf[i]) : bf16_to_f32(buf[i]);
    free(buf);
    return 0;
}

int cli_download_i32(const cli_env *env, cl_mem m, size_t n, int32_t *out) { return read_buffer(env, m, n * 4, out); }

/* --------------------------------------------------------------- timing */

/* The busy kernel: one work-item's chain of dependent FMAs, about 0.5 ms on
 * an H200 (HOLD_STEPS), longer than a driver takes to hand the commands
 * behind it to the device. Built once per context. */
#define HOLD_STEPS 200000
static const char hold_src[] = "__kernel void hold(__global float *x, int n) {\n"
                               "    float a = 0.5f * (float)n;\n"
                               "    for (int i = 0; i < n; ++i) a = fma(a, 0.9999f, 0.5f);\n"
                               "    if (a == -1.0f) x[0] = a; /* never: keeps the chain */\n"
                               "}\n";
static struct {
    cl_context cl;
    cl_program prog;
    cl_kernel kernel;
} hold_cache;

static void hold_release(void)
{
    if (hold_cache.kernel) clReleaseKernel(hold_cache.kernel);
    if (hold_cache.prog) clReleaseProgram(hold_cache.prog);
    memset(&hold_cache, 0, sizeof hold_cache);
}

static cl_kernel hold_kernel(const cli_env *env)
{
    if (hold_cache.kernel && hold_cache.cl == env->cl) return hold_cache.kernel;
    hold_release();
    const char *src = hold_src;
    cl_int err;
    cl_program p = clCreateProgramWithSource(env->cl, 1, &src, NULL, &err);
    if (err != CL_SUCCESS) return NULL;
    cl_kernel k = NULL;
    if (clBuildProgram(p, 1, &env->device, "", NULL, NULL) == CL_SUCCESS) k = clCreateKernel(p, "hold", &err);
    if (!k) {
        clReleaseProgram(p);
        return NULL;
    }
    hold_cache.cl = env->cl;
    hold_cache.prog = p;
    hold_cache.kernel = k;
    return k;
}

/* `released`: the user event's status is already set. */
static void timer_release(cli_timer *t, bool released)
{
    if (t->user) {
        if (!released) clSetUserEventStatus(t->user, CL_COMPLETE);
        clReleaseEvent(t->user);
    }
    if (t->hold) clReleaseEvent(t->hold);
    if (t->marker) clReleaseEvent(t->marker);
    if (t->scratch) clReleaseMemObject(t->scratch);
    memset(t, 0, sizeof *t);
}

int cli_timer_begin(const cli_env *env, cli_timer *t)
{
    cl_int err;
    const cl_int zero = 0, steps = HOLD_STEPS;
    const size_t one = 1;
    memset(t, 0, sizeof *t);
    cl_kernel hold = hold_kernel(env);
    t->user = clCreateUserEvent(env->cl, &err);
    if (err == CL_SUCCESS) t->scratch = clCreateBuffer(env->cl, CL_MEM_READ_WRITE, sizeof zero, NULL, &err);
    if (err == CL_SUCCESS && hold) { /* without it (its build failed), the fill waits on the user event alone */
        err = clSetKernelArg(hold, 0, sizeof t->scratch, &t->scratch);
        if (err == CL_SUCCESS) err = clSetKernelArg(hold, 1, sizeof steps, &steps);
        if (err == CL_SUCCESS) err = clEnqueueNDRangeKernel(env->queue, hold, 1, NULL, &one, &one, 1, &t->user, &t->hold);
    }
    if (err == CL_SUCCESS)
        err = clEnqueueFillBuffer(env->queue, t->scratch, &zero, sizeof zero, 0, sizeof zero, 1, t->hold ? &t->hold : &t->user,
                                  &t->marker);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clnsa: timing start command failed: %s\n", cli_cl_error(err));
        timer_release(t, false);
        return -1;
    }
    return 0;
}

double cli_timer_end(cli_timer *t, cl_event done)
{
    clSetUserEventStatus(t->user, CL_COMPLETE);
    cl_int err = done ? clWaitForEvents(1, &done) : clWaitForEvents(1, &t->marker);
    cl_ulong t0 = 0, t1 = 0;
    if (err == CL_SUCCESS)
        err = clGetEventProfilingInfo(t->marker, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL);
    if (err == CL_SUCCESS && done) err = clGetEventProfilingInfo(done, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    timer_release(t, true);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clnsa: profiling events failed: %s\n", cli_cl_error(err));
        return -1;
    }
    return t1 > t0 ? (double)(t1 - t0) * 1e-6 : 0.0;
}

uint64_t cli_rng(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void cli_causal_selection(int32_t *row, int S, int t, int block, int init_blocks, int local_blocks, uint64_t *state)
{
    const int cur = t / block, nb = cur + 1, init = init_blocks < nb ? init_blocks : nb;
    const int local0 = cur + 1 - local_blocks > init ? cur + 1 - local_blocks : init; /* past the init ones */
    int n = 0;
    for (int j = 0; j < init && n < S; ++j) row[n++] = j;
    for (int j = local0; j <= cur && n < S; ++j) row[n++] = j;
    while (n < S && n < nb) { /* a block not taken yet: nb > n of them are left */
        const int x = (int)(cli_rng(state) % (uint64_t)nb);
        bool taken = false;
        for (int u = 0; u < n; ++u) taken = taken || row[u] == x;
        if (!taken) row[n++] = x;
    }
    for (; n < S; ++n) row[n] = -1;
}

cl_mem cli_random(const cli_env *env, size_t n, float lo, float hi, clnsa_dtype dt, uint64_t *state)
{
    float *x = cli_malloc(n * sizeof *x);
    if (!x) return NULL;
    for (size_t i = 0; i < n; ++i) x[i] = lo + (hi - lo) * (float)((cli_rng(state) >> 11) * 0x1.0p-53);
    cl_mem m = cli_upload_f32(env, x, n, dt);
    free(x);
    return m;
}

double cli_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void cli_sort_doubles(double *x, size_t n) { qsort(x, n, sizeof *x, cmp_double); }

double cli_median(double *x, size_t n)
{
    cli_sort_doubles(x, n);
    return x[n / 2];
}

int cli_parse_int_list(const char *cmd, const char *opt, const char *s, int lo, int hi, int *out, int max)
{
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        const long x = strtol(p, &end, 10);
        if (end == p || x < lo || x > hi || n == max || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "clnsa %s: %s: expected a comma-separated list of at most %d integers in [%d, %d], got '%s'\n",
                    cmd, opt, max, lo, hi, s);
            return -1;
        }
        out[n++] = (int)x;
        if (*end == '\0') return n;
        p = end + 1;
    }
}

/* ---------------------------------------------------------------- misc */

const char *cli_shape_str(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t n = 0;
    n += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n < size; ++i)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

const char *cli_path(const char *dir, const char *name, char *buf, size_t size)
{
    size_t dl = strlen(dir);
    snprintf(buf, size, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", name);
    return buf;
}

int cli_mkdirs(const char *dir)
{
    char path[4096];
    if (!*dir) {
        fprintf(stderr, "clnsa: empty output directory name\n");
        return -1;
    }
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        fprintf(stderr, "clnsa: %s: path too long\n", dir);
        return -1;
    }
    for (char *p = path + 1;; ++p) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(path, 0777) != 0 && errno != EEXIST) {
                fprintf(stderr, "clnsa: %s: cannot create directory: %s\n", path, strerror(errno));
                return -1;
            }
            *p = c;
            if (!c) break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "clnsa: %s: not a directory\n", dir);
        return -1;
    }
    return 0;
}

clnsa_tensor cli_t4(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d)
{
    const int64_t s[4] = {a, b, c, d};
    return clnsa_tensor_contiguous(m, dt, 4, s);
}

clnsa_tensor cli_t3(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b, int64_t c)
{
    const int64_t s[3] = {a, b, c};
    return clnsa_tensor_contiguous(m, dt, 3, s);
}

bool cli_param_ok(const char *cmd, const char *opt, double v)
{
    if (v == 0.0 || (float)v != 0.0f) return true;
    fprintf(stderr, "clnsa %s: --%s: %g becomes 0 (the default) as a float; expected 0 or a value in [%g, %g]\n", cmd, opt,
            v, (double)FLT_MIN, (double)CLNSA_PARAM_MAX);
    return false;
}
