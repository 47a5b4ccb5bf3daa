#!/usr/bin/env python3
# CPU emulation of topk_radix_kernel's index math (src/backend/cuda/kernels.cu): the order-preserving keys, the
# 11/11/10-bit histogram passes with the early stop, the descending-digit scan over thread-held int2 bin pairs (warp
# scan + warps' totals), the warp-sliced two-sweep compaction with its tie cut, and the ranking split over gridDim.y
# blocks -- against a plain sort with the CPU rule (score descending, index ascending; -1 padding).
# The GPU tests are CudaOps.TopkExactTies and CudaOps.IndexerScoresAndTopk.
import numpy as np
rng = np.random.default_rng(5)
BINS, THREADS, WARPS = 2048, 1024, 32

def order_key(f):
    f = np.where(f == 0, np.float32(0), f).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    return np.where(u & 0x80000000, (~u) & 0xFFFFFFFF, u | 0x80000000).astype(np.uint64)

def select(keys, kk, k):
    V = len(keys)
    prefix, mask, want, passes = 0, 0, kk, 0
    if V > k:
        for p in range(3):
            shift, dmask = (21, 2047) if p == 0 else ((10, 2047) if p == 1 else (0, 1023))
            m = (keys & mask) == prefix
            h = np.bincount(((keys[m] >> shift) & dmask).astype(np.int64), minlength=BINS)
            # thread i: int2 at 1023 - i -> c.x = bin 2046 - 2i, c.y = bin 2047 - 2i
            cx = np.array([h[2046 - 2 * i] for i in range(THREADS)]); cy = np.array([h[2047 - 2 * i] for i in range(THREADS)])
            cs = cx + cy
            incl = np.zeros(THREADS, np.int64)
            wsum = np.zeros(WARPS, np.int64)
            for w in range(WARPS):
                incl[32 * w:32 * w + 32] = np.cumsum(cs[32 * w:32 * w + 32])
                wsum[w] = incl[32 * w + 31]
            found = []
            for i in range(THREADS):
                above = wsum[:i // 32].sum() + incl[i] - cs[i]
                if above < want and above + cs[i] >= want:
                    hi = above + cy[i] >= want
                    found.append((2047 - 2 * i - (0 if hi else 1), above if hi else above + cy[i], cy[i] if hi else cx[i]))
            assert len(found) == 1
            digit, s_above, s_count = found[0]
            prefix |= digit << shift; mask |= dmask << shift; want -= s_above; passes += 1
            if s_count == want: break
    return prefix, mask, want, passes

def topk(scores, k, split):
    V = len(scores); kk = min(V, k)
    out = np.full(k, -1, np.int64)
    if kk == 0: return out, 0
    keys = order_key(scores)
    prefix, mask, want, passes = select(keys, kk, k)
    n_gt = kk - want
    C = (V + 1023) // 1024 * 32
    mk = keys & mask
    cnt = [(int((mk[min(V, w * C):min(V, w * C + C)] > prefix).sum()), int((mk[min(V, w * C):min(V, w * C + C)] == prefix).sum())) for w in range(WARPS)]
    cand = [None] * k  # every slot < kk must be written
    for w in range(WARPS):
        lo, hi = w * C, min(V, w * C + C)
        bg, be = sum(c[0] for c in cnt[:w]), sum(c[1] for c in cnt[:w])
        for b in range(lo, hi, 32):
            for lane in range(32):
                i = b + lane
                if i >= hi: continue
                ck = (int(keys[i]) << 32) | (0xFFFFFFFF - i)
                if mk[i] > prefix: cand[bg] = ck; bg += 1
                elif mk[i] == prefix:
                    if be < want: cand[n_gt + be] = ck
                    be += 1
    assert all(c is not None for c in cand[:kk])
    assert len(set(cand[:kk])) == kk
    share = (kk + split - 1) // split
    for y in range(split):
        for j in range(y * share, min(kk, y * share + share)):
            rank = sum(c > cand[j] for c in cand[:kk])
            out[rank] = 0xFFFFFFFF - (cand[j] & 0xFFFFFFFF)
    return out, passes

def reference(scores, k):
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))  # -0.0 == 0.0 for the sort key
    kk = min(len(scores), k)
    return np.array(order[:kk] + [-1] * (k - kk))

cases = 0
stops = {}
for V, k, distinct in [(2048, 512, 0), (2048, 512, 7), (2048, 512, 1), (2049, 512, 3), (4096, 512, 0), (4096, 512, 13),
                       (513, 512, 4), (512, 512, 0), (300, 512, 5), (0, 512, 0), (5000, 4, 3), (3000, 2048, 0),
                       (2048, 512, 100000), (6000, 512, 2)]:
    for rep in range(3):
        if distinct == 0:
            s = (rng.standard_normal(V) * rng.uniform(0.01, 10)).astype(np.float32)
        else:
            p = rng.integers(0, distinct, V)
            s = np.where(p == 0, np.float32(-0.0), ((p - distinct // 2) * 0.37).astype(np.float32)).astype(np.float32)
        for split in (1, 8):
            got, passes = topk(s, k, split)
            want = reference(s, k)
            assert (got == want).all(), (V, k, distinct, split, np.nonzero(got != want)[0][:10])
            stops[passes] = stops.get(passes, 0) + 1
            cases += 1
print(f"ok: {cases} rows match the CPU order; rows by passes run: {dict(sorted(stops.items()))}")
