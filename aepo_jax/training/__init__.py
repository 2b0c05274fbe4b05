"""Training: optimiser, train state, jitted RL/SFT steps, checkpoints, metrics and the trainers.

    from aepo_jax.training import RLTrainer, SFTTrainer, make_rl_train_step, Checkpointer
"""

from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.checkpoint import Checkpointer, abstract_like
from aepo_jax.training.metrics_log import MetricsLogger, read_metrics
from aepo_jax.training.optimizer import (
    cast_for_compute,
    learning_rate_schedule,
    make_optimizer,
    weight_decay_mask,
)
from aepo_jax.training.rl_trainer import RLTrainer
from aepo_jax.training.sft_trainer import (
    SequenceBatches,
    SFTTrainer,
    text_record_to_tokens,
)
from aepo_jax.training.train_state import (
    TrainState,
    batch_shardings,
    train_state_shardings,
)
from aepo_jax.training.train_step import (
    StepConfig,
    make_logprob_fn,
    make_rl_train_step,
    make_sft_train_step,
    sequence_logprobs,
)

__all__ = [
    "Checkpointer",
    "MetricsLogger",
    "RLTrainer",
    "SFTTrainer",
    "SequenceBatches",
    "StepConfig",
    "TrainState",
    "abstract_like",
    "batch_shardings",
    "cast_for_compute",
    "learning_rate_schedule",
    "make_logprob_fn",
    "make_optimizer",
    "make_rl_train_step",
    "make_sft_train_step",
    "pad_sequences",
    "read_metrics",
    "sequence_logprobs",
    "text_record_to_tokens",
    "train_state_shardings",
    "weight_decay_mask",
]
