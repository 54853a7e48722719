/* guard.h: guard regions. An output is placed inside a larger buffer filled
 * with a byte pattern: elements before it, a gap after each of its innermost
 * rows, elements after it. After the op, every element of the view must equal
 * the same op's result in a plain contiguous buffer, and every byte outside
 * the view must still hold the pattern. Inputs are snapshotted whole before
 * the op and must come out byte-identical. */
#ifndef CLNSA_GUARD_H
#define CLNSA_GUARD_H

#include "testutil.h"

/* The whole buffer's size / contents (blocking read); assert on failure. */
size_t mem_bytes(cl_mem m);
unsigned char *read_all(cl_command_queue q, cl_mem m);

typedef struct {
    clnsa_tensor view;     /* the output as the op gets it; view.data NULL when `like` was absent */
    size_t bytes;          /* of the guarded buffer */
    unsigned char *before; /* the pattern written over it */
} guard_view;

/* A view shaped like `like` (dtype, rank, shape) at a nonzero offset inside a
 * pattern-filled buffer; with gaps, rows of the innermost dim are separated
 * by unused elements. An absent `like` gives an absent view. */
void guard_place(const test_env *env, guard_view *g, const clnsa_tensor *like, bool gaps, unsigned salt);
/* Asserts the view's elements equal those of `expect` (same shape, any
 * layout) bitwise and that nothing outside the view changed; returns the
 * number of guard bytes checked. `what` names the output in messages. */
size_t guard_check(const test_env *env, const guard_view *g, const clnsa_tensor *expect, const char *what);
void guard_free(guard_view *g);

/* Whole-buffer copies of the inputs of an op. */
#define SNAPSHOT_MAX 48
typedef struct {
    int n;
    cl_mem m[SNAPSHOT_MAX];
    unsigned char *data[SNAPSHOT_MAX];
} snapshot;

/* Adds the buffers of the present tensors among t[0..count). A struct whose
 * members are all clnsa_tensor (the inputs structs of clnsa.h) is passed as
 * TENSORS_OF(s). */
void snapshot_add(const test_env *env, snapshot *s, const clnsa_tensor *t, size_t count);
#define TENSORS_OF(s) ((const clnsa_tensor *)&(s)), (sizeof(s) / sizeof(clnsa_tensor))
/* Asserts every buffer is byte-identical to its snapshot, then frees it. */
void snapshot_check(const test_env *env, snapshot *s, const char *what);

#endif
