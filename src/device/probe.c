/* probe.c: what a device is and what it can do, read once per context.
 * Kernels are specialized from this (vendor path, tile sizes that fit). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Vendor extension queries (cl_ext.h names, spelled out so that older
 * headers build too). */
#define NV_COMPUTE_MAJOR 0x4000
#define NV_COMPUTE_MINOR 0x4001
#define AMD_BOARD_NAME 0x4038
#define AMD_GFXIP_MAJOR 0x404A
#define AMD_GFXIP_MINOR 0x404B
#define INTEL_IP_VERSION 0x4250
#define INTEL_SUBGROUP_SIZES 0x4108

static void get_str(cl_device_id d, cl_device_info what, char *buf, size_t size)
{
    buf[0] = '\0';
    if (clGetDeviceInfo(d, what, size, buf, NULL) != CL_SUCCESS) buf[0] = '\0';
    buf[size - 1] = '\0';
}

static bool has_ext(const char *exts, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = strstr(exts, name); p; p = strstr(p + 1, name))
        if ((p == exts || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
    return false;
}

static clnsa_vendor classify(const clnsa_device_info *info)
{
    const char *v = info->vendor_name, *p = info->platform_name;
    if (strstr(p, "Portable Computing Language") || strstr(p, "PoCL")) return CLNSA_VENDOR_POCL;
    if (strstr(p, "rusticl") || strstr(p, "Clover") || strstr(v, "Mesa")) return CLNSA_VENDOR_MESA;
    if (strstr(v, "NVIDIA")) return CLNSA_VENDOR_NVIDIA;
    if (strstr(v, "Advanced Micro Devices") || strstr(v, "AMD")) return CLNSA_VENDOR_AMD;
    if (strstr(v, "Intel")) return CLNSA_VENDOR_INTEL;
    return CLNSA_VENDOR_OTHER;
}

static void probe_architecture(cl_device_id d, clnsa_device_info *info, const char *exts)
{
    cl_uint u1 = 0, u2 = 0;
    snprintf(info->architecture, sizeof info->architecture, "%s", info->is_gpu ? "gpu" : "cpu");
    if (has_ext(exts, "cl_nv_device_attribute_query") &&
        clGetDeviceInfo(d, NV_COMPUTE_MAJOR, sizeof u1, &u1, NULL) == CL_SUCCESS &&
        clGetDeviceInfo(d, NV_COMPUTE_MINOR, sizeof u2, &u2, NULL) == CL_SUCCESS) {
        info->nv_compute_major = (int)u1;
        info->nv_compute_minor = (int)u2;
        snprintf(info->architecture, sizeof info->architecture, "sm_%u%u", u1, u2);
    } else if (has_ext(exts, "cl_amd_device_attribute_query") &&
               clGetDeviceInfo(d, AMD_GFXIP_MAJOR, sizeof u1, &u1, NULL) == CL_SUCCESS &&
               clGetDeviceInfo(d, AMD_GFXIP_MINOR, sizeof u2, &u2, NULL) == CL_SUCCESS) {
        snprintf(info->architecture, sizeof info->architecture, "gfx%u%02x", u1, u2);
    } else if (has_ext(exts, "cl_intel_device_attribute_query") &&
               clGetDeviceInfo(d, INTEL_IP_VERSION, sizeof u1, &u1, NULL) == CL_SUCCESS) {
        snprintf(info->architecture, sizeof info->architecture, "intel-ip-0x%08x", u1);
    }
}

/* The preferred work-group multiple is a kernel property: ask a trivial one. */
static size_t probe_wg_multiple(cl_device_id d)
{
    size_t mult = 1;
    cl_int err;
    cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    if (err != CL_SUCCESS) return mult;
    const char *src = "__kernel void probe(__global int *p) { p[get_global_id(0)] = 0; }";
    cl_program p = clCreateProgramWithSource(c, 1, &src, NULL, &err);
    if (err == CL_SUCCESS && clBuildProgram(p, 1, &d, "", NULL, NULL) == CL_SUCCESS) {
        cl_kernel k = clCreateKernel(p, "probe", &err);
        if (err == CL_SUCCESS) {
            clGetKernelWorkGroupInfo(k, d, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                                     sizeof mult, &mult, NULL);
            clReleaseKernel(k);
        }
    }
    if (p) clReleaseProgram(p);
    clReleaseContext(c);
    return mult ? mult : 1;
}

/* The variables that lower the probed limits, to simulate other vendors'
 * devices on this one (.ci/matrix.sh's limits stage). */
static const char *const limit_env[] = {"CLNSA_MAX_LOCAL_MEM", "CLNSA_MAX_WORK_GROUP", "CLNSA_WG_MULTIPLE",
                                        "CLNSA_MAX_MEM_ALLOC"};

bool device_limits_from_env(void)
{
    for (size_t i = 0; i < sizeof limit_env / sizeof limit_env[0]; ++i)
        if (getenv(limit_env[i])) return true;
    return false;
}

static void apply_limits_from_env(clnsa_device_info *info)
{
    int lm = cx_env_int(limit_env[0], 0), wg = cx_env_int(limit_env[1], 0);
    int mult = cx_env_int(limit_env[2], 0), alloc = cx_env_int(limit_env[3], 0);
    if (lm > 0 && (cl_ulong)lm < info->local_mem_size) info->local_mem_size = (cl_ulong)lm;
    if (alloc > 0 && (cl_ulong)alloc < info->max_mem_alloc_size) info->max_mem_alloc_size = (cl_ulong)alloc;
    if (wg > 0 && (size_t)wg < info->max_work_group_size) info->max_work_group_size = (size_t)wg;
    if (mult > 0) info->preferred_wg_multiple = (size_t)mult;
}

clnsa_status clnsa_probe_device(cl_device_id d, clnsa_device_info *info)
{
    if (!d || !info) return CLNSA_ERROR_NULL_ARGUMENT;
    memset(info, 0, sizeof *info);
    cl_platform_id plat;
    cl_device_type type = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL) != CL_SUCCESS)
        return CLNSA_ERROR_OPENCL;
    clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof info->platform_name, info->platform_name, NULL);
    get_str(d, CL_DEVICE_NAME, info->name, sizeof info->name);
    get_str(d, CL_DEVICE_VENDOR, info->vendor_name, sizeof info->vendor_name);
    get_str(d, CL_DRIVER_VERSION, info->driver_version, sizeof info->driver_version);
    get_str(d, CL_DEVICE_VERSION, info->device_version, sizeof info->device_version);
    get_str(d, CL_DEVICE_OPENCL_C_VERSION, info->opencl_c_version, sizeof info->opencl_c_version);
    sscanf(info->opencl_c_version, "OpenCL C %d.%d", &info->opencl_c_major, &info->opencl_c_minor);
    clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    info->is_gpu = (type & CL_DEVICE_TYPE_GPU) != 0;
    clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof info->compute_units, &info->compute_units, NULL);
    clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof info->global_mem_size, &info->global_mem_size, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof info->max_mem_alloc_size, &info->max_mem_alloc_size, NULL);
    clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof info->local_mem_size, &info->local_mem_size, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof info->max_work_group_size,
                    &info->max_work_group_size, NULL);

    size_t ext_size = 0;
    clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_size);
    char *exts = calloc(ext_size + 1, 1);
    if (!exts) return CLNSA_ERROR_OUT_OF_HOST_MEMORY;
    clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, ext_size, exts, NULL);
    info->has_fp16 = has_ext(exts, "cl_khr_fp16");
    info->has_fp64 = has_ext(exts, "cl_khr_fp64");
    info->has_subgroups = has_ext(exts, "cl_khr_subgroups") || has_ext(exts, "cl_intel_subgroups");
    if (has_ext(exts, "cl_intel_subgroups")) {
        size_t sizes[8], bytes = 0;
        if (clGetDeviceInfo(d, INTEL_SUBGROUP_SIZES, sizeof sizes, sizes, &bytes) == CL_SUCCESS) {
            info->num_subgroup_sizes = (int)(bytes / sizeof(size_t));
            memcpy(info->subgroup_sizes, sizes, bytes);
        }
    }
    info->vendor = classify(info);
    probe_architecture(d, info, exts);
    free(exts);
    if (info->vendor == CLNSA_VENDOR_NVIDIA && info->num_subgroup_sizes == 0) {
        info->subgroup_sizes[0] = 32; /* a warp, reachable through shfl.sync PTX */
        info->num_subgroup_sizes = 1;
    }
    info->preferred_wg_multiple = probe_wg_multiple(d);
    apply_limits_from_env(info);
    return CLNSA_SUCCESS;
}

