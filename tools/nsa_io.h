/* nsa_io.h: the input folder of `clnsa nsa`: reads and checks the .npy files
 * on the host, so that a bad file is reported by name before any device work.
 * Every failure prints ONE line on stderr, starting with the file's path. */
#ifndef CLNSA_NSA_IO_H
#define CLNSA_NSA_IO_H

#include <stdint.h>

enum { GATE_CMP, GATE_SLC, GATE_SWA, GATE_N };

typedef struct {
    const char *dir;
    int B, T, HQ, H, DK, DV;
    float *q, *k, *v;     /* required; float arrays of any float dtype, as f32 */
    float *gate[GATE_N];  /* g_cmp, g_slc, g_swa [B, T, HQ]; NULL: file absent */
    int32_t *cu;          /* cu_seqlens [N+1] (int32 or int64 on disk); NULL: absent */
    int N;
    float *k_cmp, *v_cmp; /* [B, NC, H, DK] / [B, NC, H, DV]; both or neither */
    int NC;
    int32_t *bidx;        /* block_indices [B, T, H, S]; NULL: absent */
    int S;
    int32_t *bcnt;        /* block_counts [B, T, H]; NULL: absent */
    float *dout;          /* do [B, T, HQ, DV]: the output gradient; NULL: absent (no backward) */
} nsa_files;

/* Reads dir/{q,k,v}.npy and whichever optional files exist, and checks every
 * shape against q, k and v. */
int nsa_files_load(const char *dir, nsa_files *f);
/* The checks that depend on the options: k_cmp's row count for the
 * compression stride, and block_indices entries below the number of
 * selection blocks of their sequence. */
int nsa_files_check(const nsa_files *f, int block_size, int cmp_stride);
void nsa_files_free(nsa_files *f);

#endif
