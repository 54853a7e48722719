/* json.c: see json.h. A recursive-descent parser (depth-limited), UTF-8
 * passed through, \u escapes of the Basic Multilingual Plane and surrogate
 * pairs decoded to UTF-8. */
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p, *end, *start;
    char *err;
    size_t err_size;
    int depth;
} js_parser;

static bool fail(js_parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(js_parser *ps, const char *fmt, ...)
{
    if (ps->err && ps->err_size && !ps->err[0]) {
        int line = 1;
        for (const char *c = ps->start; c < ps->p && c < ps->end; ++c) line += *c == '\n';
        int n = snprintf(ps->err, ps->err_size, "line %d: ", line);
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < ps->err_size) vsnprintf(ps->err + n, ps->err_size - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return false;
}

static void skip_ws(js_parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ++ps->p;
}

static bool parse_value(js_parser *ps, js_value *out);

static bool push_item(js_value *v, js_value item, char *key)
{
    js_value *items = realloc(v->items, (v->count + 1) * sizeof *items);
    if (!items) return false;
    v->items = items;
    if (v->type == JS_OBJECT) {
        char **keys = realloc(v->keys, (v->count + 1) * sizeof *keys);
        if (!keys) return false;
        v->keys = keys;
        keys[v->count] = key;
    }
    items[v->count++] = item;
    return true;
}

static void put_utf8(char *buf, size_t *n, uint32_t c)
{
    if (c < 0x80) {
        buf[(*n)++] = (char)c;
    } else if (c < 0x800) {
        buf[(*n)++] = (char)(0xc0 | (c >> 6));
        buf[(*n)++] = (char)(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
        buf[(*n)++] = (char)(0xe0 | (c >> 12));
        buf[(*n)++] = (char)(0x80 | ((c >> 6) & 0x3f));
        buf[(*n)++] = (char)(0x80 | (c & 0x3f));
    } else {
        buf[(*n)++] = (char)(0xf0 | (c >> 18));
        buf[(*n)++] = (char)(0x80 | ((c >> 12) & 0x3f));
        buf[(*n)++] = (char)(0x80 | ((c >> 6) & 0x3f));
        buf[(*n)++] = (char)(0x80 | (c & 0x3f));
    }
}

static bool hex4(js_parser *ps, uint32_t *out)
{
    uint32_t c = 0;
    if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
    for (int i = 0; i < 4; ++i) {
        char h = *ps->p++;
        c <<= 4;
        if (h >= '0' && h <= '9') c |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') c |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') c |= (uint32_t)(h - 'A' + 10);
        else return fail(ps, "bad \\u escape");
    }
    *out = c;
    return true;
}

/* At the opening quote. Escapes only shrink the text, so the raw length
 * bounds the decoded one (a \u escape of 6 bytes decodes to at most 3, a
 * surrogate pair of 12 to 4). */
static bool parse_string(js_parser *ps, char **out)
{
    ++ps->p;
    const char *s = ps->p;
    while (ps->p < ps->end && *ps->p != '"') ps->p += *ps->p == '\\' && ps->p + 1 < ps->end ? 2 : 1;
    if (ps->p >= ps->end) return fail(ps, "unterminated string");
    const char *e = ps->p;
    char *buf = malloc((size_t)(e - s) + 1);
    if (!buf) return fail(ps, "out of memory");
    size_t n = 0;
    ps->p = s;
    while (ps->p < e) {
        char c = *ps->p++;
        if ((unsigned char)c < 0x20) {
            free(buf);
            return fail(ps, "control character in a string");
        }
        if (c != '\\') {
            buf[n++] = c;
            continue;
        }
        char x = *ps->p++;
        uint32_t u;
        switch (x) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u':
            if (!hex4(ps, &u)) {
                free(buf);
                return false;
            }
            if (u >= 0xd800 && u < 0xdc00 && e - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
                uint32_t lo;
                ps->p += 2;
                if (!hex4(ps, &lo)) {
                    free(buf);
                    return false;
                }
                u = lo >= 0xdc00 && lo < 0xe000 ? 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00) : 0xfffd;
            } else if (u >= 0xd800 && u < 0xe000) {
                u = 0xfffd;
            }
            if (u == 0) u = 0xfffd; /* no NUL inside C strings */
            put_utf8(buf, &n, u);
            break;
        default:
            free(buf);
            return fail(ps, "bad escape '\\%c'", x);
        }
    }
    buf[n] = '\0';
    ps->p = e + 1;
    *out = buf;
    return true;
}

