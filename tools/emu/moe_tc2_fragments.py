#!/usr/bin/env python3
# CPU emulation of expert_tc2's index math (src/backend/cuda/moe_tc2.cuh): the gather's K permutation, the cp.async
# staging of FP4 bytes and swizzled BF16 rows, the ldmatrix.x4 addressing, the A fragments (two bytes per row per
# MMA, E8M0 scale), the mma.sync m16n8k16 fragment layouts (PTX ISA) and the epilogue's row/slot mapping -- for
# partial row and slot tiles -- against direct dot products. Exact in fp64 (E2M1 x E8M0 x quarter-integers).
# It checks the kernel's arithmetic layout without a GPU; the GPU test is CudaOps.Mxfp4ExpertsGroupedPrefill.
import numpy as np
rng = np.random.default_rng(1)
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
def kperm16(q): return 4*(q>>1)+(q&1) if q < 8 else 4*((q-8)>>1)+2+(q&1)

def run(GATE_UP, K=128, I=96, d=128, ns=50):
    R = I if GATE_UP else d
    rows_total = R
    W = [rng.integers(0, 256, size=(rows_total, K//2), dtype=np.uint8) for _ in range(2)]   # w1/w3 or w2
    S = [rng.integers(118, 126, size=(rows_total, K//32), dtype=np.uint8) for _ in range(2)]
    X = rng.integers(-8, 9, size=(ns, K)).astype(np.float64) * 0.25
    def deq(Wb, Sb, r, k):
        byte = Wb[r, k//2]; nib = (byte >> 4) if (k & 1) else (byte & 15)
        return E2M1[nib] * 2.0**(int(Sb[r, k//32]) - 127)
    ref = [np.array([[sum(deq(W[m], S[m], r, k)*X[s, k] for k in range(K)) for s in range(ns)] for r in range(R)]) for m in range(2 if GATE_UP else 1)]
    xg = np.zeros((ns, K))
    for p in range(ns):
        for q in range(K): xg[p, q] = X[p, (q & ~15) + kperm16(q & 15)]
    half = 64 if GATE_UP else 128
    out = [np.zeros((R, ns)) for _ in range(2)]
    for bx in range((R + half - 1)//half):
        r0 = bx*half
        def wrow(tr):
            second = GATE_UP and tr >= 64
            r = min(r0 + (tr % 64 if GATE_UP else tr), R-1)
            m = 1 if second else 0
            return m, r
        for s0 in range(0, ns, 64):
            nst = min(64, ns - s0)
            acc = np.zeros((8, 32, 2, 4, 4))  # warp, lane, mt, j, c
            for ks in range(K//64):
                A = np.zeros(128*32, dtype=np.uint8)
                for tid in range(256):
                    m, r = wrow(tid >> 1)
                    A[tid*16:(tid+1)*16] = W[m][r, ks*32 + 16*(tid&1): ks*32 + 16*(tid&1) + 16]
                B = np.zeros(64*64)   # in b16 units: (slot*8 + pchunk)*8 + e
                for tid in range(256):
                    bs, bc = tid >> 3, tid & 7
                    for sl in (bs, bs+32):
                        src = s0 + min(sl, nst-1)
                        pc = bc ^ (sl & 7)
                        B[(sl*8+pc)*8:(sl*8+pc)*8+8] = xg[src, ks*64 + 8*bc: ks*64+8*bc+8]
                for warp in range(8):
                    wm, wn = warp & 3, warp >> 2
                    for kk in range(4):
                        # ldmatrix: per h, matrices 0..3 rows from lanes 8i..8i+7
                        b = np.zeros((32, 4, 2, 2))  # lane, j, reg, half -> value
                        for h in range(2):
                            mats = []
                            for mi in range(4):
                                rowsv = []
                                for rr in range(8):
                                    lane = 8*mi + rr
                                    sl = wn*32 + 16*h + 8*(mi>>1) + (lane & 7); ch = 2*kk + (mi & 1)
                                    off = (sl*8 + (ch ^ (sl & 7)))*8
                                    rowsv.append(B[off:off+8])
                                mats.append(rowsv)
                            for lane in range(32):
                                regs = [(mats[i][lane//4][2*(lane%4)], mats[i][lane//4][2*(lane%4)+1]) for i in range(4)]
                                b[lane, 2*h, 0], b[lane, 2*h, 1] = regs[0], regs[1]
                                b[lane, 2*h+1, 0], b[lane, 2*h+1, 1] = regs[2], regs[3]
                        # A fragments
                        af = np.zeros((32, 2, 4, 2))
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            for mt in range(2):
                                base = mt*64 + 16*wm if GATE_UP else 32*wm + 16*mt
                                for hh in range(2):
                                    tr = base + g + 8*hh
                                    b0 = A[tr*32 + 8*kk + 2*t]; b1 = A[tr*32 + 8*kk + 2*t + 1]
                                    m, r = wrow(tr)
                                    sc = 2.0**(int(S[m][r, (ks*64 + 16*kk)//32]) - 127)
                                    af[lane, mt, hh] = (E2M1[b0 & 15]*sc, E2M1[b0 >> 4]*sc)
                                    af[lane, mt, 2+hh] = (E2M1[b1 & 15]*sc, E2M1[b1 >> 4]*sc)
                        # MMA per spec
                        for mt in range(2):
                            Am = np.zeros((16, 16))
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                Am[g, 2*t:2*t+2] = af[lane, mt, 0]; Am[g+8, 2*t:2*t+2] = af[lane, mt, 1]
                                Am[g, 2*t+8:2*t+10] = af[lane, mt, 2]; Am[g+8, 2*t+8:2*t+10] = af[lane, mt, 3]
                            for j in range(4):
                                Bm = np.zeros((16, 8))
                                for lane in range(32):
                                    g, t = lane >> 2, lane & 3
                                    Bm[2*t:2*t+2, g] = b[lane, j, 0]; Bm[2*t+8:2*t+10, g] = b[lane, j, 1]
                                C = Am @ Bm
                                for lane in range(32):
                                    g, t = lane >> 2, lane & 3
                                    acc[warp, lane, mt, j] += [C[g, 2*t], C[g, 2*t+1], C[g+8, 2*t], C[g+8, 2*t+1]]
            for warp in range(8):
                wm, wn = warp & 3, warp >> 2
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for j in range(4):
                        for h in range(2):
                            for q in range(2):
                                sl = wn*32 + j*8 + 2*t + q
                                if sl >= nst: continue
                                s = s0 + sl
                                if GATE_UP:
                                    r = r0 + 16*wm + g + 8*h
                                    if r >= R: continue
                                    out[0][r, s] = acc[warp, lane, 0, j, 2*h+q]; out[1][r, s] = acc[warp, lane, 1, j, 2*h+q]
                                else:
                                    for mt in range(2):
                                        r = r0 + 32*wm + 16*mt + g + 8*h
                                        if r >= R: continue
                                        out[0][r, s] = acc[warp, lane, mt, j, 2*h+q]
    for m in range(len(ref)):
        err = np.abs(out[m] - ref[m]).max()
        print("GATE_UP" if GATE_UP else "down", "matrix", m, "max |err|", err, "max |ref|", np.abs(ref[m]).max())
        assert err <= 1e-9 * max(1, np.abs(ref[m]).max()), "MISMATCH"
run(True)                              # gate/up: partial row tile (I = 96), one partial slot tile
run(False, K=128, I=128, d=192, ns=70)  # down: partial row tile (192 = 1.5 x 128), two slot tiles
print("OK")
