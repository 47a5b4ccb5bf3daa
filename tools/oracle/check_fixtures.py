#!/usr/bin/env python3
"""Re-load golden fixture directories and prove they are self-consistent.

For an official-layout case: parse the safetensors files with a tiny reader of our own, decode every
dtype with bit-level tables (BF16, F32, I64, F8_E4M3, F8_E8M0, packed E2M1), dequantise (FP8 128x128
with E8M0 or F32 scales, MXFP4 1x32 E8M0, NVFP4 1x16 E4M3 x F32 global), rebuild the HF oracle from
config.json and reproduce logits.bin. For the HF-layout case: `from_pretrained` + forward.

Usage: python3 tools/oracle/check_fixtures.py [DIR ...]   (default: every case under tests/fixtures)
Exit status 0 iff every case reproduces its golden logits.
"""

from __future__ import annotations

import glob
import json
import os
import re
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------------------------------
# bit-level decoders (independent of torch's float8 casts used by the generator)
# ---------------------------------------------------------------------------------------------
def _e4m3_table() -> np.ndarray:
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s, e, m = (b >> 7) & 1, (b >> 3) & 0xF, b & 7
        if e == 0xF and m == 7:
            v = np.nan
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


E4M3 = _e4m3_table()
E8M0 = np.array([np.nan if b == 255 else 2.0 ** (b - 127) for b in range(256)], dtype=np.float64)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def read_safetensors(path: str) -> dict:
    """-> {name: (dtype_str, shape, raw uint8 ndarray)}"""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), np.frombuffer(buf, dtype=np.uint8, count=b - a, offset=base + a))
    return out


def decode(dtype: str, shape, raw: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        u = raw.view("<u2").astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64).reshape(shape)
    if dtype == "F32":
        return raw.view("<f4").astype(np.float64).reshape(shape)
    if dtype == "F64":
        return raw.view("<f8").reshape(shape).copy()
    if dtype == "I64":
        return raw.view("<i8").reshape(shape).copy()
    if dtype == "F8_E4M3":
        return E4M3[raw].reshape(shape)
    if dtype == "F8_E8M0":
        return E8M0[raw].reshape(shape)
    if dtype in ("I8", "U8"):
        return raw.reshape(shape).copy()
    raise ValueError(f"unsupported dtype {dtype}")


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """[out, in/2] bytes -> [out, in] values; low nibble = even k."""
    lo, hi = packed & 0xF, packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)
    return E2M1[codes]