static bool parse_number(js_parser *ps, js_value *out)
{
    const char *s = ps->p;
    if (ps->p < ps->end && *ps->p == '-') ++ps->p;
    if (ps->p >= ps->end || !(*ps->p >= '0' && *ps->p <= '9')) return fail(ps, "expected a value");
    while (ps->p < ps->end && ((*ps->p >= '0' && *ps->p <= '9') || *ps->p == '.' || *ps->p == 'e' || *ps->p == 'E' ||
                               *ps->p == '+' || *ps->p == '-'))
        ++ps->p;
    char tmp[64];
    size_t n = (size_t)(ps->p - s);
    if (n >= sizeof tmp) return fail(ps, "number too long");
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    char *end;
    double x = strtod(tmp, &end);
    if (*end || !isfinite(x)) return fail(ps, "bad number '%s'", tmp);
    out->type = JS_NUMBER;
    out->number = x;
    return true;
}

static bool literal(js_parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || strncmp(ps->p, word, n) != 0) return fail(ps, "expected a value");
    ps->p += n;
    return true;
}

static bool parse_container(js_parser *ps, js_value *out, bool object)
{
    if (++ps->depth > 64) return fail(ps, "nested too deeply");
    out->type = object ? JS_OBJECT : JS_ARRAY;
    ++ps->p;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == (object ? '}' : ']')) {
        ++ps->p;
        --ps->depth;
        return true;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(ps);
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a key string");
            if (!parse_string(ps, &key)) return false;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                free(key);
                return fail(ps, "expected ':'");
            }
            ++ps->p;
        }
        js_value item;
        memset(&item, 0, sizeof item);
        if (!parse_value(ps, &item) || !push_item(out, item, key)) {
            js_free(&item);
            free(key);
            return ps->err && ps->err[0] ? false : fail(ps, "out of memory");
        }
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ++ps->p;
            continue;
        }
        if (ps->p < ps->end && *ps->p == (object ? '}' : ']')) {
            ++ps->p;
            --ps->depth;
            return true;
        }
        return fail(ps, "expected ',' or '%c'", object ? '}' : ']');
    }
}

static bool parse_value(js_parser *ps, js_value *out)
{
    memset(out, 0, sizeof *out);
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end of text");
    switch (*ps->p) {
    case '{': return parse_container(ps, out, true);
    case '[': return parse_container(ps, out, false);
    case '"':
        out->type = JS_STRING;
        return parse_string(ps, &out->string);
    case 't':
        out->type = JS_BOOL;
        out->boolean = true;
        return literal(ps, "true");
    case 'f':
        out->type = JS_BOOL;
        return literal(ps, "false");
    case 'n':
        out->type = JS_NULL;
        return literal(ps, "null");
    default: return parse_number(ps, out);
    }
}

bool js_parse(const char *text, size_t len, js_value *out, char *err, size_t err_size)
{
    js_parser ps = {text, text + len, text, err, err_size, 0};
    if (err && err_size) err[0] = '\0';
    if (!parse_value(&ps, out)) {
        js_free(out);
        return false;
    }
    skip_ws(&ps);
    if (ps.p != ps.end) {
        js_free(out);
        return fail(&ps, "text after the value");
    }
    return true;
}

bool js_parse_file(const char *path, js_value *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_size, "%s: cannot open", path);
        return false;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 > cap) {
            cap = (n + 4096) * 2;
            char *b = realloc(buf, cap);
            if (!b) break;
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool read_ok = !ferror(f) && buf;
    fclose(f);
    if (!read_ok) {
        free(buf);
        snprintf(err, err_size, "%s: read error", path);
        return false;
    }
    char msg[200];
    bool ok = js_parse(buf, n, out, msg, sizeof msg);
    free(buf);
    if (!ok) snprintf(err, err_size, "%s: %s", path, msg);
    return ok;
}

