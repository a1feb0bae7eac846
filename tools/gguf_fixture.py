#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/types.gguf and types.json: one tensor per ggml type `shardes::gguf`
dequantizes, plus metadata of every value type, with the `gguf` Python package.

The reference for `src/gguf/` (`tests/pretrained/gguf_read.rs`). Run it once, in a throw-away
virtualenv outside the repository, and commit what it writes. The versions are pinned
because the expected values come from the package's `gguf.quants.dequantize`:

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /tmp/hfvenv/bin/python tools/gguf_fixture.py tests/fixtures/gguf

It writes:
- `types.gguf` (GGUF v3, `general.alignment` = 64 rather than the default 32, so a reader
  that ignores the key misplaces the data): one tensor per type F32, F16, BF16, Q8_0, Q4_0,
  Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. The quantized ones are random block bytes (written
  through the writer's `raw_dtype` path) whose f16 scale fields are overwritten with small
  finite values, so every dequantized value is finite and the test can compare bit for
  bit; several are 2-D or 3-D, so the ggml dimension order (`ne[0]` contiguous) is tested.
  Metadata holds every value type (u8 ... i64, f32, f64, bool, string), arrays of strings
  and of integers, and a nested array.
- `types.json`: the versions used; per tensor its name, type, ggml dims, PyTorch shape
  and the values of `gguf.quants.dequantize` (each an f32 written as the exact decimal of
  its f64 widening, so it parses back to the same bits); per metadata key its type and
  value (arrays list their items, each with its own type).
"""

import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf.constants import GGML_QUANT_SIZES

# Byte offsets (within one block) of the f16 fields holding scales and minima; random bytes
# there could be NaN or infinity, so they are overwritten with small finite values.
F16_FIELDS = {
    T.Q8_0: [0],
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}

# (name, type, PyTorch shape). Names of equal length ("t.q4_0" / "t.q5_0") let the test
# make duplicates by overwriting bytes in place.
TENSORS = [
    ("t.f32", T.F32, (2, 3, 4)),
    ("t.f16", T.F16, (2, 16)),
    ("t.bf16", T.BF16, (32,)),
    ("t.q8_0", T.Q8_0, (2, 64)),
    ("t.q4_0", T.Q4_0, (64,)),
    ("t.q4_1", T.Q4_1, (2, 32)),
    ("t.q5_0", T.Q5_0, (64,)),
    ("t.q5_1", T.Q5_1, (64,)),
    ("t.q4_k", T.Q4_K, (256,)),
    ("t.q5_k", T.Q5_K, (256,)),
    ("t.q6_k", T.Q6_K, (2, 256)),
]

VALUE_NAMES = {
    V.UINT8: "u8",
    V.INT8: "i8",
    V.UINT16: "u16",
    V.INT16: "i16",
    V.UINT32: "u32",
    V.INT32: "i32",
    V.UINT64: "u64",
    V.INT64: "i64",
    V.FLOAT32: "f32",
    V.FLOAT64: "f64",
    V.BOOL: "bool",
    V.STRING: "string",
    V.ARRAY: "array",
}

# (key, value, type, array element type). Keys of equal length ("test.u8" / "test.i8") let
# the test make duplicates in place.
METADATA = [
    ("test.u8", 200, V.UINT8, None),
    ("test.i8", -100, V.INT8, None),
    ("test.u16", 60000, V.UINT16, None),
    ("test.i16", -30000, V.INT16, None),
    ("test.u32", 4000000000, V.UINT32, None),
    ("test.i32", -2000000000, V.INT32, None),
    ("test.u64", 18000000000000000000, V.UINT64, None),
    ("test.i64", -9000000000000000000, V.INT64, None),
    ("test.f32", 0.1, V.FLOAT32, None),
    ("test.f64", 0.1, V.FLOAT64, None),
    ("test.true", True, V.BOOL, None),
    ("test.false", False, V.BOOL, None),
    ("test.string", "héllo, gguf", V.STRING, None),
    ("test.empty", "", V.STRING, None),
    ("test.strings", ["a b", "ĠParis", "", "<|im_end|>"], V.ARRAY, V.STRING),
    ("test.ints", [1, -2, 3, 2147483647], V.ARRAY, V.INT32),
    ("test.bytes", [0, 1, 255], V.ARRAY, V.UINT8),
    ("test.u64s", [0, 18000000000000000000], V.ARRAY, V.UINT64),
    ("test.floats", [0.5, -1.25], V.ARRAY, V.FLOAT32),
    ("test.nested", [[1, 2], [3, 4, 5]], V.ARRAY, V.ARRAY),
]


def exact(x) -> float:
    """The f32 `x` widened to f64: Python prints its shortest round-trip decimal."""
    return float(np.float32(x))


def block_bytes(rng: np.random.Generator, ty: T, n: int) -> np.ndarray:
    """Random raw bytes for `n` values of the quantized type `ty`, scales made finite."""
    block, size = GGML_QUANT_SIZES[ty]
    raw = rng.integers(0, 256, size=(n // block, size), dtype=np.uint8)
    for at in F16_FIELDS[ty]:
        scale = rng.uniform(-0.05, 0.05, size=n // block).astype(np.float16)
        raw[:, at : at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw


def tensor_data(rng: np.random.Generator, ty: T, shape: tuple) -> np.ndarray:
    """The bytes stored for one tensor, shaped as the writer wants them."""
    n = int(np.prod(shape))
    if ty == T.F32:
        return rng.standard_normal(shape).astype(np.float32)
    if ty == T.F16:
        return rng.standard_normal(shape).astype(np.float16)
    if ty == T.BF16:
        # Truncated f32 values: finite, and the bits below 16 zero as in real bf16.
        bits = rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8).reshape(*shape[:-1], -1)
    # Raw blocks in PyTorch order: the last axis holds a row's blocks.
    return block_bytes(rng, ty, n).reshape(*shape[:-1], -1)


def meta_json(value, vtype: V, sub_type) -> dict:
    """One metadata value as `{"type", "value"}`, arrays as `{"type", "items"}`."""
    if vtype == V.ARRAY:
        if sub_type == V.ARRAY:
            return {"type": "array", "items": [meta_json(v, V.ARRAY, V.INT32) for v in value]}
        return {"type": "array", "items": [meta_json(v, sub_type, None) for v in value]}
    if vtype == V.FLOAT32:
        value = exact(value)
    return {"type": VALUE_NAMES[vtype], "value": value}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20250207)

    writer = gguf.GGUFWriter(out / "types.gguf", arch="test")
    writer.add_custom_alignment(64)
    for key, value, vtype, sub_type in METADATA:
        # add_key_value directly: add_string/add_array skip empty values.
        writer.add_key_value(key, value, vtype, sub_type=sub_type)

    expected = []
    for name, ty, shape in TENSORS:
        data = tensor_data(rng, ty, shape)
        if ty in (T.F32, T.F16):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=ty)
        values = gguf.quants.dequantize(data, ty).astype(np.float32).reshape(-1)
        assert values.size == int(np.prod(shape)) and np.isfinite(values).all(), name
        expected.append(
            {
                "name": name,
                "type": ty.name,
                "dims": list(reversed(shape)),
                "shape": list(shape),
                "values": [exact(v) for v in values],
            }
        )

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    metadata = {"general.architecture": {"type": "string", "value": "test"}}
    metadata["general.alignment"] = {"type": "u32", "value": 64}
    for key, value, vtype, sub_type in METADATA:
        metadata[key] = meta_json(value, vtype, sub_type)

    doc = {
        "versions": {"gguf": version("gguf"), "numpy": np.__version__},
        "alignment": 64,
        "metadata": metadata,
        "tensors": expected,
    }
    with open(out / "types.json", "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: gguf_fixture.py OUT_DIR (tests/fixtures/gguf)")
    main(Path(sys.argv[1]))
