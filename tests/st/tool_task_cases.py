"""The toy tool task as config overrides of the tiny GRPO job, shared by tests/st/test_multi_turn_learning.py and
benchmarks/bench_tool_learning.py: the row's label is known only to the 'secret' tool (configs/tools/
toy_secret.yaml), one tool round of one call, 2 tokens a turn, 8 in all."""
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

TASK = ["megatron_training.data_path=toy:tool", 'rl_config.verifier_function=["tool_match"]',
        "rl_config.multi_turn_enable=true",
        f"rl_config.tool_config_path={os.path.join(ROOT, 'configs', 'tools', 'toy_secret.yaml')}",
        "rl_config.max_tool_calls=1", "rl_config.max_parallel_calls=1",
        "rl_config.max_total_response_length=8", "generate_config.sampling_config.max_tokens=2"]

# how the learning test and the benchmark train it: 16 prompts x 8 samples, no KL, lr 3e-3, seed 7
LEARNING = ["megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8",
            "rl_config.mini_batch_size=8", "rl_config.init_kl_coef=0.0", "actor_config.lr=3.0e-3", "rl_config.seed=7"]
