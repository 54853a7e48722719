/* Probe: NSA's compressed branch warp-specialized on wgmma (bench/results/session30_probe_ws_cmp.cl),
 * checked against a double-precision reference at a small T, then timed at the anchor's T. The
 * session29 probe's host, with a persistent grid and bf16 output. Environment: EXTRA (defines),
 * VFIRST / VLAST (variants), WGN (consumer warpgroups), NWG (work-groups; default the compute
 * units), ALLT (time T 8k, 16k, 32k, 64k; else 8k and 64k). Run from the project root on the GPU
 * machine:
 *   gcc -O2 -std=c11 -Iinclude -Isrc bench/results/session30_probe_ws_cmp.c build-gpu/libclnsa.a -lOpenCL -lm -lpthread */
#include "probe_host.h"

enum { D = 128, HQ = 64, NH = 4, CB = 64 };

static const char *variant = "";

static cl_program build(int wgn)
{
    char head[1024], name[64];
    snprintf(head, sizeof head, "#define WGMMA_NV 1\n#define NCONS %d\n%s\n%s\n", wgn, variant,
             getenv("EXTRA") ? getenv("EXTRA") : "");
    snprintf(name, sizeof name, "ws_ncons%d_%d.ptx", wgn, (int)strlen(variant));
    static const char *const files[] = {"cl/warpgroup_mma.h", "bench/results/session30_probe_ws_cmp.cl", NULL};
    return build_sm90a(head, files, name);
}

static int nwg = 132;

static double run(cl_kernel k, int T, int wgn, int reps)
{
    (void)T;
    size_t ls = 128 * (size_t)(wgn + 1), gs = (size_t)nwg * ls;
    return median_ms(k, 1, &gs, &ls, reps);
}

int main(void)
{
    open_nvidia_gpu();
    cl_int err;
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
    cl_mem bi = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)Tmax * NH * NCmax * 4, NULL, &err); /* importance */
    CK(err);
    cl_mem bx = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)Tmax * NH * 16 * 4, NULL, &err); /* the top-16 */
    CK(err);

