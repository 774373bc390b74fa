"""The policy being trained: the model, and how the builtin tiny model is built and fine-tuned."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from coevolve.config.base import Section

# The settings only a pretrained model's warm-up reads (agent/warmup.py); they decide nothing when warmup_steps is 0.
WARMUP_SETTINGS = ("warmup_steps", "warmup_learning_rate", "warmup_batch_size")


class PolicyConfig(Section):
    model: str = Field(
        "builtin:tiny",
        description=(
            "'builtin:tiny' is a 656k-parameter Qwen3 built offline (tokenizer + SFT on demonstrations, never on "
            "held-out tasks); with the default settings round 0 copies the build the environment ships "
            "(envs/<name>/checkpoint0/; make policy rebuilds it). Otherwise a Hugging Face model id or a local "
            "path, loaded the same way."
        ),
    )
    sft_tasks: int = Field(
        4000,
        ge=1,
        description=(
            "Demonstrations the builtin tiny model is fine-tuned on: single-turn tasks from the unguided explorer "
            "with sft_min_calls to sft_max_calls calls, a different distribution from the multi-turn target tasks "
            "(D_0, dev, held-out), so checkpoint 0 knows the format and the tools but has never seen a target task; "
            "an environment may ask for a share of jobs of the target's shape instead (the workplace: "
            "environment.sft_target_share), none of them a task of D_0 or a held-out split."
        ),
    )
    sft_min_calls: int = Field(1, ge=1, description="Fewest calls of a demonstration task of the builtin tiny model.")
    sft_max_calls: int = Field(
        2,
        ge=1,
        description=(
            "Most calls of a demonstration task: at most 2 in one turn, so the target's longer jobs spread over "
            "several user turns are new to checkpoint 0 and left for the loop to teach."
        ),
    )
    sft_joint_calls: float = Field(
        0.25,
        ge=0,
        le=1,
        description=(
            "Share of the demonstrations that ask for their calls in one request; the others ask for each call in a "
            "turn of its own. Low, so two calls in one request, which most target turns ask for, is the skill "
            "checkpoint 0 has least of and the loop can teach."
        ),
    )
    sft_steps: int = Field(
        800,
        ge=0,
        description=(
            "SFT steps for 'builtin:tiny': about 6 minutes here, partial skill so rounds have signal. An environment "
            "may set its own (the workplace: environment.sft_steps), and then a value given here is refused when "
            "checkpoint 0 is built, naming that setting."
        ),
    )
    sft_learning_rate: float = Field(
        6e-3, gt=0, description="Tiny random-init models need a large rate (6e-3 beat 3e-3 at equal steps)."
    )
    sft_batch_size: int = Field(16, ge=1, description="Demonstrations per SFT step.")
    hidden_size: int = Field(128, ge=16, description="Width of the builtin tiny model.")
    num_layers: int = Field(
        2, ge=1, description="Depth of the builtin tiny model: 2 layers train twice as fast as 4 at similar skill."
    )
    vocab_size: int = Field(2048, ge=300, description="Byte-level BPE vocabulary trained on the demonstrations' text.")
    warmup_steps: int = Field(
        0,
        ge=0,
        description=(
            "For a pretrained policy.model: SFT steps on the builtin tiny model's demonstrations before round 0 "
            "(agent/warmup.py), so a model that answers in prose first learns the call format and GRPO gets "
            "groups with successes; 0 starts GRPO from the model as given. Ignored for 'builtin:tiny'."
        ),
    )
    warmup_learning_rate: float = Field(
        2e-4,
        gt=0,
        description=(
            "Warm-up SFT rate, with the tiny recipe's warmup and cosine decay: SmolLM2-135M's loss on the "
            "demonstrations went from 1.9 to 0.16 in 24 steps at 2e-4 (docs/engines.md); a pretrained model needs "
            "a rate far below the random-init tiny model's 6e-3."
        ),
    )
    warmup_batch_size: int = Field(
        4,
        ge=1,
        description="Demonstrations per warm-up step: a quarter of the tiny model's; a 135M model's CPU step is slow.",
    )
    torch_threads: int = Field(
        1,
        ge=1,
        description=(
            "CPU threads for torch while the policy generates and while the tiny checkpoint 0 trains: one is fastest "
            "for tiny models on shared cores. Part of checkpoint 0's recipe (the count changes its bits): another "
            "count builds the tiny checkpoint 0 anew, policy.sft_steps of SFT taking minutes on a CPU, instead of "
            "copying the shipped one; training.torch_threads sets an update's threads alone."
        ),
    )
    cpu_kernels: Literal["avx2", "native"] = Field(
        "avx2",
        description=(
            "Vector code paths of torch, MKL and oneDNN on x86 CPUs. The same build of checkpoint 0 differs in its "
            "bytes between AVX2 and AVX-512 kernels, so 'avx2' pins all three (ATEN_CPU_CAPABILITY, MKL_CBWR, "
            "ONEDNN_MAX_CPU_ISA) and a seed gives the same run on machines with either; 'native' lets each CPU use "
            "its fastest. Applied by the CLI before torch loads; GPUs are unaffected."
        ),
    )
