#!/usr/bin/env python3
# CPU emulation of expert_tc_dec's index math (src/backend/cuda/expert_tc_dec.cuh): the per-lane cp.async pieces of
# a step (16 rows x 4 chunks + the rows' scale words), the activation's 8-column permutation, the per-thread 32-bit
# weight words and their E2M1 nibble pairs (e2m1x2_f16x2: value x 2^-14), the mma.sync m16n8k16 fragment layouts
# (PTX ISA), the per-chunk scaling and the epilogue's row mapping -- against direct dot products (exact in fp64).
import numpy as np
rng = np.random.default_rng(3)
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])

def f16pair(w):  # the two halves e2m1x2_f16x2 builds from nibbles 0 and 4 of w, as values (x 2^-14)
    return (E2M1[w & 15] * 2.0**-14, E2M1[(w >> 16) & 15] * 2.0**-14)

def run(GATE_UP, d=256, I=64, k=2):
    K = d if GATE_UP else I
    R = I if GATE_UP else d
    nmat = 2 if GATE_UP else 1
    W = [[rng.integers(0, 256, size=(R, K // 2), dtype=np.uint8) for _ in range(nmat)] for _ in range(k)]
    S = [[rng.integers(115, 125, size=(R, K // 32), dtype=np.uint8) for _ in range(nmat)] for _ in range(k)]
    X = [rng.integers(-16, 17, size=K).astype(np.float64) / 8 for _ in range(1 if GATE_UP else k)]  # q values
    XS = [2.0 ** rng.integers(-3, 3, size=K // 128) for _ in range(len(X))]  # QA8 block scales
    def deq(j, m, r, c):
        b = W[j][m][r, c // 2]; nib = (b >> 4) if (c & 1) else (b & 15)
        return E2M1[nib] * 2.0 ** (int(S[j][m][r, c // 32]) - 127)
    xval = lambda j, c: X[0 if GATE_UP else j][c] * XS[0 if GATE_UP else j][c // 128]
    ref = {(j, m, r): sum(deq(j, m, r, c) * xval(j, c) for c in range(K)) for j in range(k) for m in range(nmat) for r in range(R)}
    ordr = [0, 4, 1, 5, 2, 6, 3, 7]  # staging: stored position s holds column ordr[s] of each 8-group
    xq = [np.array([Xr[(c // 8) * 8 + ordr[c % 8]] for c in range(K)]) for Xr in X]
    per_slot = I // 8 if GATE_UP else d // 16
    ks = K // 128
    out = {}
    for tt in range(per_slot * k):
        j, rt = tt // per_slot, tt % per_slot
        def rows_of(r):  # (matrix, row) of tile row r
            return ((0 if r < 8 else 1), 8 * rt + (r & 7)) if GATE_UP else (0, 16 * rt + r)
        acc = np.zeros((32, 2))
        for lk in range(ks):
            slotw = {}  # by position: piece (row, c) stored at 4 row + (c ^ ((row >> 1) & 3)) (the kernel's swizzle)
            pos = lambda row, c: 4 * row + (c ^ ((row >> 1) & 3))
            for lane in range(32):  # lane copies rows lane // 4 and lane // 4 + 8, chunk 4 lk + lane % 4
                for row in (lane >> 2, (lane >> 2) + 8):
                    m, r = rows_of(row)
                    chunk = 4 * lk + (lane & 3)
                    slotw[pos(row, lane & 3)] = W[j][m][r, chunk * 16:(chunk + 1) * 16]
            assert len(slotw) == 64
            slots = {}
            for lane in range(16):  # lanes < 16: the 4 scale bytes (chunks 4 lk ..) of tile row lane
                m, r = rows_of(lane)
                slots[lane] = S[j][m][r, 4 * lk:4 * lk + 4]
            xrow = xq[0 if GATE_UP else j][lk * 128:(lk + 1) * 128]
            xs = XS[0 if GATE_UP else j][lk]
            for c in range(4):
                Am = [np.zeros((16, 16)), np.zeros((16, 16))]
                Bm = [np.zeros((16, 8)), np.zeros((16, 8))]
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    wg = int.from_bytes(bytes(slotw[pos(g, c)][4 * t:4 * t + 4]), 'little')
                    wg8 = int.from_bytes(bytes(slotw[pos(g + 8, c)][4 * t:4 * t + 4]), 'little')
                    # bank check: the 32 lanes' words of one chunk column land in 32 distinct banks
                    if lane == 31:
                        for rr in (0, 8):
                            banks = {((pos(gg + rr, c) * 16 + 4 * tt) // 4) % 32 for gg in range(8) for tt in range(4)}
                            assert len(banks) == 32, "bank conflict"
                    regs = [[f16pair(wg), f16pair(wg8), f16pair(wg >> 4), f16pair(wg8 >> 4)],
                            [f16pair(wg >> 8), f16pair(wg8 >> 8), f16pair(wg >> 12), f16pair(wg8 >> 12)]]
                    xb = xrow[32 * c + 8 * t: 32 * c + 8 * t + 8] if g == 0 else np.zeros(8)
                    bregs = [[(xb[0], xb[1]), (xb[2], xb[3])], [(xb[4], xb[5]), (xb[6], xb[7])]]
                    for mm in range(2):
                        a = regs[mm]
                        Am[mm][g, 2*t:2*t+2] = a[0]; Am[mm][g+8, 2*t:2*t+2] = a[1]
                        Am[mm][g, 2*t+8:2*t+10] = a[2]; Am[mm][g+8, 2*t+8:2*t+10] = a[3]
                        Bm[mm][2*t:2*t+2, g] = bregs[mm][0]; Bm[mm][2*t+8:2*t+10, g] = bregs[mm][1]
                C = Am[0] @ Bm[0] + Am[1] @ Bm[1]
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    sg = int(slots[g][c]); sg8 = int(slots[g + 8][c])
                    acc[lane, 0] += C[g, 2*t] * 2.0 ** (sg - 127) * xs * 16384
                    acc[lane, 1] += C[g+8, 2*t] * 2.0 ** (sg8 - 127) * xs * 16384
        for lane in range(0, 32, 4):  # t == 0 lanes hold column 0
            g = lane >> 2
            if GATE_UP:
                out[(j, 0, 8 * rt + g)] = acc[lane, 0]; out[(j, 1, 8 * rt + g)] = acc[lane, 1]
            else:
                out[(j, 0, 16 * rt + g)] = acc[lane, 0]; out[(j, 0, 16 * rt + g + 8)] = acc[lane, 1]
    err = max(abs(out[key] - ref[key]) for key in ref)
    mx = max(abs(v) for v in ref.values())
    print("gate/up" if GATE_UP else "down", "tiles", per_slot * k, "max |err|", err, "max |ref|", mx)
    assert len(out) == len(ref) and err <= 1e-12 * max(1.0, mx), "MISMATCH"

run(True, d=256, I=64, k=2)
run(False, d=32, I=256, k=2)
print("OK")
