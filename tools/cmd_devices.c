/* cmd_devices.c: `clnsa devices`, every OpenCL platform and device with what
 * clnsa_probe_device finds, and which one `run` picks by default. */
#include "cli_common.h"
#include "cmds.h"
#include "tune_common.h"

static const char *bytes_str(cl_ulong b, char *buf, size_t size)
{
    if (b >= (1ull << 30)) snprintf(buf, size, "%.1f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, size, "%.1f MiB", (double)b / (double)(1ull << 20));
    else if (b >= 1024) snprintf(buf, size, "%.1f KiB", (double)b / 1024.0);
    else snprintf(buf, size, "%llu B", (unsigned long long)b);
    return buf;
}

static void print_device(int p, int d, cl_device_id dev, bool is_default)
{
    clnsa_device_info in;
    clnsa_status st = clnsa_probe_device(dev, &in);
    if (st != CLNSA_SUCCESS) {
        printf("%c device %d:%d: probe failed: %s\n", is_default ? '*' : ' ', p, d, clnsa_status_string(st));
        return;
    }
    char g[32], l[32], sg[96] = "";
    printf("%c device %d:%d  %s%s\n", is_default ? '*' : ' ', p, d, in.name, is_default ? "  (default for run)" : "");
    printf("    %-20s %s (%s)\n", "vendor", in.vendor_name, tune_vendor_key(in.vendor));
    printf("    %-20s %s\n", "platform", in.platform_name);
    printf("    %-20s %s\n", "driver", in.driver_version);
    printf("    %-20s %s\n", "device version", in.device_version);
    printf("    %-20s %s\n", "OpenCL C version", in.opencl_c_version);
    printf("    %-20s %s (%s)\n", "architecture", in.architecture, in.is_gpu ? "GPU" : "not a GPU");
    printf("    %-20s %u\n", "compute units", in.compute_units);
    printf("    %-20s %s\n", "global memory", bytes_str(in.global_mem_size, g, sizeof g));
    printf("    %-20s %s\n", "local memory", bytes_str(in.local_mem_size, l, sizeof l));
    printf("    %-20s %zu\n", "max work-group size", in.max_work_group_size);
    printf("    %-20s %zu\n", "preferred multiple", in.preferred_wg_multiple);
    printf("    %-20s %s\n", "fp16", in.has_fp16 ? "yes" : "no");
    printf("    %-20s %s\n", "fp64", in.has_fp64 ? "yes" : "no");
    size_t n = 0;
    for (int i = 0; i < in.num_subgroup_sizes && i < 8 && n < sizeof sg; ++i)
        n += (size_t)snprintf(sg + n, sizeof sg - n, "%s%zu", i ? " " : ", sizes ", in.subgroup_sizes[i]);
    printf("    %-20s %s%s\n", "subgroups", in.has_subgroups ? "yes" : "no", sg);
}

static void usage(FILE *f, const cli_opt *opts, size_t n)
{
    fprintf(f, "usage: clnsa devices [--params [--device P:D] [shape options]]\n"
               "Lists every OpenCL platform and device with the properties clnsa probes.\n"
               "The device marked * is the one `clnsa run` and `clnsa nsa` use without --device:\n"
               "$CLNSA_DEVICE (P:D) if set, else the first GPU, else PoCL's CPU device, else the first device.\n"
               "--params shows, per kernel family, the parameters chosen on a device for a shape class (the\n"
               "anchor's by default, then each one a tuning entry names for the device) and where they come from:\n"
               "the user file (CLNSA_TUNING_FILE), the database (vendor/architecture/device), or the safe default.\n\n");
    cli_print_opts(f, opts, n);
}

int cmd_devices(int argc, char **argv)
{
    bool params = false;
    const char *device = NULL;
    int D = 128, DV = 0, G = 16, block = 64, S = 16, dtype = 2;
    const cli_opt opts[] = {
        {"--params", OPT_FLAG, &params, 0, 0, NULL, NULL, "show the chosen kernel parameters instead"},
        {"--device", OPT_STRING, &device, 0, 0, NULL, "P:D", "with --params: this device (default: as clnsa run)"},
        {"--D", OPT_INT, &D, 8, 256, NULL, "N", "with --params: head dim of q and k (default 128)"},
        {"--DV", OPT_INT, &DV, 8, 256, NULL, "N", "with --params: head dim of v (default: --D)"},
        {"--G", OPT_INT, &G, 1, 256, NULL, "N", "with --params: GQA group (default 16)"},
        {"--block", OPT_INT, &block, 1, 4096, NULL, "N", "with --params: selection block (default 64)"},
        {"--S", OPT_INT, &S, 1, 256, NULL, "N", "with --params: selected blocks (default 16)"},
        {"--dtype", OPT_CHOICE, &dtype, 0, 0, "f32|f16|bf16", NULL, "with --params: storage dtype (default bf16)"},
    };
    const size_t nopts = sizeof opts / sizeof opts[0];
    int rc = cli_parse("devices", argc, argv, 2, opts, nopts, NULL);
    if (rc < 0) {
        usage(stdout, opts, nopts);
        return CLI_OK;
    }
    if (rc) return rc;
    if (params) {
        const tune_problem pb = {.dk = D, .dv = DV ? DV : D, .g = G, .block = block, .dtype = cli_dtype_from_choice(dtype), .S = S,
                                 .cmp_block = block, .cmp_stride = block, .slc = true};
        return tune_print_params(device, &pb) ? CLI_FAIL : CLI_OK;
    }

    cl_platform_id plats[32];
    cl_uint np = 0;
    if (clGetPlatformIDs(32, plats, &np) != CL_SUCCESS || np == 0) {
        fprintf(stderr, "clnsa devices: no OpenCL platform found (install an OpenCL driver, e.g. pocl-opencl-icd)\n");
        return CLI_FAIL;
    }
    if (np > 32) np = 32;
    int def_p = -1, def_d = -1;
    if (cli_default_device(&def_p, &def_d)) def_p = def_d = -1;
    unsigned total = 0;
    for (cl_uint p = 0; p < np; ++p) {
        char name[256] = "", version[256] = "";
        clGetPlatformInfo(plats[p], CL_PLATFORM_NAME, sizeof name, name, NULL);
        clGetPlatformInfo(plats[p], CL_PLATFORM_VERSION, sizeof version, version, NULL);
        name[sizeof name - 1] = version[sizeof version - 1] = '\0';
        printf("platform %u: %s (%s)\n", p, name, version);
        cl_device_id devs[64];
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 64, devs, &nd) != CL_SUCCESS) nd = 0;
        if (nd > 64) nd = 64;
        if (nd == 0) printf("  (no devices)\n");
        for (cl_uint d = 0; d < nd; ++d, ++total)
            print_device((int)p, (int)d, devs[d], (int)p == def_p && (int)d == def_d);
    }
    if (def_p >= 0) printf("default device: %d:%d\n", def_p, def_d);
    return total ? CLI_OK : CLI_FAIL;
}
