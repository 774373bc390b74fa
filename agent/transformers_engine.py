"""Generation with Hugging Face transformers, returning the behaviour logprobs GRPO needs.

The engine runs a manual decoding loop over a left-padded batch with a KV cache: it samples from
softmax(logits / temperature) and records the log-probability of each sampled token under that
same distribution, which is what the update stage uses as the behaviour policy. Sampling starts from
each distinct prompt read alone (a task's samples share their first prompt), whose cache the batch
decodes from and the behaviour logprobs are scored on, so those are a function of the checkpoint, the
prompt and the tokens. A prompt is read in fixed pieces from the longest prefix whose cache the engine
still holds (agent/prefix_cache.py): a turn reads only what followed the episode's last message.
Greedy decoding (temperature 0), which evaluation uses and nothing trains on, starts from batched
forward passes and records the chosen token's logprob at temperature 1 from the decoding loop itself.

Sampling is seeded per prompt: ``generate(..., seeds=[...])`` draws every row's uniforms from a
generator of its own seed (one uniform per token position) and picks the token by inverse CDF, so
a row's sample depends only on its prompt, its seed and the weights, never on its batch
neighbours, the batch size or earlier calls. Without seeds the engine's own generator is used.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.attention import use_grouped_attention
from agent.chat import ChatFormat
from agent.engine import Engine, Generation
from agent.prefix_cache import PrefixPass, PrefixStore, cut_points, generation_opener
from coevolve.optional import freeze_long_lived, optional_module

if TYPE_CHECKING:
    from coevolve.config import PipelineConfig

peft = optional_module("peft")
torch = optional_module("torch")
transformers = optional_module("transformers")


def load_policy(model: str | Path) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a local folder or a Hugging Face id, in float32.

    A folder holding only a LoRA adapter is loaded onto its base model and merged, so callers
    always get a plain model. On a CPU it runs grouped-query attention without copying keys and values
    (agent/attention.py).
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
    use_grouped_attention(policy)
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
        return cls(
            checkpoint,
            torch_threads=config.policy.torch_threads,
            seed=config.seed,
            prefill_batch=config.rollout.prefill_batch,
            prefix_cache_mb=config.rollout.prefix_cache_mb,
        )

    def __init__(
        self,
        model_path: str | Path,
        torch_threads: int = 1,
        seed: int = 0,
        prefill_batch: int = 8,
        prefix_cache_mb: int = 256,
    ) -> None:
        torch.set_num_threads(torch_threads)
        self.prefill_batch = prefill_batch
        self.prefixes = PrefixStore(prefix_cache_mb * 2**20)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self.reload(model_path)

    def reload(self, model_path: str | Path) -> None:
        """Switch to another checkpoint (e.g. the one the last update wrote)."""
        self.model_path = Path(model_path) if Path(model_path).exists() else model_path
        self.model, self.tokenizer = load_policy(model_path)
        self.model.to(self.device)
        self.chat = ChatFormat(self.tokenizer)
        self._opener = generation_opener(self.chat)
        self.prefixes.clear()  # caches of the weights before

    def close(self) -> None:
        """Drop the model and, on a GPU, return its memory, so the update stage can train in it."""
        self.model = None
        self.prefixes.clear()
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
        batch = len(prompts)
        sampling = temperature > 0
        uniforms = self._uniforms(seeds, batch, max_new_tokens) if sampling else None
        # Each row's tokens (pad once it stopped) and, greedy, their logprobs; ``rows``: the rows still decoded.
        chosen_tokens = torch.full((batch, max_new_tokens), pad, dtype=torch.long, device=self.device)
        greedy_logprobs = torch.zeros((batch, max_new_tokens), device=self.device)
        rows = torch.arange(batch, device=self.device)
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        steps = 0
        with torch.inference_mode():
            # Sampling starts from each distinct prompt's own forward pass (the behaviour logprobs need it alone);
            # greedy decoding, which nothing trains on, from batched ones.
            prompt_pass = self._prompts_alone(prompts) if sampling else None
            if prompt_pass is not None:
                past, logits, attention = self._batch_cache([prompt_pass[tuple(p)] for p in prompts])
            else:
                past, logits, attention = self._prefill(prompts, pad)
            step_pos = attention.sum(-1, keepdim=True) - 1
            for position in range(max_new_tokens):
                if uniforms is not None:  # sampling (temperature > 0)
                    logprobs = torch.log_softmax(logits / temperature, dim=-1)
                    # Inverse CDF: the first token whose cumulative probability reaches the row's uniform.
                    # Uniforms lie in (0, 1], so a zero-probability token is never chosen.
                    cdf = logprobs.exp().cumsum(dim=-1)
                    target = uniforms[rows, position : position + 1] * cdf[:, -1:]
                    chosen = torch.searchsorted(cdf, target).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
                else:
                    chosen = logits.argmax(dim=-1)
                    picked = torch.log_softmax(logits, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
                    greedy_logprobs[rows, position] = picked
                chosen = torch.where(done, torch.full_like(chosen, pad), chosen)
                chosen_tokens[rows, position] = chosen
                steps = position + 1
                done = done | (chosen == eos)
                if bool(done.all()) or steps == max_new_tokens:
                    break
                if bool(done.any()):
                    # Rows whose message ended leave the batch (and their KV-cache rows): messages vary in length,
                    # and the loop runs until the longest one ends. A row's uniforms and its scored logprobs do
                    # not depend on its neighbours, so the episodes are the same either way.
                    keep = (~done).nonzero().squeeze(-1)
                    past.batch_select_indices(keep)
                    rows, chosen, done, attention, step_pos = (
                        t[keep] for t in (rows, chosen, done, attention, step_pos)
                    )
                step_pos = step_pos + 1
                attention = torch.cat(
                    [attention, torch.ones((len(rows), 1), dtype=attention.dtype, device=self.device)], -1
                )
                out = self.model(
                    input_ids=chosen.unsqueeze(-1),
                    attention_mask=attention,
                    position_ids=step_pos,
                    past_key_values=past,
                    use_cache=True,
                    logits_to_keep=1,
                )
                past = out.past_key_values
                logits = out.logits[:, -1, :].float()
        # One transfer at the end instead of per-token Python work inside the loop.
        all_tokens = chosen_tokens[:, :steps].tolist()
        all_greedy = greedy_logprobs[:, :steps].tolist() if uniforms is None else None
        generations = []
        # Samples of one prompt often draw the same message; its logprobs, a function of prompt and tokens, once.
        scored: dict[tuple[tuple[int, ...], tuple[int, ...]], list[float]] = {}
        for row, (prompt, row_tokens) in enumerate(zip(prompts, all_tokens, strict=True)):
            length = row_tokens.index(eos) + 1 if eos in row_tokens else len(row_tokens)
            tokens = row_tokens[:length]
            if prompt_pass is not None:
                key = (tuple(prompt), tuple(tokens))
                if key not in scored:
                    with torch.inference_mode():
                        scored[key] = self._behaviour_logprobs(prompt, prompt_pass[key[0]], tokens, temperature)
                logprobs = list(scored[key])
            else:
                logprobs = all_greedy[row][:length] if all_greedy is not None else []
            generations.append(
                Generation(
                    token_ids=tokens,
                    logprobs=logprobs,
                    finish_reason="stop" if row_tokens[length - 1] == eos else "length",
                )
            )
        return generations

    def _prompts_alone(self, prompts: list[list[int]]) -> dict[tuple[int, ...], PrefixPass]:
        """Each distinct prompt read alone, without padding (`_read`): its KV cache and last logits.

        A task's group_size samples share their first prompt, so it is read once for all of them. Alone, its
        bits are a function of the checkpoint and the prompt only, whatever batch the prompt came in.
        """
        passes: dict[tuple[int, ...], PrefixPass] = {}
        for prompt in prompts:
            key = tuple(prompt)
            if key not in passes:
                passes[key] = self._read(prompt, len(prompt) - 1)
        return passes

    def _read(self, tokens: list[int], logits_from: int) -> PrefixPass:
        """``tokens`` read in their fixed pieces (agent/prefix_cache.py), from the longest prefix the store holds:
        the whole sequence's KV cache and the logits of positions ``logits_from`` on."""
        # Cut as if the sequence went on: where it ends a piece, its cache is a prefix another read can start from.
        cuts = cut_points([*tokens, -1], self.chat.eos_token_id, self._opener)
        ends_a_piece = cuts[-1:] == [len(tokens)]
        cuts = cuts[:-1] if ends_a_piece else cuts
        start, keys, values = 0, None, None
        for cut in reversed(cuts):
            found = self.prefixes.get(tuple(tokens[:cut]))
            if found is not None:
                (keys, values), start = found, cut
                break
        logits = []
        for end in [c for c in cuts if c > start] + [len(tokens)]:
            cache = transformers.DynamicCache(config=self.model.config)
            for layer, (layer_keys, layer_values) in enumerate(zip(keys or [], values or [], strict=True)):
                cache.update(layer_keys, layer_values, layer)
            keep = end - max(start, logits_from)
            out = self.model(
                input_ids=torch.tensor([tokens[start:end]], dtype=torch.long, device=self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=max(keep, 1),  # 0 would keep every position
            )
            if keep > 0:
                logits.append(out.logits[0, -keep:].float())
            keys = [layer.keys for layer in out.past_key_values.layers]
            values = [layer.values for layer in out.past_key_values.layers]
            if end < len(tokens) or ends_a_piece:
                self.prefixes.put(tuple(tokens[:end]), keys, values)
            start = end
        return PrefixPass(keys=keys or [], values=values or [], logits=torch.cat(logits))

    def _batch_cache(self, rows: list[PrefixPass]) -> tuple[Any, Any, Any]:
        """The left-padded batch of the rows' own prompt passes: KV cache, last logits and attention mask."""
        width = max(row.keys[0].shape[-2] for row in rows)
        attention = torch.zeros((len(rows), width), dtype=torch.long, device=self.device)
        for i, row in enumerate(rows):
            attention[i, width - row.keys[0].shape[-2] :] = 1
        cache = transformers.DynamicCache(config=self.model.config)
        for layer in range(len(rows[0].keys)):
            keys = [
                torch.nn.functional.pad(row.keys[layer], (0, 0, width - row.keys[layer].shape[-2], 0)) for row in rows
            ]
            values = [
                torch.nn.functional.pad(row.values[layer], (0, 0, width - row.values[layer].shape[-2], 0))
                for row in rows
            ]
            cache.update(torch.cat(keys), torch.cat(values), layer)
        return cache, torch.stack([row.logits[-1] for row in rows]), attention

    def _prefill(self, prompts: list[list[int]], pad: int) -> tuple[Any, Any, Any]:
        """The left-padded batch's forward pass, in slices of ``prefill_batch`` rows: KV cache, last logits, mask.

        Padded prompts' activations of a whole batch of 64 outgrow the CPU's caches; slices of 8 rows took the
        shipped checkpoint's prefill of 48 prompts from 0.41 s to 0.23 s here (benchmarks/STEP.md).
        """
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        # Left padding shifts real tokens right; positions must count real tokens only.
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        keys: list[list[Any]] = []
        values: list[list[Any]] = []
        logits = []
        for start in range(0, len(prompts), self.prefill_batch):
            rows = slice(start, start + self.prefill_batch)
            out = self.model(
                input_ids=input_ids[rows],
                attention_mask=attention[rows],
                position_ids=positions[rows],
                use_cache=True,
                logits_to_keep=1,
            )
            logits.append(out.logits[:, -1, :].float())
            for layer, cached in enumerate(out.past_key_values.layers):
                if layer == len(keys):
                    keys.append([])
                    values.append([])
                keys[layer].append(cached.keys)
                values[layer].append(cached.values)
        cache = transformers.DynamicCache(config=self.model.config)
        for layer in range(len(keys)):
            cache.update(torch.cat(keys[layer]), torch.cat(values[layer]), layer)
        return cache, torch.cat(logits), attention

    def _behaviour_logprobs(
        self, prompt: list[int], prompt_pass: PrefixPass, tokens: list[int], temperature: float
    ) -> list[float]:
        """The logprobs of ``tokens`` after the prompt: the prompt's last logits, then a read of the prompt and
        the tokens (`_read`, which starts from the prompt's cache).

        The batched decoding loop's own logprobs depend on which other prompts shared its batch (on CPU a
        matrix product over another batch shape rounds its last bits differently), so an episode replayed
        after a crash in a smaller batch would store other bits. Read alone, without padding, in fixed pieces,
        they are a function of the checkpoint, the prompt and the tokens only: GRPO's "old" logprobs, and so the
        checkpoint an update writes, then do not depend on how the rollout was batched. The read also leaves the
        prompt and message's cache in the store for the episode's next turn.
        """
        logits = prompt_pass.logits[-1:]
        read = self._read([*prompt, *tokens], len(prompt))
        logits = torch.cat([logits, read.logits[: len(tokens) - 1]])
        picked = torch.tensor(tokens, dtype=torch.long, device=self.device).unsqueeze(-1)
        return torch.log_softmax(logits / temperature, dim=-1).gather(-1, picked).squeeze(-1).tolist()

    def _uniforms(self, seeds: list[int] | None, batch: int, max_new_tokens: int) -> Any:
        """One uniform in (0, 1] per (row, token position):
        from each row's own seed, else from the engine's generator."""
        if seeds is None:
            draws = torch.rand((batch, max_new_tokens), generator=self._generator, device=self.device)
        else:
            rows = [torch.rand(max_new_tokens, generator=torch.Generator().manual_seed(int(seed))) for seed in seeds]
            draws = torch.stack(rows).to(self.device)
        return 1.0 - draws
