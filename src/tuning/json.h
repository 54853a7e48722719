/* json.h: a small JSON reader and writer for the tuning files (user files,
 * the tuner's output and `clnsa tune --merge`). A parsed document is a tree
 * of js_value; objects keep their keys in file order. */
#ifndef CLNSA_JSON_H
#define CLNSA_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum { JS_NULL, JS_BOOL, JS_NUMBER, JS_STRING, JS_ARRAY, JS_OBJECT } js_type;

typedef struct js_value {
    js_type type;
    bool boolean;
    double number;
    char *string;           /* JS_STRING */
    size_t count;           /* JS_ARRAY, JS_OBJECT: items */
    struct js_value *items; /* array elements or object values */
    char **keys;            /* JS_OBJECT: one key per item */
} js_value;

/* Parses `len` bytes of text into *out (freed with js_free). On a syntax
 * error returns false and writes "line N: what" to err. */
bool js_parse(const char *text, size_t len, js_value *out, char *err, size_t err_size);
/* Reads and parses a whole file; err names the file on failure. */
bool js_parse_file(const char *path, js_value *out, char *err, size_t err_size);
void js_free(js_value *v);

/* Member `key` of an object (NULL if absent or not an object). */
const js_value *js_get(const js_value *obj, const char *key);
/* The string of a JS_STRING value, else NULL. */
const char *js_str(const js_value *v);
/* A JS_NUMBER that is an integer in [lo, hi] into *out. */
bool js_int(const js_value *v, long lo, long hi, long *out);

/* Writes v as indented JSON (objects on several lines, short arrays of
 * scalars and objects of scalars on one line). */
void js_write(FILE *f, const js_value *v, int indent);
/* Writes a JSON string literal (quoted, escaped). */
void js_write_string(FILE *f, const char *s);

/* Building values (for --merge): each returns false when out of memory. */
js_value js_make_string(const char *s);
js_value js_make_number(double x);
bool js_object_set(js_value *obj, const char *key, js_value v); /* replaces an existing key */
bool js_array_push(js_value *arr, js_value v);
/* A deep copy. */
bool js_copy(const js_value *v, js_value *out);

#endif
