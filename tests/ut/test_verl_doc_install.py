"""docs/verl_dp_balance.md (and its Chinese twin) install the patched verl into verl's own environment: no
bare `pip install` of verl (it would land in this project's environment), and the reason they give holds:
verl 0.9.1's transformers cap is below this package's floor."""
import os
import re

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [os.path.join(ROOT, "docs", "verl_dp_balance.md"), os.path.join(ROOT, "docs", "features", "verl_dp_balance.md")]
VERL_TRANSFORMERS = "transformers>=5.5.3,!=5.6.0,<5.11"  # verl 0.9.1's setup.py install_requires


def _code_lines(text):
    return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]


@pytest.mark.parametrize("path", DOCS, ids=[os.path.relpath(p, ROOT) for p in DOCS])
def test_verl_goes_into_its_own_venv(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    installs = [line for line in _code_lines(text) if "pip install" in line and "verl" in line]
    assert installs, "the doc shows how to install the patched verl"
    for line in installs:
        assert line.split()[0].startswith("/tmp/verl-venv/"), f"installs verl outside its own venv: {line}"
    assert "python3 -m venv /tmp/verl-venv" in text
    assert f"`{VERL_TRANSFORMERS}`" in text


def test_verls_transformers_cap_is_below_our_floor():
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
        (ours,) = [Requirement(l) for l in f if l.startswith("transformers")]
    floor = Version(next(s.version for s in ours.specifier if s.operator == ">="))
    cap = Version(next(s.version for s in Requirement(VERL_TRANSFORMERS).specifier if s.operator == "<"))
    assert cap <= floor
