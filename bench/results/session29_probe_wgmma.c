/* Probe: can an OpenCL program on NVIDIA reach Hopper's wgmma?
 *
 * NVIDIA's OpenCL compiles OpenCL C for .target sm_90, where ptxas rejects wgmma. Its program
 * binaries are PTX text, though, and clCreateProgramWithBinary hands PTX to the driver's JIT.
 * So: write each sm_90a instruction as a PTX comment ("// @WG ...") in inline asm, so the
 * first build sees comments (with the operands already named by the compiler), take the PTX,
 * uncomment the instructions, retarget it to sm_90a, and build that as a binary.
 *
 * Checks: (1) wgmma written plainly fails the build; (2) the rewritten PTX builds and
 * wgmma.m64n16k16 (A in registers, B from local memory through a descriptor) gives the
 * exact product, for both readings of the descriptor's two byte offsets; (3) throughput of
 * m64nNk16 for N = 64, 128, 256 against mma.sync m16n8k16.
 *
 * Build: gcc -O2 -std=c11 bench/results/session29_probe_wgmma.c -lOpenCL -o probe_wgmma */
#include "probe_host.h"

static char *build_log(cl_program p) {
    size_t n = 0;
    clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    char *s = calloc(n + 1, 1);
    clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, n, s, NULL);
    return s;
}

static cl_program build_src(const char *src, cl_int *status) {
    cl_int err;
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CK(err);
    *status = clBuildProgram(p, 1, &dev, "-cl-std=CL1.2", NULL, NULL);
    return p;
}

static char *program_ptx(cl_program p) {
    size_t n = 0;
    CK(clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL));
    char *s = calloc(n + 1, 1);
    unsigned char *ptrs[1] = {(unsigned char *)s};
    CK(clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof ptrs, ptrs, NULL));
    return s;
}

/* Uncomment "// @WG " lines and retarget to sm_90a. */
static char *rewrite(const char *ptx) {
    size_t n = strlen(ptx);
    char *out = calloc(n + 64, 1), *o = out;
    const char *s = ptx;
    while (*s) {
        if (!strncmp(s, "// @WG ", 7)) { s += 7; continue; }
        if (!strncmp(s, ".target sm_90", 13) && s[13] != 'a') {
            memcpy(o, ".target sm_90a", 14); o += 14; s += 13; continue;
        }
        *o++ = *s++;
    }
    return out;
}

static cl_program build_ptx(const char *ptx, cl_int *status) {
    cl_int err, bs;
    size_t n = strlen(ptx) + 1;
    const unsigned char *b = (const unsigned char *)ptx;
    cl_program p = clCreateProgramWithBinary(ctx, 1, &dev, &n, &b, &bs, &err);
    if (err != CL_SUCCESS) { *status = err; return NULL; }
    *status = clBuildProgram(p, 1, &dev, NULL, NULL, NULL);
    return p;
}

static void print_lines(const char *ptx, const char *needle, int max) {
    const char *s = ptx;
    while (max > 0 && (s = strstr(s, needle))) {
        const char *b = s; while (b > ptx && b[-1] != '\n') b--;
        const char *e = strchr(s, '\n'); if (!e) e = s + strlen(s);
        printf("    | %.*s\n", (int)(e - b), b);
        s = e; max--;
    }
}

static unsigned short to_bf16(float f) { unsigned u; memcpy(&u, &f, 4); return (unsigned short)(u >> 16); }

/* ---- kernel sources ---------------------------------------------------------------- */

static const char *common_src =
    "inline ulong wg_desc(__local const void *p, uint lbo, uint sbo) {\n"
    "  uint a = (uint)(size_t)p;\n"
    "  return (ulong)((a & 0x3FFFF) >> 4) | ((ulong)(lbo >> 4) << 16) | ((ulong)(sbo >> 4) << 32);\n"
    "}\n"
    "inline uint pack2(ushort lo, ushort hi) { return (uint)lo | ((uint)hi << 16); }\n";

/* One warpgroup: D(64x16) = A(64x16) B(16x16). B is stored n-group j at j*256 bytes, k-core c
 * at c*128 bytes, row n (16 bytes: 8 k values) inside. desc takes (lbo, sbo) from the args. */
