#!/usr/bin/env python3
"""Generate the DeepSeek-V4 golden fixtures under tests/fixtures/<case>/ (issue 3).

Oracle: Hugging Face transformers 5.17 `DeepseekV4ForCausalLM`, run in float64 on CPU, one full
forward with `use_cache=False`. Tiny random models; every parameter randomised; quantised cases are
quantised first and the *dequantised* values are loaded into the oracle, so checkpoint and golden use
identical weights. Seeds are re-drawn until every indexer / router top-k boundary has a relative
score gap > GAP_MIN.

Usage:  python3 tools/oracle/make_fixtures.py [--out tests/fixtures] [--case NAME ...] [--no-extra]
Runs on CPU in well under 2 minutes (2 cores). See tools/oracle/README.md and HF_SEMANTICS.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

GAP_MIN = 1e-4  # required relative gap at every top-k boundary (issue asks for > 1e-5)
MAX_TRIES = 40
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ----------------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------------
FLASH_DIMS = dict(
    vocab_size=256, hidden_size=64, num_attention_heads=4, head_dim=128, qk_rope_head_dim=64,
    q_lora_rank=32, o_groups=2, o_lora_rank=32, n_routed_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=32, routed_scaling_factor=1.5, sliding_window=16, index_n_heads=16,
    index_head_dim=128, index_topk=4, swiglu_limit=3.0,
    rope_scaling=dict(type="yarn", factor=16, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1),
)
PRO_DIMS = dict(
    vocab_size=320, hidden_size=64, num_attention_heads=8, head_dim=128, qk_rope_head_dim=64,
    q_lora_rank=48, o_groups=4, o_lora_rank=32, n_routed_experts=12, num_experts_per_tok=3,
    moe_intermediate_size=32, routed_scaling_factor=2.5, sliding_window=32, index_n_heads=16,
    index_head_dim=128, index_topk=8, swiglu_limit=4.0,
    rope_scaling=dict(type="yarn", factor=16, original_max_position_embeddings=8192, beta_fast=32, beta_slow=1),
)

FLASH_BF16_DIMS = dict(FLASH_DIMS, n_routed_experts=4)  # BF16 experts are 4x the FP4 bytes: fewer of them

CASES = {
    "flash_bf16": dict(dims=FLASH_BF16_DIMS, ratios=[0, 0, 4, 16, 4, 16, 0], num_hash_layers=3, T=128,
                       fmt="bf16", seed=1000, shards=1, w1_gain=1.6),
    "flash_fp8": dict(dims=FLASH_DIMS, ratios=[0, 0, 4, 16, 4, 16, 0], num_hash_layers=3, T=128,
                      fmt="fp8", seed=2000, shards=2, w1_gain=1.6),
    "pro_fp8": dict(dims=PRO_DIMS, ratios=[32, 32, 4, 32, 0], num_hash_layers=2, T=160,
                    fmt="fp8", seed=3000, shards=1, w1_gain=2.0),
    "base_fp8": dict(dims=FLASH_DIMS, ratios=[0, 0, 4, 16, 0], num_hash_layers=2, T=128,
                     fmt="base", seed=4000, shards=1, w1_gain=1.6),
    "nvfp4": dict(dims=FLASH_DIMS, ratios=[0, 0, 4, 16, 0], num_hash_layers=2, T=112,
                  fmt="nvfp4", seed=5000, shards=1, w1_gain=1.6),
    "hf_layout": dict(dims=FLASH_DIMS, ratios=[0, 4, 16, 0], num_hash_layers=1, T=96,
                      fmt="hf", seed=6000, shards=1, w1_gain=1.6),
}


def official_config(case: dict) -> dict:
    d = case["dims"]
    ratios = case["ratios"]
    L = len(ratios) - 1
    oc = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": d["vocab_size"],
        "hidden_size": d["hidden_size"],
        "num_hidden_layers": L,
        "num_attention_heads": d["num_attention_heads"],
        "num_key_value_heads": 1,
        "head_dim": d["head_dim"],
        "qk_rope_head_dim": d["qk_rope_head_dim"],
        "q_lora_rank": d["q_lora_rank"],
        "o_groups": d["o_groups"],
        "o_lora_rank": d["o_lora_rank"],
        "sliding_window": d["sliding_window"],
        "compress_ratios": ratios,
        "compress_rope_theta": 160000.0,
        "rope_theta": 10000.0,
        "rope_scaling": dict(d["rope_scaling"]),
        "max_position_embeddings": d["rope_scaling"]["factor"] * d["rope_scaling"]["original_max_position_embeddings"],
        "index_n_heads": d["index_n_heads"],
        "index_head_dim": d["index_head_dim"],
        "index_topk": d["index_topk"],
        "n_routed_experts": d["n_routed_experts"],
        "n_shared_experts": 1,
        "num_experts_per_tok": d["num_experts_per_tok"],
        "moe_intermediate_size": d["moe_intermediate_size"],
        "num_hash_layers": case["num_hash_layers"],
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": d["routed_scaling_factor"],
        "swiglu_limit": d["swiglu_limit"],
        "hidden_act": "silu",
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "num_nextn_predict_layers": 1,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "bfloat16",
    }
    fmt = case["fmt"]
    fp8_qc = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
              "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if fmt == "fp8":
        oc["quantization_config"] = fp8_qc
        oc["expert_dtype"] = "fp4"
    elif fmt == "base":
        qc = dict(fp8_qc)
        del qc["scale_fmt"]  # Base checkpoints: F32 block scales (the loader keys off the scale dtype)
        oc["quantization_config"] = qc
        oc["expert_dtype"] = "fp8"
    elif fmt == "nvfp4":
        qc = dict(fp8_qc)
        qc.update({
            "quant_algo": "MIXED_PRECISION",
            "moe_quant_algo": "NVFP4",
            "group_size": 16,
            "producer": "modelopt",
            "quantized_layers": {f"layers.{i}.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16}
                                 for i in range(L)},
            "ignore": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"],
        })
        oc["quantization_config"] = qc
        oc["expert_dtype"] = "fp4"
    return oc


# ----------------------------------------------------------------------------------------------
# tensor inventory (MODEL.md §3.2-3.3) with init scales
# ----------------------------------------------------------------------------------------------
# kinds: "lin"  = dense linear that is FP8 in quantised checkpoints
#        "exp"  = routed expert linear (FP4 / FP8 / NVFP4)
#        "bf16" = always BF16,  "f32" = always F32,  "tid" = I64 tid2eid
def inventory(oc: dict, case: dict):
    d = oc["hidden_size"]
    H, D = oc["num_attention_heads"], oc["head_dim"]
    qr, G, ro = oc["q_lora_rank"], oc["o_groups"], oc["o_lora_rank"]
    E, I, V = oc["n_routed_experts"], oc["moe_intermediate_size"], oc["vocab_size"]
    nI, DI = oc["index_n_heads"], oc["index_head_dim"]
    L = oc["num_hidden_layers"]
    hc = oc["hc_mult"]
    mix = (2 + hc) * hc
    g1 = case["w1_gain"]
    inv = []  # (name, shape, kind, init)

    def add(name, shape, kind, init):
        inv.append((name, tuple(shape), kind, init))

    add("embed.weight", [V, d], "bf16", ("normal", 1.0))
    for pfx, i, ratio, is_mtp in [(f"layers.{i}.", i, oc["compress_ratios"][i], False) for i in range(L)] + \
                                [("mtp.0.", L, oc["compress_ratios"][L], True)]:
        if is_mtp:
            add(pfx + "e_proj.weight", [d, d], "lin", ("normal", 1 / math.sqrt(d)))
            add(pfx + "h_proj.weight", [d, d], "lin", ("normal", 1 / math.sqrt(d)))
            add(pfx + "enorm.weight", [d], "bf16", ("norm",))
            add(pfx + "hnorm.weight", [d], "bf16", ("norm",))
        for site in ("attn", "ffn"):
            add(pfx + f"hc_{site}_fn", [mix, hc * d], "f32", ("normal", 1 / math.sqrt(hc * d)))
            add(pfx + f"hc_{site}_base", [mix], "f32", ("normal", 0.5))
            add(pfx + f"hc_{site}_scale", [3], "f32", ("uniform", 0.5, 1.5))
        add(pfx + "attn_norm.weight", [d], "bf16", ("norm",))
        add(pfx + "ffn_norm.weight", [d], "bf16", ("norm",))
        add(pfx + "attn.attn_sink", [H], "f32", ("normal", 1.0))
        add(pfx + "attn.wq_a.weight", [qr, d], "lin", ("normal", 1 / math.sqrt(d)))
        add(pfx + "attn.q_norm.weight", [qr], "bf16", ("norm",))
        add(pfx + "attn.wq_b.weight", [H * D, qr], "lin", ("normal", 1 / math.sqrt(qr)))
        add(pfx + "attn.wkv.weight", [D, d], "lin", ("normal", 1 / math.sqrt(d)))
        add(pfx + "attn.kv_norm.weight", [D], "bf16", ("norm",))
        add(pfx + "attn.wo_a.weight", [G * ro, H * D // G], "lin", ("normal", 1 / math.sqrt(H * D // G)))
        add(pfx + "attn.wo_b.weight", [d, G * ro], "lin", ("normal", 1 / math.sqrt(G * ro)))
        if ratio > 0:
            coff = 2 if ratio == 4 else 1
            add(pfx + "attn.compressor.wkv.weight", [coff * D, d], "bf16", ("normal", 1 / math.sqrt(d)))
            add(pfx + "attn.compressor.wgate.weight", [coff * D, d], "bf16", ("normal", 1.5 / math.sqrt(d)))
            add(pfx + "attn.compressor.ape", [ratio, coff * D], "f32", ("normal", 0.7))
            add(pfx + "attn.compressor.norm.weight", [D], "bf16", ("norm",))
        if ratio == 4:
            add(pfx + "attn.indexer.wq_b.weight", [nI * DI, qr], "lin", ("normal", 1 / math.sqrt(qr)))
            add(pfx + "attn.indexer.weights_proj.weight", [nI, d], "bf16", ("normal", 1 / math.sqrt(d)))
            add(pfx + "attn.indexer.compressor.wkv.weight", [2 * DI, d], "bf16", ("normal", 1 / math.sqrt(d)))
            add(pfx + "attn.indexer.compressor.wgate.weight", [2 * DI, d], "bf16", ("normal", 1.5 / math.sqrt(d)))
            add(pfx + "attn.indexer.compressor.ape", [4, 2 * DI], "f32", ("normal", 0.7))
            add(pfx + "attn.indexer.compressor.norm.weight", [DI], "bf16", ("norm",))
        add(pfx + "ffn.gate.weight", [E, d], "bf16", ("normal", 1 / math.sqrt(d)))
        if (not is_mtp) and i < oc["num_hash_layers"]:
            add(pfx + "ffn.gate.tid2eid", [V, oc["num_experts_per_tok"]], "tid", ("tid",))
        else:
            add(pfx + "ffn.gate.bias", [E], "f32", ("normal", 0.25))
        for e in range(E):
            add(pfx + f"ffn.experts.{e}.w1.weight", [I, d], "exp", ("normal", g1 / math.sqrt(d)))
            add(pfx + f"ffn.experts.{e}.w3.weight", [I, d], "exp", ("normal", g1 / math.sqrt(d)))
            add(pfx + f"ffn.experts.{e}.w2.weight", [d, I], "exp", ("normal", 1 / math.sqrt(I)))
        add(pfx + "ffn.shared_experts.w1.weight", [I, d], "lin", ("normal", g1 / math.sqrt(d)))
        add(pfx + "ffn.shared_experts.w3.weight", [I, d], "lin", ("normal", g1 / math.sqrt(d)))
        add(pfx + "ffn.shared_experts.w2.weight", [d, I], "lin", ("normal", 1 / math.sqrt(I)))
        if is_mtp:
            add(pfx + "norm.weight", [d], "bf16", ("norm",))
            add(pfx + "hc_head_fn", [hc, hc * d], "f32", ("normal", 1 / math.sqrt(hc * d)))
            add(pfx + "hc_head_base", [hc], "f32", ("normal", 0.5))
            add(pfx + "hc_head_scale", [1], "f32", ("uniform", 0.5, 1.5))
    add("norm.weight", [d], "bf16", ("norm",))
    add("hc_head_fn", [hc, hc * d], "f32", ("normal", 1 / math.sqrt(hc * d)))
    add("hc_head_base", [hc], "f32", ("normal", 0.5))
    add("hc_head_scale", [1], "f32", ("uniform", 0.5, 1.5))
    add("head.weight", [V, d], "bf16", ("normal", 2.0 / math.sqrt(d)))
    return inv


def draw(shape, init, gen, oc):
    kind = init[0]
    if kind == "normal":
        return torch.randn(shape, generator=gen, dtype=torch.float32) * init[1]
    if kind == "uniform":
        return torch.rand(shape, generator=gen, dtype=torch.float32) * (init[2] - init[1]) + init[1]
    if kind == "norm":  # RMSNorm weights around 1
        return 1.0 + 0.25 * torch.randn(shape, generator=gen, dtype=torch.float32)
    if kind == "tid":
        V, k = shape
        E = oc["n_routed_experts"]
        return torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(V)]).to(torch.int64)
    raise ValueError(kind)


# ----------------------------------------------------------------------------------------------
# quantisers (MODEL.md §3.4-3.6).  Each returns (stored tensors {suffix: tensor}, dequantised fp64)
# ----------------------------------------------------------------------------------------------
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def pow2_ceil_exponent(x: torch.Tensor) -> torch.Tensor:
    """exact ceil(log2(x)) for positive finite x (float64)."""
    m, e = torch.frexp(x.to(torch.float64))  # x = m * 2^e, m in [0.5, 1)
    return torch.where(m == 0.5, e - 1, e).to(torch.int64)


def e8m0_tensor(exponents: torch.Tensor) -> torch.Tensor:
    b = exponents + 127
    assert int(b.min()) >= 1 and int(b.max()) <= 254, "E8M0 exponent out of range"
    return b.to(torch.uint8).view(torch.float8_e8m0fnu)


def mantissa_trunc(x: torch.Tensor, bits: int) -> torch.Tensor:
    """fp32 with only `bits` significant bits (incl. the implicit one), rounded up in magnitude."""
    x = x.to(torch.float32)
    drop = 24 - bits
    xi = x.view(torch.int32)
    mask = ~((1 << drop) - 1)
    lo = (xi & mask).view(torch.float32)
    up = ((xi & mask) + (1 << drop)).view(torch.float32)
    return torch.where(lo == x, lo, up)


def blockify(W: torch.Tensor, bo: int, bi: int):
    out, inn = W.shape
    nb_o, nb_i = -(-out // bo), -(-inn // bi)
    Wp = torch.zeros(nb_o * bo, nb_i * bi, dtype=W.dtype)
    Wp[:out, :inn] = W
    return Wp.view(nb_o, bo, nb_i, bi), nb_o, nb_i


def quant_fp8_block(W: torch.Tensor, scale_kind: str):
    """128x128 block FP8 E4M3; scale E8M0 (power of two covering amax/448) or F32 (Base style)."""
    out, inn = W.shape
    Wb, nbo, nbi = blockify(W.to(torch.float32), 128, 128)
    amax = Wb.abs().amax(dim=(1, 3)).clamp_min(1e-12)  # [nbo, nbi]
    if scale_kind == "e8m0":
        ex = pow2_ceil_exponent(amax.to(torch.float64) / 448.0)
        s = torch.pow(2.0, ex.to(torch.float64)).to(torch.float32)
        stored_scale = e8m0_tensor(ex)
    else:
        s = mantissa_trunc(amax / 448.0, 16)  # <=16 significant bits: e4m3 * s is exact in fp32
        stored_scale = s.clone()
    sx = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:out, :inn]
    q = (W.to(torch.float32) / sx).clamp(-448, 448).to(torch.float8_e4m3fn)
    deq = q.to(torch.float64) * sx.to(torch.float64)
    return {"weight": q, "scale": stored_scale}, deq


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """nearest E2M1 code (|v| <= 6 expected); sign in bit 3; zero magnitude never gets the sign bit."""
    mag = v.abs().to(torch.float64).clamp(max=6.0)
    idx = (mag.unsqueeze(-1) - E2M1_VALUES).abs().argmin(dim=-1)
    sign = ((v < 0) & (idx > 0)).to(torch.int64)
    return idx + 8 * sign


def e2m1_value(codes: torch.Tensor) -> torch.Tensor:
    mag = E2M1_VALUES[codes & 7]
    return torch.where((codes & 8) > 0, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    lo, hi = codes[:, 0::2], codes[:, 1::2]
    return (lo | (hi << 4)).to(torch.uint8)


def quant_mxfp4(W: torch.Tensor):
    """routed experts: E2M1 with 1x32 UE8M0 blocks along K; stored I8 [out, in/2] + .scale [out, in/32]."""
    out, inn = W.shape
    assert inn % 32 == 0
    Wb = W.to(torch.float64).view(out, inn // 32, 32)
    amax = Wb.abs().amax(-1).clamp_min(1e-12)
    ex = pow2_ceil_exponent(amax / 6.0)
    s = torch.pow(2.0, ex.to(torch.float64))
    codes = e2m1_codes(Wb / s.unsqueeze(-1)).view(out, inn)
    deq = (e2m1_value(codes).view(out, inn // 32, 32) * s.unsqueeze(-1)).view(out, inn)
    return {"weight": pack_nibbles(codes).view(torch.int8), "scale": e8m0_tensor(ex)}, deq


def quant_nvfp4(W: torch.Tensor, gen: torch.Generator):
    """ModelOpt NVFP4: E2M1, per-16 E4M3 block scale, F32 global scale, F32 input_scale."""
    out, inn = W.shape
    assert inn % 16 == 0
    W64 = W.to(torch.float64)
    gscale = mantissa_trunc(torch.tensor(float(W64.abs().max()) / (6.0 * 448.0)), 8)  # weight_scale_2
    g = float(gscale)
    Wb = W64.view(out, inn // 16, 16)
    amax = Wb.abs().amax(-1)
    bs = (amax / (6.0 * g)).clamp(min=2.0 ** -9, max=448.0).to(torch.float32).to(torch.float8_e4m3fn)
    bsf = bs.to(torch.float64)
    assert bool((bsf > 0).all())
    codes = e2m1_codes((Wb / (bsf.unsqueeze(-1) * g)).clamp(-6, 6)).view(out, inn)
    deq = (e2m1_value(codes).view(out, inn // 16, 16) * bsf.unsqueeze(-1) * g).view(out, inn)
    input_scale = torch.tensor(float(mantissa_trunc(torch.tensor(
        (2.0 + 3.0 * float(torch.rand((), generator=gen))) / (6.0 * 448.0)), 12)), dtype=torch.float32)
    stored = {"weight": pack_nibbles(codes), "weight_scale": bs,
              "weight_scale_2": gscale.reshape(()).to(torch.float32), "input_scale": input_scale}
    return stored, deq


# ----------------------------------------------------------------------------------------------
# model generation
# ----------------------------------------------------------------------------------------------
def generate_weights(oc: dict, case: dict, seed: int):
    """Returns (stored: {official name: tensor in checkpoint dtype}, logical: {name: fp64 dequantised})."""
    gen = torch.Generator().manual_seed(seed)
    fmt = case["fmt"]
    stored, logical = {}, {}
    for name, shape, kind, init in inventory(oc, case):
        x = draw(shape, init, gen, oc)
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        if kind == "tid":
            stored[name] = x
            logical[name] = x
        elif kind == "f32":
            stored[name] = x.to(torch.float32)
            logical[name] = x.to(torch.float64)
        elif kind == "bf16" or fmt in ("bf16", "hf"):
            xb = x.to(torch.bfloat16)
            stored[name] = xb
            logical[name] = xb.to(torch.float64)
        elif kind == "lin":
            st, deq = quant_fp8_block(x, "f32" if fmt == "base" else "e8m0")
            stored[base + ".weight"], stored[base + ".scale"] = st["weight"], st["scale"]
            logical[name] = deq
        elif kind == "exp":
            if fmt == "base":
                st, deq = quant_fp8_block(x, "f32")
                stored[base + ".weight"], stored[base + ".scale"] = st["weight"], st["scale"]
            elif fmt == "nvfp4" and not name.startswith("mtp."):
                st, deq = quant_nvfp4(x, gen)
                for k, v in st.items():
                    stored[base + "." + k] = v
            else:
                st, deq = quant_mxfp4(x)
                stored[base + ".weight"], stored[base + ".scale"] = st["weight"], st["scale"]
            logical[name] = deq
        else:
            raise ValueError(kind)
    return stored, logical


def write_official(stored: dict, outdir: str, shards: int):
    from safetensors.torch import save_file

    names = list(stored.keys())  # inventory order: embed, layers..., mtp, norm/hc_head/head
    meta = {"format": "pt"}
    if shards == 1:
        save_file({n: stored[n].contiguous() for n in names}, os.path.join(outdir, "model.safetensors"), metadata=meta)
        return ["model.safetensors"]
    # split: shard 1 = embed + first half of the layers, last shard = the rest (mtp in the last one)
    mtp = [n for n in names if n.startswith("mtp.")]
    rest = [n for n in names if not n.startswith("mtp.")]
    half = len(rest) // 2
    parts = [rest[:half], rest[half:] + mtp]
    files, weight_map, total = [], {}, 0
    for k, part in enumerate(parts):
        fn = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
        save_file({n: stored[n].contiguous() for n in part}, os.path.join(outdir, fn), metadata=meta)
        files.append(fn)
        for n in part:
            weight_map[n] = fn
            total += stored[n].numel() * stored[n].element_size()
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    return files + ["model.safetensors.index.json"]


def yarn_blend_check(oc: dict) -> dict:
    """Which rope pairs of the compress profile are base / blended / fully interpolated."""
    R = oc["qk_rope_head_dim"]
    rs = oc["rope_scaling"]
    base = oc["compress_rope_theta"]

    def cdim(n):
        return R * math.log(rs["original_max_position_embeddings"] / (n * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(cdim(rs["beta_fast"])), 0)
    high = min(math.ceil(cdim(rs["beta_slow"])), R - 1)
    ramp = [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(R // 2)]
    return {"low": low, "high": high,
            "pairs_base": sum(r == 0 for r in ramp), "pairs_blended": sum(0 < r < 1 for r in ramp),
            "pairs_interpolated": sum(r == 1 for r in ramp)}


def try_seed(oc, case, seed, T, model=None):
    stored, logical = generate_weights(oc, case, seed)
    hf_state = common.official_to_hf_state(logical, oc)
    if model is None:
        model = common.build_hf_model(oc, hf_state)
    else:
        common.load_into(model, hf_state)
    ids = torch.randint(0, oc["vocab_size"], (T,), generator=torch.Generator().manual_seed(seed + 7))
    logits, probe = common.probed_forward(model, ids)
    gaps = list(probe.index_gaps.values()) + list(probe.router_gaps.values())
    return stored, logical, model, ids, logits, probe, (min(gaps) if gaps else math.inf)


@torch.no_grad()
def causality_check(model, ids, logits, oc):
    """Logits of every prefix must equal the corresponding rows of the full forward."""
    W = oc["sliding_window"]
    ms = sorted({r for r in oc["compress_ratios"] if r > 0})
    T = len(ids)
    P = {5, W + 1, T - 1}
    for m in ms:
        P |= {2 * m, 2 * m + 1, 3 * m - 1}
    P = sorted(p for p in P if 1 <= p < T)
    worst = 0.0
    for p in P:
        lp = common.full_forward(model, ids[:p])
        worst = max(worst, float((lp - logits[:p]).abs().max()))
    return {"prefix_lengths": P, "max_abs_diff": worst}


@torch.no_grad()
def hf_cache_check(model, ids, logits, chunk):
    """Diagnostic only (NOT the golden): HF's own cached chunked forward vs the full forward."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
        rows = []
        for s in range(0, len(ids), chunk):
            out = model(input_ids=ids[None, s:s + chunk], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0])
        got = torch.cat(rows)
        return {"chunk": chunk, "max_abs_diff": float((got - logits).abs().max())}
    except Exception as exc:  # noqa: BLE001
        return {"chunk": chunk, "error": f"{type(exc).__name__}: {exc}"[:300]}


