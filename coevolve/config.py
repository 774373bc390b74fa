"""The one typed configuration of the pipeline, and the only place defaults live.

Defaults are the embedded run: a 2-core laptop, no GPU, no network, three rounds in minutes.
Where that differs from the paper (arXiv 2604.15840), the comment gives the paper's value;
`configs/paper.yaml` sets all of them back for a GPU machine.

Sources, later ones winning, layered by pydantic-settings in `load_config`: defaults < YAML file
(``--config``) < environment variables (``COEVOLVE_<SECTION>__<FIELD>``, e.g.
``COEVOLVE_ROLLOUT__GROUP_SIZE=8``; list values as JSON) < CLI overrides (``--set rollout.group_size=8``).
A loaded configuration is a plain `PipelineConfig`: `PipelineConfig.with_overrides` and the flows
never read the environment again, so overrides given in code (an ablation arm's) always win.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, InitSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from coevolve.errors import ConfigError


class _Section(BaseModel):
    # A typo in a field name must fail loudly instead of silently using a default.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EnvironmentConfig(_Section):
    name: Literal["bfcl"] = Field("bfcl", description="Environment the agent plays. BFCL v3 multi-turn runs offline.")
    max_steps: int = Field(30, ge=1, description="Model messages per episode before it counts as a failure (paper: 30).")
    max_steps_per_turn: int = Field(4, ge=1, description="Model messages per user turn; a turn ends when the model calls no tool.")
    max_observation_chars: int = Field(
        80,
        ge=16,
        description=(
            "Tool results longer than this are cut in the prompt. Short for the builtin tiny model: results are most "
            "of its tokens and it only needs to see that the calls ran (paper-scale configs raise it)."
        ),
    )


    tool_list: Literal["described", "signatures", "names"] = Field(
        "names",
        description=(
            "How the system prompt lists tools: with signatures and descriptions, signatures only, or bare names. "
            "Bare names for the builtin tiny model: its prompts get about 5x shorter, so SFT and rollouts run several "
            "times faster and it learns arguments from demonstrations; 'described' for real LLMs (configs/paper.yaml)."
        ),
    )
    prompt_style: Literal["compact", "bfcl"] = Field(
        "compact",
        description=(
            "How tools, calls and results are written in the policy's prompts. 'compact': the project's short prompt "
            "(tool_list, one python call list per message, cut results), which the builtin tiny model is trained on. "
            "'bfcl': exactly what bfcl-eval sends the model family bfcl_handler names (its system prompt or chat "
            "template, tool-call syntax, full results, the miss_func reveal turn and its 20-step turn limit), so a "
            "policy trains in the format its BFCL score is measured in and scores compare with published ones."
        ),
    )
    bfcl_handler: Literal["qwen_fc", "qwen", "llama_3_1", "chat"] | None = Field(
        None,
        description=(
            "bfcl-eval handler family for prompt_style 'bfcl': 'qwen_fc' (Qwen's template, tools in <tools>, calls in "
            "<tool_call> blocks), 'qwen' (Qwen prompting: bfcl's system prompt, python call lists), 'llama_3_1' "
            "(Llama 3.1 JSON calls, tools in the first user message), 'chat' (bfcl's prompting message list rendered "
            "with the model's own chat template). Unset: derived from policy.model where the name leaves one choice "
            "(coevolve.config.derive_bfcl_handler)."
        ),
    )


class PolicyConfig(_Section):
    model: str = Field(
        "builtin:tiny",
        description=(
            "'builtin:tiny' builds a 2M-parameter Qwen3 offline (tokenizer + SFT on seed demonstrations, never on "
            "held-out tasks); otherwise a Hugging Face model id or a local path, loaded the same way."
        ),
    )
    sft_tasks: int = Field(
        4000,
        ge=1,
        description=(
            "Demonstrations the builtin tiny model is fine-tuned on: single-turn tasks from the unguided explorer with "
            "sft_min_calls to sft_max_calls calls, a different distribution from the multi-turn target tasks (D_0, dev, "
            "held-out), so checkpoint 0 knows the format and the tools but has never seen a target task."
        ),
    )
    sft_min_calls: int = Field(1, ge=1, description="Fewest calls of a demonstration task of the builtin tiny model.")
    sft_max_calls: int = Field(
        2,
        ge=1,
        description=(
            "Most calls of a demonstration task: at most 2 in one turn, so the target's longer jobs spread over several "
            "user turns are new to checkpoint 0 and left for the loop to teach."
        ),
    )
    sft_joint_calls: float = Field(
        0.25,
        ge=0,
        le=1,
        description=(
            "Share of the demonstrations that ask for their calls in one request; the others ask for each call in a turn "
            "of its own. Low, so two calls in one request, which most target turns ask for, is the skill checkpoint 0 "
            "has least of and the loop can teach."
        ),
    )
    sft_steps: int = Field(800, ge=0, description="SFT steps for 'builtin:tiny': about 6 minutes here, partial skill so rounds have signal.")
    sft_learning_rate: float = Field(6e-3, gt=0, description="Tiny random-init models need a large rate (6e-3 beat 3e-3 at equal steps).")
    sft_batch_size: int = Field(16, ge=1, description="Demonstrations per SFT step.")
    hidden_size: int = Field(128, ge=16, description="Width of the builtin tiny model.")
    num_layers: int = Field(2, ge=1, description="Depth of the builtin tiny model: 2 layers train twice as fast as 4 at similar skill.")
    vocab_size: int = Field(2048, ge=300, description="Byte-level BPE vocabulary trained on the demonstrations' text.")
    torch_threads: int = Field(1, ge=1, description="CPU threads for torch: one is fastest for tiny models on shared cores.")
    cpu_kernels: Literal["avx2", "native"] = Field(
        "avx2",
        description=(
            "Vector code paths of torch, MKL and oneDNN on x86 CPUs. The same build of checkpoint 0 differs in its "
            "bytes between AVX2 and AVX-512 kernels, so 'avx2' pins all three (ATEN_CPU_CAPABILITY, MKL_CBWR, "
            "ONEDNN_MAX_CPU_ISA) and a seed gives the same run on machines with either; 'native' lets each CPU use "
            "its fastest. Applied by the CLI before torch loads; GPUs are unaffected."
        ),
    )


class RolloutConfig(_Section):
    engine: Literal["transformers", "vllm", "openai"] = Field(
        "transformers",
        description=(
            "Generation backend. 'transformers' runs anywhere; 'vllm' runs vllm.LLM in-process (GPU machines with the "
            "vllm extra, or the CPU build in .venv-vllm); 'openai' sends token-id prompts to an OpenAI-compatible "
            "vLLM server at base_url (start it with --logprobs-mode processed_logprobs)."
        ),
    )
    base_url: str | None = Field(
        None, description="Server URL for engine 'openai', e.g. http://127.0.0.1:8000/v1 (required for that engine)."
    )
    served_model: str | None = Field(
        None,
        description=(
            "Model name on the 'openai' server; None sends the round's checkpoint path, which is the name vLLM serves a "
            "folder under, so a server restarted on each checkpoint needs no setting."
        ),
    )
    api_key_env: str = Field(
        "COEVOLVE_OPENAI_API_KEY",
        description="Environment variable holding the 'openai' server's API key, so keys never sit in config files; unset sends none.",
    )
    request_timeout_s: float = Field(300.0, gt=0, description="Seconds one 'openai' completion may take: long messages on a busy server.")
    request_retries: int = Field(3, ge=0, description="Retries of a failed 'openai' request (connection, timeout, 5xx) before the stage fails.")
    concurrency: int = Field(32, ge=1, description="Requests in flight to each 'openai' server, so its continuous batching sees the batch.")
    logprob_tolerance: float | None = Field(
        0.05,
        ge=0,
        description=(
            "Engine 'openai' compares its first sampled batch's logprobs with a local forward pass of the checkpoint and "
            "stops when the mean absolute difference per token exceeds this: a server without --logprobs-mode "
            "processed_logprobs returns untempered logprobs, which silently bias GRPO's importance ratios. A float32 "
            "server agrees within 1e-3; a server in lower precision than the local float32 pass may need more. None "
            "skips the check (e.g. a checkpoint too large to load on the machine running the rollout stage)."
        ),
    )
    vllm_dtype: str = Field("auto", description="Weights dtype of vLLM engines and servers; 'auto' keeps a local checkpoint's saved dtype.")
    vllm_gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="GPU memory share of engine 'vllm': half leaves room for the update stage's trainer."
    )
    vllm_max_model_len: int | None = Field(None, ge=16, description="Context length of engine 'vllm'; None uses the model's.")
    vllm_tensor_parallel_size: int = Field(
        1, ge=1, description="GPUs one vLLM engine (in-process or `coevolve serve`) shards a model over: for models one GPU cannot hold."
    )
    vllm_data_parallel_size: int = Field(
        1, ge=1, description="Model replicas of one vLLM engine (in-process or `coevolve serve`): more rollout throughput per machine."
    )
    base_urls: list[str] = Field(
        default_factory=list,
        description=(
            "Fleet of OpenAI-compatible servers for engine 'openai'; requests spread across them and a server that "
            "fails mid-round has its requests retried on the others. base_url alone is a one-server fleet."
        ),
    )
    control_timeout_s: float = Field(
        30.0, gt=0, description="Seconds a health check or weight-push call to a server may take, so a hung server cannot stall a stage."
    )
    weight_sync: Literal["auto", "lora", "reload", "off", "restart"] = Field(
        "auto",
        description=(
            "How engine 'openai' gets each round's weights onto its servers: 'lora' loads the round's adapter "
            "(training.use_lora; servers started on checkpoint 0 with --enable-lora), 'reload' reloads the checkpoint in "
            "place (servers with VLLM_SERVER_DEV_MODE=1), 'off' asks for the checkpoint by name (servers restarted on "
            "each checkpoint by someone else), 'restart' starts the pipeline's own servers on each stage's checkpoint "
            "(managed_servers > 0; for vLLM builds that cannot reload in place). 'auto' is 'lora' with use_lora, else "
            "'restart' with managed servers, else 'reload' where the servers allow it, else 'off'."
        ),
    )
    managed_servers: int = Field(
        0,
        ge=0,
        description=(
            "Rollout servers the pipeline starts itself (`coevolve serve`, on 127.0.0.1) on each rollout or evaluation "
            "stage's checkpoint and stops when the stage releases its engine, so no server holds memory while the "
            "update trains. The fallback where servers cannot take weights in place (a vLLM without reload_weights, or "
            "a checkpoint that changed tied embeddings on servers not started by coevolve serve): costs one server start "
            "per stage. 0: use base_url(s)."
        ),
    )
    managed_port: int = Field(
        8100,
        ge=1024,
        le=65535,
        description=(
            "Port of the first managed server; the following ones take the next ports, and a port already taken is "
            "replaced by a free one, so a stale server or another run cannot block a stage."
        ),
    )
    server_max_lora_rank: int = Field(
        64,
        ge=1,
        description=(
            "--max-lora-rank of `coevolve serve` with use_lora: each round's adapter is trained on the previous merged "
            "checkpoint, so a server on checkpoint 0 serves round r as the stack of r adapters (rank r x lora_rank)."
        ),
    )
    server_max_loras: int = Field(2, ge=1, description="--max-loras of `coevolve serve`: the round's adapter and the one being replaced.")
    tasks_per_round: int = Field(
        24, ge=1, description="Tasks drawn from the pool per round (paper: 32 per step); with 24, 6-7 groups a round have reward variance."
    )
    group_size: int = Field(6, ge=2, description="Samples per task, the GRPO group n (paper: 8). At least 2 for an advantage.")
    temperature: float = Field(0.9, ge=0, description="Sampling temperature of training rollouts (paper: 0.9).")
    eval_temperature: float = Field(0.0, ge=0, description="Evaluation decoding; 0 is greedy (paper: greedy).")
    max_new_tokens: int = Field(96, ge=8, description="Tokens per model message (paper: 4096 per response).")
    heldout_tasks: int = Field(
        100, ge=0, description="Held-out synthetic tasks scored greedily after each round; 100 resolves about 0.04 (one sd 0.03 at 10%)."
    )
    final_heldout_tasks: int = Field(
        0,
        ge=0,
        description=(
            "Size of the final held-out split (tasks/splits.build_final_heldout): frozen at round 0, refused by validation, "
            "and scored by the ablation only on checkpoint 0 (once) and each run's final checkpoint, where its power is "
            "needed; 0 leaves it out. configs/ablation.yaml sets 500 (one sd about 0.018 at 0.2, against 0.04 on 100)."
        ),
    )
    checkpoint0_scores_from: str | None = Field(
        None,
        description=(
            "Run id whose round-0 scores of checkpoint 0 (held-out and dev rows) this run copies instead of scoring it "
            "again, when that run's checkpoint 0 has the same digest and its rows cover the same tasks; the ablation sets "
            "it to its first run for every other run, whose evaluation settings are the same, so checkpoint 0 is scored once."
        ),
    )
    dev_eval_tasks: int = Field(
        0,
        ge=0,
        description=(
            "Dev tasks (the first N of tasks/splits.build_dev_split) each round's checkpoint, and checkpoint 0, are also "
            "scored on greedily, for the report's dev curve; 0 skips it, so a round costs one evaluation."
        ),
    )
    generate_batch: int = Field(
        64,
        ge=1,
        description=(
            "Episodes per generate call; one call's environment steps run while the next call generates. 64 bounds "
            "transformers' padded batch memory on a CPU; vLLM schedules its own batches, so raise it there."
        ),
    )

    @model_validator(mode="after")
    def _check_engine(self) -> RolloutConfig:
        if self.managed_servers > 0:
            if self.engine != "openai":
                raise ValueError(
                    f"rollout.managed_servers={self.managed_servers} starts servers for engine 'openai', but rollout.engine "
                    f"is {self.engine!r}; set rollout.engine=openai or rollout.managed_servers=0."
                )
            if self.base_url or self.base_urls:
                raise ValueError(
                    f"rollout.managed_servers={self.managed_servers} starts the pipeline's own servers, so rollout.base_url "
                    "and rollout.base_urls must be empty; remove them to use managed servers, or set "
                    "rollout.managed_servers=0 to use the servers at those URLs."
                )
        elif self.weight_sync == "restart":
            raise ValueError(
                "rollout.weight_sync=restart restarts servers the pipeline starts itself, but rollout.managed_servers is 0; "
                "set rollout.managed_servers=1 (or more), or choose weight_sync auto, lora, reload or off for servers "
                "at rollout.base_url(s)."
            )
        if self.engine == "openai" and not self.base_url and not self.base_urls and self.managed_servers == 0:
            raise ValueError(
                "rollout.engine is 'openai' but rollout.base_url is not set; give the server URL, e.g. "
                "http://127.0.0.1:8000/v1, or let the pipeline start its own servers with rollout.managed_servers=1."
            )
        return self


class SignalConfig(_Section):
    enabled: list[Literal["forgetting", "boundary", "rare"]] = Field(
        ["forgetting", "boundary", "rare"], description="Signals to mine; leave one out for an ablation."
    )
    forgetting_window: int = Field(10, ge=1, description="W: past scores per task; the paper gives no value.")
    rare_theta: float = Field(5.0, gt=0, lt=100, description="A pattern is rare below theta percent of trajectories (paper: 5).")
    rare_min_total: int = Field(20, ge=1, description="N_min: trajectories seen before rarity is judged.")
    pattern: Literal["tool_sequence", "tool_bigrams"] = Field(
        "tool_sequence", description="Action pattern of a trajectory: its tool-name sequence, or its tool-name bigrams."
    )
    max_signals_per_round: int = Field(24, ge=1, description="Signals passed to synthesis per round, kinds interleaved.")


class SynthesisConfig(_Section):
    mode: Literal["signal", "random", "off"] = Field(
        "signal",
        description=(
            "'signal' explores where signals point; 'random' draws the same number of targets uniformly (the control); "
            "'off' keeps the seed pool static (GRPO on D_0 alone, the paper's baseline)."
        ),
    )
    synthesizer: Literal["programmatic", "llm"] = Field(
        "programmatic",
        description=(
            "'programmatic' needs no LLM (the offline default); 'llm' has a chat model on an OpenAI-compatible endpoint "
            "write the contexts, propose each exploration call and write the queries, as in the paper."
        ),
    )
    llm_base_url: str = Field(
        "http://127.0.0.1:8000/v1",
        description="OpenAI-compatible API root (ending in /v1) of the LLM synthesizer and the LLM judge; a local vLLM server by default.",
    )
    llm_model: str = Field("", description="Model name sent to the endpoint; required when synthesizer is 'llm' or the judge is on.")
    llm_api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="Name of the environment variable holding the endpoint's API key, so no secret lives in a config file; unset sends none.",
    )
    llm_temperature: float = Field(0.7, ge=0, description="Sampling temperature of synthesis calls: some variety across exploration runs.")
    llm_max_tokens: int = Field(384, ge=16, description="Tokens per LLM reply; contexts and single calls are short.")
    llm_timeout_s: float = Field(120.0, gt=0, description="Seconds per LLM request before it counts as an infrastructure failure.")
    explorations_per_signal: int = Field(2, ge=1, description="Independent exploration runs per signal (multi-round).")
    steps_per_exploration: int = Field(5, ge=1, description="Environment steps per exploration run (multi-step).")
    min_task_steps: int = Field(3, ge=1, description="Minimal reference length of a synthesized task (paper: 3).")
    max_task_steps: int = Field(5, ge=1, description="Longest reference kept, so the policy can fit it in one message.")


class ValidationConfig(_Section):
    llm_judge: bool = Field(
        False,
        description=(
            "Also ask an LLM (synthesis.llm_* endpoint) to judge each replayed candidate on the paper's five criteria; "
            "off by default because the embedded run has no LLM endpoint."
        ),
    )
    embedding_dedupe: bool = Field(
        False,
        description=(
            "Reject candidates whose query is too similar to a pool task's (all-MiniLM-L6-v2 embeddings, optional extra "
            "'similarity'); off by default: exact and normalized action-sequence dedupe already runs."
        ),
    )
    similarity_threshold: float = Field(
        0.95, gt=0, le=1, description="Cosine similarity at or above which a candidate's query counts as a near-duplicate."
    )


class PoolConfig(_Section):
    seed_size: int = Field(100, ge=1, description="Tasks of D_0 from unguided exploration (paper: 100).")
    calls_per_turn: int | None = Field(
        2,
        ge=1,
        description=(
            "The target distribution: D_0, the dev and held-out splits and every synthesized task ask for 3-5 calls "
            "spread over user turns of at most this many calls (2: two or three turns), as the official multi-turn "
            "entries spread a job over several requests. None makes single-turn tasks."
        ),
    )
    policy: Literal["append", "dedupe"] = Field("append", description="How validated tasks join the pool; the paper appends.")
    max_size: int | None = Field(None, ge=1, description="Cap on the pool; None keeps every task (the paper).")
    seed: int | None = Field(
        None,
        description=(
            "Seeds the seed pool, the held-out split and the builtin policy; None uses the run's seed. An ablation fixes "
            "it so every arm and every loop seed starts from the same pool and checkpoint 0."
        ),
    )


class TrainingConfig(_Section):
    learning_rate: float = Field(
        5e-4,
        gt=0,
        description=(
            "AdamW rate (paper: 1e-6 for 4B-30B models; tiny models need more). With 4 steps a round, 1e-3 made the "
            "builtin policy collapse within 5 rounds and 2e-3 within 1; 5e-4 stayed stable."
        ),
    )
    steps_per_round: int = Field(4, ge=1, description="Optimizer steps on each round's groups (paper: F=10 steps per round).")
    epsilon_low: float = Field(0.20, ge=0, description="Lower clip range (paper: 0.20).")
    epsilon_high: float = Field(0.28, ge=0, description="Upper clip range (paper: 0.28).")
    beta: float = Field(1e-3, ge=0, description="KL coefficient (paper: 1e-3).")
    kl_reference: Literal["initial", "round"] = Field(
        "initial",
        description=(
            "Policy the KL penalty (beta) is taken against. 'initial' is checkpoint 0 for every round: the paper "
            "penalizes KL (1e-3) to the initial policy over a whole run of 120 steps. 'round' is the round's input "
            "checkpoint, which makes beta a per-round trust region that no longer bounds the drift from checkpoint 0. "
            "With use_lora, 'initial' keeps checkpoint 0 as a separate reference model in memory (one more copy of the "
            "weights), while 'round' uses the adapter-disabled model, which is the round's input because every "
            "round's adapter is merged into the next checkpoint."
        ),
    )
    use_lora: bool = Field(False, description="Train a LoRA adapter (large models) instead of full weights.")
    lora_rank: int = Field(16, ge=1, description="LoRA rank when use_lora is on.")
    num_processes: int = Field(
        1,
        ge=1,
        description=(
            "Training processes (ranks) of the update stage. Above 1 the stage launches its own process group "
            "(torchrun unless 'launcher' names another) and each rank trains on whole groups, never part of one; "
            "when the round's groups do not divide evenly, the largest process count that divides them is used."
        ),
    )
    launcher: Literal["none", "torchrun", "accelerate"] = Field(
        "none",
        description=(
            "How the update stage runs: 'none' trains inside the stage's process (num_processes 1) or under torchrun "
            "(more); 'torchrun' always launches 'torchrun --standalone' (gloo ranks on CPU, NCCL on GPUs); "
            "'accelerate' runs 'accelerate launch --config_file accelerate_config' for DDP, DeepSpeed or FSDP."
        ),
    )
    accelerate_config: Path | None = Field(
        None,
        description=(
            "Accelerate config file for launcher 'accelerate' (deployments/accelerate/ ships DDP, DeepSpeed ZeRO-3 "
            "and FSDP2 ones); num_processes overrides the file's process count so the groups divide evenly."
        ),
    )


class TrackingConfig(_Section):
    mlflow_uri: str | None = Field(
        None,
        description=(
            "MLflow tracking URI; None uses SQLite under state_dir. With a tracking server (`mlflow server "
            "--backend-store-uri sqlite:///... --serve-artifacts --host 127.0.0.1`), http://HOST:PORT: artifacts go "
            "through the server, so workers need no shared artifact folder."
        ),
    )
    register_checkpoints: Literal["copy", "uri"] = Field(
        "copy",
        description=(
            "How each round's checkpoint becomes a model version: 'copy' logs the checkpoint folder as artifacts "
            "(self-contained; a 4B model copies about 8 GB a round), 'uri' registers the folder where it already is "
            "(state_dir on shared storage), copying nothing; the folder must then be kept. 'uri' needs a store this "
            "process opens (SQLite): a tracking server refuses local folders as version sources."
        ),
    )
    experiment: str = Field("coevolve", description="MLflow experiment name.")
    registered_model: str = Field(
        "coevolve-policy",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description=(
            "Prefix of the registry names. Each run registers its own model, '<prefix>-<run_id>', one version per "
            "round, so its aliases 'current' and 'best' rank that run's versions only (an ablation's arms and seeds "
            "never share them)."
        ),
    )


class WarehouseConfig(_Section):
    uri: str | None = Field(
        None,
        description=(
            "Where the warehouse's table files and records live: a folder, or s3://bucket/prefix (fsspec with s3fs: "
            "pip install -e '.[s3]'; the bucket must exist). None keeps them under state_dir/warehouse. Every machine "
            "that runs a stage must see the same place; checkpoints, pool snapshots and MLflow stay under state_dir."
        ),
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "fsspec options for uri (for s3://, s3fs.S3FileSystem's arguments), e.g. {'endpoint_url': "
            "'http://127.0.0.1:9000'} for an S3-compatible server (MinIO, moto), {'client_kwargs': {'region_name': "
            "'eu-west-1'}} for a region. Credentials are better left to the usual AWS_* variables (or key/secret here "
            "only in a private file). Listings are never cached (use_listings_cache defaults to False for URLs), so "
            "every reader sees files other processes wrote since."
        ),
    )
    flush_every: int = Field(
        64,
        ge=1,
        description=(
            "Finished episodes the rollout stage collects before writing them: a failure late in the stage loses "
            "at most this many, and a resumed stage plays only the episodes not yet stored. Each batch is two "
            "files made durable (fsync), about 5 ms each here, so much smaller batches slow writes and leave "
            "many small files (benchmarks/README.md, warehouse)."
        ),
    )


class PlacementConfig(_Section):
    """Where each stage of a round runs: 'inline' in the round's process, or a deployment on a work pool."""

    rollout: str = Field("inline", description="'inline', or the deployment that runs the stage, e.g. 'coevolve-stage/rollout-gpu'.")
    mine: str = Field("inline", description="'inline', or a deployment such as 'coevolve-stage/mine-cpu'.")
    synthesize: str = Field("inline", description="'inline', or a deployment such as 'coevolve-stage/synthesize-cpu'.")
    validate_: str = Field(
        "inline", alias="validate", description="'inline', or a deployment such as 'coevolve-stage/validate-cpu'."
    )
    update: str = Field("inline", description="'inline', or a deployment such as 'coevolve-stage/update-gpu'.")
    evaluate: str = Field("inline", description="'inline', or a deployment such as 'coevolve-stage/evaluate-gpu'.")
    stage_timeout_s: float = Field(
        6 * 3600.0, gt=0, description="Seconds the round waits for a deployed stage before failing it (a 4B update can take hours)."
    )
    round_concurrency: Literal["wait", "fail"] = Field(
        "wait",
        description=(
            "A second round of the same run started while one runs (on any machine that shares the Prefect server): "
            "'wait' until the first finishes (up to round_wait_s), or 'fail' at once naming the run."
        ),
    )
    round_wait_s: float = Field(
        24 * 3600.0, gt=0, description="Seconds a waiting round waits for the run's slot before it fails."
    )

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, serialize_by_alias=True)

    @field_validator("rollout", "mine", "synthesize", "validate_", "update", "evaluate")
    @classmethod
    def _deployment_name(cls, value: str) -> str:
        if value != "inline" and value.count("/") != 1:
            raise ValueError(
                f"{value!r} is neither 'inline' nor a deployment name '<flow>/<deployment>'; e.g. "
                "'coevolve-stage/rollout-gpu' (prefect.yaml defines one per placeable stage)."
            )
        return value

    def target(self, stage: str) -> str:
        """'inline' or the deployment of ``stage``."""
        return getattr(self, "validate_" if stage == "validate" else stage)


