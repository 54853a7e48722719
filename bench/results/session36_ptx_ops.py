# Opcode histograms of the kernels in two program caches (f16 and bf16 builds), printed where they differ.
import collections, glob, os, re, sys
def progs(d):
    out = {}
    for f in sorted(glob.glob(d + "/**/*", recursive=True)):
        if not os.path.isfile(f): continue
        t = open(f, "rb").read().decode("latin-1")
        for m in re.finditer(r"\.entry\s+(\w+)(.*?)\n}\n", t, re.S):
            name, body = m.group(1), m.group(2)
            h = collections.Counter()
            for line in body.split("\n"):
                line = line.strip()
                if not line or line.startswith(("//", ".", "{", "}", "$")) or line.endswith(":"): continue
                if line.startswith("@"): line = line.split(None, 1)[1] if " " in line else line
                op = line.split()[0].rstrip(";")
                op = re.sub(r"\.(f16|bf16|f16x2|bf16x2)", ".H", op)
                h[op] += 1
            out.setdefault(name, []).append((sum(h.values()), h, os.path.basename(f)[:8]))
    return out
a, b = progs(sys.argv[1]), progs(sys.argv[2])
for name in sorted(set(a) & set(b)):
    if not re.search(sys.argv[3], name): continue
    for (na, ha, fa), (nb, hb, fb) in zip(sorted(a[name], key=lambda x: x[0]), sorted(b[name], key=lambda x: x[0])):
        print(f"{name}: {na} instructions ({fa}, f16) vs {nb} ({fb}, bf16)")
        for op in sorted(set(ha) | set(hb)):
            if ha[op] != hb[op]: print(f"   {op:40s} {ha[op]:6d} {hb[op]:6d}")
