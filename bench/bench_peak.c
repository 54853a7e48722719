/* bench_peak.c: the device's measured rates, the denominators of the floors
 * in bench/RESULTS.md: memory bandwidth (a float4 copy of --mib MiB),
 * L2 read bandwidth (float4 reads, PASSES passes over a --l2-mib MiB buffer
 * that stays in the last-level cache, each pass shifted so that no work-item
 * finds its data in its own L1: the ceiling of kernels that stream K/V
 * already on chip, like the selected branch), FP32 FMA throughput
 * (independent fma chains), and on NVIDIA devices of
 * compute capability 8.0 and later the tensor-core rate of a warp-level
 * mma.sync.m16n8k16 (bf16 in, f32 accumulate) through inline PTX, as issue
 * 6's fast path would use it, and the SM cycles one warp alone spends per
 * such product with 1, 2 and 4 independent chains (its latency, and how
 * many chains a warp needs to keep its tensor core busy), and on compute
 * capability 9.0 Hopper's warpgroup product wgmma.m64n64k16
 * (cl/warpgroup_probe.cl, through the sm_90a path). Each rate is the
 * best of --repeat timed runs (profiling events) after a warm-up: a peak,
 * not a typical rate.
 *
 *   bench_peak [--mib 1024] [--l2-mib 16] [--repeat 5] [--json out.json]
 * The device is CLNSA_TEST_DEVICE ("P:D" or a platform-name word) or the
 * first one found. */
#include "bench_util.h"
#include "testutil.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ITER iterations of CH independent chains per work-item. The mma kernel's
 * operands are arbitrary bit patterns of small bf16 values: the rate does not
 * depend on them, and the sum is stored so the work is not optimized away. */
static const char *source =
    "__kernel void copy4(__global const float4 *a, __global float4 *b) {\n"
    "    const size_t i = get_global_id(0); b[i] = a[i];\n"
    "}\n"
    "__kernel void read_l2(__global const float4 *a, uint n, __global float *out) {\n"
    "    const uint gs = get_global_size(0);\n"
    "    float4 s = (float4)(0.0f);\n"
    "    for (uint p = 0; p < PASSES; ++p) {\n"
    "        const uint shift = (uint)(((ulong)p * 2654435761u) % n);\n"
    "        for (uint i = get_global_id(0); i < n; i += gs) s += a[i + shift < n ? i + shift : i + shift - n];\n"
    "    }\n"
    "    out[get_global_id(0)] = s.x + s.y + s.z + s.w;\n"
    "}\n"
    "__kernel void fma_peak(__global float *out, float x) {\n"
    "    float c[8];\n"
    "    for (int k = 0; k < 8; ++k) c[k] = x + k;\n"
    "    for (int i = 0; i < ITER; ++i)\n"
    "        for (int k = 0; k < 8; ++k) c[k] = fma(c[k], x, 0.5f);\n"
    "    float s = 0; for (int k = 0; k < 8; ++k) s += c[k];\n"
    "    out[get_global_id(0)] = s;\n"
    "}\n"
    "#if MMA\n"
    "__kernel void mma_peak(__global float *out, uint seed) {\n"
    "    float c[CH][4];\n"
    "    uint a = 0x3c003c00u ^ (seed & 0xffu), b = 0x3c003c00u ^ get_local_id(0);\n"
    "    for (int k = 0; k < CH; ++k) c[k][0] = c[k][1] = c[k][2] = c[k][3] = 0.0f;\n"
    "    for (int i = 0; i < ITER; ++i)\n"
    "        for (int k = 0; k < CH; ++k)\n"
    "            asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \"\n"
    "                         \"{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n"
    "                         : \"+f\"(c[k][0]), \"+f\"(c[k][1]), \"+f\"(c[k][2]), \"+f\"(c[k][3])\n"
    "                         : \"r\"(a), \"r\"(b), \"r\"(a), \"r\"(b), \"r\"(a), \"r\"(b));\n"
    "    float s = 0; for (int k = 0; k < CH; ++k) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];\n"
    "    out[get_global_id(0)] = s;\n"
    "}\n"
    /* one warp, N dependent chains of LAT_ITER products each: its SM cycles
     * (%clock, read once the last product is done) per product */
    "#define MMA_CHAIN(NAME, N) __kernel void NAME(__global uint *out, uint seed) { \\\n"
    "    float c[N][4]; uint a = 0x3c003c00u ^ (seed & 0xffu), b = 0x3c003c00u ^ get_local_id(0), t0, t1; \\\n"
    "    for (int k = 0; k < N; ++k) c[k][0] = c[k][1] = c[k][2] = c[k][3] = 0.0f; \\\n"
    "    asm volatile(\"mov.u32 %0, %%clock;\" : \"=r\"(t0)); \\\n"
    "    for (int i = 0; i < LAT_ITER; ++i) \\\n"
    "        for (int k = 0; k < N; ++k) \\\n"
    "            asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \" \\\n"
    "                         \"{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\" \\\n"
    "                         : \"+f\"(c[k][0]), \"+f\"(c[k][1]), \"+f\"(c[k][2]), \"+f\"(c[k][3]) \\\n"
    "                         : \"r\"(a), \"r\"(b), \"r\"(a), \"r\"(b), \"r\"(a), \"r\"(b)); \\\n"
    "    float s = 0; for (int k = 0; k < N; ++k) s += c[k][0] + c[k][1] + c[k][2] + c[k][3]; \\\n"
    "    asm volatile(\"add.f32 %1, %1, 0f00000000;\\n\\tmov.u32 %0, %%clock;\" : \"=r\"(t1), \"+f\"(s)); \\\n"
    "    if (get_local_id(0) == 0) out[get_group_id(0)] = s == 12345.0f ? 0u : t1 - t0; \\\n"
    "}\n"
    "MMA_CHAIN(mma_chain1, 1)\n"
    "MMA_CHAIN(mma_chain2, 2)\n"
    "MMA_CHAIN(mma_chain4, 4)\n"
    "#endif\n";

