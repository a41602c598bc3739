"""The offline feature cache: format, validation, memory-mapped reads (DESIGN §7.3).

A cache is a folder::

    manifest.json        what was cached, from which target, template and data; shard list
    index.bin            int64 little-endian [N, 3]: (shard, byte offset, tokens) per sample
    shard-RRRRR-KKKKK.bin  samples written by rank R, its K-th shard

Samples are stored in dataset order (sample ``i`` of the index is sample ``i`` of the
tokenized records), each one contiguous in its shard so that a read touches one region::

    features [T, L, H]   raw outputs of the target's feature layers   (cache dtype)
    hidden   [T, H]      final-normed last hidden state               (cache dtype)
    fscale   [T, L]      fp8 only: float32 per-vector scales
    hscale   [T]         fp8 only
    ids      [T]         int32 token ids
    mask     [T]         uint8 loss mask (1 = assistant token)

every section starting on a 16-byte boundary, everything little-endian. bf16/fp16/fp32
store the values as they are; fp8 (e4m3) stores ``x / s`` with ``s = absmax / 448`` per
vector. Each shard and the index have a sha256 in the manifest; :meth:`FeatureCache.open`
checks them, and :meth:`FeatureCache.check_compatible` checks the target and the chat
template before training uses the cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dspark.data.cache_checks import check_index, check_shard_entries
from dspark.data.samples import TrainSample
from dspark.drafters.blocks import batch_anchors
from dspark.errors import DsparkError
from dspark.protocols import TrainBatch

FORMAT = "dspark-feature-cache"
VERSION = 1
MANIFEST = "manifest.json"
INDEX = "index.bin"
ALIGN = 16
FP8_MAX = 448.0  # largest finite float8_e4m3fn

# Cache dtype -> (numpy storage dtype, torch dtype the stored bits are viewed as).
_STORAGE = {
    "fp32": (np.dtype("<f4"), torch.float32),
    "bf16": (np.dtype("<i2"), torch.bfloat16),
    "fp16": (np.dtype("<f2"), torch.float16),
    "fp8": (np.dtype("<u1"), torch.float8_e4m3fn),
}
# What a read returns by default: the stored dtype, fp8 decoded to bf16.
_READ_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


class CacheError(DsparkError):
    """The cache is missing, corrupt, or does not belong to this target / template."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def sample_layout(num_tokens: int, num_layers: int, hidden_size: int, dtype: str) -> dict[str, tuple]:
    """Section name -> ``(byte offset, numpy dtype, shape)`` within one sample, plus ``"size"``."""
    T, L, H = num_tokens, num_layers, hidden_size
    storage = _STORAGE[dtype][0]
    sections: list[tuple[str, np.dtype, tuple[int, ...]]] = [
        ("features", storage, (T, L, H)),
        ("hidden", storage, (T, H)),
    ]
    if dtype == "fp8":
        sections += [("fscale", np.dtype("<f4"), (T, L)), ("hscale", np.dtype("<f4"), (T,))]
    sections += [("ids", np.dtype("<i4"), (T,)), ("mask", np.dtype("u1"), (T,))]
    layout: dict[str, tuple] = {}
    offset = 0
    for name, dt, shape in sections:
        layout[name] = (offset, dt, shape)
        offset = _aligned(offset + dt.itemsize * int(np.prod(shape)))
    layout["size"] = offset
    return layout


# -- encoding (the writer side lives in cache_build.py) ---------------------------------------


