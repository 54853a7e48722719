/* cache.c: compiled programs on disk, so that a process does not compile
 * every kernel again at start-up.
 *
 * The key is the exact text compiled (defines and sources), the build
 * options, the device name, the driver version, the platform name and
 * clnsa's version; a file is named after the key's FNV-1a 64 hash and holds
 *   header: magic "clnsaPB\n", format version, header size, two 64-bit hashes
 *           of the key (FNV-1a from two offset bases), the source length, the
 *           binary's length and FNV-1a checksum, the lengths of the short key
 *           strings, and a checksum of the header;
 *   the short key strings verbatim (device, driver, platform, version,
 *   options), then the binary.
 * A file is taken only when all of that agrees with what is being built
 * (a truncated, corrupt or mismatching file is a miss, never handed to the
 * driver: PoCL aborts on a truncated binary), and then only if the driver
 * accepts the binary; otherwise the program is built from source and the
 * file replaced. Files are written to a temporary name and renamed, so a
 * reader never sees half a file, whatever a crashed or concurrent writer did.
 * Nothing is ever evicted: delete the folder to reclaim the space. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CACHE_FORMAT 1u
#define CACHE_MAX_BINARY ((uint64_t)1 << 30)
#define CACHE_MAX_STRING 4096u
#define FNV_BASIS 0xcbf29ce484222325ull
#define FNV_BASIS2 0x84222325cbf29ce4ull

static const char cache_magic[8] = {'c', 'l', 'n', 's', 'a', 'P', 'B', '\n'};

enum { K_DEVICE, K_DRIVER, K_PLATFORM, K_VERSION, K_OPTIONS, K_SHORT };

typedef struct {
    char magic[8];
    uint32_t format, header_bytes; /* header_bytes: this struct and the strings */
    uint64_t key_hash, key_hash2, source_len, binary_len, binary_sum;
    uint32_t lens[K_SHORT];
    uint32_t reserved;
    uint64_t header_sum; /* FNV-1a of the header (this field 0) and the strings */
} cache_header;

_Static_assert(sizeof(cache_header) == 88, "cache_header must have no padding");

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

typedef struct {
    const char *s[K_SHORT + 1]; /* the short strings, then the source */
    size_t len[K_SHORT + 1];
    uint64_t hash, hash2;
    char path[4200];
} cache_key;

static bool make_key(const clnsa_context *ctx, const char *src, const char *options, cache_key *k)
{
    k->s[K_DEVICE] = ctx->info.name;
    k->s[K_DRIVER] = ctx->info.driver_version;
    k->s[K_PLATFORM] = ctx->info.platform_name;
    k->s[K_VERSION] = clnsa_version();
    k->s[K_OPTIONS] = options;
    k->s[K_SHORT] = src;
    k->hash = FNV_BASIS;
    k->hash2 = FNV_BASIS2;
    for (int i = 0; i <= K_SHORT; ++i) {
        k->len[i] = strlen(k->s[i]);
        if (i < K_SHORT && k->len[i] > CACHE_MAX_STRING) return false;
        const uint64_t n = k->len[i];
        k->hash = fnv1a(fnv1a(k->hash, &n, sizeof n), k->s[i], k->len[i]);
        k->hash2 = fnv1a(fnv1a(k->hash2, &n, sizeof n), k->s[i], k->len[i]);
    }
    int w = snprintf(k->path, sizeof k->path, "%s/%016llx.clbin", ctx->cache_dir, (unsigned long long)k->hash);
    return w > 0 && (size_t)w < sizeof k->path;
}

static uint64_t header_checksum(cache_header h, const unsigned char *strings)
{
    h.header_sum = 0;
    return fnv1a(fnv1a(FNV_BASIS, &h, sizeof h), strings, h.header_bytes - sizeof h);
}

/* The whole file, or NULL (absent, unreadable, or absurdly large). */
static unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size > 0 && (uint64_t)st.st_size <= CACHE_MAX_BINARY + (1u << 20) &&
        (buf = malloc((size_t)st.st_size)) && fread(buf, 1, (size_t)st.st_size, f) == (size_t)st.st_size) {
        *size = (size_t)st.st_size;
    } else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* Does the file hold exactly this key, intact? Then *bin, *bin_len. */
