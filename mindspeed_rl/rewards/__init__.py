"""Rewards: the rule verifiers (math answers via math-verify, the toy tasks, ReTool's tool bonus), their weighted sum
per row (``rule_reward.VerifierReward``) and the pool of worker processes that runs them with a timeout
(``verifier_pool``)."""