def dequant_official(tensors: dict) -> tuple[dict, list]:
    """tensors: name -> (dtype, shape, raw). Returns ({logical name: float64/int64 ndarray}, notes)."""
    logical, used, notes = {}, set(), []
    names = set(tensors)
    for name in sorted(names):
        if name in used or not name.endswith(".weight") and name.endswith(
                (".scale", ".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        dt, shape, raw = tensors[name]
        stem = name[: -len(".weight")] if name.endswith(".weight") else None
        if stem and stem + ".weight_scale" in names:  # NVFP4 (ModelOpt)
            assert dt == "U8", name
            ws_dt, _, ws_raw = tensors[stem + ".weight_scale"]
            assert ws_dt == "F8_E4M3"
            g_dt, g_shape, g_raw = tensors[stem + ".weight_scale_2"]
            assert g_dt == "F32" and g_shape == ()
            ws = decode(ws_dt, tensors[stem + ".weight_scale"][1], ws_raw)
            g = float(decode(g_dt, (1,), g_raw)[0])
            vals = unpack_e2m1(decode(dt, shape, raw))
            W = vals * np.repeat(ws, 16, axis=1) * g
            used |= {stem + s for s in (".weight_scale", ".weight_scale_2", ".input_scale")}
            assert stem + ".input_scale" in names, f"{stem}: NVFP4 without input_scale"
        elif stem and stem + ".scale" in names:
            s_dt, s_shape, s_raw = tensors[stem + ".scale"]
            S = decode(s_dt, s_shape, s_raw)
            assert s_dt in ("F8_E8M0", "F32"), f"{stem}.scale has dtype {s_dt}"
            if dt == "F8_E4M3":  # 128x128 blocks, ceil division
                out, inn = shape
                assert S.shape == (-(-out // 128), -(-inn // 128)), f"{stem}.scale shape {S.shape}"
                W = decode(dt, shape, raw) * np.repeat(np.repeat(S, 128, 0), 128, 1)[:out, :inn]
            elif dt == "I8":  # MXFP4 routed expert: [out, in/2] + E8M0 [out, in/32]
                out, half = shape
                assert s_dt == "F8_E8M0" and S.shape == (out, 2 * half // 32)
                W = unpack_e2m1(decode(dt, shape, raw)) * np.repeat(S, 32, axis=1)
            else:
                raise ValueError(f"{name}: {dt} weight with a .scale")
            used.add(stem + ".scale")
        else:
            W = decode(dt, shape, raw)
        assert not (np.issubdtype(W.dtype, np.floating) and np.isnan(W).any()), f"NaN in {name}"
        logical[name] = W
        used.add(name)
    leftover = names - used
    assert not leftover, f"unconsumed tensors: {sorted(leftover)[:8]}"
    return logical, notes


def check_official(d: str, oc: dict) -> torch.Tensor:
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    idx = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f))
    if os.path.exists(idx):
        with open(idx) as fh:
            wm = json.load(fh)["weight_map"]
        assert set(wm) == set(tensors), "index weight_map does not match the shard contents"
        for n, fn in wm.items():
            assert n in read_safetensors(os.path.join(d, fn)), n
    logical, _ = dequant_official(tensors)
    # inventory sanity: MTP present, every main layer present, un-prefixed names
    L = oc["num_hidden_layers"]
    assert any(n.startswith("mtp.0.") for n in logical), "no mtp.0.* block"
    assert all(not n.startswith("model.") for n in logical)
    assert {int(m.group(1)) for n in logical if (m := re.match(r"layers\.(\d+)\.", n))} == set(range(L))
    model = common.build_hf_model(oc, common.official_to_hf_state(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in logical.items()}, oc))
    problems = common.check_nothing_constant(model)
    assert not problems, problems
    return model


def check_hf(d: str):
    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM.from_pretrained(d).double().eval()
    model.config._experts_implementation = "eager"
    problems = common.check_nothing_constant(model)
    assert not problems, problems
    return model


def check_dir(d: str) -> bool:
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    ids = np.fromfile(os.path.join(d, "ids.bin"), dtype="<i4")
    gold = np.fromfile(os.path.join(d, "logits.bin"), dtype="<f4")
    V = cfg["vocab_size"]
    assert len(ids) == meta["T"] and gold.size == meta["T"] * V, "ids/logits sizes disagree with meta.json"
    assert ids.min() >= 0 and ids.max() < V
    gold = gold.reshape(meta["T"], V)
    if meta["layout"] == "hf":
        model = check_hf(d)
    else:
        assert "compress_ratios" in cfg and len(cfg["compress_ratios"]) == cfg["num_hidden_layers"] + 1
        model = check_official(d, cfg)
    logits = common.full_forward(model, torch.from_numpy(ids.astype(np.int64)))
    got = logits.to(torch.float32).numpy()
    diff = float(np.abs(got - gold).max())
    scale = float(np.abs(gold).max())
    # Same machine: bit-identical (diff 0). Another CPU / torch build: ~1e-6 relative, because HF keeps RMSNorm,
    # RoPE, mHC, compressor softmax and indexer scores in fp32 inside the float64 model (HF_SEMANTICS.md §7).
    ok = diff <= 1e-5 * scale
    print(f"{'OK  ' if ok else 'FAIL'} {os.path.basename(d):12s} T={meta['T']:4d} layout={meta['layout']:8s} "
          f"format={meta['format']:6s} max|diff|={diff:.3g} (max|logit| {scale:.3g})")
    return ok


def main():
    dirs = sys.argv[1:] or sorted(p for p in glob.glob(os.path.join(REPO, "tests", "fixtures", "*"))
                                  if os.path.exists(os.path.join(p, "meta.json")))
    torch.set_num_threads(1)
    ok = all([check_dir(d) for d in dirs])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
