/* libFuzzer target for the .npy parser (util/npy.c).
 * Build: clang -g -O1 -fsanitize=fuzzer,address,undefined -Iutil \
 *          util/npy.c tests/fuzz/fuzz_npy.c -o fuzz_npy
 * Run:   ./fuzz_npy tests/fuzz/npy_corpus  (add -max_total_time=60 etc.) */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  npy_array a;
  char err[256];
  if (npy_parse(data, size, &a, err, sizeof err) == 0) {
    /* Exercise the conversions on whatever parsed (sizes are bounded by the
     * input length, so this stays cheap). */
    double *d = NULL;
    int32_t *i = NULL;
    if (npy_to_f64(&a, &d, NULL, 0) == 0) free(d);
    if (npy_to_i32(&a, &i, err, sizeof err) == 0) free(i);
  }
  npy_free(&a);
  npy_free(&a);
  return 0;
}
