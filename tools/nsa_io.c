/* nsa_io.c: see nsa_io.h. */
#include "nsa_io.h"

#include "cli_common.h"
#include "npy_file.h"
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int load_qkv(const char *dir, nsa_files *o)
{
    npy_file f;
    int64_t any4[4] = {-1, -1, -1, -1};
    int rc = -1;
    if (npy_file_open(dir, "q.npy", 1, &f) < 0) return -1;
    if (npy_file_check_shape(&f, 4, any4, "[B, T, HQ, DK]")) goto done;
    for (int i = 0; i < 3; ++i)
        if (f.a.shape[i] < 1 || f.a.shape[i] > (i == 1 ? (1 << 30) : 65535)) {
            npy_file_fail(f.path, "dim %d = %lld: expected B, HQ in 1..65535 and T in 1..2^30", i, (long long)f.a.shape[i]);
            goto done;
        }
    if (npy_file_check_head_dim(&f, 3, "DK")) goto done;
    o->B = (int)f.a.shape[0], o->T = (int)f.a.shape[1], o->HQ = (int)f.a.shape[2], o->DK = (int)f.a.shape[3];
    if (npy_file_floats(&f, &o->q)) goto done;
    npy_free(&f.a);

    int64_t wk[4] = {o->B, o->T, -1, o->DK};
    if (npy_file_open(dir, "k.npy", 1, &f) < 0 || npy_file_check_shape(&f, 4, wk, "[B, T, H, DK]")) goto done;
    if (f.a.shape[2] < 1 || o->HQ % f.a.shape[2]) {
        npy_file_fail(f.path, "H = %lld: expected a KV head count >= 1 dividing HQ = %d (q.npy)", (long long)f.a.shape[2], o->HQ);
        goto done;
    }
    o->H = (int)f.a.shape[2];
    if (npy_file_floats(&f, &o->k)) goto done;
    npy_free(&f.a);

    int64_t wv[4] = {o->B, o->T, o->H, -1};
    if (npy_file_open(dir, "v.npy", 1, &f) < 0 || npy_file_check_shape(&f, 4, wv, "[B, T, H, DV]")) goto done;
    if (npy_file_check_head_dim(&f, 3, "DV")) goto done;
    o->DV = (int)f.a.shape[3];
    if (npy_file_floats(&f, &o->v)) goto done;
    rc = 0;
done:
    npy_free(&f.a);
    return rc;
}

static int load_cu(const char *dir, nsa_files *o)
{
    npy_file f;
    int rc = npy_file_open(dir, "cu_seqlens.npy", 0, &f);
    if (rc <= 0) return rc;
    rc = -1;
    if (f.a.ndim != 1 || f.a.shape[0] < 2) {
        char got[128];
        npy_file_fail(f.path, "expected shape [N+1] with N >= 1, got %s", cli_shape_str(f.a.ndim, f.a.shape, got, sizeof got));
        goto done;
    }
    if (o->B != 1) {
        npy_file_fail(f.path, "varlen needs B = 1, but q.npy has B = %d", o->B);
        goto done;
    }
    if (npy_file_ints(&f, &o->cu)) goto done;
    o->N = (int)f.a.shape[0] - 1;
    if (o->cu[0] != 0 || o->cu[o->N] != o->T) {
        npy_file_fail(f.path, "expected cu_seqlens[0] = 0 and cu_seqlens[%d] = T = %d, got %d and %d", o->N, o->T, o->cu[0],
             o->cu[o->N]);
        goto done;
    }
    for (int s = 0; s < o->N; ++s)
        if (o->cu[s + 1] < o->cu[s]) {
            npy_file_fail(f.path, "expected non-decreasing offsets, got cu_seqlens[%d] = %d > cu_seqlens[%d] = %d", s, o->cu[s],
                 s + 1, o->cu[s + 1]);
            goto done;
        }
    rc = 1;
done:
    npy_free(&f.a);
    return rc;
}

static int load_indices(const char *dir, nsa_files *o)
{
    npy_file f;
    int rc = npy_file_open(dir, "block_indices.npy", 0, &f);
    if (rc > 0) {
        int64_t want[4] = {o->B, o->T, o->H, -1};
        rc = -1;
        if (npy_file_check_shape(&f, 4, want, "[B, T, H, S]")) goto done;
        if (f.a.shape[3] < 1 || f.a.shape[3] > 1024) {
            npy_file_fail(f.path, "S = %lld: expected 1..1024 selected blocks per query", (long long)f.a.shape[3]);
            goto done;
        }
        if (npy_file_ints(&f, &o->bidx)) goto done;
        o->S = (int)f.a.shape[3];
        rc = 1;
    }
    npy_free(&f.a);
    if (rc < 0) return rc;
    rc = npy_file_open(dir, "block_counts.npy", 0, &f);
    if (rc > 0) {
        int64_t want[3] = {o->B, o->T, o->H};
        rc = npy_file_check_shape(&f, 3, want, "[B, T, H]") || npy_file_ints(&f, &o->bcnt) ? -1 : 1;
    }
done:
    npy_free(&f.a);
    return rc;
}

