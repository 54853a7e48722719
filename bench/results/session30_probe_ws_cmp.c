/* Probe: NSA's compressed branch warp-specialized on wgmma (bench/results/session30_probe_ws_cmp.cl),
 * checked against a double-precision reference at a small T, then timed at the anchor's T. The
 * session29 probe's host, with a persistent grid and bf16 output. Environment: EXTRA (defines),
 * VFIRST / VLAST (variants), WGN (consumer warpgroups), NWG (work-groups; default the compute units). Run from the project
 * root on the GPU machine:
 *   gcc -O2 -std=c11 -Iinclude -Isrc bench/results/session30_probe_ws_cmp.c build-gpu/libclnsa.a -lOpenCL -lm -lpthread */
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ptx_to_sm90a(const char *ptx, int maxnreg, const char **why);

#define CK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("FAIL %s: %d (line %d)\n", #x, e_, __LINE__); exit(1); } } while (0)
enum { D = 128, HQ = 64, NH = 4, CB = 64 };

static cl_context ctx;
static cl_device_id dev;
static cl_command_queue q;

static char *slurp(const char *path)
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

static const char *variant = "";

static cl_program build(int wgn)
{
    char head[1024];
    snprintf(head, sizeof head, "#define WGMMA_NV 1\n#define NCONS %d\n%s\n%s\n", wgn, variant,
             getenv("EXTRA") ? getenv("EXTRA") : "");
    char *a = slurp("cl/warpgroup_mma.h"), *b = slurp("bench/results/session30_probe_ws_cmp.cl");
    size_t n = strlen(head) + strlen(a) + strlen(b) + 2;
    char *src = malloc(n);
    snprintf(src, n, "%s%s\n%s", head, a, b);
    cl_int err;
    const char *cs = src;
    cl_program p = clCreateProgramWithSource(ctx, 1, &cs, NULL, &err);
    CK(err);
    if (clBuildProgram(p, 1, &dev, "-cl-std=CL1.2 -cl-unsafe-math-optimizations", NULL, NULL) != CL_SUCCESS) {
        char log[20000] = "";
        clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        printf("build failed:\n%s\n", log);
        exit(1);
    }
    size_t len;
    CK(clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL));
    char *ptx = calloc(len + 1, 1);
    CK(clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof ptx, &ptx, NULL));
    const char *why = NULL;
    char *ptx2 = ptx_to_sm90a(ptx, strstr(src, "#define WG_MAXNREG ") ? atoi(strstr(src, "#define WG_MAXNREG ") + 19) : 0, &why);
    if (!ptx2) { printf("rewrite: %s\n", why); exit(1); }
    size_t n2 = strlen(ptx2) + 1;
    const unsigned char *bin = (const unsigned char *)ptx2;
    cl_int bs;
    cl_program p2 = clCreateProgramWithBinary(ctx, 1, &dev, &n2, &bin, &bs, &err);
    CK(err);
    const cl_int bst = clBuildProgram(p2, 1, &dev, "-cl-nv-verbose", NULL, NULL);
    {
        char log[20000] = "";
        clGetProgramBuildInfo(p2, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        printf("  JIT log: %s\n", log);
    }
    if (bst != CL_SUCCESS) {
        char log[20000] = "";
        clGetProgramBuildInfo(p2, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        printf("sm_90a build failed:\n%s\n", log);
        exit(1);
    }
    if (getenv("OUT")) {
        char path[512];
        snprintf(path, sizeof path, "%s/ws_ncons%d_%d.ptx", getenv("OUT"), wgn, (int)strlen(variant));
        FILE *f = fopen(path, "w");
        if (f) { fputs(ptx2, f); fclose(f); }
    }
    return p2;
}

static unsigned short bf16(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}
static double unbf(unsigned short h)
{
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int nwg = 132;

static double run(cl_kernel k, int T, int wgn, int reps)
{
    (void)T;
    size_t ls = 128 * (size_t)(wgn + 1), gs = (size_t)nwg * ls;
    double t[16];
    for (int r = 0; r < reps; ++r) {
        cl_event ev;
        cl_int e = clEnqueueNDRangeKernel(q, k, 1, NULL, &gs, &ls, 0, NULL, &ev);
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

int main(void)
{
    cl_platform_id plats[8];
    cl_uint np = 0;
    CK(clGetPlatformIDs(8, plats, &np));
    int found = 0;
    for (cl_uint i = 0; i < np && !found; i++) {
        char name[256];
        clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strstr(name, "NVIDIA") && clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_GPU, 1, &dev, NULL) == CL_SUCCESS) found = 1;
    }
    if (!found) { printf("no NVIDIA GPU\n"); return 1; }
    cl_int err;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CK(err);
    q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    CK(err);
    {
        cl_uint cu = 0;
        CK(clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL));
        nwg = getenv("NWG") ? atoi(getenv("NWG")) : (int)cu;
    }
    const float scale_log2 = (float)(1.0 / sqrt((double)D) / log(2.0));
    const int Tmax = 65536, NCmax = Tmax / CB;
    unsigned short *hq = malloc((size_t)Tmax * HQ * D * 2), *hk = malloc((size_t)NCmax * NH * D * 2),
                   *hv = malloc((size_t)NCmax * NH * D * 2);
    srand(7);
    for (size_t i = 0; i < (size_t)Tmax * HQ * D; ++i) hq[i] = bf16((float)rand() / RAND_MAX * 2 - 1);
    for (size_t i = 0; i < (size_t)NCmax * NH * D; ++i) hk[i] = bf16((float)rand() / RAND_MAX * 2 - 1);
    for (size_t i = 0; i < (size_t)NCmax * NH * D; ++i) hv[i] = bf16((float)rand() / RAND_MAX * 2 - 1);
    cl_mem bq = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)Tmax * HQ * D * 2, hq, &err);
    cl_mem bk = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)NCmax * NH * D * 2, hk, &err);
    cl_mem bv = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)NCmax * NH * D * 2, hv, &err);
    cl_mem bo = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)Tmax * HQ * D * 2, NULL, &err);
    cl_mem bl = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)Tmax * HQ * 4, NULL, &err);

