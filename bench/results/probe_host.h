/* probe_host.h: the host side the standalone probes under bench/results/ share (they are built
 * by hand on the GPU machine, not by meson): the NVIDIA device, sources read from files, bf16,
 * and a program built for sm_90a through the library's ptx_to_sm90a (link build-gpu/libclnsa.a
 * where build_sm90a is used). */
#ifndef PROBE_HOST_H
#define PROBE_HOST_H
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("FAIL %s: %d (line %d)\n", #x, e_, __LINE__); exit(1); } } while (0)

static cl_context ctx;
static cl_device_id dev;
static cl_command_queue q;

char *ptx_to_sm90a(const char *ptx, int maxnreg, const char **why); /* src/internal.h */
int sm90a_register_cap(const char *src);

/* The median of reps (at most 16) runs of k, kernel ms by profiling events; -1 if the launch
 * fails. */
static inline double median_ms(cl_kernel k, cl_uint dims, const size_t *gs, const size_t *ls, int reps)
{
    double t[16];
    for (int r = 0; r < reps; ++r) {
        cl_event ev;
        cl_int e = clEnqueueNDRangeKernel(q, k, dims, NULL, gs, ls, 0, NULL, &ev);
        if (e != CL_SUCCESS) { printf("  launch failed: %d\n", e); return -1; }
        CK(clWaitForEvents(1, &ev));
        cl_ulong a, b;
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL);
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL);
        t[r] = (b - a) * 1e-6;
        clReleaseEvent(ev);
    }
    for (int i = 0; i < reps; ++i)
        for (int j = i + 1; j < reps; ++j)
            if (t[j] < t[i]) { double x = t[i]; t[i] = t[j]; t[j] = x; }
    return t[reps / 2];
}

/* dev: the first NVIDIA GPU; exits saying so when there is none. */
static inline void find_nvidia_gpu(void)
{
    cl_platform_id plats[8];
    cl_uint np = 0;
    CK(clGetPlatformIDs(8, plats, &np));
    for (cl_uint i = 0; i < np; i++) {
        char name[256];
        clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strstr(name, "NVIDIA") && clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_GPU, 1, &dev, NULL) == CL_SUCCESS) return;
    }
    printf("no NVIDIA GPU\n");
    exit(1);
}

/* dev, its context ctx and a profiling queue q. */
static inline void open_nvidia_gpu(void)
{
    find_nvidia_gpu();
    cl_int err;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CK(err);
    q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    CK(err);
}


static inline char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) { printf("cannot open %s\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc((size_t)n + 1, 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) exit(1);
    fclose(f);
    return s;
}

static inline unsigned short bf16(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}

static inline double unbf(unsigned short h)
{
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The compressed branch of query row qrow (D elements) against the first nv compressed keys
 * (rows k_at(j), v_at(j) of kc / vc), in double precision: the scaled scores sc, their max mx
 * and sum of exp(sc - mx), and the unnormalized output ref (D). */
static inline void cmp_reference(const unsigned short *qrow, const unsigned short *kc, const unsigned short *vc,
                                 size_t row_stride, int nv, int D, double *sc, double *mx, double *sum, double *ref)
{
    *mx = -INFINITY;
    *sum = 0;
    for (int j = 0; j < nv; ++j) {
        double s = 0;
        for (int d = 0; d < D; ++d) s += unbf(qrow[d]) * unbf(kc[(size_t)j * row_stride + d]);
        sc[j] = s / sqrt((double)D);
        if (sc[j] > *mx) *mx = sc[j];
    }
    for (int d = 0; d < D; ++d) ref[d] = 0;
    for (int j = 0; j < nv; ++j) {
        const double p = exp(sc[j] - *mx);
        *sum += p;
        for (int d = 0; d < D; ++d) ref[d] += p * unbf(vc[(size_t)j * row_stride + d]);
    }
}

/* head, then the files' text (NULL-terminated), built for sm_90a: compiled, its PTX rewritten
 * (the kernels' .maxnreg from "#define WG_MAXNREG n" where the source has it), then built as a
 * binary with the JIT's report (-cl-nv-verbose) printed. The PTX is kept as $OUT/save_as. */
static inline cl_program build_sm90a(const char *head, const char *const *files, const char *save_as)
{
    size_t n = strlen(head) + 1;
    char *texts[8];
    int nf = 0;
    for (; files[nf]; ++nf) n += strlen(texts[nf] = slurp(files[nf])) + 1;
    char *src = malloc(n), *p = src;
    p += sprintf(p, "%s", head);
    for (int i = 0; i < nf; ++i) p += sprintf(p, "%s\n", texts[i]);
    cl_int err;
    const char *cs = src;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &cs, NULL, &err);
    CK(err);
    if (clBuildProgram(prog, 1, &dev, "-cl-std=CL1.2 -cl-unsafe-math-optimizations", NULL, NULL) != CL_SUCCESS) {
        char log[20000] = "";
        clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        printf("build failed:\n%s\n", log);
        exit(1);
    }
    size_t len;
    CK(clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL));
    char *ptx = calloc(len + 1, 1);
    CK(clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof ptx, &ptx, NULL));
    const char *why = NULL;
    char *ptx2 = ptx_to_sm90a(ptx, sm90a_register_cap(src), &why);
    if (!ptx2) { printf("rewrite: %s\n", why); exit(1); }
    size_t n2 = strlen(ptx2) + 1;
    const unsigned char *bin = (const unsigned char *)ptx2;
    cl_int bs;
    cl_program prog2 = clCreateProgramWithBinary(ctx, 1, &dev, &n2, &bin, &bs, &err);
    CK(err);
    const cl_int bst = clBuildProgram(prog2, 1, &dev, "-cl-nv-verbose", NULL, NULL);
    char log[20000] = "";
    clGetProgramBuildInfo(prog2, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    printf("  JIT log: %s\n", log);
    if (bst != CL_SUCCESS) {
        printf("sm_90a build failed\n");
        exit(1);
    }
    if (getenv("OUT")) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", getenv("OUT"), save_as);
        FILE *f = fopen(path, "w");
        if (f) { fputs(ptx2, f); fclose(f); }
    }
    clReleaseProgram(prog);
    free(src);
    free(ptx);
    return prog2;
}
#endif