@torch.no_grad()
def sensitivity(model, ids, logits, oc):
    """How much the golden moves under plausible engine bugs (max|dlogit| / max|logit|). Every entry must be
    far above the acceptance tolerance 1e-4, otherwise the fixture could not catch that bug."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdl

    scale = float(logits.abs().max())
    res = {}

    def run(name, mutate):
        m = copy.deepcopy(model)
        if mutate(m) is False:
            return
        res[name] = float((common.full_forward(m, ids) - logits).abs().max()) / scale

    def no_yarn(m):
        R = oc["qk_rope_head_dim"]
        plain = 1.0 / (oc["compress_rope_theta"] ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
        for mod in m.modules():
            if isinstance(mod, mdl.DeepseekV4RotaryEmbedding):
                mod.compress_inv_freq.copy_(plain)

    def main_rope_everywhere(m):
        for mod in m.modules():
            if isinstance(mod, mdl.DeepseekV4RotaryEmbedding):
                mod.compress_inv_freq.copy_(mod.main_inv_freq)

    def no_sink(m):
        for mod in m.modules():
            if isinstance(mod, mdl.DeepseekV4Attention):
                mod.sinks.fill_(-1e30)

    def no_clamp(m):
        for mod in m.modules():
            if isinstance(mod, (mdl.DeepseekV4Experts, mdl.DeepseekV4MLP)):
                mod.limit = float("inf")

    def window_minus_1(m):
        m.config.sliding_window = oc["sliding_window"] - 1

    def topk_plus_1(m):
        found = False
        for mod in m.modules():
            if isinstance(mod, mdl.DeepseekV4Indexer):
                mod.index_topk += 1
                found = True
        return found

    def no_router_bias(m):
        found = False
        for mod in m.modules():
            if isinstance(mod, mdl.DeepseekV4TopKRouter):
                mod.e_score_correction_bias.zero_()
                found = True
        return found

    def no_position_bias(m):
        found = False
        for n, p in m.named_parameters():
            if n.endswith("position_bias"):
                p.zero_()
                found = True
        return found

    for name, fn in [("yarn_off_on_compressed_layers", no_yarn), ("main_rope_on_compressed_layers",
                     main_rope_everywhere), ("sinks_removed", no_sink), ("swiglu_clamp_removed", no_clamp),
                     ("sliding_window_minus_1", window_minus_1), ("index_topk_plus_1", topk_plus_1),
                     ("router_bias_ignored", no_router_bias), ("compressor_ape_ignored", no_position_bias)]:
        run(name, fn)
    return res


def fp32_vs_fp64(model, ids, logits):
    m32 = copy.deepcopy(model).float()
    with torch.no_grad():
        l32 = m32(input_ids=ids[None], use_cache=False).logits[0].double()
    return float((l32 - logits).abs().max())


FORMATS = {
    "bf16": {"dense_linears": "BF16", "routed_experts": "BF16", "mtp_routed_experts": "BF16"},
    "fp8": {"dense_linears": "F8_E4M3 + .scale F8_E8M0 [ceil(out/128), ceil(in/128)]",
            "routed_experts": "I8 [out, in/2] packed E2M1 (low nibble = even k) + .scale F8_E8M0 [out, in/32]",
            "mtp_routed_experts": "same as routed_experts"},
    "base": {"dense_linears": "F8_E4M3 + .scale F32 [ceil(out/128), ceil(in/128)]",
             "routed_experts": "F8_E4M3 + .scale F32 [ceil(out/128), ceil(in/128)]",
             "mtp_routed_experts": "same as routed_experts"},
    "nvfp4": {"dense_linears": "F8_E4M3 + .scale F8_E8M0 [ceil(out/128), ceil(in/128)]",
              "routed_experts": "ModelOpt NVFP4: .weight U8 [out, in/2] (low nibble = even k), .weight_scale "
                                "F8_E4M3 [out, in/16], .weight_scale_2 F32 [], .input_scale F32 []",
              "mtp_routed_experts": "I8 [out, in/2] E2M1 + .scale F8_E8M0 [out, in/32] (MXFP4, as the fp8 case)"},
    "hf": {"all": "HF save_pretrained: BF16 weights, F32 hc_*/sinks/position_bias/gate bias, I64 tid2eid; "
                  "routed experts split per expert (w1/w2/w3) by HF's reverse conversion mapping"},
}
COMMON_FORMATS = ("dense_linears = wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b, shared_experts.w1/w2/w3, "
                  "mtp e_proj/h_proj; always BF16: embed, head, norms, compressor wkv/wgate, weights_proj, "
                  "gate.weight; F32: hc_*, attn_sink, ape, gate.bias; I64: tid2eid")


def write_common(outdir, name, case, seed, ids, logits, probe, oc, extra):
    ids.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(outdir, "ids.bin"))
    logits.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(outdir, "logits.bin"))
    amax_per_pos = logits.abs().amax(-1)
    clamp = probe.clamp
    meta = {
        "case": name,
        "seed": seed,
        "T": len(ids),
        "vocab_size": oc["vocab_size"],
        "layout": "hf" if case["fmt"] == "hf" else "official",
        "format": case["fmt"],
        "formats": dict(FORMATS[case["fmt"]], note=COMMON_FORMATS),
        "oracle": "transformers DeepseekV4ForCausalLM, eager attention + eager experts, model.double(), "
                  "one full forward with use_cache=False (see tools/oracle/HF_SEMANTICS.md)",
        "schedule": {"compress_ratios": oc["compress_ratios"], "num_hash_layers": oc["num_hash_layers"]},
        "files": extra.pop("files"),
        "ids": "ids.bin: int32 little-endian [T]",
        "logits": "logits.bin: float32 little-endian [T, vocab], row t = logits after token t; "
                  "full forward (use_cache=False) of HF DeepseekV4ForCausalLM in float64, cast to float32",
        "torch_version": torch.__version__,
        "transformers_version": __import__("transformers").__version__,
        "max_abs_logit": float(logits.abs().max()),
        "max_abs_logit_per_position_min": float(amax_per_pos.min()),
        "max_abs_logit_per_position_max": float(amax_per_pos.max()),
        "logit_std": float(logits.std()),
        "gap_threshold": GAP_MIN,
        "min_rel_topk_gap": min(list(probe.index_gaps.values()) + list(probe.router_gaps.values())),
        "min_rel_gap_indexer_per_layer": {str(k): v for k, v in probe.index_gaps.items()},
        "min_rel_gap_router_per_layer": {str(k): v for k, v in probe.router_gaps.items()},
        "indexer_queries_with_real_choice_per_layer": {str(k): v for k, v in
                                                       probe.index_queries_with_choice.items()},
        "swiglu_clamp_hits": {
            "limit": oc["swiglu_limit"],
            "routed_gate_above": clamp["routed_gate_hi"], "routed_up_outside": clamp["routed_up"],
            "routed_values": clamp["routed_n"],
            "shared_gate_above": clamp["shared_gate_hi"], "shared_up_outside": clamp["shared_up"],
            "shared_values": clamp["shared_n"],
        },
    }
    meta.update(extra)
    with open(os.path.join(outdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def cast_for_hf_layout(logical, oc):
    """A fp32 HF model whose parameters carry the dtypes a real checkpoint has (BF16 / F32 / I64)."""
    from transformers import DeepseekV4ForCausalLM

    cfg = common.hf_config_from_official(oc)
    m = DeepseekV4ForCausalLM(cfg).eval()
    hf_state = common.official_to_hf_state(logical, oc)
    with torch.no_grad():
        for n, p in list(m.named_parameters()) + [(n, b) for n, b in m.named_buffers() if "inv_freq" not in n]:
            v = hf_state[n]
            is_f32 = any(n.endswith(s) for s in (".fn", ".base", ".scale", "hc_fn", "hc_base", "hc_scale",
                                                 ".sinks", ".position_bias", ".e_score_correction_bias"))
            if not v.is_floating_point():
                p.data = v.to(torch.int64)
            elif is_f32:
                p.data = v.to(torch.float32)
            else:
                p.data = v.to(torch.bfloat16)
    return m


def make_case(name, case, outroot, extra_checks=True, diagnostics=False):
    t0 = time.time()
    oc = official_config(case)
    outdir = os.path.join(outroot, name)
    T = case["T"]
    seed = case["seed"]
    model = None
    for attempt in range(MAX_TRIES):
        stored, logical, model, ids, logits, probe, gap = try_seed(oc, case, seed, T, model)
        if gap > GAP_MIN:
            break
        print(f"  [{name}] seed {seed}: min rel top-k gap {gap:.3g} <= {GAP_MIN}, re-seeding", flush=True)
        seed += 1
    else:
        raise RuntimeError(f"{name}: no seed with gaps > {GAP_MIN}")

    problems = common.check_nothing_constant(model)
    assert not problems, problems

    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    extra = {"seed_attempts": attempt + 1, "yarn": yarn_blend_check(oc)}

    if case["fmt"] == "hf":
        m = cast_for_hf_layout(logical, oc)
        m.save_pretrained(outdir)
        from transformers import DeepseekV4ForCausalLM

        re_model = DeepseekV4ForCausalLM.from_pretrained(outdir).double().eval()
        re_model.config._experts_implementation = "eager"
        s1, s2 = model.state_dict(), re_model.state_dict()
        bad = [k for k in s1 if k not in s2 or not torch.equal(s1[k].double() if s1[k].is_floating_point() else s1[k],
                                                             s2[k].double() if s2[k].is_floating_point() else s2[k])]
        assert not bad, f"hf_layout round trip mismatch: {bad[:5]}"
        relog = common.full_forward(re_model, ids)
        assert torch.equal(relog, logits), "hf_layout reload changed the logits"
        extra["files"] = sorted(os.listdir(outdir))
        extra["hf_layout_note"] = ("written by DeepseekV4ForCausalLM.save_pretrained (transformers "
                                   f"{__import__('transformers').__version__}); see HF_SEMANTICS.md for the names")
    else:
        files = write_official(stored, outdir, case["shards"])
        with open(os.path.join(outdir, "config.json"), "w") as f:
            json.dump(oc, f, indent=2)
        extra["files"] = ["config.json"] + files

    if extra_checks:
        extra["causality"] = causality_check(model, ids, logits, oc)
        # HF keeps some internals in fp32 even in a float64 model (RMSNorm, RoPE, mHC mixing, compressor
        # softmax, indexer scores), so prefix vs full differs at fp32 rounding level (BLAS tiling depends on
        # the sequence length); a real dependence on later tokens would be orders of magnitude larger.
        assert extra["causality"]["max_abs_diff"] < 1e-5 * float(logits.abs().max()), \
            f"HF full forward is NOT causal: {extra['causality']}"
        extra["fp32_oracle_vs_fp64_max_abs_diff"] = fp32_vs_fp64(model, ids, logits)
        extra["sensitivity_rel"] = sensitivity(model, ids, logits, oc)
        weak = {k: v for k, v in extra["sensitivity_rel"].items() if v < 1e-3}
        assert not weak, f"{name}: fixture barely reacts to {weak}"
    if diagnostics:
        extra["hf_cached_forward_diagnostic"] = [hf_cache_check(model, ids, logits, c) for c in (1, 7)]
    meta = write_common(outdir, name, case, seed, ids, logits, probe, oc, extra)
    size = sum(os.path.getsize(os.path.join(outdir, f)) for f in os.listdir(outdir))
    print(f"[{name}] T={T} seed={seed} size={size / 1e6:.2f} MB max|logit|={meta['max_abs_logit']:.3f} "
          f"min_gap={meta['min_rel_topk_gap']:.3g} clamp(routed g/u)={probe.clamp['routed_gate_hi']}/"
          f"{probe.clamp['routed_up']} of {probe.clamp['routed_n']} ({time.time() - t0:.1f}s)", flush=True)
    return meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--no-extra", action="store_true", help="skip the causality and fp32-vs-fp64 checks")
    ap.add_argument("--diagnostics", action="store_true",
                    help="also compare HF's own cached (chunked) forward with the golden (slow; not a golden)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    for name in args.case or list(CASES):
        make_case(name, CASES[name], args.out, extra_checks=not args.no_extra, diagnostics=args.diagnostics)
    total = 0
    for root, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"total fixture size {total / 1e6:.2f} MB, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
