"""The verl series (patches/verl/<version>/): built from our package, applies to
verl's released source (pip download, no dependencies), and the patched
seqlen_balancing keeps verl's contract while balancing better.

The released source is downloaded once per session; set VERL_SDIST to a
verl-0.9.1.tar.gz (or its unpacked directory) to skip the download. verl's own
tests/utils/test_seqlen_balancing.py is not in the sdist: set VERL_TEST_FILE to
it (from a verl checkout) to run it on both trees.
"""
import inspect
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch

PATCHES = Path(__file__).resolve().parents[1]
REPO = PATCHES.parent
BUILD = PATCHES / "build_series.py"
sys.path.insert(0, str(PATCHES))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_series  # noqa: E402
import series_spec  # noqa: E402
import verl_tree  # noqa: E402

VERSION = verl_tree.VERSION
SERIES_DIR = PATCHES / "verl" / VERSION
PUBLIC = ("calculate_workload", "karmarkar_karp", "greedy_partition", "get_seqlen_balanced_partitions",
          "log_seqlen_unbalance", "ceildiv", "roundup_divisible", "rearrange_micro_batches", "get_reverse_idx",
          "prepare_dynamic_batch", "restore_dynamic_batch", "get_group_balanced_partitions")


# ------------------------------------------------------------------ build (no download)


def test_committed_verl_series_is_the_build():
    built = build_series.build_all(REPO)
    verl_built = {p: t for p, t in built.items() if p.is_relative_to(build_series.VERL_OUT)}
    assert {p.name for p in verl_built} == {p.name for p in SERIES_DIR.glob("*.patch")}
    for path, text in verl_built.items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} differs from the build"


def test_new_files_are_adapted_package_files():
    patch = next(SERIES_DIR.glob("0001-*.patch")).read_text(encoding="utf-8")
    sections = build_series.split_sections(patch)
    for pkg in series_spec.VERL_SERIES[VERSION][0].package:
        section = sections[pkg.target]
        assert "\nnew file mode" in section
        body = section.split("\n@@", 1)[1].split("\n")[1:]
        post = "".join(line[1:] + "\n" for line in body if line.startswith("+"))
        want = build_series.adapt((REPO / pkg.path).read_text(encoding="utf-8"), pkg, VERSION, None)
        assert post == want, f"{pkg.target} drifted from {pkg.path}"
    assert "from verl.utils.partition_refine import" in sections["verl/utils/balanced_partitions.py"]
    assert "mindspeed_rl" not in patch


VERL_PATCHES = sorted(SERIES_DIR.glob("*.patch"))


@pytest.mark.parametrize("patch", VERL_PATCHES, ids=lambda p: p.name[:4])
def test_verl_patch_static_checks(patch, tmp_path):
    import test_patch_files as static

    static.test_patch_parses(patch)  # mail form, hunks, at most 3 context lines
    static.test_python_added_lines(patch)  # new files compile; our lines English, no trailing spaces
    if shutil.which("git"):
        static.test_git_numstat_agrees(patch, tmp_path)
    touched = {fd.path for fd in static.parse_patch(patch.read_text(encoding="utf-8"))}
    assert all(path.startswith("verl/") for path in touched), touched


