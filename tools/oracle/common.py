"""Shared helpers for the DeepSeek-V4 golden-fixture tooling (test tooling only).

* official root config.json  ->  HF `DeepseekV4Config`
* official (un-prefixed) tensor names  ->  HF `DeepseekV4ForCausalLM` state-dict names
* building the HF oracle in float64 and running a full forward (`use_cache=False`) with hooks
  that record the indexer / router top-k boundary gaps and SwiGLU clamp statistics.

Dequantisation is deliberately NOT in here: make_fixtures.py quantises with torch casts,
check_fixtures.py decodes the stored bytes with its own bit-level tables.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"


# ----------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------
def layer_kind(ratio: int) -> str:
    """Official rule (inference/model.py): ratio 0 = SWA, ratio 4 = CSA (overlap + indexer), other = HCA."""
    if ratio == 0:
        return SWA
    return CSA if ratio == 4 else HCA


def hf_config_from_official(oc: dict):
    """Build the HF config that describes the same model as an official-style root config.

    HF's own legacy folding (`compress_ratios` -> `layer_types`) only knows the ratios 0/4/128 and
    raises KeyError on e.g. 16, so the layer types and the HCA rate are passed explicitly here.
    """
    from transformers import DeepseekV4Config

    L = oc["num_hidden_layers"]
    ratios = list(oc["compress_ratios"])
    assert len(ratios) == L + oc.get("num_nextn_predict_layers", 1), "compress_ratios must have L+1 entries"
    kinds = [layer_kind(r) for r in ratios[:L]]
    hca_rates = sorted({r for r in ratios[:L] if layer_kind(r) == HCA})
    assert len(hca_rates) <= 1, "HF supports a single HCA ratio per model"
    rates = {CSA: 4, HCA: hca_rates[0] if hca_rates else 128}
    rs = oc["rope_scaling"]
    rope_parameters = {
        "rope_type": rs.get("type", rs.get("rope_type")),
        "factor": float(rs["factor"]),
        "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
        "beta_fast": rs["beta_fast"],
        "beta_slow": rs["beta_slow"],
    }
    keys = [
        "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "q_lora_rank", "num_experts_per_tok", "n_routed_experts",
        "n_shared_experts", "scoring_func", "norm_topk_prob", "routed_scaling_factor", "max_position_embeddings",
        "rope_theta", "compress_rope_theta", "hc_mult", "hc_sinkhorn_iters", "hc_eps", "swiglu_limit",
        "sliding_window", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim", "index_topk",
        "num_nextn_predict_layers", "hidden_act", "rms_norm_eps", "bos_token_id", "eos_token_id",
        "tie_word_embeddings",
    ]
    kw = {k: oc[k] for k in keys if k in oc}
    cfg = DeepseekV4Config(
        **kw,
        layer_types=kinds,
        compress_rates=rates,
        num_hash_layers=oc["num_hash_layers"],
        qk_rope_head_dim=oc["qk_rope_head_dim"],
        rope_parameters=rope_parameters,
    )
    assert cfg.qk_rope_head_dim == oc["qk_rope_head_dim"]
    assert cfg.mlp_layer_types == ["hash_moe"] * oc["num_hash_layers"] + ["moe"] * (L - oc["num_hash_layers"])
    cfg._experts_implementation = "eager"
    return cfg


# ----------------------------------------------------------------------------------------------
# names (MODEL.md §3.7, re-derived for transformers 5.17's module tree)
# ----------------------------------------------------------------------------------------------
GLOBAL_MAP = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
LAYER_MAP = {
    "hc_attn_fn": "attn_hc.fn",
    "hc_attn_base": "attn_hc.base",
    "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn",
    "hc_ffn_base": "ffn_hc.base",
    "hc_ffn_scale": "ffn_hc.scale",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
_EXPERT_RE = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$")


def official_to_hf_state(logical: dict, oc: dict) -> dict:
    """logical: official name -> dequantised float tensor (only `.weight`-level logical tensors, no
    `.scale`). Returns the HF state dict (mtp.* dropped, routed experts stacked)."""
    L, E = oc["num_hidden_layers"], oc["n_routed_experts"]
    out, experts = {}, {}
    for name, t in logical.items():
        if name.startswith("mtp."):
            continue
        if name in GLOBAL_MAP:
            out[GLOBAL_MAP[name]] = t
            continue
        m = _EXPERT_RE.match(name)
        if m:
            experts[(int(m.group(1)), int(m.group(2)), m.group(3))] = t
            continue
        m = re.match(r"^layers\.(\d+)\.(.+)$", name)
        assert m and m.group(2) in LAYER_MAP, f"unmapped official tensor {name}"
        out[f"model.layers.{m.group(1)}.{LAYER_MAP[m.group(2)]}"] = t
    for i in range(L):
        gu = [torch.cat([experts[(i, e, "w1")], experts[(i, e, "w3")]], dim=0) for e in range(E)]
        out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.stack(gu)
        out[f"model.layers.{i}.mlp.experts.down_proj"] = torch.stack([experts[(i, e, "w2")] for e in range(E)])
    return out


def build_hf_model(oc: dict, hf_state: dict):
    """Instantiate the oracle, load the given state strictly, return it in float64 / eval / eager."""
    from transformers import DeepseekV4ForCausalLM

    cfg = hf_config_from_official(oc)
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(cfg)
    model = model.double().eval()
    load_into(model, hf_state)
    model.config._experts_implementation = "eager"
    return model


def load_into(model, hf_state: dict):
    sd = {k: (v.to(torch.float64) if v.is_floating_point() else v.to(torch.int64)) for k, v in hf_state.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, f"unexpected keys: {unexpected}"
    assert not missing, f"missing keys: {missing}"


def check_nothing_constant(model, default_scalars=(0.0, 1.0)):
    """Every parameter / persistent buffer must be randomised (HF inits sinks, position_bias, hc base,
    e_score_correction_bias to 0, hc scale to 1, tid2eid to 0). Returns a list of problems."""
    problems = []
    named = list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if "inv_freq" not in n
    ]
    for n, t in named:
        if t.numel() == 1:
            if float(t.detach().reshape(-1)[0]) in default_scalars:
                problems.append(f"{n}: scalar left at default {float(t)}")
        elif torch.unique(t).numel() < 2:
            problems.append(f"{n}: constant tensor")
        if n.endswith("tid2eid"):
            srt = t.sort(dim=1).values
            if (srt[:, 1:] == srt[:, :-1]).any():
                problems.append(f"{n}: a row repeats an expert id")
    return problems


# ----------------------------------------------------------------------------------------------
# golden forward with instrumentation
# ----------------------------------------------------------------------------------------------
def _rel_gap(a: float, b: float) -> float:
    return (a - b) / max(abs(a), abs(b), 1e-300)


class Probe:
    """Forward hooks that record (a) indexer top-k boundary gaps per CSA layer among *visible* entries,
    (b) router top-k boundary gaps (score + bias) per score-routed layer, (c) SwiGLU clamp hit counts."""

    def __init__(self, model):
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdl

        self.model = model
        self.cfg = model.config
        self.handles = []
        self.index_gaps = {}  # layer -> min rel gap
        self.index_queries_with_choice = {}  # layer -> #queries where n_visible > topk
        self.index_selected = {}  # layer -> LongTensor [T, topk] (-1 padded) of selected entries
        self.router_gaps = {}
        self.clamp = {"routed_gate_hi": 0, "routed_up": 0, "routed_n": 0,
                      "shared_gate_hi": 0, "shared_up": 0, "shared_n": 0}
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            if attn.compressor is not None and hasattr(attn.compressor, "indexer"):
                self.handles.append(attn.compressor.indexer.scorer.register_forward_hook(self._idx_hook(i)))
            if isinstance(layer.mlp.gate, mdl.DeepseekV4TopKRouter):
                self.handles.append(layer.mlp.gate.register_forward_hook(self._router_hook(i)))
            self.handles.append(layer.mlp.experts.register_forward_hook(self._experts_hook))
            self.handles.append(layer.mlp.shared_experts.register_forward_hook(self._shared_hook))

    def _idx_hook(self, i):
        def hook(mod, args, out):
            scores = out[0].detach().to(torch.float64)  # [S, T_c]
            S, Tc = scores.shape
            k_cfg = self.cfg.index_topk
            m = self.cfg.compress_rates[CSA]
            gmin, nchoice = math.inf, 0
            sel = torch.full((S, k_cfg), -1, dtype=torch.long)
            for t in range(S):
                nvis = min((t + 1) // m, Tc)
                if nvis == 0:
                    continue
                v = scores[t, :nvis]
                order = torch.sort(v, descending=True, stable=True).indices
                k = min(k_cfg, nvis)
                sel[t, :k] = order[:k].sort().values
                if nvis > k_cfg:
                    nchoice += 1
                    a, b = float(v[order[k - 1]]), float(v[order[k]])
                    gmin = min(gmin, _rel_gap(a, b))
            self.index_gaps[i] = gmin
            self.index_queries_with_choice[i] = nchoice
            self.index_selected[i] = sel
        return hook

    def _router_hook(self, i):
        def hook(mod, args, out):
            logits = out[0].detach()
            s = (mod.score_fn(logits) + mod.e_score_correction_bias).to(torch.float64)
            v = torch.sort(s, dim=-1, descending=True).values
            k = mod.top_k
            a, b = v[:, k - 1], v[:, k]
            gaps = (a - b) / torch.maximum(a.abs(), b.abs()).clamp_min(1e-300)
            self.router_gaps[i] = float(gaps.min())
        return hook

    def _experts_hook(self, mod, args, out):
        h, idx = args[0], args[1]
        lim = mod.limit
        I = mod.intermediate_dim
        for t in range(h.shape[0]):
            for e in idx[t].tolist():
                gu = F.linear(h[t], mod.gate_up_proj[e])
                g, u = gu[:I], gu[I:]
                self.clamp["routed_gate_hi"] += int((g > lim).sum())
                self.clamp["routed_up"] += int((u.abs() > lim).sum())
                self.clamp["routed_n"] += I

    def _shared_hook(self, mod, args, out):
        x = args[0]
        g, u = mod.gate_proj(x), mod.up_proj(x)
        self.clamp["shared_gate_hi"] += int((g > mod.limit).sum())
        self.clamp["shared_up"] += int((u.abs() > mod.limit).sum())
        self.clamp["shared_n"] += g.numel()

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def full_forward(model, ids: torch.Tensor) -> torch.Tensor:
    """Golden = one full forward, no cache. ids: LongTensor [T]. Returns float64 logits [T, V]."""
    out = model(input_ids=ids[None], use_cache=False)
    return out.logits[0]


@torch.no_grad()
def probed_forward(model, ids):
    probe = Probe(model)
    try:
        logits = full_forward(model, ids)
    finally:
        probe.remove()
    return logits, probe
