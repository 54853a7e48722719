# Selections of the full forward (the split: nsa_cmp_topk_wgmma) at the anchor's shape, per dtype:
# agreement between dtypes, and how many distinct blocks the 64 tokens of a block select together.
# torch only (the machine's python may lack numpy): .npy written and read by hand.
import ast, ctypes, os, sys, torch
T, HQ, H, D, S = int(os.environ.get("TS_T", 65536)), 64, 4, 128, 16
def save(path, t):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (tuple(t.shape),)
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode())
        t = t.contiguous().view(-1)
        for i in range(0, t.numel(), 1 << 26):  # string_at takes an int's size
            c = t[i:i + (1 << 26)]; f.write(ctypes.string_at(c.data_ptr(), c.numel() * c.element_size()))
def load(path):
    b = open(path, "rb").read(); n = int.from_bytes(b[8:10], "little"); h = ast.literal_eval(b[10:10 + n].decode())
    dt = {"<i4": torch.int32, "<i8": torch.int64}[h["descr"]]
    return torch.frombuffer(bytearray(b[10 + n:]), dtype=dt).reshape(h["shape"]).long()
if sys.argv[1] == "gen":
    g = torch.Generator().manual_seed(1)
    for n, h in (("q", HQ), ("k", H), ("v", H)):
        save(f"{sys.argv[2]}/{n}.npy", torch.rand((1, T, h, D), generator=g) * 2 - 1)
    sys.exit(0)
sel = {dt: load(f"{sys.argv[2]}/{dt}/block_indices.npy")[0] for dt in sys.argv[3:]}  # [T, H, S]
lo, nb = T // 32, T // 64
for dt, a in sel.items():
    ok = (a >= 0) & (a < nb)
    u = []
    for b0 in range(lo - lo % 64, T, 64 * 61):  # a sample of 64-token blocks
        for h in range(H):
            v = a[b0:b0 + 64, h].flatten(); u.append(len(torch.unique(v[(v >= 0) & (v < nb)])))
    print(f"{dt}: valid selections a row (t >= {lo}): mean {ok[lo:].sum(-1).float().mean():.3f}; distinct blocks "
          f"a 64-token block and head (sample of {len(u)}): mean {sum(u) / len(u):.1f} of at most 1024")
names = list(sel)
for i in range(len(names)):
    for j in range(i + 1, len(names)):
        a, b = sel[names[i]], sel[names[j]]; same = tot = 0
        for t in range(lo, T, 97):
            for h in range(H):
                x, y = set(a[t, h].tolist()), set(b[t, h].tolist()); same += len(x & y); tot += len(x)
        print(f"{names[i]} vs {names[j]}: {same / tot:.4f} of the selected blocks shared (rows t >= {lo}, every 97th)")