static const char *mm_src =
    "__kernel __attribute__((reqd_work_group_size(128,1,1)))\n"
    "void mm(__global const ushort *A, __global const ushort *B, __global float *D, uint lbo, uint sbo) {\n"
    "  __local ushort bt[256] __attribute__((aligned(256)));\n"
    "  int lid = get_local_id(0);\n"
    "  for (int i = lid; i < 256; i += 128) {\n"
    "    int k = i / 16, n = i % 16;\n" /* B is row-major k x n in global */
    "#if TRANS\n"
    "    int off = (k / 8) * 128 + (n / 8) * 64 + (k % 8) * 8 + (n % 8);\n" /* MN-major: 16 bytes along n */
    "#else\n"
    "    int off = (n / 8) * 128 + (k / 8) * 64 + (n % 8) * 8 + (k % 8);\n" /* K-major, in ushorts */
    "#endif\n"
    "    bt[off] = B[i];\n"
    "  }\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  asm volatile(\"// @WG fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  int w = lid / 32, l = lid % 32, g = l / 4, t = l % 4;\n"
    "  int r0 = 16 * w + g, r1 = r0 + 8;\n"
    "  uint a0 = pack2(A[r0*16+2*t], A[r0*16+2*t+1]);\n"
    "  uint a1 = pack2(A[r1*16+2*t], A[r1*16+2*t+1]);\n"
    "  uint a2 = pack2(A[r0*16+2*t+8], A[r0*16+2*t+9]);\n"
    "  uint a3 = pack2(A[r1*16+2*t+8], A[r1*16+2*t+9]);\n"
    "  float d0=0,d1=0,d2=0,d3=0,d4=0,d5=0,d6=0,d7=0;\n"
    "  ulong desc = wg_desc(bt, lbo, sbo);\n"
    "  asm volatile(\"// @WG wgmma.fence.sync.aligned;\" ::: \"memory\");\n"
    "  asm volatile(\"{\\n// @WG .reg .pred p;\\n// @WG setp.ne.b32 p, %13, 0;\\n\"\n"
    "    \"// @WG wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, TRANS;\\n}\"\n"
    "    : \"+f\"(d0),\"+f\"(d1),\"+f\"(d2),\"+f\"(d3),\"+f\"(d4),\"+f\"(d5),\"+f\"(d6),\"+f\"(d7)\n"
    "    : \"r\"(a0),\"r\"(a1),\"r\"(a2),\"r\"(a3),\"l\"(desc),\"r\"(0) : \"memory\");\n"
    "  asm volatile(\"// @WG wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n"
    "  asm volatile(\"// @WG wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n"
    "  float d[8] = {d0,d1,d2,d3,d4,d5,d6,d7};\n"
    "  for (int i = 0; i < 2; i++) {\n"
    "    D[r0*16 + 8*i + 2*t] = d[4*i];   D[r0*16 + 8*i + 2*t + 1] = d[4*i+1];\n"
    "    D[r1*16 + 8*i + 2*t] = d[4*i+2]; D[r1*16 + 8*i + 2*t + 1] = d[4*i+3];\n"
    "  }\n"
    "}\n";