#define REGS3 "#define REGS 1\n#define REG_LO 32\n#define REG_HI 152\n#define WG_MAXNREG 128\n"
#define REGS2 "#define REGS 1\n#define REG_LO 40\n#define REG_HI 232\n#define WG_MAXNREG 168\n"
    /* 0-3 with 3 consumer warpgroups (WGN 3), 4-5 with 2 */
    static const char *variants[] = {REGS3 "#define NSTK 3",
                                     REGS3 "#define NSTK 3\n#define PIPE 1",
                                     "#define REGS 1\n#define REG_LO 24\n#define REG_HI 160\n#define WG_MAXNREG 128\n#define NSTK 3\n#define PIPE 1",
                                     REGS3 "#define PIPE 1",
                                     REGS2 "#define NSTK 3\n#define PIPE 1",
                                     REGS2 "#define NSTK 3"};
    const int first = getenv("VFIRST") ? atoi(getenv("VFIRST")) : 0;
    const int last = getenv("VLAST") ? atoi(getenv("VLAST")) : 0;
    for (int vi = first; vi <= last; ++vi)
    for (int wgn = getenv("WGN") ? atoi(getenv("WGN")) : 2; wgn <= (getenv("WGN") ? atoi(getenv("WGN")) : 2); ++wgn) {
        variant = variants[vi];
        printf("variant %d (%s):\n", vi, variant);
        cl_program p = build(wgn);
        cl_kernel k = clCreateKernel(p, "cmp_ws", &err);
        CK(err);
        clSetKernelArg(k, 0, sizeof bq, &bq);
        clSetKernelArg(k, 1, sizeof bk, &bk);
        clSetKernelArg(k, 2, sizeof bv, &bv);
        clSetKernelArg(k, 3, sizeof bo, &bo);
        clSetKernelArg(k, 4, sizeof bl, &bl);
        clSetKernelArg(k, 6, sizeof scale_log2, &scale_log2);
        /* check at T = 1000 (not a multiple of 4 * wgn or of 64) against the reference */
        {
            const int T = 1000;
            const float nanv = NAN;
            const unsigned short nanh = 0x7fc0;
            CK(clEnqueueFillBuffer(q, bo, &nanh, 2, 0, (size_t)T * HQ * D * 2, 0, NULL, NULL));
            CK(clEnqueueFillBuffer(q, bl, &nanv, 4, 0, (size_t)T * HQ * 4, 0, NULL, NULL));
            clSetKernelArg(k, 5, sizeof T, &T);
            if (run(k, T, wgn, 1) < 0) continue;
            unsigned short *o = malloc((size_t)T * HQ * D * 2);
            float *l = malloc((size_t)T * HQ * 4);
            CK(clEnqueueReadBuffer(q, bo, CL_TRUE, 0, (size_t)T * HQ * D * 2, o, 0, NULL, NULL));
            CK(clEnqueueReadBuffer(q, bl, CL_TRUE, 0, (size_t)T * HQ * 4, l, 0, NULL, NULL));
            double num = 0, den = 0, lerr = 0;
            int nans = 0;
            double sc[1024], ref[D];
            for (int t = 0; t < T; ++t)
                for (int hqi = 0; hqi < HQ; ++hqi) {
                    const int h = hqi / 16, nv = (t + 1) / CB;
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j < nv; ++j) {
                        double s = 0;
                        for (int d = 0; d < D; ++d)
                            s += unbf(hq[((size_t)t * HQ + hqi) * D + d]) * unbf(hk[((size_t)j * NH + h) * D + d]);
                        sc[j] = s / sqrt((double)D);
                        if (sc[j] > mx) mx = sc[j];
                    }
                    for (int d = 0; d < D; ++d) ref[d] = 0;
                    for (int j = 0; j < nv; ++j) {
                        const double p = exp(sc[j] - mx);
                        sum += p;
                        for (int d = 0; d < D; ++d) ref[d] += p * unbf(hv[((size_t)j * NH + h) * D + d]);
                    }
                    for (int d = 0; d < D; ++d) {
                        const double r = nv ? ref[d] / sum : 0, x = unbf(o[((size_t)t * HQ + hqi) * D + d]);
                        if (isnan(x)) nans++;
                        num += (x - r) * (x - r);
                        den += r * r;
                    }
                    const double lr = nv ? mx + log(sum) : -INFINITY, lx = l[(size_t)t * HQ + hqi];
                    if (isnan(lx)) nans++;
                    else if (nv && fabs(lx - lr) > lerr) lerr = fabs(lx - lr);
                    else if (!nv && lx != -INFINITY) nans++;
                }
            printf("NCONS %d: check at T %d: o rel L2 %.3g, lse max |err| %.3g, NaN/unwritten %d\n", wgn, T, sqrt(num / den), lerr,
                   nans);
            free(o);
            free(l);
        }
        for (int T = 8192; T <= Tmax; T *= 8) {
            clSetKernelArg(k, 5, sizeof T, &T);
            run(k, T, wgn, 2);
            const double ms = run(k, T, wgn, 7);
            double flop = 0;
            for (int t = 0; t < T; ++t) flop += 4.0 * HQ * D * ((t + 1) / CB);
            printf("NCONS %d: T %d: %.3f ms, %.1f TFLOP/s\n", wgn, T, ms, flop / ms * 1e-9);
        }
    }
    return 0;
}
