"""Just enough of the GGUF format to read a few metadata values cheaply.

The arena set-up (engine/process.py ``prepare``) needs the model's training
context (``<arch>.context_length``) to size the arena before the engine loads
anything; reading the header costs tens of milliseconds (a 262k-string
vocabulary is skipped in one tight loop) where a vocab-only load costs half
a second and a lot of log.
"""
from __future__ import annotations

import math
import mmap
import struct

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


def metadata(path: str, want: set[str] | None = None) -> dict:
    """Scalar and string metadata of a GGUF (arrays are skipped). With
    ``want``, stops as soon as every wanted key was seen."""
    return _header(path, want, None)


def tensor_names(path: str) -> list[str]:
    """The names of a GGUF's tensors (from the tensor infos after the metadata)."""
    names: list[str] = []
    _header(path, None, names)
    return names


# llama_ftype_name (src/llama-model-loader.cpp) by general.file_type: /props' model_ftype and
# /v1/models' meta.ftype show the name, as llama-server does
FTYPE_NAMES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
               11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium",
               16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 19: "IQ2_XXS - 2.0625 bpw",
               20: "IQ2_XS - 2.3125 bpw", 21: "Q2_K - Small", 22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw",
               24: "IQ1_S - 1.5625 bpw", 25: "IQ4_NL - 4.5 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw",
               28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw", 30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw",
               32: "BF16", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary", 38: "MXFP4 MoE",
               39: "NVFP4", 40: "Q1_0", 41: "Q2_0"}


_U64 = struct.Struct("<Q")


def ftype_name(file_type: str) -> str:
    """general.file_type's value (as metadata text) by llama.cpp's name; "" if absent."""
    if not file_type:
        return ""
    try:
        return FTYPE_NAMES.get(int(file_type), "unknown, may not work")
    except ValueError:
        return file_type


def n_params(path: str) -> int:
    """The model's parameters: the elements of every tensor the file holds
    (llama-server's ``meta.n_params``, llama_model_n_params; the workers'
    vocabulary-only model has no tensors to count)."""
    sizes: list[int] = []
    _header(path, None, [], sizes)
    return sum(sizes)


def _header(path: str, want: set[str] | None, tensors: list[str] | None,
            sizes: list[int] | None = None) -> dict:
    out: dict = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} not supported")
        pos = 24

        def string(pos: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", m, pos)
            return m[pos + 8 : pos + 8 + n].decode("utf-8", "replace"), pos + 8 + n

        def skip(t: int, pos: int) -> int:
            if t in _SCALARS:
                return pos + struct.calcsize(_SCALARS[t])
            if t == STRING:
                (n,) = struct.unpack_from("<Q", m, pos)
                return pos + 8 + n
            if t == ARRAY:
                et, n = struct.unpack_from("<IQ", m, pos)
                pos += 12
                if et in _SCALARS:
                    return pos + n * struct.calcsize(_SCALARS[et])
                if et == STRING:  # a vocabulary (262,144 strings for Gemma 3): one tight loop, no call per string
                    u64 = _U64.unpack_from
                    for _ in range(n):
                        pos += 8 + u64(m, pos)[0]
                    return pos
                for _ in range(n):
                    pos = skip(et, pos)
                return pos
            raise ValueError(f"unknown GGUF value type {t}")

        for _ in range(n_kv):
            key, pos = string(pos)
            (t,) = struct.unpack_from("<I", m, pos)
            pos += 4
            if t in _SCALARS:
                out[key] = struct.unpack_from(_SCALARS[t], m, pos)[0]
            elif t == STRING:
                out[key] = string(pos)[0]
            pos = skip(t, pos)
            if want is not None and want <= out.keys():
                break
        if tensors is not None:  # each info: name, n_dims (u32), dims (u64 each), type (u32), offset (u64)
            for _ in range(n_tensors):
                name, pos = string(pos)
                (nd,) = struct.unpack_from("<I", m, pos)
                if sizes is not None:
                    sizes.append(math.prod(struct.unpack_from(f"<{nd}Q", m, pos + 4)))
                pos += 4 + 8 * nd + 4 + 8
                tensors.append(name)
    return out


def context_length(path: str) -> int:
    """The model's training context (0 if the file does not say)."""
    meta = metadata(path, None)
    arch = meta.get("general.architecture", "")
    return int(meta.get(f"{arch}.context_length", 0))


def embedding_length(path: str) -> int:
    """The model's hidden size (``<arch>.embedding_length``; 0 if absent):
    the floats of a pooled embedding, for sizing the channels' vector area."""
    meta = metadata(path, None)
    arch = meta.get("general.architecture", "")
    return int(meta.get(f"{arch}.embedding_length", 0))
