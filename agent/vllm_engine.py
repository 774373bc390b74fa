"""Generation with an in-process vLLM engine (``vllm.LLM``), with the behaviour logprobs GRPO needs.

Same contract as `agent.transformers_engine.TransformersEngine`: token-id prompts in, one `Generation` per prompt
out (token ids with the EOS when it stopped, their logprobs, "stop" or "length"). Prefix caching is
on because a round's prompts share long prefixes: the n samples of a task are the same prompt, and
every step of an episode extends the previous one.

Logprobs come from the sampling distribution (``logprobs_mode="processed_logprobs"``: after
temperature), matching the transformers engine; greedy requests get the untempered ones.
``generate(..., seeds=[...])`` gives every request its own sampling seed (vLLM keeps a generator
per seeded request), so a prompt's sample does not depend on what it is batched with.
`reload` loads a new round's checkpoint folder into the running engine with
``collective_rpc("reload_weights", kwargs={"weights_path": ...})`` (vLLM 0.32; checked on the CPU
build), and builds a new engine where that is not available, for another architecture, or where
the checkpoint changed tied input/output embeddings (0.32's reload leaves the output layer stale:
`agent.weights.stale_tied_output`). TRL's tensor-by-tensor weight sync
does not work with the CPU build (its weights are repacked); loading from the folder does.
The engine is a context manager: leaving it (or `close`) shuts vLLM down and empties the CUDA
cache, so the update stage gets the GPU memory back.

Needs ``vllm`` importable, so it runs in vLLM's own environment (``make setup-vllm``: ``.venv-vllm``, the
CPU build; ``make setup-gpu``: ``.venv-gpu-vllm``): vLLM cannot be installed beside the project's prefect
3.8.8, so a pipeline run generates on servers from that environment instead (engine 'openai',
``rollout.managed_servers``, ``make gpu-run``). The module imports neither vllm nor prefect at import time,
and scripts that construct the engine need a ``if __name__ == "__main__":`` guard (vLLM spawns worker
processes).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.chat import ChatFormat
from agent.engine import Engine, Generation
from agent.transformers_engine import free_device_memory
from agent.weights import stale_tied_output, vllm_dtype
from coevolve.optional import optional_module

if TYPE_CHECKING:
    from coevolve.config import PipelineConfig

transformers = optional_module("transformers")
vllm = optional_module("vllm")
vllm_inputs = optional_module("vllm.inputs")
vllm_platforms = optional_module("vllm.platforms")


def _whole_prefills_on_cpu(model_path: str | Path, args: dict[str, Any]) -> dict[str, Any]:
    """Scheduler settings the CPU build needs for seeded requests: no chunked prefill.

    Its sampler cannot rewind a request's generator after a partial prefill ("CPU Generator does
    not use offset") and the engine dies, so every prompt is prefilled whole; the token budget of a
    step must then hold the longest context. Other platforms need nothing.
    """
    if not vllm_platforms.current_platform.is_cpu() or "enable_chunked_prefill" in args:
        return {}
    context = args.get("max_model_len")
    if context is None:
        context = (
            getattr(transformers.AutoConfig.from_pretrained(str(model_path)), "max_position_embeddings", None) or 0
        )
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(context), 4096)}


class VLLMEngine(Engine):
    """Batched sampling from a local checkpoint through ``vllm.LLM``."""

    name = "vllm"

    @classmethod
    def from_config(cls, checkpoint: str | Path, config: PipelineConfig) -> VLLMEngine:
        rollout = config.rollout
        return cls(
            checkpoint,
            seed=config.seed,
            dtype=vllm_dtype(checkpoint, rollout.vllm_dtype),
            max_model_len=rollout.vllm_max_model_len,
            gpu_memory_utilization=rollout.vllm_gpu_memory_utilization,
            tensor_parallel_size=rollout.vllm_tensor_parallel_size,
            data_parallel_size=rollout.vllm_data_parallel_size,
        )

    def __init__(
        self,
        model_path: str | Path,
        *,
        seed: int = 0,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        extra_args: dict[str, Any] | None = None,
    ) -> None:
        self.seed = seed
        self._engine_args: dict[str, Any] = {
            "dtype": dtype,
            "max_model_len": max_model_len,
            "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": tensor_parallel_size,
            "data_parallel_size": data_parallel_size,
            # Graph capture costs start-up time that short rollout stages never earn back.
            "enforce_eager": enforce_eager,
            **(extra_args or {}),
        }
        self.llm: Any = None
        # The checkpoint the engine generates with, and the folder its tied output layer was built from.
        self.model_path: str | Path = model_path
        self._built_from: str | Path = model_path
        self.reload(model_path)

    def reload(self, model_path: str | Path) -> None:
        """Switch to another checkpoint: loaded into the running engine where vLLM can, else a new engine."""
        if self.llm is not None and self.reload_in_place(model_path):
            return
        self._build(model_path)

    def reload_in_place(self, model_path: str | Path) -> bool:
        """Load a checkpoint folder's weights into the running engine (``reload_weights``); False where unsupported."""

        def architecture(path: str | Path) -> dict[str, Any]:
            settings = transformers.AutoConfig.from_pretrained(str(path)).to_dict()
            return {k: v for k, v in settings.items() if k not in ("_name_or_path", "transformers_version")}

        try:
            same = architecture(model_path) == architecture(self.model_path)
        except (OSError, ValueError):
            return False
        if not same:
            return False  # another architecture or size: the engine must be rebuilt

        if stale_tied_output(model_path, self._built_from):
            return False  # vLLM 0.32 would keep the old tied output layer
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(Path(model_path).resolve())})
        except Exception:  # noqa: BLE001 - a failed reload of any kind falls back to a rebuild
            # An older vLLM without weights_path, or an executor that cannot reload: each raises its own
            # errors from inside its workers, and all of them mean the same here: the engine is rebuilt.
            return False
        self.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values
        self.model_path = model_path
        return True

    def _build(self, model_path: str | Path) -> None:
        self.shutdown()
        self.model_path = model_path
        self._built_from = model_path  # the folder the running engine's tied output layer comes from
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_path))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.chat = ChatFormat(self.tokenizer)
        args = {k: v for k, v in self._engine_args.items() if v is not None}
        args = {**_whole_prefills_on_cpu(model_path, args), **args}
        self.llm = vllm.LLM(
            model=str(model_path),
            seed=self.seed,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            **args,
        )

    @property
    def max_context_tokens(self) -> int | None:
        return int(self.llm.llm_engine.model_config.max_model_len) if self.llm is not None else None

    def shutdown(self) -> None:
        """Free the engine's workers and memory (also done by `reload`)."""
        if self.llm is None:
            return
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        self.llm = None
        free_device_memory()

    def close(self) -> None:
        self.shutdown()

    def _generate(
        self, prompts: list[list[int]], temperature: float, max_new_tokens: int, seeds: list[int] | None
    ) -> list[Generation]:
        """One ``LLM.generate`` call; ``seeds`` seed each request's sampling."""
        eos = self.chat.eos_token_id

        def params(seed: int | None) -> Any:
            return vllm.SamplingParams(
                temperature=temperature,
                max_tokens=max_new_tokens,
                logprobs=0,  # the sampled token's own logprob only
                stop_token_ids=[eos],
                skip_special_tokens=False,
                detokenize=False,  # the rollout decodes; text here would be wasted work
                seed=seed if temperature > 0 else None,
            )

        per_request = params(None) if seeds is None else [params(int(seed)) for seed in seeds]
        outputs = self.llm.generate(
            [vllm_inputs.TokensPrompt(prompt_token_ids=list(p)) for p in prompts], per_request, use_tqdm=False
        )
        generations = []
        for output in outputs:
            sample = output.outputs[0]
            tokens = list(sample.token_ids)
            logprobs = [float(step[token].logprob) for token, step in zip(tokens, sample.logprobs or [], strict=False)]
            if len(logprobs) != len(tokens):
                raise RuntimeError(f"vLLM returned {len(tokens)} tokens but {len(logprobs)} logprobs.")
            stopped = bool(tokens) and tokens[-1] == eos
            generations.append(
                Generation(token_ids=tokens, logprobs=logprobs, finish_reason="stop" if stopped else "length")
            )
        return generations