/* Throughput kernel for m64nNk16, generated: INNER wgmmas a group, iters groups. */
static char *tput_src(int N, int inner) {
    int nd = N / 2;
    char *s = malloc(200000), *o = s;
    o += sprintf(o, "__kernel __attribute__((reqd_work_group_size(128,1,1)))\n"
                    "void tput(__global float *out, int iters) {\n"
                    "  __local ushort bt[16*%d] __attribute__((aligned(256)));\n"
                    "  int lid = get_local_id(0);\n"
                    "  for (int i = lid; i < 16*%d; i += 128) bt[i] = (ushort)0x3c00;\n"
                    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
                    "  asm volatile(\"// @WG fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
                    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
                    "  uint a0 = 0x3c003c00u + lid, a1 = a0, a2 = a0, a3 = a0;\n"
                    "  ulong desc = wg_desc(bt, 128, 256);\n", N, N);
    for (int i = 0; i < nd; i++) o += sprintf(o, "  float d%d = 0;\n", i);
    o += sprintf(o, "  for (int it = 0; it < iters; it++) {\n"
                    "    asm volatile(\"// @WG wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
    for (int k = 0; k < inner; k++) {
        o += sprintf(o, "    asm volatile(\"{\\n// @WG .reg .pred p;\\n// @WG setp.ne.b32 p, %%%d, 0;\\n"
                        "// @WG wgmma.mma_async.sync.aligned.m64n%dk16.f32.bf16.bf16 {", nd + 5, N);
        for (int i = 0; i < nd; i++) o += sprintf(o, "%s%%%d", i ? "," : "", i);
        o += sprintf(o, "}, {%%%d,%%%d,%%%d,%%%d}, %%%d, p, 1, 1, 0;\\n}\"\n      : ", nd, nd + 1, nd + 2, nd + 3, nd + 4);
        for (int i = 0; i < nd; i++) o += sprintf(o, "%s\"+f\"(d%d)", i ? "," : "", i);
        o += sprintf(o, "\n      : \"r\"(a0),\"r\"(a1),\"r\"(a2),\"r\"(a3),\"l\"(desc),\"r\"(1) : \"memory\");\n");
    }
    o += sprintf(o, "    asm volatile(\"// @WG wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n"
                    "    asm volatile(\"// @WG wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n"
                    "  }\n  float acc = 0;\n");
    for (int i = 0; i < nd; i++) o += sprintf(o, "  acc += d%d;\n", i);
    o += sprintf(o, "  out[get_global_id(0)] = acc;\n}\n");
    return s;
}

/* mma.sync reference throughput: 4 warps, each 8 independent m16n8k16 chains. */
static const char *mma_src =
    "__kernel __attribute__((reqd_work_group_size(128,1,1)))\n"
    "void tput(__global float *out, int iters) {\n"
    "  uint a0 = 0x3c003c00u + get_local_id(0), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0;\n"
    "  float c[8][4];\n"
    "  for (int j = 0; j < 8; j++) for (int i = 0; i < 4; i++) c[j][i] = 0;\n"
    "  for (int it = 0; it < iters; it++) {\n"
    "    #pragma unroll\n"
    "    for (int r = 0; r < 2; r++) {\n"
    "    #pragma unroll\n"
    "    for (int j = 0; j < 8; j++)\n"
    "      asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n"
    "        : \"+f\"(c[j][0]),\"+f\"(c[j][1]),\"+f\"(c[j][2]),\"+f\"(c[j][3]) : \"r\"(a0),\"r\"(a1),\"r\"(a2),\"r\"(a3),\"r\"(b0),\"r\"(b1));\n"
    "    }\n"
    "  }\n"
    "  float acc = 0;\n"
    "  for (int j = 0; j < 8; j++) for (int i = 0; i < 4; i++) acc += c[j][i];\n"
    "  out[get_global_id(0)] = acc;\n"
    "}\n";

static char *cat(const char *a, const char *b) {
    char *s = malloc(strlen(a) + strlen(b) + 1);
    strcpy(s, a); strcat(s, b);
    return s;
}

/* Build OpenCL C with "// @WG" lines, then through the PTX rewrite. NULL on failure. */
static cl_program build_wg(const char *src, const char *tag, int show) {
    cl_int st;
    cl_program p = build_src(src, &st);
    if (st != CL_SUCCESS) {
        char *log = build_log(p);
        printf("[%s] first build failed %d:\n%.2000s\n", tag, st, log);
        return NULL;
    }
    char *ptx = program_ptx(p);
    if (show) {
        print_lines(ptx, ".version", 1);
        print_lines(ptx, ".target", 1);
        print_lines(ptx, "// @WG wgmma.mma_async", 1);
    }
    char *ptx2 = rewrite(ptx);
    if (show && getenv("OUT")) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.ptx", getenv("OUT"), tag);
        FILE *f = fopen(path, "w");
        if (f) { fputs(ptx2, f); fclose(f); }
    }
    cl_program p2 = build_ptx(ptx2, &st);
    if (st != CL_SUCCESS) {
        char *log = p2 ? build_log(p2) : strdup("(no program)");
        printf("[%s] PTX build failed %d:\n%.3000s\n", tag, st, log);
        return NULL;
    }
    if (show) {
        char *again = program_ptx(p2);
        printf("[%s] binary program built; its binary: %zu bytes, starts %.40s\n", tag, strlen(again), again);
    }
    return p2;
}

static double time_kernel(cl_kernel k, size_t groups, int reps) {
    size_t gs = groups * 128, ls = 128;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        cl_event ev;
        CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &gs, &ls, 0, NULL, &ev));
        CK(clWaitForEvents(1, &ev));
        cl_ulong t0, t1;
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
        double ms = (t1 - t0) * 1e-6;
        if (ms < best) best = ms;
        clReleaseEvent(ev);
    }
    return best;
}

