"""Configs whose GRPO advantages are zero by construction: found at plan time (a warning in the
run and a note in ``--dry-run``), not after hours of ``pg_loss = 0``."""
from typing import List


def zero_advantage_reasons(rl_config) -> List[str]:
    """Why every group-normalised advantage of ``rl_config`` is 0 whatever the model does (empty: it
    can learn, or the advantages are not group-normalised)."""
    if rl_config.adv_estimator not in ("group_norm", "grpo"):
        return []  # rloo and reinforce_plus_plus* keep a lone sample's score
    reasons = []
    if rl_config.n_samples_per_prompt == 1:
        reasons.append("rl_config.n_samples_per_prompt=1 with adv_estimator group_norm: each group holds one "
                       "sample, so every advantage is 0 and the policy loss is 0; give n_samples_per_prompt >= 2")
    weights = list(rl_config.verifier_weight or [])
    overlong = rl_config.overlong_buffer_enable and rl_config.overlong_buffer > 0  # DAPO's length reward
    if weights and all(w == 0 for w in weights) and not overlong:
        reasons.append(f"rl_config.verifier_weight={weights}: every reward is 0, so every advantage is 0 and the "
                       f"policy loss is 0; give a verifier a non-zero weight")
    return reasons
