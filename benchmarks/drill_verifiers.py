"""A verifier for benchmarks/fault_drill.py: broken for every row, as one reading labels of a
format it does not expect would be (rl_config.verifier_function=[benchmarks.drill_verifiers:always_raises])."""


def always_raises(response: str, label: str) -> float:
    raise ValueError(f"label {label!r} is not a number")