const clnsa_device_info *clnsa_context_device_info(const clnsa_context *ctx)
{
    return ctx ? &ctx->info : NULL;
}

warp_mode device_warp_mode(const clnsa_context *ctx, clnsa_dtype dtype)
{
    const bool tf32 = dtype == CLNSA_DTYPE_F32 && ctx->tf32;
    if (dtype != CLNSA_DTYPE_F16 && dtype != CLNSA_DTYPE_BF16 && !tf32) return WARP_OFF;
    switch (ctx->matrix_path) {
    case CLNSA_MATRIX_PORTABLE: return WARP_OFF;
    case CLNSA_MATRIX_EMULATED: return WARP_EMULATED;
    default:
        return ctx->info.vendor == CLNSA_VENDOR_NVIDIA && ctx->info.nv_compute_major >= 8 ? WARP_NV : WARP_OFF;
    }
}

bool device_wgmma(const clnsa_context *ctx)
{
    return ctx->matrix_path != CLNSA_MATRIX_PORTABLE && ctx->matrix_path != CLNSA_MATRIX_EMULATED &&
           ctx->info.vendor == CLNSA_VENDOR_NVIDIA && ctx->info.nv_compute_major == 9 &&
           ctx->info.nv_compute_minor == 0 && cx_env_int("CLNSA_WGMMA", 1) != 0;
}

warp_mode device_warp_path(const clnsa_context *ctx, clnsa_dtype dtype, int dk, int dv, const clnsa_tensor *const *rows,
                           size_t nrows)
{
    const warp_mode w = device_warp_mode(ctx, dtype);
    if (w == WARP_OFF || dk % 16 || dv % 16 || dk > 128 || dv > 128) return WARP_OFF;
    for (size_t i = 0; i < nrows; ++i)
        if (!tensor_rows_aligned(rows[i])) return WARP_OFF;
    return w;
}