void js_free(js_value *v)
{
    if (!v) return;
    for (size_t i = 0; i < v->count; ++i) {
        js_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    memset(v, 0, sizeof *v);
}

const js_value *js_get(const js_value *obj, const char *key)
{
    if (!obj || obj->type != JS_OBJECT) return NULL;
    for (size_t i = 0; i < obj->count; ++i)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

const char *js_str(const js_value *v) { return v && v->type == JS_STRING ? v->string : NULL; }

bool js_int(const js_value *v, long lo, long hi, long *out)
{
    if (!v || v->type != JS_NUMBER || v->number != floor(v->number) || v->number < (double)lo || v->number > (double)hi)
        return false;
    *out = (long)v->number;
    return true;
}

/* ---------------------------------------------------------------- writer */

void js_write_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; ++c) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c == '\n') fputs("\\n", f);
        else if (*c == '\t') fputs("\\t", f);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

static bool is_scalar(const js_value *v) { return v->type != JS_ARRAY && v->type != JS_OBJECT; }

/* On one line: scalars only, or (depth 2) scalars and such containers. */
static bool flat(const js_value *v, int depth)
{
    for (size_t i = 0; i < v->count; ++i)
        if (!is_scalar(&v->items[i]) && (depth <= 1 || !flat(&v->items[i], depth - 1))) return false;
    return true;
}

static void write_number(FILE *f, double x)
{
    if (x == floor(x) && fabs(x) < 1e15) fprintf(f, "%.0f", x);
    else fprintf(f, "%.6g", x);
}

void js_write(FILE *f, const js_value *v, int indent)
{
    switch (v->type) {
    case JS_NULL: fputs("null", f); return;
    case JS_BOOL: fputs(v->boolean ? "true" : "false", f); return;
    case JS_NUMBER: write_number(f, v->number); return;
    case JS_STRING: js_write_string(f, v->string ? v->string : ""); return;
    case JS_ARRAY:
    case JS_OBJECT: break;
    }
    const bool obj = v->type == JS_OBJECT, one_line = flat(v, v->type == JS_OBJECT && v->count <= 4 ? 2 : 1);
    fputc(obj ? '{' : '[', f);
    for (size_t i = 0; i < v->count; ++i) {
        if (one_line) fputs(i ? ", " : "", f);
        else fprintf(f, "%s\n%*s", i ? "," : "", indent + 2, "");
        if (obj) {
            js_write_string(f, v->keys[i]);
            fputs(": ", f);
        }
        js_write(f, &v->items[i], indent + 2);
    }
    if (!one_line && v->count) fprintf(f, "\n%*s", indent, "");
    fputc(obj ? '}' : ']', f);
}

/* -------------------------------------------------------------- building */

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

js_value js_make_string(const char *s)
{
    js_value v;
    memset(&v, 0, sizeof v);
    v.type = JS_STRING;
    v.string = dup_str(s);
    return v;
}

js_value js_make_number(double x)
{
    js_value v;
    memset(&v, 0, sizeof v);
    v.type = JS_NUMBER;
    v.number = x;
    return v;
}

bool js_object_set(js_value *obj, const char *key, js_value v)
{
    if (obj->type != JS_OBJECT) return false;
    for (size_t i = 0; i < obj->count; ++i)
        if (strcmp(obj->keys[i], key) == 0) {
            js_free(&obj->items[i]);
            obj->items[i] = v;
            return true;
        }
    char *k = dup_str(key);
    if (!k || !push_item(obj, v, k)) {
        free(k);
        return false;
    }
    return true;
}

bool js_array_push(js_value *arr, js_value v) { return arr->type == JS_ARRAY && push_item(arr, v, NULL); }

bool js_copy(const js_value *v, js_value *out)
{
    memset(out, 0, sizeof *out);
    out->type = v->type;
    out->boolean = v->boolean;
    out->number = v->number;
    if (v->string && !(out->string = dup_str(v->string))) return false;
    for (size_t i = 0; i < v->count; ++i) {
        js_value c;
        if (!js_copy(&v->items[i], &c)) {
            js_free(out);
            return false;
        }
        char *k = v->keys ? dup_str(v->keys[i]) : NULL;
        if ((v->keys && !k) || !push_item(out, c, k)) {
            free(k);
            js_free(&c);
            js_free(out);
            return false;
        }
    }
    return true;
}
