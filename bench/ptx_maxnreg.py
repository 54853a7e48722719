#!/usr/bin/env python3
"""A probe, not part of the library: caps the registers of kernel KERNEL in every
clnsa program-cache file of DIR (src/program/cache.c) by writing a `.maxnreg N` into its
PTX (a performance directive that the driver's JIT honours when it loads the cached
program; NVIDIA's OpenCL ignores -cl-nv-maxrregcount), and fixes the file's checksums
so that the cache takes it. Use on a copy of a cache made by the same command, then
run that command with CLNSA_CACHE_DIR=DIR; bench/ptxas_report.py shows the result.

  python3 bench/ptx_maxnreg.py DIR KERNEL N
"""
import glob, re, struct, sys
FNV, PRIME, M = 0xcbf29ce484222325, 0x100000001b3, (1 << 64) - 1
def fnv(h, data):
    for b in data:
        h = ((h ^ b) * PRIME) & M
    return h
FMT = "<8sIIQQQQQ5IIQ"
d, kern, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for path in glob.glob(d + "/*.clbin"):
    buf = open(path, "rb").read()
    f = list(struct.unpack(FMT, buf[:88]))
    hb = f[2]
    strings, binary = buf[88:hb], buf[hb:]
    ptx = binary.decode("latin-1")
    # the entry's parameters, then its directives (.reqntid ...), then the body
    pat = re.compile(r"(\.entry\s+" + kern + r"\s*\((?:[^()]|\([^()]*\))*\))([^{]*)(\{)")
    new, k = pat.subn(lambda m: m.group(1) + re.sub(r"\.maxnreg\s+\d+", "", m.group(2)) + "\n.maxnreg %d\n" % n
                      + m.group(3), ptx, count=1)
    if not k:
        continue
    binary = new.encode("latin-1")
    f[6] = len(binary)                      # binary_len
    f[7] = fnv(FNV, binary)                 # binary_sum
    f[14] = 0                               # header_sum
    hdr = struct.pack(FMT, *f)
    f[14] = fnv(fnv(FNV, hdr), strings)
    open(path, "wb").write(struct.pack(FMT, *f) + strings + binary)
    print("patched", path, kern, n)