static int load_cmp(const char *dir, nsa_files *o)
{
    int64_t wk[4] = {o->B, -1, o->H, o->DK}, wv[4] = {o->B, -1, o->H, o->DV};
    char path[4096];
    npy_file f;
    int rk = npy_file_open(dir, "k_cmp.npy", 0, &f);
    if (rk < 0) return -1;
    if (rk > 0) {
        int bad = npy_file_check_shape(&f, 4, wk, "[B, NC, H, DK]") || npy_file_floats(&f, &o->k_cmp);
        o->NC = bad ? 0 : (int)f.a.shape[1];
        npy_free(&f.a);
        if (bad) return -1;
        wv[1] = o->NC;
    }
    int rv = npy_file_load_floats(dir, "v_cmp.npy", false, 4, wv, "[B, NC, H, DV] (NC of k_cmp.npy)", &o->v_cmp);
    if (rv < 0) return -1;
    if (rk != rv)
        return npy_file_fail(cli_path(dir, rk ? "k_cmp.npy" : "v_cmp.npy", path, sizeof path), "given without %s",
                    rk ? "v_cmp.npy" : "k_cmp.npy");
    return 0;
}

int nsa_files_load(const char *dir, nsa_files *o)
{
    static const char *const gates[GATE_N] = {"g_cmp.npy", "g_slc.npy", "g_swa.npy"};
    memset(o, 0, sizeof *o);
    o->dir = dir;
    if (load_qkv(dir, o)) return -1;
    int64_t wg[3] = {o->B, o->T, o->HQ};
    for (int i = 0; i < GATE_N; ++i)
        if (npy_file_load_floats(dir, gates[i], false, 3, wg, "[B, T, HQ]", &o->gate[i]) < 0) return -1;
    if (load_cu(dir, o) < 0 || load_indices(dir, o) < 0 || load_cmp(dir, o) < 0) return -1;
    int64_t wo[4] = {o->B, o->T, o->HQ, o->DV};
    if (npy_file_load_floats(dir, "do.npy", false, 4, wo, "[B, T, HQ, DV]", &o->dout) < 0) return -1;
    return 0;
}

int nsa_files_check(const nsa_files *f, int block_size, int cmp_stride)
{
    char path[4096];
    if (f->k_cmp) {
        int64_t nc = 0;
        if (!f->cu) nc = ((int64_t)f->T + cmp_stride - 1) / cmp_stride;
        for (int s = 0; f->cu && s < f->N; ++s) nc += ((int64_t)f->cu[s + 1] - f->cu[s] + cmp_stride - 1) / cmp_stride;
        if (nc != f->NC)
            return npy_file_fail(cli_path(f->dir, "k_cmp.npy", path, sizeof path),
                        "NC = %d compressed tokens, but %lld are expected with compression stride %d%s", f->NC,
                        (long long)nc, cmp_stride, f->cu ? " and cu_seqlens.npy" : "");
    }
    if (!f->bidx) return 0;
    const size_t S = (size_t)f->S;
    for (int b = 0; b < f->B; ++b)
        for (int t = 0, s = 0; t < f->T; ++t) {
            while (f->cu && s + 1 < f->N && f->cu[s + 1] <= t) ++s;
            const int64_t len = f->cu ? f->cu[s + 1] - f->cu[s] : f->T;
            const int64_t nb = (len + block_size - 1) / block_size;
            for (int h = 0; h < f->H; ++h) {
                const int32_t *row = f->bidx + (((size_t)b * f->T + t) * f->H + h) * S;
                for (size_t j = 0; j < S; ++j)
                    if (row[j] >= nb)
                        return npy_file_fail(cli_path(f->dir, "block_indices.npy", path, sizeof path),
                                    "entry [%d, %d, %d, %zu] = %d is out of range: the sequence of token %d has %lld "
                                    "blocks of %d",
                                    b, t, h, j, row[j], t, (long long)nb, block_size);
            }
        }
    return 0;
}

void nsa_files_free(nsa_files *f)
{
    free(f->q), free(f->k), free(f->v);
    for (int i = 0; i < GATE_N; ++i) free(f->gate[i]);
    free(f->cu), free(f->k_cmp), free(f->v_cmp), free(f->bidx), free(f->bcnt), free(f->dout);
    memset(f, 0, sizeof *f);
}
