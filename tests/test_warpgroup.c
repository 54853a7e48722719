/* test_warpgroup.c: the sm_90a path (src/program/ptx_sm90a.c,
 * cl/warpgroup_mma.h). The PTX rewrite is checked on any device; the
 * warpgroup products and setmaxnreg run where device_wgmma says they may (an
 * NVIDIA device of compute capability 9.0) and are skipped elsewhere with a
 * message.
 * Linked with the static library: it calls program_get and ptx_to_sm90a. */
#include "testutil.h"

#include "internal.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

TEST_ENV_GROUP

static void test_ptx_rewrite(void **state)
{
    (void)state;
    const char *why = NULL;
    const char *ptx = ".version 9.0\n.target sm_90, texmode_independent\n.address_size 64\n"
                      "\t// @sm_90a wgmma.fence.sync.aligned;\n\tmov.u32 %r1, %r2; // sm_90 stays\n"
                      "{\n// @sm_90a .reg .pred p;\n}\n";
    char *out = ptx_to_sm90a(ptx, 0, &why);
    assert_non_null(out);
    assert_string_equal(out, ".version 9.0\n.target sm_90a, texmode_independent\n.address_size 64\n"
                             "\twgmma.fence.sync.aligned;\n\tmov.u32 %r1, %r2; // sm_90 stays\n"
                             "{\n.reg .pred p;\n}\n");
    free(out);

    /* The cap a source asks for, and none. */
    assert_int_equal(sm90a_register_cap("#define WGMMA_NV 1\n#define WG_MAXNREG 128\n"), 128);
    assert_int_equal(sm90a_register_cap("#define WGMMA_NV 1\n"), 0);

    /* A register cap: every kernel's, before its body. */
    const char *two = ".target sm_90\n.entry a(\n\t.param .u64 a_0\n)\n.reqntid 256, 1, 1\n{\n"
                      "// @sm_90a setmaxnreg.inc.sync.aligned.u32 216;\n{ }\n}\n.entry b(\n)\n{\nret;\n}\n";
    out = ptx_to_sm90a(two, 128, &why);
    assert_non_null(out);
    assert_string_equal(out, ".target sm_90a\n.entry a(\n\t.param .u64 a_0\n)\n.reqntid 256, 1, 1\n.maxnreg 128\n{\n"
                             "setmaxnreg.inc.sync.aligned.u32 216;\n{ }\n}\n.entry b(\n)\n.maxnreg 128\n{\nret;\n}\n");
    free(out);

    /* Nothing marked, another target, already sm_90a, a cap out of range:
     * refused, saying why. */
    assert_null(ptx_to_sm90a(".target sm_90\nmov.u32 %r1, %r2;\n", 0, &why));
    assert_non_null(strstr(why, "no instruction marked"));
    assert_null(ptx_to_sm90a(".target sm_80\n// @sm_90a wgmma.fence.sync.aligned;\n", 0, &why));
    assert_non_null(strstr(why, ".target sm_90"));
    assert_null(ptx_to_sm90a(".target sm_90a\n// @sm_90a wgmma.fence.sync.aligned;\n", 0, &why));
    assert_null(ptx_to_sm90a(two, 256, &why));
    assert_non_null(strstr(why, "WG_MAXNREG"));
}

/* The probe kernels' program (cl/warpgroup_probe.cl) with `extra` defines. */
static cl_program probe_program(const char *extra)
{
    static const char *const files[] = {"common.h", "warpgroup_mma.h", "warpgroup_probe.cl", NULL};
    char defines[256];
    snprintf(defines, sizeof defines, "#define STORAGE 2\n#define IDX_LONG 0\n#define VARLEN 0\n#define WGMMA_NV 1\n%s", extra);
    cl_program prog = NULL;
    assert_int_equal(program_get(env.ctx, files, defines, &prog), CLNSA_SUCCESS);
    return prog;
}

/* One wgmma.m64nNk16 (N = n) with B in the layout trans_b names, against
 * the exact products of small integers (exact in bf16 and in f32 sums), d
 * poisoned. */