def derive_bfcl_handler(model: str) -> str | None:
    """The bfcl-eval handler family a model name leaves no choice about, or None.

    bfcl-eval scores Qwen models both ways (function calling and prompting) and most families in
    several handlers, so only names that say which one are derived: a Qwen name ending in ``-FC``
    and Llama 3.1 to 3.3 (whose bfcl handler is LlamaHandler_3_1).
    """
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if "qwen" in name and name.endswith("-fc"):
        return "qwen_fc"
    if re.search(r"llama-?3\.[123]", name):
        return "llama_3_1"
    return None


class PipelineConfig(_Section):
    run_id: str = Field("default", pattern=r"^[A-Za-z0-9_.-]+$", description="Names a run; rounds of one run share a pool.")
    state_dir: Path = Field(
        Path(".coevolve"),
        description=(
            "Holds the warehouse, MLflow store, checkpoints, pool snapshots. Made absolute when the configuration "
            "loads, so recorded checkpoint paths never depend on the working directory (a relative path that went "
            "missing would otherwise look like a hub model id)."
        ),
    )
    seed: int = Field(0, description="Seeds exploration, sampling and training.")
    rounds: int = Field(3, ge=1, description="Rounds the evolve command runs.")
    # Two: a round's torch work uses one thread (policy.torch_threads), so one seed's chain of runs keeps one
    # core busy, and two chains at once fill the 2-core machine this default is for. More than the cores
    # only makes the chains take turns. Never changes a result: each seed's runs are the same either way.
    ablation_workers: int = Field(
        2, ge=1, description="Seeds whose runs the ablation command plays at the same time, each in its own process."
    )
    environment: EnvironmentConfig = EnvironmentConfig()
    policy: PolicyConfig = PolicyConfig()
    rollout: RolloutConfig = RolloutConfig()
    signals: SignalConfig = SignalConfig()
    synthesis: SynthesisConfig = SynthesisConfig()
    validation: ValidationConfig = ValidationConfig()
    pool: PoolConfig = PoolConfig()
    training: TrainingConfig = TrainingConfig()
    tracking: TrackingConfig = TrackingConfig()
    warehouse: WarehouseConfig = WarehouseConfig()
    placement: PlacementConfig = PlacementConfig()

    @field_validator("state_dir", mode="after")
    @classmethod
    def _absolute_state_dir(cls, value: Path) -> Path:
        return Path(os.path.abspath(value.expanduser()))

    @model_validator(mode="after")
    def _check_ranges(self) -> PipelineConfig:
        env = self.environment
        if env.prompt_style == "bfcl" and self.policy.model == "builtin:tiny":
            raise ValueError(
                "environment.prompt_style 'bfcl' needs a pretrained model: builtin:tiny is fine-tuned on demonstrations "
                "in the compact prompt and only knows that one. Keep prompt_style compact, or set policy.model to a "
                "Hugging Face id or local path (and environment.bfcl_handler)."
            )
        if env.prompt_style == "bfcl" and env.bfcl_handler is None:
            derived = derive_bfcl_handler(self.policy.model)
            if derived is None:
                raise ValueError(
                    f"environment.prompt_style is 'bfcl' but the bfcl-eval handler of {self.policy.model!r} cannot be "
                    "told from its name; set environment.bfcl_handler to qwen_fc (Qwen function calling), qwen (Qwen "
                    "prompting), llama_3_1 (Llama 3.1-3.3) or chat (bfcl's prompting messages in the model's own chat "
                    "template)."
                )
            # Filled in once so every stage (rollout, evaluation, synthesis) reads the same handler.
            self.__dict__["environment"] = env.model_copy(update={"bfcl_handler": derived})
        if self.synthesis.max_task_steps < self.synthesis.min_task_steps:
            raise ValueError(
                f"synthesis.max_task_steps ({self.synthesis.max_task_steps}) is below synthesis.min_task_steps "
                f"({self.synthesis.min_task_steps}); raise max_task_steps or lower min_task_steps."
            )
        if self.policy.sft_max_calls < self.policy.sft_min_calls:
            raise ValueError(
                f"policy.sft_max_calls ({self.policy.sft_max_calls}) is below policy.sft_min_calls "
                f"({self.policy.sft_min_calls}); raise sft_max_calls or lower sft_min_calls."
            )
        server = (self.tracking.mlflow_uri or "").startswith(("http://", "https://"))
        if self.tracking.register_checkpoints == "uri" and server:
            raise ValueError(
                f"tracking.register_checkpoints='uri' cannot be used with the MLflow tracking server "
                f"{self.tracking.mlflow_uri}: a server refuses to register a local checkpoint folder (a file:// source "
                "outside the run's artifacts). Use tracking.register_checkpoints=copy, or a store of your own "
                "(tracking.mlflow_uri unset, or sqlite:///<shared path>) to register the folder where it is."
            )
        needs_llm = self.synthesis.synthesizer == "llm" or self.validation.llm_judge
        if needs_llm and not self.synthesis.llm_model:
            raise ValueError(
                "synthesis.llm_model is empty but synthesis.synthesizer is 'llm' or validation.llm_judge is on; "
                "set synthesis.llm_model to the endpoint's model name (and synthesis.llm_base_url to its /v1 root)."
            )
        return self

    @property
    def start_seed(self) -> int:
        """The seed of everything round 0 builds: seed pool, held-out split, checkpoint 0."""
        return self.seed if self.pool.seed is None else self.pool.seed

    # Paths derived from state_dir, so one setting moves every store.
    @property
    def warehouse_path(self) -> Path | str:
        """The warehouse root: ``warehouse.uri``, else the folder ``state_dir/warehouse``."""
        return self.warehouse.uri or self.state_dir / "warehouse"

    @property
    def mlflow_tracking_uri(self) -> str:
        return self.tracking.mlflow_uri or f"sqlite:///{(self.state_dir / 'mlflow.db').resolve()}"

    @property
    def registered_model_name(self) -> str:
        """The run's own registered model: ``<tracking.registered_model>-<run_id>``."""
        return f"{self.tracking.registered_model}-{self.run_id}"

    @property
    def artifacts_dir(self) -> Path:
        return self.state_dir / "mlartifacts"

    def run_dir(self) -> Path:
        return self.state_dir / "runs" / self.run_id

    def checkpoint_dir(self, round_: int) -> Path:
        return self.run_dir() / "checkpoints" / f"round-{round_:03d}"

    def pool_path(self, round_: int) -> Path:
        return self.run_dir() / "pools" / f"pool-{round_:03d}.parquet"

    def with_overrides(self, overrides: dict[str, Any]) -> PipelineConfig:
        """This configuration with ``overrides`` applied: values given in code win, the environment is not read."""
        try:
            return PipelineConfig.model_validate(_deep_merge(self.model_dump(mode="json"), overrides))
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from None


