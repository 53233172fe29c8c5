"""mindspeed-rl: GRPO post-training with data-parallel sequence-length balance."""

__version__ = "0.1.0"
