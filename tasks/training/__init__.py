"""The update stage's machinery: GRPO groups from the warehouse, TRL's trainer with the stored behaviour logprobs,
the optimizer state carried between steps, and the update as ranks under torchrun or accelerate."""
