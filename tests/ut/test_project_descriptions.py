"""What the project says it is, where a newcomer first reads it (README's opening, setup.py's description,
`python cli/train_grpo.py --help`): GRPO, DAPO and PPO post-training with DP batch balance, not GRPO alone."""
import os
import re

from cli.train_grpo import _parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _says_all_three(text):
    text = " ".join(text.split())
    assert all(name in text for name in ("GRPO", "DAPO", "PPO")), text
    assert "DP batch balance" in text, text


def test_cli_help_names_every_algorithm():
    _says_all_three(_parser().description)


def test_setup_description_names_every_algorithm():
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        (description,) = re.findall(r'description="([^"]+)"', f.read())
    _says_all_three(description)


def test_readme_opening_names_every_algorithm():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        opening = f.read().split("\n\n")[1]  # the paragraph under the title
    _says_all_three(opening)


def test_package_docstring_names_every_algorithm():
    import mindspeed_rl
    _says_all_three(mindspeed_rl.__doc__)


def test_readme_says_the_run_names_its_algorithm_first():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    assert "It first prints the algorithm (GRPO, DAPO or PPO" in text
