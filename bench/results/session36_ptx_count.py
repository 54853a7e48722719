import glob, os, re, sys
pats = {"v4": r"ld\.global(\.nc)?\.v4\.(u32|b32)", "u16": r"ld\.global(\.nc)?\.(u16|b16)", "cvt": r"cvt\.f32\.f16",
        "ldlocal": r"ld\.local", "stlocal": r"st\.local"}
for d in sys.argv[1:]:
    for f in sorted(glob.glob(d + "/**/*", recursive=True)):
        if not os.path.isfile(f): continue
        t = open(f, "rb").read().decode("latin-1")
        ents = re.findall(r"\.entry\s+(\w+)", t)
        if not ents: continue
        c = {k: len(re.findall(p, t)) for k, p in pats.items()}
        print(d, os.path.basename(f)[:12], ",".join(ents)[:60], " ".join(f"{k}={v}" for k, v in c.items()))
