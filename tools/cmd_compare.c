/* cmd_compare.c: `clnsa compare A.npy B.npy [--tol X] [--sets]`, a hidden
 * subcommand for tests/cli_golden.sh (no numpy needed).
 *  - default: relative L2 error ||A - B|| / ||B|| (||A - B|| when B is all
 *    zero) must be <= tol (default 1e-4). Any NaN fails; an infinite entry
 *    must be equal in both (lse is -inf where a query sees nothing) and is
 *    left out of the norms.
 *  - --sets: integer arrays; each row of the last dim is compared as a
 *    (multi)set, order ignored; the fraction of rows that differ must be
 *    <= tol (default 0).
 * Shapes must be equal. Prints one line; exits 0 when within tolerance, 1
 * when not, 2 on a usage or file error. */
#include "cli_common.h"
#include "cmds.h"
#include "npy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int compare_sets(const char *na, const char *nb, const npy_array *a, const npy_array *b, double tol)
{
    char err[512];
    int32_t *x = NULL, *y = NULL;
    if (a->ndim < 1) {
        fprintf(stderr, "clnsa compare: %s: --sets needs at least one dimension\n", na);
        return CLI_USAGE;
    }
    if (npy_to_i32(a, &x, err, sizeof err) || npy_to_i32(b, &y, err, sizeof err)) {
        fprintf(stderr, "clnsa compare: --sets: %s\n", err);
        free(x);
        return CLI_USAGE;
    }
    const size_t n = (size_t)npy_numel(a), w = (size_t)a->shape[a->ndim - 1], rows = w ? n / w : 0;
    size_t bad = 0, first = 0;
    for (size_t r = 0; r < rows; ++r) {
        qsort(x + r * w, w, sizeof *x, cmp_i32);
        qsort(y + r * w, w, sizeof *y, cmp_i32);
        if (memcmp(x + r * w, y + r * w, w * sizeof *x) != 0 && bad++ == 0) first = r;
    }
    free(x);
    free(y);
    const double frac = rows ? (double)bad / (double)rows : 0.0;
    const int ok = frac <= tol;
    printf("compare %s %s: %zu of %zu rows differ as sets (%.3g%%, tol %.3g%%)", na, nb, bad, rows, 100 * frac, 100 * tol);
    if (bad) printf(", first row %zu", first);
    printf(": %s\n", ok ? "ok" : "FAIL");
    return ok ? CLI_OK : CLI_FAIL;
}

static int compare_values(const char *na, const char *nb, const npy_array *a, const npy_array *b, double tol)
{
    char err[512];
    double *x = NULL, *y = NULL;
    if (npy_to_f64(a, &x, err, sizeof err) || npy_to_f64(b, &y, err, sizeof err)) {
        fprintf(stderr, "clnsa compare: %s\n", err);
        free(x);
        return CLI_USAGE;
    }
    const size_t n = (size_t)npy_numel(a);
    double num = 0, den = 0;
    const char *why = NULL;
    size_t at = 0;
    for (size_t i = 0; i < n && !why; ++i) {
        if (isnan(x[i]) || isnan(y[i])) why = "NaN", at = i;
        else if (isinf(x[i]) || isinf(y[i])) {
            if (x[i] != y[i]) why = "infinity mismatch", at = i;
        } else {
            num += (x[i] - y[i]) * (x[i] - y[i]);
            den += y[i] * y[i];
        }
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    const int ok = !why && rel <= tol;
    if (why) printf("compare %s %s: %s at flat index %zu (%g vs %g): FAIL\n", na, nb, why, at, x[at], y[at]);
    else printf("compare %s %s: rel L2 %.3e (tol %.1e): %s\n", na, nb, rel, tol, ok ? "ok" : "FAIL");
    free(x);
    free(y);
    return ok ? CLI_OK : CLI_FAIL;
}

int cmd_compare(int argc, char **argv)
{
    double tol = NAN; /* NaN: not given */
    bool sets = false;
    const char *files[2] = {NULL, NULL};
    int nfiles = 0;
    const cli_opt opts[] = {
        {"--tol", OPT_DOUBLE, &tol, 0, 0, NULL, "X", "tolerance (1e-4; with --sets the fraction of rows, 0)"},
        {"--sets", OPT_FLAG, &sets, 0, 0, NULL, NULL, "compare the int rows of the last dim as sets"},
    };
    /* file names and options in any order: split them */
    char **optv = cli_malloc((size_t)argc * sizeof *optv);
    int optc = 0;
    if (!optv) return CLI_FAIL;
    for (int i = 2; i < argc; ++i) {
        if (argv[i][0] != '-' && nfiles < 2) {
            files[nfiles++] = argv[i];
            continue;
        }
        optv[optc++] = argv[i];
        if (strcmp(argv[i], "--tol") == 0 && i + 1 < argc) optv[optc++] = argv[++i];
    }
    int rc = cli_parse("compare", optc, optv, 0, opts, 2, NULL);
    free(optv);
    if (rc < 0) {
        printf("usage: clnsa compare A.npy B.npy [--tol X] [--sets]\n"
               "Relative L2 error ||A - B|| / ||B|| <= tol (NaN fails, infinities must match), or with\n"
               "--sets the rows of the last dim compared as sets. Exit 0: within tolerance, 1: not, 2: error.\n\n");
        cli_print_opts(stdout, opts, 2);
        return CLI_OK;
    }
    if (rc) return rc;
    if (nfiles != 2) {
        fprintf(stderr, "clnsa compare: expected two .npy files (see clnsa compare --help)\n");
        return CLI_USAGE;
    }
    if (isnan(tol)) tol = sets ? 0.0 : 1e-4;
    if (!(tol >= 0)) {
        fprintf(stderr, "clnsa compare: --tol: expected a value >= 0, got %g\n", tol);
        return CLI_USAGE;
    }

    npy_array a, b;
    char err[512];
    memset(&b, 0, sizeof b);
    if (npy_load(files[0], &a, err, sizeof err) || npy_load(files[1], &b, err, sizeof err)) {
        fprintf(stderr, "clnsa compare: %s\n", err);
        npy_free(&a);
        return CLI_USAGE;
    }
    bool same = a.ndim == b.ndim;
    for (int d = 0; same && d < a.ndim; ++d) same = a.shape[d] == b.shape[d];
    if (!same) {
        char sa[128], sb[128];
        printf("compare %s %s: shapes differ: %s vs %s: FAIL\n", files[0], files[1],
               cli_shape_str(a.ndim, a.shape, sa, sizeof sa), cli_shape_str(b.ndim, b.shape, sb, sizeof sb));
        rc = CLI_FAIL;
    } else {
        rc = sets ? compare_sets(files[0], files[1], &a, &b, tol) : compare_values(files[0], files[1], &a, &b, tol);
    }
    npy_free(&a);
    npy_free(&b);
    return rc;
}