class _Yaml12Loader(yaml.SafeLoader):
    """YAML with the 1.2 booleans only: ``mode: off`` must stay the string 'off', not become False."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ``["rollout.group_size=8", ...]`` into a nested dict; values are parsed as YAML scalars."""
    merged: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"Override {pair!r} has no '='; write it as section.field=value, e.g. rollout.group_size=8.")
        key, raw = pair.split("=", 1)
        try:
            value = _load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"Override {pair!r}: the value is not valid YAML ({exc}).") from exc
        merged = _deep_merge(merged, _nested(key.strip(), value))
    return merged


def _explain(exc: ValidationError) -> str:
    lines = ["The configuration is invalid:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  - {where}: unknown field; check its spelling against `coevolve config --show`.")
        else:
            lines.append(f"  - {where}: {err['msg']} (got {err.get('input')!r}).")
    return "\n".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
    data: dict[str, Any] | None = None,
) -> PipelineConfig:
    """Build the configuration from ``data``, a YAML file, the environment and CLI overrides, later ones winning.

    ``environ`` defaults to the process environment. Raises ConfigError, with what to change, for a
    missing or malformed file and for any invalid value.
    """
    merged: dict[str, Any] = dict(data or {})
    if path is not None:
        merged = _deep_merge(merged, _read_file(Path(path)))
    environ = dict(os.environ if environ is None else environ)
    _check_env_names(environ)
    sources = (
        InitSettingsSource(_LayeredConfig, init_kwargs=parse_overrides(overrides or [])),
        _MappingEnvSource(_LayeredConfig, environ),
        InitSettingsSource(_LayeredConfig, init_kwargs=merged),
    )
    try:
        layered = _LayeredConfig(_build_sources=(sources, {}))
        return PipelineConfig.model_validate(layered.model_dump())
    except ValidationError as exc:
        raise ConfigError(_explain(exc)) from None
    except SettingsError as exc:
        raise ConfigError(f"A COEVOLVE_ environment variable could not be parsed ({exc}); list values are JSON, e.g. '[\"boundary\", \"rare\"]'.") from None