enum { ITER = 4096, CH = 8, PASSES = 32, LAT_ITER = 1024 };

/* The SM cycles one warp alone on its SM spends per mma.sync with n
 * independent accumulator chains (kernel mma_chain<n>): the latency of one
 * product for n = 1, the issue interval of the SM quarter's tensor core once
 * n chains cover the latency. Mean over the work-groups, one per unit. */
static double mma_cycles(cl_command_queue q, cl_program p, cl_mem out, cl_uint units, int n)
{
    char name[32];
    snprintf(name, sizeof name, "mma_chain%d", n);
    cl_int err;
    cl_kernel k = clCreateKernel(p, name, &err);
    const cl_uint seed = 3;
    clSetKernelArg(k, 0, sizeof out, &out);
    clSetKernelArg(k, 1, sizeof seed, &seed);
    const size_t local = 32, global = 32 * (size_t)units;
    clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL);
    cl_uint *cyc = malloc(units * sizeof *cyc);
    double sum = 0;
    if (cyc && clEnqueueReadBuffer(q, out, CL_TRUE, 0, units * sizeof *cyc, cyc, 0, NULL, NULL) == CL_SUCCESS)
        for (cl_uint i = 0; i < units; ++i) sum += cyc[i];
    free(cyc);
    clReleaseKernel(k);
    return sum / units / ((double)LAT_ITER * n);
}

static test_env env;

static double best_ms(cl_command_queue q, cl_kernel k, size_t global, size_t local, int repeat)
{
    double best = 1e300;
    for (int r = -1; r < repeat; ++r) {
        cl_event ev;
        if (clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, &ev) != CL_SUCCESS) return -1;
        clWaitForEvents(1, &ev);
        cl_ulong a = 0, b = 0;
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL);
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL);
        clReleaseEvent(ev);
        if (r >= 0 && (double)(b - a) * 1e-6 < best) best = (double)(b - a) * 1e-6;
    }
    return best;
}

