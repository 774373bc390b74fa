"""Generation with Hugging Face transformers, returning the behaviour logprobs GRPO needs.

The engine runs a manual decoding loop over a left-padded batch with a KV cache: it samples from
softmax(logits / temperature) and records the log-probability of each sampled token under that
same distribution, which is what the update stage uses as the behaviour policy. Greedy decoding
(temperature 0) records the chosen token's logprob at temperature 1.

Sampling is seeded per prompt: ``generate(..., seeds=[...])`` draws every row's uniforms from a
generator of its own seed (one uniform per token position) and picks the token by inverse CDF, so
a row's sample depends only on its prompt, its seed and the weights, never on its batch
neighbours, the batch size or earlier calls. Without seeds the engine's own generator is used.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.chat import ChatFormat
from agent.engine import Engine, Generation
from coevolve.optional import freeze_long_lived, optional_module

if TYPE_CHECKING:
    from coevolve.config import PipelineConfig

peft = optional_module("peft")
torch = optional_module("torch")
transformers = optional_module("transformers")


def load_policy(model: str | Path) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a local folder or a Hugging Face id, in float32.

    A folder holding only a LoRA adapter is loaded onto its base model and merged, so callers
    always get a plain model.
    """
    source = str(model)
    adapter_config = Path(source) / "adapter_config.json"
    if adapter_config.is_file() and not (Path(source) / "config.json").is_file():
        base_name = peft.PeftConfig.from_pretrained(source).base_model_name_or_path
        base = transformers.AutoModelForCausalLM.from_pretrained(base_name, dtype=torch.float32)
        policy = peft.PeftModel.from_pretrained(base, source).merge_and_unload()
    else:
        policy = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy.eval()
    return policy, tokenizer


# Whether this process's long-lived objects are frozen out of the cycle collector yet (see free_device_memory).
_FROZEN: list[bool] = []


def free_device_memory() -> None:
    """Collect the models an engine dropped and, on a GPU, hand their cached memory back for the update stage.

    A dropped model is freed only by the cycle collector (its modules refer to each other), and a full
    collection walks every object of the process: 0.33-0.4 s with the pipeline's libraries loaded, at every
    engine close (benchmarks/README.md, "A training step by part"). So the first collection freezes what
    survives it (`coevolve.optional.freeze_long_lived`: the libraries' objects, which live as long as the process)
    and later ones walk only what was made since.
    """
    gc.collect()
    if not _FROZEN:
        freeze_long_lived()  # nothing it freezes is garbage: the collection just ran
        _FROZEN.append(True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class TransformersEngine(Engine):
    """Batched sampling from a local policy checkpoint with per-token behaviour logprobs."""

    name = "transformers"

    @classmethod
    def from_config(cls, checkpoint: str | Path, config: PipelineConfig) -> TransformersEngine:
        return cls(checkpoint, torch_threads=config.policy.torch_threads, seed=config.seed)

    def __init__(self, model_path: str | Path, torch_threads: int = 1, seed: int = 0) -> None:
        torch.set_num_threads(torch_threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self.reload(model_path)

    def reload(self, model_path: str | Path) -> None:
        """Switch to another checkpoint (e.g. the one the last update wrote)."""
        self.model_path = Path(model_path) if Path(model_path).exists() else model_path
        self.model, self.tokenizer = load_policy(model_path)
        self.model.to(self.device)
        self.chat = ChatFormat(self.tokenizer)

    def close(self) -> None:
        """Drop the model and, on a GPU, return its memory, so the update stage can train in it."""
        self.model = None
        free_device_memory()

    @property
    def max_context_tokens(self) -> int | None:
        return getattr(getattr(self.model, "config", None), "max_position_embeddings", None)

    def _generate(
        self, prompts: list[list[int]], temperature: float, max_new_tokens: int, seeds: list[int] | None
    ) -> list[Generation]:
        """One decoding loop over the left-padded batch; ``seeds`` fix each row's sample whatever batch it is
        generated in."""
        eos = self.chat.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        width = max(len(p) for p in prompts)
        batch = len(prompts)
        input_ids = torch.full((batch, width), pad, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        # Left padding shifts real tokens right; positions must count real tokens only.
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        uniforms = self._uniforms(seeds, batch, max_new_tokens) if temperature > 0 else None

        chosen_steps: list[Any] = []
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        past = None
        step_ids, step_pos = input_ids, positions
        with torch.inference_mode():
            for position in range(max_new_tokens):
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=attention,
                    position_ids=step_pos,
                    past_key_values=past,
                    use_cache=True,
                    logits_to_keep=1,
                )
                past = out.past_key_values
                logits = out.logits[:, -1, :].float()
                if uniforms is not None:  # sampling (temperature > 0)
                    logprobs = torch.log_softmax(logits / temperature, dim=-1)
                    # Inverse CDF: the first token whose cumulative probability reaches the row's uniform.
                    # Uniforms lie in (0, 1], so a zero-probability token is never chosen.
                    cdf = logprobs.exp().cumsum(dim=-1)
                    target = uniforms[:, position : position + 1] * cdf[:, -1:]
                    chosen = torch.searchsorted(cdf, target).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
                else:
                    chosen = logits.argmax(dim=-1)
                chosen = torch.where(done, torch.full_like(chosen, pad), chosen)
                chosen_steps.append(chosen)
                done = done | (chosen == eos)
                if bool(done.all()):
                    break
                step_ids = chosen.unsqueeze(-1)
                step_pos = step_pos[:, -1:] + 1
                attention = torch.cat(
                    [attention, torch.ones((batch, 1), dtype=attention.dtype, device=self.device)], -1
                )
        # One transfer at the end instead of per-token Python work inside the loop.
        all_tokens = torch.stack(chosen_steps, dim=1).tolist()
        generations = []
        for prompt, row_tokens in zip(prompts, all_tokens, strict=True):
            length = row_tokens.index(eos) + 1 if eos in row_tokens else len(row_tokens)
            generations.append(
                Generation(
                    token_ids=row_tokens[:length],
                    logprobs=self._behaviour_logprobs(prompt, row_tokens[:length], temperature),
                    finish_reason="stop" if row_tokens[length - 1] == eos else "length",
                )
            )
        return generations

    def _behaviour_logprobs(self, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
        """The logprobs of ``tokens`` after ``prompt``, from one forward pass over this episode alone.

        The batched decoding loop's own logprobs depend on which other prompts shared its batch (on CPU a
        matrix product over another batch shape rounds its last bits differently), so an episode replayed
        after a crash in a smaller batch would store other bits. Scored alone, without padding, they are
        a function of the checkpoint, the prompt and the tokens only: GRPO's "old" logprobs, and so the
        checkpoint an update writes, then do not depend on how the rollout was batched.
        """
        ids = torch.tensor([prompt + tokens], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, logits_to_keep=len(tokens) + 1).logits[0, :-1].float()
        if temperature > 0:
            logits = logits / temperature
        picked = torch.tensor(tokens, dtype=torch.long, device=self.device).unsqueeze(-1)
        return torch.log_softmax(logits, dim=-1).gather(-1, picked).squeeze(-1).tolist()

    def _uniforms(self, seeds: list[int] | None, batch: int, max_new_tokens: int) -> Any:
        """One uniform in (0, 1] per (row, token position):
        from each row's own seed, else from the engine's generator."""
        if seeds is None:
            draws = torch.rand((batch, max_new_tokens), generator=self._generator, device=self.device)
        else:
            rows = [torch.rand(max_new_tokens, generator=torch.Generator().manual_seed(int(seed))) for seed in seeds]
            draws = torch.stack(rows).to(self.device)
        return 1.0 - draws
