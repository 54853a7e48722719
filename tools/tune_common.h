/* tune_common.h: what `clnsa tune` (cmd_tune.c), its --merge mode
 * (tune_merge.c) and `clnsa devices --params` share: the tuning file format
 * as JSON values. */
#ifndef CLNSA_TUNE_COMMON_H
#define CLNSA_TUNE_COMMON_H

#include "tuning/json.h"
#include "tuning/tuning.h"

/* {"WG": 64, "GT": 16, ...} of a family's values. */
js_value tune_params_json(const tune_family *f, const int *v);
/* {"dk": .., "dv": .., "g": .., "block": .., "dtype": ".."} */
js_value tune_shape_json(const tune_problem *pb);
/* "WG=64 GT=16 TK=32" */
const char *tune_params_str(const tune_family *f, const int *v, char *buf, size_t size);
/* Writes {"clnsa_tuning": 1, "entries": entries} to path atomically
 * (temporary file, then rename); prints why on failure. */
int tune_write_file(const char *path, const js_value *entries);

/* clnsa devices --params: per family, the parameters chosen on device
 * `spec` (P:D) for `pb` and for each shape class the tuning sources name
 * for this device, and where they come from. */
int tune_print_params(const char *spec, const tune_problem *pb);

/* clnsa tune --merge a.json ... --into DIR */
int tune_merge(int argc, char **argv);

#endif