def _read_file(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise ConfigError(f"Config file {file} does not exist; pass an existing YAML file to --config.")
    try:
        loaded = _load_yaml(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {file} is not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"Config file {file} must hold a mapping of sections, not {type(loaded).__name__}.")
    return loaded


class _LayeredConfig(BaseSettings, PipelineConfig):
    """PipelineConfig as pydantic-settings layers it: ``COEVOLVE_<SECTION>__<FIELD>`` variables.

    Used only inside `load_config`; everything else passes the plain PipelineConfig it returns, so a
    configuration handed to a flow, a worker or `with_overrides` never reads the environment again.
    """

    model_config = SettingsConfigDict(
        env_prefix="COEVOLVE_", env_nested_delimiter="__", case_sensitive=False, extra="forbid", validate_assignment=True
    )


class _MappingEnvSource(EnvSettingsSource):
    """The environment source reading a given mapping, so tests and callers can pass their own."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, False, False, None)


def _check_env_names(environ: Mapping[str, str]) -> None:
    """A ``COEVOLVE_<SECTION>__...`` variable naming no section fails loudly instead of being ignored.

    Other COEVOLVE_ variables without a section separator, such as the API keys named by
    rollout.api_key_env, are not configuration and are left alone (a secret is never stored with it).
    """
    sections = set(PipelineConfig.model_fields)
    for name in environ:
        if name.upper().startswith("COEVOLVE_") and "__" in name:
            section = name[len("COEVOLVE_") :].split("__", 1)[0].lower()
            if section not in sections:
                raise ConfigError(
                    f"Environment variable {name}: {section!r} is not a configuration section; "
                    f"use one of {', '.join(sorted(sections))} (check its spelling against `coevolve config --show`)."
                )
