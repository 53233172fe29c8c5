"""RuleReward with upstream's worker interface, over rewards.rule_reward.VerifierReward.

Upstream's is a Ray actor; this is a plain object: call ``initialize`` and
``init_transfer_dock`` on it directly, or pass it in the trainer's ``reward_list``
(it is callable like VerifierReward)."""
from typing import Dict

from mindspeed_rl.compat.compute_utils import compute_rule_reward, dock_call
from mindspeed_rl.rewards.rule_reward import VerifierReward as _Scorer
from mindspeed_rl.data.driver_dock import DriverDock


class RuleReward:
    def __init__(self):
        self.scorer = None
        self.td = None

    def initialize(self, megatron_config, rl_config, tokenizer):
        """Verifiers and weights from ``rl_config``; EOS from ``tokenizer`` (``eod`` or ``eos_token_id``)."""
        eos = getattr(tokenizer, "eod", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self.scorer = _Scorer(rl_config.verifier_function, rl_config.verifier_weight, eos,
                              tokenizer=getattr(tokenizer, "tokenizer", tokenizer),
                              parallel=rl_config.verifier_parallel, timeout=rl_config.verifier_timeout)

    def init_transfer_dock(self, td, mm_td=None):
        """``td``: upstream's GRPOTransferDock actor handle, or a dock object (the trainer's DriverDock)."""
        if mm_td is not None:
            raise NotImplementedError("multimodal transfer docks are not implemented")
        self.td = td

    def compute_rm_score(self) -> Dict[str, float]:
        """Score the dock's whole batch into ``rm_scores``; returns reward mean/max/min."""
        if self.scorer is None or self.td is None:
            raise RuntimeError("RuleReward: call initialize() and init_transfer_dock() first")
        rows = self.td.max_len if isinstance(self.td, DriverDock) else dock_call(self.td, "get_experience_len")
        return compute_rule_reward(self.td, self.scorer, rows)

    def __call__(self, responses, labels):
        if self.scorer is None:
            raise RuntimeError("RuleReward: call initialize() first")
        return self.scorer(responses, labels)
