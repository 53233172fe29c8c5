"""The registered algorithms as config overrides of the tiny GRPO job (verl's recommended settings where it
gives them), shared by the learning test and benchmarks/bench_algorithms_learning.py."""

ALGORITHMS = {
    "GSPO": ["rl_config.loss_mode=gspo", "rl_config.clip_higher_enable=true", "rl_config.clip_ratio_low=0.0003",
             "rl_config.clip_ratio_high=0.0004", "rl_config.loss_agg_mode=seq-mean-token-mean"],
    "Dr.GRPO": ["rl_config.norm_adv_by_std_in_grpo=false", "rl_config.loss_agg_mode=seq-mean-token-sum-norm"],
    "RLOO": ["rl_config.adv_estimator=rloo"],
    "REINFORCE++": ["rl_config.adv_estimator=reinforce_plus_plus"],
    "REINFORCE++-baseline": ["rl_config.adv_estimator=reinforce_plus_plus_baseline"],
    "CISPO": ["rl_config.loss_mode=cispo", "rl_config.clip_higher_enable=true", "rl_config.clip_ratio_low=1.0",
              "rl_config.clip_ratio_high=0.28"],
}

# the length task as the GRPO learning test runs it: 16 prompts x 8 samples, 60 iterations, no KL
LENGTH_TASK = ["megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8",
               "rl_config.mini_batch_size=8", "rl_config.init_kl_coef=0.0", "megatron_training.train_iters=60"]