int main(void) {
    find_nvidia_gpu();
    char dname[256], dver[256];
    clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname, dname, NULL);
    clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof dver, dver, NULL);
    cl_uint cus;
    clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL);
    printf("device %s, driver %s, %u CUs\n", dname, dver, cus);
    cl_int err;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CK(err);
    q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err); CK(err);

    /* (1) wgmma written plainly */
    {
        const char *src = "__kernel void k(__global float *o) { asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\"); o[0] = 1; }\n";
        cl_int st;
        cl_program p = build_src(src, &st);
        char *log = build_log(p);
        printf("(1) plain wgmma.fence in OpenCL C: build status %d\n    log: %.600s\n", st, log);
    }

    /* (2) the product, both readings of the offsets */
    {
      for (int trans = 0; trans < 2; trans++) {
        char *src = cat(trans ? "#define TRANS 1\n" : "#define TRANS 0\n", cat(common_src, mm_src));
        char *tp = strstr(src, "1, 1, TRANS;"); /* the immediate inside the asm text */
        memcpy(tp, trans ? "1, 1, 1;    " : "1, 1, 0;    ", 12);
        cl_program p = build_wg(src, trans ? "mm_trans" : "mm", !trans);
        if (p) {
            unsigned short A[64 * 16], B[16 * 16];
            double ref[64 * 16];
            srand(1);
            for (int i = 0; i < 64 * 16; i++) A[i] = to_bf16((float)(rand() % 9 - 4));
            for (int i = 0; i < 16 * 16; i++) B[i] = to_bf16((float)(rand() % 9 - 4));
            for (int m = 0; m < 64; m++)
                for (int n = 0; n < 16; n++) {
                    double s = 0;
                    for (int k = 0; k < 16; k++) {
                        unsigned ua = (unsigned)A[m * 16 + k] << 16, ub = (unsigned)B[k * 16 + n] << 16;
                        float fa, fb; memcpy(&fa, &ua, 4); memcpy(&fb, &ub, 4);
                        s += (double)fa * fb;
                    }
                    ref[m * 16 + n] = s;
                }
            cl_mem bA = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof A, A, &err); CK(err);
            cl_mem bB = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof B, B, &err); CK(err);
            cl_mem bD = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * 16 * 4, NULL, &err); CK(err);
            cl_kernel k = clCreateKernel(p, "mm", &err); CK(err);
            cl_uint offs[2][2] = {{128, 256}, {256, 128}};
            for (int v = 0; v < 2; v++) {
                float D[64 * 16];
                for (int i = 0; i < 64 * 16; i++) D[i] = NAN;
                CK(clEnqueueWriteBuffer(q, bD, CL_TRUE, 0, sizeof D, D, 0, NULL, NULL));
                clSetKernelArg(k, 0, sizeof bA, &bA); clSetKernelArg(k, 1, sizeof bB, &bB);
                clSetKernelArg(k, 2, sizeof bD, &bD);
                clSetKernelArg(k, 3, 4, &offs[v][0]); clSetKernelArg(k, 4, 4, &offs[v][1]);
                size_t gs = 128, ls = 128;
                CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &gs, &ls, 0, NULL, NULL));
                CK(clEnqueueReadBuffer(q, bD, CL_TRUE, 0, sizeof D, D, 0, NULL, NULL));
                double maxerr = 0; int nans = 0;
                for (int i = 0; i < 64 * 16; i++) {
                    if (isnan(D[i])) nans++;
                    else if (fabs(D[i] - ref[i]) > maxerr) maxerr = fabs(D[i] - ref[i]);
                }
                printf("(2) wgmma m64n16k16 %s, lbo %u sbo %u: max |err| %g, NaN %d%s\n", trans ? "B MN-major (trans-b 1)" : "B K-major",
                       offs[v][0], offs[v][1], maxerr, nans, (maxerr == 0 && nans == 0) ? "  EXACT" : "");
            }
        }
      }
    }

    /* (4) setmaxnreg: two warpgroups trade registers under a cap of 128 */
    {
        const char *src =
            "__kernel __attribute__((reqd_work_group_size(256,1,1))) void regs(__global float *out) {\n"
            "  if (get_local_id(0) < 128) { asm volatile(\"// @WG setmaxnreg.dec.sync.aligned.u32 40;\" ::: \"memory\"); out[get_global_id(0)] = 1; }\n"
            "  else { asm volatile(\"// @WG setmaxnreg.inc.sync.aligned.u32 216;\" ::: \"memory\"); out[get_global_id(0)] = 2; }\n"
            "}\n";
        cl_int st;
        cl_program p = build_src(src, &st);
        char *ptx = rewrite(program_ptx(p));
        /* third try: the cap as a PTX directive, .maxnreg 128 after .reqntid */
        char *capped = malloc(strlen(ptx) + 32), *at = strstr(ptx, ".reqntid");
        at = at ? strchr(at, '\n') : NULL;
        if (at) sprintf(capped, "%.*s\n.maxnreg 128%s", (int)(at - ptx), ptx, at);
        const char *opts[3] = {"-cl-nv-verbose -cl-nv-maxrregcount=128", "-cl-nv-verbose", "-cl-nv-verbose"};
        for (int o = 0; o < 3; ++o) {
            if (o == 2) {
                if (!at) break;
                ptx = capped;
            }
            size_t n = strlen(ptx) + 1;
            const unsigned char *b = (const unsigned char *)ptx;
            cl_int bs;
            cl_program p2 = clCreateProgramWithBinary(ctx, 1, &dev, &n, &b, &bs, &err);
            st = clBuildProgram(p2, 1, &dev, opts[o], NULL, NULL);
            printf("(4) setmaxnreg, options '%s': build %d\n    log: %.1500s\n", opts[o], st, build_log(p2));
            if (st != CL_SUCCESS) continue;
            cl_kernel k = clCreateKernel(p2, "regs", &err);
            cl_mem ob = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 512 * 4, NULL, &err);
            clSetKernelArg(k, 0, sizeof ob, &ob);
            size_t gs = 512, ls = 256;
            cl_int e = clEnqueueNDRangeKernel(q, k, 1, NULL, &gs, &ls, 0, NULL, NULL);
            float h[512];
            cl_int r = clEnqueueReadBuffer(q, ob, CL_TRUE, 0, sizeof h, h, 0, NULL, NULL);
            int ok = e == CL_SUCCESS && r == CL_SUCCESS;
            for (int i = 0; ok && i < 512; ++i) ok = h[i] == ((i % 256) < 128 ? 1.0f : 2.0f);
            printf("(4) ran: enqueue %d, read %d, values %s\n", e, r, ok ? "right" : "WRONG");
        }
    }

    /* (3) throughput */
    {
        size_t groups = (size_t)cus * 8;
        int iters = 2000;
        cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, groups * 128 * 4, NULL, &err); CK(err);
        {
            cl_int st;
            cl_program p = build_src(mma_src, &st);
            if (st == CL_SUCCESS) {
                cl_kernel k = clCreateKernel(p, "tput", &err); CK(err);
                clSetKernelArg(k, 0, sizeof out, &out); clSetKernelArg(k, 1, 4, &iters);
                double ms = time_kernel(k, groups, 5);
                double flop = (double)groups * 4 * iters * 16 * 2.0 * 16 * 8 * 16;
                printf("(3) mma.sync m16n8k16: %.3f ms, %.1f TFLOP/s\n", ms, flop / ms * 1e-9);
            }
        }
        int Ns[5] = {16, 32, 64, 128, 256};
        for (int i = 0; i < 5; i++) {
            int inner = 8;
            char *src = cat(common_src, tput_src(Ns[i], inner));
            char tag[32]; sprintf(tag, "tput n%d", Ns[i]);
            cl_program p = build_wg(src, tag, 0);
            if (!p) continue;
            cl_kernel k = clCreateKernel(p, "tput", &err); CK(err);
            int it = iters * 64 / Ns[i];
            clSetKernelArg(k, 0, sizeof out, &out); clSetKernelArg(k, 1, 4, &it);
            for (int occ = 1; occ <= 2; occ++) {
                size_t g = (size_t)cus * occ * 2;
                double ms = time_kernel(k, g, 5);
                double flop = (double)g * it * inner * 2.0 * 64 * Ns[i] * 16;
                printf("(3) wgmma m64n%dk16 (A in registers), %zu groups: %.3f ms, %.1f TFLOP/s\n", Ns[i], g, ms, flop / ms * 1e-9);
            }
        }
    }
    return 0;
}