int main(int argc, char **argv)
{
    int mib = 1024, l2_mib = 16, repeat = 5;
    const char *json = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib")) mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--l2-mib")) l2_mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--repeat")) repeat = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--json")) json = argv[i + 1];
        else {
            fprintf(stderr, "bench_peak: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (mib < 1) mib = 1;
    if (l2_mib < 1 || l2_mib > mib) l2_mib = mib;
    if (repeat < 1) repeat = 1;
    test_env_open(&env);
    const clnsa_device_info *di = clnsa_context_device_info(env.ctx);
    const bool mma = di->vendor == CLNSA_VENDOR_NVIDIA && di->nv_compute_major >= 8;
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(env.cl, env.device, CL_QUEUE_PROFILING_ENABLE, &err);
    cl_program p = clCreateProgramWithSource(env.cl, 1, &source, NULL, &err);
    char opts[128];
    snprintf(opts, sizeof opts, "-DITER=%d -DCH=%d -DPASSES=%d -DLAT_ITER=%d -DMMA=%d", ITER, CH, PASSES, LAT_ITER,
             mma ? 1 : 0);
    if (clBuildProgram(p, 1, &env.device, opts, NULL, NULL) != CL_SUCCESS) {
        char log[8192] = "";
        clGetProgramBuildInfo(p, env.device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        fprintf(stderr, "bench_peak: build failed:\n%s\n", log);
        return 1;
    }
    const size_t n4 = (size_t)mib * 1024 * 1024 / 16, wg = di->max_work_group_size < 256 ? di->max_work_group_size : 256;
    const size_t lanes = (size_t)di->compute_units * 2048 / wg * wg; /* enough to fill every unit */
    cl_mem a = clCreateBuffer(env.cl, CL_MEM_READ_WRITE, n4 * 16, NULL, &err);
    cl_mem b = clCreateBuffer(env.cl, CL_MEM_READ_WRITE, n4 * 16, NULL, &err);
    cl_mem out = clCreateBuffer(env.cl, CL_MEM_READ_WRITE, lanes * 4, NULL, &err);
    const float zero = 0.0f;
    clEnqueueFillBuffer(q, a, &zero, sizeof zero, 0, n4 * 16, 0, NULL, NULL);

    cl_kernel copy = clCreateKernel(p, "copy4", &err), fk = clCreateKernel(p, "fma_peak", &err);
    clSetKernelArg(copy, 0, sizeof a, &a);
    clSetKernelArg(copy, 1, sizeof b, &b);
    const double copy_ms = best_ms(q, copy, n4 / wg * wg, wg, repeat);
    const double gbs = 2.0 * (double)(n4 / wg * wg) * 16 / (copy_ms * 1e-3) / 1e9;
    cl_kernel rk = clCreateKernel(p, "read_l2", &err);
    const cl_uint l2_n4 = (cl_uint)((size_t)l2_mib * 1024 * 1024 / 16);
    clSetKernelArg(rk, 0, sizeof a, &a);
    clSetKernelArg(rk, 1, sizeof l2_n4, &l2_n4);
    clSetKernelArg(rk, 2, sizeof out, &out);
    const double l2_ms = best_ms(q, rk, lanes, wg, repeat);
    const double l2_gbs = (double)PASSES * l2_n4 * 16 / (l2_ms * 1e-3) / 1e9;
    clReleaseKernel(rk);
    const float x = 0.999f;
    clSetKernelArg(fk, 0, sizeof out, &out);
    clSetKernelArg(fk, 1, sizeof x, &x);
    const double fma_ms = best_ms(q, fk, lanes, wg, repeat);
    const double fma_tflops = 2.0 * 8 * ITER * (double)lanes / (fma_ms * 1e-3) / 1e12;
    double mma_ms = -1, mma_tflops = -1, chain_cycles[3] = {-1, -1, -1};
    if (mma) {
        for (int i = 0; i < 3; ++i) chain_cycles[i] = mma_cycles(q, p, out, di->compute_units, 1 << i);
        cl_kernel mk = clCreateKernel(p, "mma_peak", &err);
        const cl_uint seed = 1;
        clSetKernelArg(mk, 0, sizeof out, &out);
        clSetKernelArg(mk, 1, sizeof seed, &seed);
        mma_ms = best_ms(q, mk, lanes, wg, repeat);
        mma_tflops = 4096.0 * CH * ITER * (double)(lanes / 32) / (mma_ms * 1e-3) / 1e12;
        clReleaseKernel(mk);
    }
    double wg_ms = -1, wg_tflops = -1;
    if (device_wgmma(env.ctx)) {
        static const char *const files[] = {"common.h", "warpgroup_mma.h", "warpgroup_probe.cl", NULL};
        cl_program wp = NULL;
        cl_kernel wk = NULL;
        if (program_get(env.ctx, files,
                        "#define STORAGE 2\n#define IDX_LONG 0\n#define VARLEN 0\n#define WGMMA_NV 1\n#define TRANS_B 0\n",
                        &wp) != CLNSA_SUCCESS ||
            kernel_create(env.ctx, wp, "warpgroup_rate", &wk) != CLNSA_SUCCESS) {
            fprintf(stderr, "bench_peak: the wgmma kernel: %s\n", clnsa_last_error(env.ctx));
            return 1;
        }
        const cl_uint iters = ITER * 2;
        const size_t groups = (size_t)di->compute_units * 4;
        clSetKernelArg(wk, 0, sizeof out, &out);
        clSetKernelArg(wk, 1, sizeof iters, &iters);
        wg_ms = best_ms(q, wk, groups * 128, 128, repeat);
        wg_tflops = 2.0 * 64 * 64 * 16 * 8 * (double)iters * (double)groups / (wg_ms * 1e-3) / 1e12;
        clReleaseKernel(wk);
    }
    printf("device: %s (%s, %s), %u compute units; best of %d\n", di->name, di->platform_name, di->driver_version,
           di->compute_units, repeat);
    printf("%-44s %10.1f GB/s  (%.3f ms)\n", "memory bandwidth (float4 copy, read + write)", gbs, copy_ms);
    printf("%-44s %10.1f GB/s  (%.3f ms, %d MiB x %d)\n", "L2 read bandwidth (float4 reads)", l2_gbs, l2_ms, l2_mib,
           PASSES);
    printf("%-44s %10.2f TFLOP/s (%.3f ms)\n", "FP32 FMA", fma_tflops, fma_ms);
    if (mma) {
        printf("%-44s %10.2f TFLOP/s (%.3f ms)\n", "tensor cores, mma.sync m16n8k16 bf16 -> f32", mma_tflops, mma_ms);
        printf("%-44s %10.1f / %.1f / %.1f SM cycles per mma\n", "one warp alone, 1 / 2 / 4 independent chains",
               chain_cycles[0], chain_cycles[1], chain_cycles[2]);
    } else printf("%-44s %10s\n", "tensor cores (NVIDIA sm_80+ only)", "n/a");
    if (wg_tflops > 0)
        printf("%-44s %10.2f TFLOP/s (%.3f ms)\n", "tensor cores, wgmma m64n64k16 bf16 -> f32", wg_tflops, wg_ms);
    else printf("%-44s %10s\n", "wgmma (NVIDIA compute capability 9.0 only)", "n/a");
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"device\": \"%s\", \"driver\": \"%s\", \"copy_GBps\": %.2f, \"l2_read_GBps\": %.2f, "
                       "\"l2_mib\": %d, \"fp32_fma_TFLOPs\": %.3f, "
                       "\"mma_bf16_TFLOPs\": %.3f, \"mma_cycles_1_2_4_chains\": [%.2f, %.2f, %.2f], \"wgmma_bf16_TFLOPs\": %.3f}\n",
                    di->name, di->driver_version, gbs, l2_gbs, l2_mib, fma_tflops, mma_tflops, chain_cycles[0],
                    chain_cycles[1], chain_cycles[2], wg_tflops);
            fclose(f);
        }
    }
    clReleaseKernel(copy);
    clReleaseKernel(fk);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(out);
    clReleaseProgram(p);
    clReleaseCommandQueue(q);
    test_env_close(&env);
    return 0;
}