static void check_product(int trans_b, int n_cols)
{
    char extra[64];
    snprintf(extra, sizeof extra, "#define TRANS_B %d\n#define PRODUCT_N %d\n", trans_b, n_cols);
    cl_kernel k = NULL;
    assert_int_equal(kernel_create(env.ctx, probe_program(extra), "warpgroup_product", &k), CLNSA_SUCCESS);

    double ref[64 * 64];
    uint64_t seed = 0x5eed0 + (uint64_t)(2 * n_cols + trans_b);
    double va[64 * 16], vb[16 * 64];
    fill_uniform(va, 64 * 16, -4.0, 5.0, &seed);
    fill_uniform(vb, 16 * (size_t)n_cols, -4.0, 5.0, &seed);
    for (int i = 0; i < 64 * 16; ++i) va[i] = floor(va[i]);
    for (int i = 0; i < 16 * n_cols; ++i) vb[i] = floor(vb[i]);
    for (int m = 0; m < 64; ++m)
        for (int n = 0; n < n_cols; ++n) {
            double s = 0;
            for (int kk = 0; kk < 16; ++kk) s += va[m * 16 + kk] * vb[kk * n_cols + n];
            ref[m * n_cols + n] = s;
        }
    cl_mem ba = upload(&env, va, 64 * 16, CLNSA_DTYPE_BF16, false);
    cl_mem bb = upload(&env, vb, 16 * (size_t)n_cols, CLNSA_DTYPE_BF16, false);
    const size_t nd = 64 * (size_t)n_cols;
    cl_mem bd = poisoned(&env, nd, CLNSA_DTYPE_F32);
    clSetKernelArg(k, 0, sizeof ba, &ba);
    clSetKernelArg(k, 1, sizeof bb, &bb);
    clSetKernelArg(k, 2, sizeof bd, &bd);
    const size_t global = 128, local = 128;
    assert_int_equal(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, &local, 0, NULL, NULL), CL_SUCCESS);
    double d[64 * 64];
    download(&env, bd, nd, CLNSA_DTYPE_F32, d);
    int wrong = 0;
    for (size_t i = 0; i < nd; ++i)
        if (!(d[i] == ref[i]) && wrong++ < 4)
            print_message("  n %d trans_b %d: d[%zu][%zu] = %g, expected %g\n", n_cols, trans_b, i / (size_t)n_cols,
                          i % (size_t)n_cols, d[i], ref[i]);
    assert_int_equal(wrong, 0);
    clReleaseMemObject(ba);
    clReleaseMemObject(bb);
    clReleaseMemObject(bd);
    clReleaseKernel(k);
}

/* Two warpgroups trading registers under a cap of 128 (WG_MAXNREG). */
static void check_registers(void)
{
    cl_kernel k = NULL;
    assert_int_equal(kernel_create(env.ctx, probe_program("#define TRANS_B 0\n#define WG_MAXNREG 128\n"),
                                   "warpgroup_registers", &k),
                     CLNSA_SUCCESS);
    cl_mem bo = poisoned(&env, 512, CLNSA_DTYPE_F32);
    clSetKernelArg(k, 0, sizeof bo, &bo);
    const size_t global = 512, local = 256;
    assert_int_equal(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, &local, 0, NULL, NULL), CL_SUCCESS);
    double o[512];
    download(&env, bo, 512, CLNSA_DTYPE_F32, o);
    for (int i = 0; i < 512; ++i) assert_true(o[i] == (i % 256 < 128 ? 1.0 : 2.0));
    clReleaseMemObject(bo);
    clReleaseKernel(k);
}

static void test_products(void **state)
{
    (void)state;
    if (!device_wgmma(env.ctx)) {
        print_message("skipped: %s is not an NVIDIA device of compute capability 9.0 (or CLNSA_WGMMA=0)\n",
                      clnsa_context_device_info(env.ctx)->name);
        skip();
    }
    for (int n = 16; n <= 64; n *= 2) {
        check_product(0, n);
        check_product(1, n);
    }
    check_registers();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ptx_rewrite),
        cmocka_unit_test(test_products),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