#define REGS3 "#define REGS 1\n#define REG_LO 32\n#define REG_HI 152\n#define WG_MAXNREG 128\n"
#define REGS2 "#define REGS 1\n#define REG_LO 40\n#define REG_HI 232\n#define WG_MAXNREG 168\n"
    /* 0-3 and 6-7 with 3 consumer warpgroups (WGN 3), 4-5 with 2 */
    static const char *variants[] = {REGS3 "#define NSTK 3",
                                     REGS3 "#define NSTK 3\n#define PIPE 1",
                                     "#define REGS 1\n#define REG_LO 24\n#define REG_HI 160\n#define WG_MAXNREG 128\n#define NSTK 3\n#define PIPE 1",
                                     REGS3 "#define PIPE 1",
                                     REGS2 "#define NSTK 3\n#define PIPE 1",
                                     REGS2 "#define NSTK 3",
                                     REGS3 "#define NSTK 3\n#define LANES_BY_KEY 1",
                                     REGS3 "#define NSTK 3\n#define LANES_BY_KEY 1\n#define PASS2 1",
                                     REGS3 "#define NSTK 3\n#define LANES_BY_KEY 1\n#define PASS2 1\n#define LIST_ONLY 1",
                                     REGS3 "#define NSTK 3\n#define LANES_BY_KEY 1\n#define PASS2 1\n#define LIST_ONLY 1\n#define MERGE_MIN 8"};
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
        clSetKernelArg(k, 7, sizeof bi, &bi);
        clSetKernelArg(k, 8, sizeof bx, &bx);
        /* check at T = 1000 (not a multiple of 4 * wgn or of 64) against the reference */
        {
            const int T = 1000;
            const float nanv = NAN;
            const unsigned short nanh = 0x7fc0;
            CK(clEnqueueFillBuffer(q, bo, &nanh, 2, 0, (size_t)T * HQ * D * 2, 0, NULL, NULL));
            CK(clEnqueueFillBuffer(q, bl, &nanv, 4, 0, (size_t)T * HQ * 4, 0, NULL, NULL));
            CK(clEnqueueFillBuffer(q, bi, &nanv, 4, 0, (size_t)T * NH * NCmax * 4, 0, NULL, NULL));
            const int poison = -7;
            CK(clEnqueueFillBuffer(q, bx, &poison, 4, 0, (size_t)T * NH * 16 * 4, 0, NULL, NULL));
            clSetKernelArg(k, 5, sizeof T, &T);
            if (run(k, T, wgn, 1) < 0) continue;
            unsigned short *o = malloc((size_t)T * HQ * D * 2);
            float *l = malloc((size_t)T * HQ * 4);
            CK(clEnqueueReadBuffer(q, bo, CL_TRUE, 0, (size_t)T * HQ * D * 2, o, 0, NULL, NULL));
            CK(clEnqueueReadBuffer(q, bl, CL_TRUE, 0, (size_t)T * HQ * 4, l, 0, NULL, NULL));
            float *im = malloc((size_t)T * NH * NCmax * 4);
            CK(clEnqueueReadBuffer(q, bi, CL_TRUE, 0, (size_t)T * NH * NCmax * 4, im, 0, NULL, NULL));
            int *sel = malloc((size_t)T * NH * 16 * 4), badsel = 0;
            CK(clEnqueueReadBuffer(q, bx, CL_TRUE, 0, (size_t)T * NH * 16 * 4, sel, 0, NULL, NULL));
            double num = 0, den = 0, lerr = 0, inum = 0, iden = 0, impref[NH][1024] = {{0}};
            int inans = 0;
            int nans = 0;
            double sc[1024], ref[D];
            for (int t = 0; t < T; ++t) {
                memset(impref, 0, sizeof impref);
                for (int hqi = 0; hqi < HQ; ++hqi) {
                    const int h = hqi / 16, nv = (t + 1) / CB;
                    double mx, sum;
                    cmp_reference(hq + ((size_t)t * HQ + hqi) * D, hk + (size_t)h * D, hv + (size_t)h * D, (size_t)NH * D, nv, D,
                                  sc, &mx, &sum, ref);
                    for (int j = 0; j < nv; ++j) impref[h][j] += exp(sc[j] - mx) / sum;
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
                for (int h = 0; h < NH; ++h) { /* the top 16: blocks 0 and nv - 1 forced, ties to the lower */
                    const int nv = (t + 1) / CB;
                    int want[16], got[16];
                    for (int i = 0; i < 16; ++i) {
                        int best = -1;
                        double bv = -INFINITY;
                        for (int j = 0; j < nv; ++j) {
                            int taken = 0;
                            for (int u = 0; u < i; ++u) taken |= want[u] == j;
                            const double v = (j == 0 || j == nv - 1) ? INFINITY : impref[h][j];
                            if (!taken && (best < 0 || v > bv)) { best = j; bv = v; }
                        }
                        want[i] = best;
                        got[i] = sel[((size_t)t * NH + h) * 16 + i];
                    }
                    for (int i = 0; i < 16; ++i)
                        for (int u = i + 1; u < 16; ++u) {
                            if (want[u] < want[i]) { int x = want[i]; want[i] = want[u]; want[u] = x; }
                            if (got[u] < got[i]) { int x = got[i]; got[i] = got[u]; got[u] = x; }
                        }
                    badsel += memcmp(want, got, sizeof want) != 0;
                }
                for (int h = 0; h < NH; ++h)
                    for (int j = 0; j < (t + 1) / CB; ++j) {
                        const double x = im[((size_t)t * NH + h) * NCmax + j], r = impref[h][j];
                        if (isnan(x)) inans++;
                        else inum += (x - r) * (x - r);
                        iden += r * r;
                    }
            }
            printf("NCONS %d: check at T %d: o rel L2 %.3g, lse max |err| %.3g, NaN/unwritten %d\n", wgn, T, sqrt(num / den), lerr,
                   nans);
            if (strstr(variant, "PASS2"))
                printf("NCONS %d: importance rel L2 %.3g, NaN/unwritten %d (LIST_ONLY: all); top-16 rows differing: %d of %d\n", wgn,
                       sqrt(inum / iden), inans, badsel, T * NH);
            free(sel);
            free(im);
            free(o);
            free(l);
        }
        for (int T = 8192; T <= Tmax; T *= getenv("ALLT") ? 2 : 8) {
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
