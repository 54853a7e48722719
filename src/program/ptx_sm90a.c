/* ptx_sm90a.c: Hopper's own instructions (wgmma, setmaxnreg) from OpenCL C.
 *
 * NVIDIA's OpenCL compiles for `.target sm_90`, where ptxas rejects the
 * instructions that only sm_90a has. Its program binaries are PTX text,
 * though, and a PTX binary goes to the driver's JIT, which takes sm_90a on a
 * device of compute capability 9.0 (checked on the H200, 2026-11-29: wgmma
 * exact, 975.6 TFLOP/s against mma.sync's 646.1, bench/RESULTS.md). So
 * kernels write each such instruction as a PTX comment behind SM90A_MARK
 * (cl/warpgroup_mma.h): the first build compiles comments, with the operands
 * already named by the compiler; this file turns them into instructions and
 * retargets the module (and gives each kernel the register cap setmaxnreg
 * needs); program.c then builds the result as a binary. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SM90A_MARK "// @sm_90a "

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

int sm90a_register_cap(const char *src)
{
    static const char define[] = "#define WG_MAXNREG ";
    const char *cap = strstr(src, define);
    return cap ? atoi(cap + strlen(define)) : 0;
}

char *ptx_to_sm90a(const char *ptx, int maxnreg, const char **why)
{
    const char *target = strstr(ptx, ".target sm_90");
    if (!target || is_name_char(target[13])) {
        *why = "the compiled PTX has no '.target sm_90' line";
        return NULL;
    }
    if (!strstr(ptx, SM90A_MARK)) {
        *why = "the compiled PTX has no instruction marked for sm_90a";
        return NULL;
    }
    if (maxnreg < 0 || maxnreg > 255) {
        *why = "the register cap (WG_MAXNREG) is not within 0 .. 255";
        return NULL;
    }
    size_t entries = 0;
    for (const char *e = ptx; (e = strstr(e, ".entry ")); ++e) ++entries;
    const size_t mark = strlen(SM90A_MARK);
    char *out = malloc(strlen(ptx) + 2 + entries * 16), *o = out;
    if (!out) {
        *why = "out of host memory";
        return NULL;
    }
    bool in_header = false; /* between an .entry and its body */
    for (const char *s = ptx; *s;) {
        if (s == target) { /* the module's target, once */
            memcpy(o, ".target sm_90a", 14);
            o += 14;
            s += 13;
        } else if (*s == '/' && strncmp(s, SM90A_MARK, mark) == 0) {
            s += mark;
        } else {
            if (*s == '.' && strncmp(s, ".entry ", 7) == 0) in_header = true;
            /* setmaxnreg is ignored (ptxas C7508) unless the entry declares
             * its register count: a directive before the body's brace. */
            if (in_header && *s == '{' && s > ptx && s[-1] == '\n') {
                in_header = false;
                if (maxnreg) o += sprintf(o, ".maxnreg %d\n", maxnreg);
            }
            *o++ = *s++;
        }
    }
    *o = '\0';
    return out;
}
