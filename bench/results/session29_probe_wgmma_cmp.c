/* Probe: NSA's compressed branch (bench/results/session29_probe_wgmma_cmp.cl) on wgmma, checked against a
 * double-precision reference at a small T, then timed at the anchor's T. Links the library's
 * ptx_to_sm90a. Run from the project root on the GPU machine:
 *   gcc -O2 -std=c11 -Iinclude -Isrc bench/results/session29_probe_wgmma_cmp.c build-gpu/libclnsa.a -lOpenCL -lm -lpthread */
#include "probe_host.h"

enum { D = 128, HQ = 64, NH = 4, CB = 64 };

static const char *variant = "";

static cl_program build(int wgn)
{
    char head[256], name[64];
    snprintf(head, sizeof head, "#define WGMMA_NV 1\n#define WGN %d\n%s\n%s\n", wgn, variant,
             getenv("EXTRA") ? getenv("EXTRA") : "");
    snprintf(name, sizeof name, "cmp_wgn%d_%d.ptx", wgn, (int)strlen(variant));
    static const char *const files[] = {"cl/warpgroup_mma.h", "bench/results/session29_probe_wgmma_cmp.cl", NULL};
    return build_sm90a(head, files, name);
}

static double run(cl_kernel k, int T, int wgn, int reps)
{
    size_t ls = 128 * (size_t)wgn, gs[2] = {(size_t)((T + 4 * wgn - 1) / (4 * wgn)) * ls, NH}, lsz[2] = {ls, 1};
    return median_ms(k, 2, gs, lsz, reps);
}

int main(void)
{
    open_nvidia_gpu();
    cl_int err;
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
    cl_mem bo = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)Tmax * HQ * D * 4, NULL, &err);
    cl_mem bl = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)Tmax * HQ * 4, NULL, &err);

    static const char *variants[] = {"", "#define ASYNC 1", "#define ASYNC 1\n#define KC 32",
                                     "#define ASYNC 1\n#define KC 32\n#define DB 1",
                                     "#define ASYNC 1\n#define KC 32\n#define PIPE 1"};
    const int first = getenv("VFIRST") ? atoi(getenv("VFIRST")) : 0;
    const int last = getenv("VLAST") ? atoi(getenv("VLAST")) : 4;
    for (int vi = first; vi <= last; ++vi)
    for (int wgn = getenv("WGN") ? atoi(getenv("WGN")) : 1; wgn <= (getenv("WGN") ? atoi(getenv("WGN")) : 4); ++wgn) {
        variant = variants[vi];
        printf("variant %d (%s):\n", vi, variant);
        cl_program p = build(wgn);
        cl_kernel k = clCreateKernel(p, "cmp_fwd", &err);
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
            CK(clEnqueueFillBuffer(q, bo, &nanv, 4, 0, (size_t)T * HQ * D * 4, 0, NULL, NULL));
            CK(clEnqueueFillBuffer(q, bl, &nanv, 4, 0, (size_t)T * HQ * 4, 0, NULL, NULL));
            clSetKernelArg(k, 5, sizeof T, &T);
            if (run(k, T, wgn, 1) < 0) continue;
            float *o = malloc((size_t)T * HQ * D * 4), *l = malloc((size_t)T * HQ * 4);
            CK(clEnqueueReadBuffer(q, bo, CL_TRUE, 0, (size_t)T * HQ * D * 4, o, 0, NULL, NULL));
            CK(clEnqueueReadBuffer(q, bl, CL_TRUE, 0, (size_t)T * HQ * 4, l, 0, NULL, NULL));
            double num = 0, den = 0, lerr = 0;
            int nans = 0;
            double sc[1024], ref[D];
            for (int t = 0; t < T; ++t)
                for (int hqi = 0; hqi < HQ; ++hqi) {
                    const int h = hqi / 16, nv = (t + 1) / CB;
                    double mx, sum;
                    cmp_reference(hq + ((size_t)t * HQ + hqi) * D, hk + (size_t)h * D, hv + (size_t)h * D, (size_t)NH * D, nv, D,
                                  sc, &mx, &sum, ref);
                    for (int d = 0; d < D; ++d) {
                        const double r = nv ? ref[d] / sum : 0, x = o[((size_t)t * HQ + hqi) * D + d];
                        if (isnan(x)) nans++;
                        num += (x - r) * (x - r);
                        den += r * r;
                    }
                    const double lr = nv ? mx + log(sum) : -INFINITY, lx = l[(size_t)t * HQ + hqi];
                    if (isnan(lx)) nans++;
                    else if (nv && fabs(lx - lr) > lerr) lerr = fabs(lx - lr);
                    else if (!nv && lx != -INFINITY) nans++;
                }
            printf("WGN %d: check at T %d: o rel L2 %.3g, lse max |err| %.3g, NaN/unwritten %d\n", wgn, T, sqrt(num / den), lerr,
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
            printf("WGN %d: T %d: %.3f ms, %.1f TFLOP/s\n", wgn, T, ms, flop / ms * 1e-9);
        }
    }
    return 0;
}