def _copy_package(tmp_path):
    shutil.copytree(REPO / "mindspeed_rl", tmp_path / "mindspeed_rl", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "mindspeed_rl" / "balance"


def test_check_fails_on_drift_of_a_verl_file(tmp_path):
    target = _copy_package(tmp_path) / "workload.py"
    text = target.read_text(encoding="utf-8")
    target.write_text(text.replace("OBJECTIVES = (", "OBJECTIVES = (  # drift\n    ", 1), encoding="utf-8")
    res = subprocess.run([sys.executable, str(BUILD), "--check", "--package", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"patches/verl/{VERSION}/0001" in res.stderr and "verl/utils/workload.py" in res.stderr


def test_check_fails_when_a_verl_adaptation_stops_matching(tmp_path):
    target = _copy_package(tmp_path) / "seqlen_balancing.py"
    text = target.read_text(encoding="utf-8")
    old = "from mindspeed_rl.balance.partition_refine import "
    assert text.count(old) == 1
    target.write_text(text.replace(old, "from mindspeed_rl.balance import partition_refine\nfrom x import "),
                      encoding="utf-8")
    res = subprocess.run([sys.executable, str(BUILD), "--check", "--package", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    assert f"{VERSION}: mindspeed_rl/balance/seqlen_balancing.py: adaptation" in res.stderr
    assert "the helpers sit in verl.utils" in res.stderr


# ------------------------------------------------------------------ released source


@pytest.fixture(scope="session")
def trees(tmp_path_factory):
    work = tmp_path_factory.mktemp("verl")
    try:
        source = verl_tree.released_source(work / "sdist")
    except verl_tree.SourceUnavailable as exc:
        pytest.skip(f"verl {VERSION} source not available ({exc}); set VERL_SDIST to a local sdist")
    original, patched, res = verl_tree.prepare_trees(work, source)
    return {"source": source, "original": original, "patched": patched, "apply": res}


@pytest.fixture()
def modules(trees, monkeypatch):
    monkeypatch.delenv("VERL_BALANCE_PARTITIONER", raising=False)
    orig = verl_tree.load_seqlen_balancing(trees["original"])
    patched = verl_tree.load_seqlen_balancing(trees["patched"])
    return orig, patched


def test_series_applies_to_released_source(trees):
    res = trees["apply"]
    assert f"verl series {VERSION} fits" in res.stdout and "chosen by verl version" in res.stdout
    patched = trees["patched"]
    for name in ("balanced_partitions", "partition_refine", "partition_exact", "workload"):
        assert (patched / "verl" / "utils" / f"{name}.py").is_file()
    assert "balance_batch_partitioner: refined" in (patched / "verl/trainer/config/ppo_trainer.yaml").read_text()
    again = subprocess.run(["bash", str(verl_tree.APPLY), str(patched)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "already applied" in again.stdout, again.stdout + again.stderr
    check = subprocess.run(["bash", str(verl_tree.APPLY), str(trees["original"]), "--check"],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "--check: nothing changed" in check.stdout
    assert not (trees["original"] / "verl" / "utils" / "workload.py").exists()


def test_apply_refuses_other_verl_version(trees, tmp_path):
    other = tmp_path / "verl-x"
    shutil.copytree(trees["source"] / "verl" / "utils", other / "verl" / "utils")
    (other / "verl" / "version").mkdir()
    (other / "verl" / "version" / "version").write_text("0.1.0\n")
    (other / "verl" / "utils" / "seqlen_balancing.py").write_text("# another release\n")
    res = subprocess.run(["bash", str(verl_tree.APPLY), str(other), "--check"], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 1
    assert "verl tree at version 0.1.0" in res.stderr and VERSION in res.stderr and "pip download" in res.stderr


def test_build_checks_stored_edits_against_the_release(trees):
    res = subprocess.run([sys.executable, str(BUILD), "--check", "--package", str(REPO), "--verl-src",
                          str(trees["patched"])], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    # the patched tree is not the release the stored edits were written against
    assert "verl/utils/seqlen_balancing.py: stored hunk" in res.stderr and "does not match upstream" in res.stderr
    ok = subprocess.run([sys.executable, str(BUILD), "--check", "--package", str(REPO), "--verl-src",
                         str(trees["source"])], capture_output=True, text=True, timeout=300)
    assert f"patches/verl/{VERSION}" not in ok.stderr, ok.stderr


def test_public_signatures_kept(modules):
    orig, patched = modules
    for name in PUBLIC:
        assert str(inspect.signature(getattr(patched, name))) == str(inspect.signature(getattr(orig, name))), name


def _lengths(seed, n, long_tail=True):
    rng = np.random.default_rng(seed)
    if long_tail:
        return np.clip(rng.lognormal(np.log(1200), 0.9, n), 20, 8192).astype(np.int64).tolist()
    return rng.integers(50, 4000, n).tolist()


def _check_partitions(parts, n, k, equal):
    assert len(parts) == k
    assert all(p and p == sorted(p) for p in parts), "partitions must be non-empty and sorted"
    assert sorted(i for p in parts for i in p) == list(range(n))
    if equal:
        assert {len(p) for p in parts} == {n // k}


def test_equal_size_partitions_balance_better(modules):
    orig, patched = modules
    total_orig = total_patched = 0.0
    for seed, (n, k) in enumerate([(64, 8), (128, 16), (256, 32), (96, 4), (512, 64)]):
        lens = _lengths(seed, n)
        work = orig.calculate_workload(torch.tensor(lens)).tolist()
        for weights in (lens, work):
            a = orig.get_seqlen_balanced_partitions(weights, k, equal_size=True)
            b = patched.get_seqlen_balanced_partitions(weights, k, equal_size=True)
            _check_partitions(b, n, k, True)
            load_a = max(sum(weights[i] for i in p) for p in a)
            load_b = max(sum(weights[i] for i in p) for p in b)
            assert load_b <= load_a, (seed, n, k)
            total_orig += load_a / (sum(weights) / k) - 1
            total_patched += load_b / (sum(weights) / k) - 1
    assert total_patched < 0.5 * total_orig, (total_patched, total_orig)
    # a tensor (what _balance_batch passes) works as well
    parts = patched.get_seqlen_balanced_partitions(torch.tensor(lens), 64, equal_size=True)
    _check_partitions(parts, 512, 64, True)


def test_free_size_partitions_and_errors(modules):
    _, patched = modules
    lens = _lengths(7, 40)
    _check_partitions(patched.get_seqlen_balanced_partitions(lens, 6, equal_size=False), 40, 6, False)
    with pytest.raises((AssertionError, ValueError), match="k_partitions"):
        patched.get_seqlen_balanced_partitions([1, 2], 3, equal_size=False)


def test_group_balanced_partitions_keep_groups(modules):
    orig, patched = modules
    worse = 0
    for seed, (groups, n, k) in enumerate([(16, 8, 4), (32, 4, 8), (64, 8, 16)]):
        lens = _lengths(100 + seed, groups * n)
        uids = [g for g in range(groups) for _ in range(n)]
        parts = patched.get_group_balanced_partitions(lens, uids, k)
        _check_partitions(parts, groups * n, k, True)
        for p in parts:
            for uid in {uids[i] for i in p}:
                assert all(i in p for i in range(uid * n, uid * n + n)), f"group {uid} split"
        ref = orig.get_group_balanced_partitions(lens, uids, k)
        work = orig.calculate_workload(torch.tensor(lens)).tolist()
        worse += max(sum(work[i] for i in p) for p in parts) > max(sum(work[i] for i in p) for p in ref)
    assert worse == 0


def test_switch_restores_verl_behaviour(modules, monkeypatch):
    orig, patched = modules
    lens = _lengths(3, 64)
    monkeypatch.setenv("VERL_BALANCE_PARTITIONER", "karmarkar_karp")
    assert patched.get_balance_partitioner() == "karmarkar_karp"
    assert patched.get_seqlen_balanced_partitions(lens, 8, True) == orig.get_seqlen_balanced_partitions(lens, 8, True)
    monkeypatch.setenv("VERL_BALANCE_PARTITIONER", "refined")
    patched.set_balance_partitioner("karmarkar_karp")  # the config key wins over the env var
    try:
        assert patched.get_seqlen_balanced_partitions(lens, 8, True) == orig.get_seqlen_balanced_partitions(
            lens, 8, True)
    finally:
        patched.set_balance_partitioner(None)
    assert patched.get_seqlen_balanced_partitions(lens, 8, True) != orig.get_seqlen_balanced_partitions(lens, 8, True)
    with pytest.raises(ValueError, match="trainer.balance_batch_partitioner='fast'"):
        patched.set_balance_partitioner("fast")
    monkeypatch.setenv("VERL_BALANCE_PARTITIONER", "fast")
    with pytest.raises(ValueError, match="VERL_BALANCE_PARTITIONER='fast'"):
        patched.get_seqlen_balanced_partitions(lens, 8, True)


def _qwen_config(tmp_path):
    from transformers import Qwen2Config

    cfg = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864, vocab_size=151936)
    cfg.save_pretrained(tmp_path)
    return cfg


def test_workload_uses_model_dims(modules, tmp_path, monkeypatch):
    orig, patched = modules
    sys.path.insert(0, str(REPO))
    from mindspeed_rl.balance.workload import WorkloadModel

    lens = torch.tensor([1, 100, 4096])
    assert torch.equal(patched.calculate_workload(lens), orig.calculate_workload(lens))  # no model: 7B constant
    cfg = _qwen_config(tmp_path)
    coef = round(1 / WorkloadModel.from_hf_config(cfg).quadratic)
    assert coef != 24576
    config = {"trainer": {"balance_batch_partitioner": "refined"},
              "actor_rollout_ref": {"model": {"path": str(tmp_path)}}}
    try:
        patched.configure_balance_batch(config)
        assert torch.equal(patched.calculate_workload(lens), coef * lens + lens ** 2)
        assert patched.calculate_workload(lens).dtype == torch.int64
        monkeypatch.setenv("VERL_BALANCE_PARTITIONER", "karmarkar_karp")
        patched.configure_balance_batch({"trainer": {}, "actor_rollout_ref": {"model": {"path": str(tmp_path)}}})
        assert torch.equal(patched.calculate_workload(lens), orig.calculate_workload(lens))
        monkeypatch.delenv("VERL_BALANCE_PARTITIONER")
        patched.configure_balance_batch({"trainer": {}, "actor_rollout_ref": {"model": {"path": "org/remote"}}})
        assert torch.equal(patched.calculate_workload(lens), orig.calculate_workload(lens))
    finally:
        patched.set_workload_model(None)
        patched.set_balance_partitioner(None)


def _batch(lens, width):
    mask = torch.zeros(len(lens), width, dtype=torch.int64)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    return {"input_ids": torch.arange(len(lens))[:, None].expand(-1, width).clone(), "attention_mask": mask}


def test_rearrange_micro_batches_keeps_the_cap(modules, monkeypatch):
    orig, patched = modules
    rng = np.random.default_rng(11)
    counts = {"verl": 0, "patched": 0, "no_fallback": 0}
    capped = patched._capped_micro_batches
    for case in range(40):
        n = int(rng.integers(4, 40))
        lens = np.clip(rng.lognormal(np.log(300), 0.8, n), 1, 1024).astype(int).tolist()
        # a cap a few percent above an even split: balanced workloads can break it
        cap = max(max(lens), int(sum(lens) / rng.integers(2, 6) * rng.uniform(1.0, 1.08)))
        batch = _batch(lens, max(lens))  # padded width <= cap, as verl asserts
        micros, idx = patched.rearrange_micro_batches(batch, max_token_len=cap)
        assert sorted(i for p in idx for i in p) == list(range(n))
        for mb, p in zip(micros, idx):
            assert int(mb["attention_mask"].sum()) <= cap, (case, cap)
            assert mb["input_ids"][:, 0].tolist() == p
        counts["patched"] += len(idx)
        counts["verl"] += len(orig.rearrange_micro_batches(batch, max_token_len=cap)[1])
        monkeypatch.setattr(patched, "_capped_micro_batches", lambda *args: [])
        counts["no_fallback"] += len(patched.rearrange_micro_batches(batch, max_token_len=cap)[1])
        monkeypatch.setattr(patched, "_capped_micro_batches", capped)
    # the token-capped packing at the same count saves micro-batches
    assert counts["patched"] < counts["no_fallback"] <= counts["verl"], counts


def _junit(path):
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kids = {c.tag for c in case}
        out[case.get("name")] = ("failed" if kids & {"failure", "error"} else "skipped" if "skipped" in kids
                                 else "passed")
    return out


def test_verl_own_tests_same_outcome(trees, tmp_path):
    test_file = verl_tree.find_verl_test_file()
    if test_file is None:
        pytest.skip("VERL_TEST_FILE not set: verl's tests/utils/test_seqlen_balancing.py is not in the sdist")
    for mod in ("tensordict", "omegaconf", "codetiming"):
        if subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True).returncode:
            pytest.skip(f"verl's tests need {mod}, which is not installed")
    outcomes = {}
    for name in ("original", "patched"):
        xml = tmp_path / f"{name}.xml"
        env = dict(os.environ, PYTHONPATH=str(trees[name]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("VERL_BALANCE_PARTITIONER", None)
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file),
                        f"--junitxml={xml}", "--rootdir", str(tmp_path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=1200)
        outcomes[name] = _junit(xml)
    assert outcomes["original"], "no verl test ran"
    assert outcomes["patched"] == outcomes["original"]
    assert sum(v == "passed" for v in outcomes["patched"].values()) >= 1