def quantize_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x [..., H]`` -> (e4m3 values ``[..., H]``, float32 scales ``[...]``), absmax per vector."""
    x = x.float()
    amax = x.abs().amax(dim=-1)  # [...]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x / scale.unsqueeze(-1)).to(torch.float8_e4m3fn), scale


def encode_sample(ids: Tensor, mask: Tensor, features: Tensor, hidden: Tensor, dtype: str) -> bytes:
    """One sample's bytes in the layout of :func:`sample_layout`."""
    T, L, H = features.shape
    assert ids.shape == (T,) and mask.shape == (T,) and hidden.shape == (T, H), (
        f"ids {tuple(ids.shape)} mask {tuple(mask.shape)} hidden {tuple(hidden.shape)} features {(T, L, H)}"
    )
    layout = sample_layout(T, L, H, dtype)
    storage, view_dtype = _STORAGE[dtype]
    arrays: dict[str, np.ndarray] = {}
    if dtype == "fp8":
        fq, fs = quantize_fp8(features)
        hq, hs = quantize_fp8(hidden)
        arrays |= {"features": fq, "hidden": hq, "fscale": fs.numpy(), "hscale": hs.numpy()}
    else:
        arrays |= {"features": features.to(view_dtype), "hidden": hidden.to(view_dtype)}
    for name in ("features", "hidden"):
        t = arrays[name].detach().cpu().contiguous()
        # Reinterpret the bits as an integer/float type numpy knows, then pin little-endian.
        bits = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        bits = bits.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else bits
        arrays[name] = bits.numpy().astype(storage, copy=False)
    arrays["ids"] = ids.cpu().numpy().astype("<i4")
    arrays["mask"] = mask.cpu().numpy().astype("u1")
    out = bytearray(layout["size"])
    for name, array in arrays.items():
        offset = layout[name][0]
        raw = np.ascontiguousarray(array, dtype=layout[name][1]).tobytes()
        out[offset : offset + len(raw)] = raw
    return bytes(out)


# -- identity of what the cache was built from --------------------------------------------------


def _sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def target_identity(target) -> dict[str, Any]:
    """What makes two targets produce the same features: architecture config and weights.

    The weights are probed rather than hashed whole: the first rows of the embedding and
    the LM head, the final norm and a slice of the last decoder layer, rounded to bf16
    so that one checkpoint loaded in fp32 or in bf16 gives the same probe.
    """
    config = target.config.to_dict()
    for volatile in (
        "_name_or_path",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "architectures",
        "use_cache",
        "_attn_implementation_autoset",
        "output_hidden_states",
    ):
        config.pop(volatile, None)
    model = target.model
    decoder = model.get_decoder()
    probe = [
        model.get_input_embeddings().weight[:8],
        model.get_output_embeddings().weight[:8],
        decoder.norm.weight,
        next(decoder.layers[-1].parameters()).flatten()[:4096],
    ]
    h = hashlib.sha256()
    for t in probe:
        h.update(t.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy().astype("<i2").tobytes())
    return {
        "name": str(getattr(target.config, "_name_or_path", "") or ""),
        "config_sha256": _sha256_json(config),
        "weights_probe_sha256": h.hexdigest(),
        "hidden_size": target.hidden_size,
        "num_layers": target.num_layers,
        "vocab_size": target.vocab_size,
        "layer_ids": list(target.target_layer_ids),
    }


