#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_safetensors_header into fuzz/corpus/safetensors_header/.

Seeds are tiny safetensors files: a few valid ones (covering every dtype, metadata, padding, scalars, empty
tensors) and a few broken ones (each violating one rule), so the fuzzer starts next to every validation branch.
Run from anywhere: python3 fuzz/make_corpus.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors_header")
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8,
         "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}


def raw(header_text, data=b"", declared=None, pad=True):
    h = header_text.encode() if isinstance(header_text, str) else header_text
    if pad:
        h += b" " * (-len(h) % 8)
    n = len(h) if declared is None else declared
    return struct.pack("<Q", n) + h + data


def valid(tensors, metadata=None):
    """tensors: list of (name, dtype, shape); data is a byte pattern of the right length."""
    header, data, off = {}, b"", 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, shape in tensors:
        n = SIZES[dt]
        for d in shape:
            n *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        data += bytes((off + i) & 0xFF for i in range(n))
        off += n
    return raw(json.dumps(header, separators=(",", ":")), data)


SEEDS = {
    "valid_empty": raw("{}"),
    "valid_one_u8": valid([("w", "U8", [4])]),
    "valid_all_dtypes": valid([("t." + d, d, [2, 3]) for d in SIZES], {"format": "pt"}),
    "valid_fp8_block": valid([("layers.0.attn.wq_a.weight", "F8_E4M3", [4, 8]),
                              ("layers.0.attn.wq_a.scale", "F8_E8M0", [1, 1])]),
    "valid_scalar_and_empty": valid([("hc_head_scale", "F32", []), ("e", "BF16", [0, 5]), ("b", "F32", [1])]),
    "valid_unpadded": raw('{"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}', bytes(8), pad=False),
    "bad_too_short": b"\x05\x00\x00",
    "bad_len_past_end": raw('{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00", declared=500),
    "bad_huge_len": raw("{}", declared=0xFFFFFFFFFFFFFFFF),
    "bad_json": raw('{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]'),
    "bad_dtype": raw('{"x":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}}', b"\x00"),
    "bad_shape_negative": raw('{"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', b"\x00"),
    "bad_shape_float": raw('{"x":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', b"\x00"),
    "bad_size_mismatch": raw('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', bytes(4)),
    "bad_offsets_past_end": raw('{"x":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}', bytes(4)),
    "bad_overlap": raw('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                       '"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}', bytes(6)),
    "bad_duplicate": raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                         '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)),
    "bad_overflow": raw('{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'),
    "bad_metadata": raw('{"__metadata__":{"k":[1]}}'),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, blob in SEEDS.items():
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(blob)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
