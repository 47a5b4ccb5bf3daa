#!/usr/bin/env python3
"""Empirical probes of what HF transformers' DeepseekV4ForCausalLM computes in a full forward
(`use_cache=False`).  Every claim in HF_SEMANTICS.md that is not a plain reading of the code is
checked here by instrumenting / perturbing a tiny random model.  Exit status 0 iff all hold.

Usage: python3 tools/oracle/probe_semantics.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import make_fixtures as mf  # noqa: E402

FAILS = []


def check(cond, msg):
    print(("  ok   " if cond else "  FAIL ") + msg)
    if not cond:
        FAILS.append(msg)


def build(case, seed):
    oc = mf.official_config(case)
    _, logical = mf.generate_weights(oc, case, seed)
    model = common.build_hf_model(oc, common.official_to_hf_state(logical, oc))
    return oc, model


@torch.no_grad()
def probe_window():
    print("[1] sliding window extent (1 SWA layer, W=16): which positions change when token p changes")
    case = dict(mf.CASES["flash_bf16"], ratios=[0, 0], num_hash_layers=0)
    oc, model = build(case, 11)
    W, T, p = oc["sliding_window"], 48, 10
    ids = torch.randint(0, oc["vocab_size"], (T,), generator=torch.Generator().manual_seed(1))
    a = common.full_forward(model, ids)
    ids2 = ids.clone()
    ids2[p] = (ids[p] + 1) % oc["vocab_size"]
    b = common.full_forward(model, ids2)
    changed = [t for t in range(T) if float((a[t] - b[t]).abs().max()) > 0]
    check(changed == list(range(p, p + W)),
          f"query t sees keys t-W+1..t (W={W} incl. current): changed positions {changed[0]}..{changed[-1]}")


@torch.no_grad()
def probe_compressed(case_name="flash_bf16", seed=1000):
    print(f"[2] compressed entries / indexer ({case_name})")
    case = mf.CASES[case_name]
    oc, model = build(case, seed)
    T = case["T"]
    ids = torch.randint(0, oc["vocab_size"], (T,), generator=torch.Generator().manual_seed(seed + 7))
    rec = {"pos": [], "bias": {}, "scores": {}}
    handles = []
    for i, layer in enumerate(model.model.layers):
        comp = layer.self_attn.compressor
        if comp is None:
            continue
        m = comp.compress_rate

        def out_hook(mod, args, out, i=i):
            rec["bias"][i] = out[1][0, 0].clone()  # [S, n_entries] 0 / -inf
        handles.append(comp.register_forward_hook(out_hook))
        for sub, tag in [(comp, "main"), (getattr(comp, "indexer", None), "indexer")]:
            if sub is None:
                continue
            orig = sub.rotary_emb.forward

            def rot(x, position_ids, layer_type=None, orig=orig, i=i, tag=tag, m=m):
                if position_ids.shape[-1] != T:  # the call for the compressed entries
                    rec["pos"].append((i, tag, m, position_ids[0].tolist(), layer_type))
                return orig(x, position_ids, layer_type=layer_type)
            sub.rotary_emb.forward = rot
        if hasattr(comp, "indexer"):
            def sc_hook(mod, args, out, i=i):
                rec["scores"][i] = out[0].clone()
            handles.append(comp.indexer.scorer.register_forward_hook(sc_hook))
    common.full_forward(model, ids)
    for h in handles:
        h.remove()

    for (i, tag, m, pos, lt) in rec["pos"]:
        n = T // m
        check(pos == [w * m for w in range(n)] and lt == "compress",
              f"layer {i} {tag} compressor (m={m}): {n} entries, RoPE positions w*m (first token of window w), "
              f"profile '{lt}'")

    for i, bias in rec["bias"].items():
        m = model.model.layers[i].self_attn.compressor.compress_rate
        vis = [[w for w in range(bias.shape[1]) if bias[t, w] == 0] for t in range(T)]
        if i not in rec["scores"]:  # HCA
            check(all(vis[t] == list(range((t + 1) // m)) for t in range(T)),
                  f"layer {i} HCA (m={m}): query t attends to ALL entries w < floor((t+1)/m)")
            continue
        k = oc["index_topk"]
        s = rec["scores"][i]
        ok_b, diff_c, ok_k = True, 0, True
        for t in range(T):
            nvis = (t + 1) // m
            mine = sorted(torch.topk(s[t, :nvis], min(k, nvis)).indices.tolist()) if nvis else []
            ok_b &= vis[t] == mine
            ok_k &= len(vis[t]) == min(k, nvis)
            # alternative rule: top-k over ALL entries, invisible ones dropped afterwards
            alt = sorted(w for w in torch.topk(s[t], min(k, s.shape[1])).indices.tolist() if w < nvis)
            diff_c += alt != mine
        check(ok_b, f"layer {i} CSA: selection = top-k of the indexer score among VISIBLE entries only "
                    f"(w < floor((t+1)/4) masked to -inf before top-k)")
        check(ok_k, f"layer {i} CSA: #selected = min(index_topk, floor((t+1)/4)) for every query")
        check(diff_c > 0, f"layer {i} CSA: the rule is discriminative ({diff_c}/{T} queries would differ under "
                          f"'top-k over all entries, drop invisible after')")


@torch.no_grad()
def probe_indexer_window_overlap(case_name="flash_bf16", seed=1000):
    print("[3] a selected compressed entry whose tokens are inside the window is still attended")
    case = mf.CASES[case_name]
    oc, model = build(case, seed)
    # entry w covers tokens [4w, 4w+3]; for t with (t+1)%4==0 the entry completed by t itself is visible
    T = case["T"]
    ids = torch.randint(0, oc["vocab_size"], (T,), generator=torch.Generator().manual_seed(seed + 7))
    got = {}
    layer = next(i for i, l in enumerate(model.model.layers) if l.self_attn.compressor is not None
                 and hasattr(l.self_attn.compressor, "indexer"))
    def hook(mod, args, out):
        got["b"] = out[1][0, 0].clone()
    h = model.model.layers[layer].self_attn.compressor.register_forward_hook(hook)
    common.full_forward(model, ids)
    h.remove()
    b = got["b"]
    last = [t for t in range(3, T, 4) if b[t, (t + 1) // 4 - 1] == 0]
    check(len(last) > 0, f"layer {layer}: {len(last)} queries select the entry completed by themselves "
                         f"(no exclusion of window-covered entries)")


def main():
    torch.set_num_threads(1)
    probe_window()
    probe_compressed("flash_bf16", 1000)
    probe_compressed("pro_fp8", 3000)
    probe_indexer_window_overlap()
    print("ALL PROBES PASSED" if not FAILS else f"{len(FAILS)} PROBE(S) FAILED")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