def template_identity(tokenizer, template_kwargs: Mapping[str, Any], max_length: int) -> dict[str, Any]:
    """The chat template (hashed), its kwargs and the truncation length the samples were made with."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return {
        "chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest(),
        "template_kwargs": dict(template_kwargs),
        "max_length": max_length,
    }


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CachedSample:
    input_ids: Tensor  # [T] long
    loss_mask: Tensor  # [T] bool
    features: Tensor  # [T, L, H]
    hidden: Tensor  # [T, H]


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class FeatureCache:
    """A built cache, read through ``numpy.memmap`` (pages load on first touch)."""

    def __init__(self, root: Path, manifest: dict[str, Any], index: np.ndarray) -> None:
        self.root = root
        self.manifest = manifest
        self.index = index  # [N, 3] int64: shard, byte offset, tokens
        self.dtype: str = manifest["dtype"]
        self.num_layers = len(manifest["target"]["layer_ids"])
        self.hidden_size = int(manifest["target"]["hidden_size"])
        self._maps: dict[int, np.memmap] = {}

    @classmethod
    def open(cls, root: str | Path, *, verify: bool = True) -> FeatureCache:
        """Open and check a cache: format, index checksum, shard sizes, and (``verify``) shard checksums.

        ``verify=False`` skips hashing the shards (sizes are still checked), for caches
        too large to read through at every start.
        """
        root = Path(root)
        path = root / MANIFEST
        if not path.is_file():
            raise CacheError(f"no feature cache at {root} (no {MANIFEST}; was the build interrupted?)")
        try:
            manifest = json.loads(path.read_text())
        except ValueError as e:  # bad JSON, or an integer too long to convert
            raise CacheError(f"{path}: corrupt manifest ({str(e).split(';')[0]})") from None
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise CacheError(
                f"{path}: not a {FORMAT} v{VERSION} manifest "
                f"(format {manifest.get('format')!r}, version {manifest.get('version')!r})"
            )
        missing = [k for k in ("dtype", "target", "template", "data", "index", "shards") if k not in manifest]
        if missing:
            raise CacheError(f"{path}: corrupt manifest (no {', '.join(missing)})")
        if manifest["dtype"] not in _STORAGE:
            raise CacheError(f"{path}: corrupt manifest (dtype {manifest['dtype']!r})")
        check_shard_entries(root, manifest["shards"], CacheError)
        if not isinstance(manifest["index"], dict) or not isinstance(manifest["index"].get("bytes"), int):
            raise CacheError(f"{path}: corrupt manifest (index)")
        files = [(INDEX, manifest["index"])] + [(s["file"], s) for s in manifest["shards"]]
        for name, meta in files:
            file = root / name
            if not file.is_file():
                raise CacheError(f"cache file {file} is missing")
            if file.stat().st_size != meta["bytes"]:
                raise CacheError(
                    f"cache file {file} has {file.stat().st_size} bytes, the manifest says {meta['bytes']}"
                )
            # A missing sha256 matches nothing: what the manifest cannot vouch for is not read.
            if (verify or name == INDEX) and sha256_file(file) != meta.get("sha256"):
                raise CacheError(f"cache file {file} is corrupt: its sha256 does not match the manifest")
        raw_index = np.fromfile(root / INDEX, dtype="<i8")
        if raw_index.size % 3:
            raise CacheError(f"{root / INDEX}: corrupt index ({raw_index.size} values, not rows of 3)")
        index = raw_index.reshape(-1, 3)
        if len(index) != manifest["data"]["num_samples"]:
            raise CacheError(
                f"{root / INDEX} has {len(index)} samples; the manifest: {manifest['data']['num_samples']}"
            )
        cache = cls(root, manifest, index)
        check_index(
            root,
            index,
            [s["bytes"] for s in manifest["shards"]],
            lambda T: sample_layout(T, cache.num_layers, cache.hidden_size, cache.dtype)["size"],
            CacheError,
        )
        return cache

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["data"]["num_tokens"])

    def check_compatible(
        self,
        target,
        *,
        template_kwargs: Mapping[str, Any] | None = None,
        max_length: int | None = None,
    ) -> None:
        """Refuse a cache made from another target, other feature layers or another template.

        Compares the target's identity (:func:`target_identity`) and, when given, the
        template kwargs and truncation length; raises :class:`CacheError` naming every
        field that differs.
        """
        cached_target = self.manifest["target"]
        current = target_identity(target)
        diffs = [
            f"target.{k}: cache {cached_target.get(k)!r}, now {current[k]!r}"
            for k in (
                "hidden_size",
                "num_layers",
                "vocab_size",
                "layer_ids",
                "config_sha256",
                "weights_probe_sha256",
            )
            if cached_target.get(k) != current[k]
        ]
        template = self.manifest["template"]
        tok = getattr(target, "tokenizer", None)
        if tok is not None:
            now = template_identity(tok, template_kwargs or {}, max_length or template["max_length"])
            keys = ["chat_template_sha256"]
            keys += ["template_kwargs"] if template_kwargs is not None else []
            keys += ["max_length"] if max_length is not None else []
            diffs += [
                f"template.{k}: cache {template[k]!r}, now {now[k]!r}" for k in keys if template[k] != now[k]
            ]
        if diffs:
            raise CacheError(
                f"the feature cache at {self.root} was built for another setup "
                f"(from {cached_target.get('name')!r}): " + "; ".join(diffs)
            )

    def _map(self, shard: int) -> np.memmap:
        if shard not in self._maps:
            # "c" (copy-on-write): writable views without touching the file, so torch accepts them.
            self._maps[shard] = np.memmap(
                self.root / self.manifest["shards"][shard]["file"], dtype=np.uint8, mode="c"
            )
        return self._maps[shard]

    def _section(self, buf: np.ndarray, layout: dict, name: str) -> np.ndarray:
        offset, dt, shape = layout[name]
        n = dt.itemsize * int(np.prod(shape))
        return buf[offset : offset + n].view(dt).reshape(shape)

    def sample(self, i: int, dtype: torch.dtype | None = None) -> CachedSample:
        """Sample ``i``; features and hidden state in ``dtype`` (default: as stored, fp8 read as bf16)."""
        shard, offset, T = (int(v) for v in self.index[i])
        layout = sample_layout(T, self.num_layers, self.hidden_size, self.dtype)
        buf = self._map(shard)[offset : offset + layout["size"]]
        view_dtype = _STORAGE[self.dtype][1]
        out_dtype = dtype or _READ_DTYPE[self.dtype]

        def values(name: str) -> Tensor:
            return torch.from_numpy(self._section(buf, layout, name)).view(view_dtype)

        features, hidden = values("features"), values("hidden")  # [T, L, H], [T, H]
        if self.dtype == "fp8":
            fscale = torch.from_numpy(self._section(buf, layout, "fscale"))  # [T, L]
            hscale = torch.from_numpy(self._section(buf, layout, "hscale"))  # [T]
            features = features.float() * fscale.unsqueeze(-1)
            hidden = hidden.float() * hscale.unsqueeze(-1)
        return CachedSample(
            input_ids=torch.from_numpy(self._section(buf, layout, "ids")).long(),
            loss_mask=torch.from_numpy(self._section(buf, layout, "mask")).bool(),
            features=features.to(out_dtype),
            hidden=hidden.to(out_dtype),
        )

    def token_samples(self) -> list:
        """The cached ids and loss masks as :class:`~dspark.data.samples.TrainSample` s, in order.

        Wrap them in a ``TrainDataset`` to drive the sampler: its fingerprint equals the
        one of the records the cache was built from.
        """

        out = []
        for i in range(len(self)):
            shard, offset, T = (int(v) for v in self.index[i])
            layout = sample_layout(T, self.num_layers, self.hidden_size, self.dtype)
            buf = self._map(shard)[offset : offset + layout["size"]]
            ids = torch.from_numpy(self._section(buf, layout, "ids")).long()
            out.append(TrainSample(ids, torch.from_numpy(self._section(buf, layout, "mask")).bool()))
        return out

    def target_batch(
        self,
        indices: Sequence[int],
        *,
        pad_id: int,
        num_anchors: int | None,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        prompt_end: bool = False,
    ) -> TrainBatch:
        """The :class:`TrainBatch` of samples ``indices``, as :func:`dspark.training.online.target_batch`
        makes it from the same samples (right padding; anchors drawn the same way from ``generator``,
        ``prompt_end`` as :func:`dspark.drafters.blocks.eligible_anchors`).

        Padding positions get zero features; no block ever sees them (they come after every
        supervised token of their row).
        """

        samples = [self.sample(i, dtype) for i in indices]
        B, T = len(samples), max(s.input_ids.numel() for s in samples)
        L, H = self.num_layers, self.hidden_size
        feat_dtype = samples[0].features.dtype
        ids = torch.full((B, T), pad_id, dtype=torch.long)  # [B, T]
        mask = torch.zeros(B, T, dtype=torch.bool)  # [B, T]
        features = torch.zeros(B, T, L, H, dtype=feat_dtype)  # [B, T, L, H]
        hidden = torch.zeros(B, T, H, dtype=feat_dtype)  # [B, T, H]
        for b, s in enumerate(samples):
            n = s.input_ids.numel()
            ids[b, :n], mask[b, :n], features[b, :n], hidden[b, :n] = (
                s.input_ids,
                s.loss_mask,
                s.features,
                s.hidden,
            )
        anchors = batch_anchors(mask, num_anchors, generator, prompt_end)  # [B, A] or None
        anchors = None if anchors is None else anchors.to(device)
        return TrainBatch(
            input_ids=ids.to(device),
            loss_mask=mask.to(device),
            features=features.to(device),
            target_hidden=hidden.to(device),
            anchors=anchors,
        )