static bool check_file(const unsigned char *buf, size_t size, const cache_key *k, const unsigned char **bin,
                       size_t *bin_len)
{
    cache_header h;
    if (size < sizeof h) return false;
    memcpy(&h, buf, sizeof h);
    if (memcmp(h.magic, cache_magic, sizeof cache_magic) != 0 || h.format != CACHE_FORMAT) return false;
    uint64_t strings = 0;
    for (int i = 0; i < K_SHORT; ++i) strings += h.lens[i];
    if (h.header_bytes != sizeof h + strings || h.header_bytes > size) return false;
    if (h.header_sum != header_checksum(h, buf + sizeof h)) return false;
    if (h.key_hash != k->hash || h.key_hash2 != k->hash2 || h.source_len != k->len[K_SHORT]) return false;
    const unsigned char *p = buf + sizeof h;
    for (int i = 0; i < K_SHORT; ++i) {
        if (h.lens[i] != k->len[i] || memcmp(p, k->s[i], k->len[i]) != 0) return false;
        p += h.lens[i];
    }
    if (h.binary_len == 0 || h.binary_len != size - h.header_bytes) return false;
    if (fnv1a(FNV_BASIS, p, (size_t)h.binary_len) != h.binary_sum) return false;
    *bin = p;
    *bin_len = (size_t)h.binary_len;
    return true;
}

cl_program program_cache_load(clnsa_context *ctx, const char *src, const char *options)
{
    cache_key k;
    if (!ctx->cache_dir || !make_key(ctx, src, options, &k)) return NULL;
    size_t size = 0, bin_len = 0;
    const unsigned char *bin = NULL;
    unsigned char *buf = read_file(k.path, &size);
    cl_program prog = NULL;
    if (buf && check_file(buf, size, &k, &bin, &bin_len)) {
        cl_int err, bin_status = CL_SUCCESS;
        prog = clCreateProgramWithBinary(ctx->cl, 1, &ctx->device, &bin_len, &bin, &bin_status, &err);
        if (err == CL_SUCCESS && bin_status == CL_SUCCESS)
            err = clBuildProgram(prog, 1, &ctx->device, options, NULL, NULL);
        if (err != CL_SUCCESS || bin_status != CL_SUCCESS) {
            if (prog) clReleaseProgram(prog);
            prog = NULL;
        }
    }
    atomic_fetch_add(prog ? &ctx->stats.disk_hits : &ctx->stats.disk_misses, 1);
    if (buf && !prog) atomic_fetch_add(&ctx->stats.disk_bad, 1);
    free(buf);
    return prog;
}

static bool mkdirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return false;
    for (char *p = path + 1;; ++p)
        if (*p == '/' || *p == '\0') {
            const char c = *p;
            *p = '\0';
            if (mkdir(path, 0700) != 0 && errno != EEXIST) return false;
            *p = c;
            if (!c) return true;
        }
}

static bool write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

void program_cache_store(clnsa_context *ctx, const char *src, const char *options, cl_program prog)
{
    cache_key k;
    size_t bin_len = 0;
    if (!ctx->cache_dir || !make_key(ctx, src, options, &k) ||
        clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof bin_len, &bin_len, NULL) != CL_SUCCESS || bin_len == 0 ||
        bin_len > CACHE_MAX_BINARY)
        return;
    cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, cache_magic, sizeof h.magic);
    h.format = CACHE_FORMAT;
    h.key_hash = k.hash;
    h.key_hash2 = k.hash2;
    h.source_len = k.len[K_SHORT];
    h.binary_len = bin_len;
    size_t strings = 0;
    for (int i = 0; i < K_SHORT; ++i) strings += h.lens[i] = (uint32_t)k.len[i];
    h.header_bytes = (uint32_t)(sizeof h + strings);
    unsigned char *buf = malloc(h.header_bytes + bin_len);
    if (!buf) return;
    unsigned char *bin = buf + h.header_bytes;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) != CL_SUCCESS) {
        free(buf);
        return;
    }
    unsigned char *p = buf + sizeof h;
    for (int i = 0; i < K_SHORT; ++i) {
        memcpy(p, k.s[i], k.len[i]);
        p += k.len[i];
    }
    h.binary_sum = fnv1a(FNV_BASIS, bin, bin_len);
    h.header_sum = header_checksum(h, buf + sizeof h);
    memcpy(buf, &h, sizeof h);

    static atomic_uint serial;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", k.path, (long)getpid(), atomic_fetch_add(&serial, 1));
    int fd = mkdirs(ctx->cache_dir) ? open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600) : -1;
    if (fd >= 0) {
        const bool ok = write_all(fd, buf, h.header_bytes + bin_len) && fsync(fd) == 0;
        if (close(fd) == 0 && ok && rename(tmp, k.path) == 0) atomic_fetch_add(&ctx->stats.disk_writes, 1);
        else unlink(tmp);
    }
    free(buf);
}

static char *join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (s) {
        memcpy(s, a, na);
        memcpy(s + na, b, nb + 1);
    }
    return s;
}

char *program_cache_dir(const char *option)
{
    const char *off = getenv("CLNSA_CACHE"), *env = getenv("CLNSA_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    if (off && strcmp(off, "0") == 0) return NULL;
    if (option && *option) return join(option, "");
    if (env && *env) return join(env, "");
    if (xdg && *xdg == '/') return join(xdg, "/clnsa");
    if (home && *home) return join(home, "/.cache/clnsa");
    return NULL;
}
