"""README.md stays a two-minute read and points at things that exist: its length is bounded, every relative link in
it and in the English reference (docs/reference/*.md) reaches a file (and a heading, where it names one), every
guide is linked from it, every command in them names a script, config and flags that exist and config keys the
loader accepts, the per-algorithm commands are the ones the learning tests train, and every headline figure is
found in the file its row links to."""
import importlib.util
import json
import os
import re
import shlex
import warnings
from decimal import ROUND_HALF_UP, Decimal

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "docs", "reference")
README_LINES = 150

DOCS = ["README.md"] + sorted(os.path.join("docs", "reference", f) for f in os.listdir(REFERENCE) if f.endswith(".md"))


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


README = _read("README.md")


def _slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped (but - and _), spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(text):
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def _links(text):
    """Relative link targets: [text](target) and <img src="target">, outside code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'<img [^>]*src="([^"]+)"', text)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_short():
    lines = README.count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; move detail to docs/reference/"
    assert len(DOCS) > 5  # the detail went somewhere


def test_the_readme_opens_with_its_title_and_one_paragraph():
    title, opening = README.split("\n\n")[:2]
    assert title == "# mindspeed-rl"
    assert not opening.startswith(("#", "|", "```"))
    assert "upstream MindSpeed-RL" in opening and "verl" in opening


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_reaches_a_file_and_heading(doc):
    text = _read(doc)
    folder = os.path.dirname(os.path.join(ROOT, doc))
    broken = []
    for target in _links(text):
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(folder, path)) if path else os.path.join(ROOT, doc)
        if not os.path.exists(full):
            broken.append(target)
        elif anchor and full.endswith(".md") and anchor not in _anchors(open(full, encoding="utf-8").read()):
            broken.append(target)
    assert broken == []


def test_the_readme_links_every_guide_and_reference_page():
    linked = {os.path.normpath(t.partition("#")[0]) for t in _links(README)}
    pages = {os.path.join("docs", "features", f) for f in os.listdir(os.path.join(ROOT, "docs", "features"))
             if f.endswith(".md")}
    pages |= {os.path.join("docs", "reference", f) for f in os.listdir(REFERENCE) if f.endswith(".md")}
    pages |= {os.path.join("docs", "upstream_api.md"), os.path.join("docs", "verl_dp_balance.md")}
    assert pages - linked == set()


def test_the_readme_names_the_guides_new_homes():
    """The balancer's guide is dp_batch_balance.md; remove_padding.md holds padding removal and dynamic batches."""
    row = [l for l in README.splitlines() if "docs/features/remove_padding.md" in l]
    assert len(row) == 1 and "padding removal" in row[0] and "dynamic batch size" in row[0]
    assert "dp_batch_balance.md" not in row[0]
    assert "DP batch balance" in [l for l in README.splitlines() if "docs/features/dp_batch_balance.md" in l][0]


# ---------------------------------------------------------------- commands

def _commands(text):
    """Each shell command of a ```bash block, continuation lines joined, the trailing comment dropped."""
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if words:
                yield words


def _all_commands():
    for doc in DOCS:
        for words in _commands(_read(doc)):
            yield doc, words


def _placeholder(word):
    return "<" in word or word.startswith("/path/") or word in ("...", "DIR")


def _source_of(words):
    """The file a command runs: `bash x.sh`, `python x.py`, `python -m a.b`; None for other programs."""
    if words[0] == "bash":
        return words[1]
    if words[0] in ("python", "python3"):
        if words[1] == "-m":
            return None if words[2] == "pip" else words[2].replace(".", "/") + ".py"
        if words[1] == "-c":
            return None
        return words[1]
    return None


def test_every_command_runs_a_file_that_exists_with_flags_it_takes():
    seen, problems = 0, []
    for doc, words in _all_commands():
        source = _source_of(words)
        if source is None:
            continue
        seen += 1
        if not os.path.exists(os.path.join(ROOT, source)):
            problems.append(f"{doc}: {source} does not exist")
            continue
        code = _read(source)
        for word in words[2:]:
            flag = word.split("=")[0]
            if flag.startswith("--") and flag not in code:
                problems.append(f"{doc}: {source} takes no {flag}")
        for i, word in enumerate(words):
            value = words[i + 1] if word == "--config" and i + 1 < len(words) else word.rpartition("=")[2]
            if re.search(r"\.(ya?ml|jsonl)$", value) and not _placeholder(value) \
                    and not os.path.exists(os.path.join(ROOT, value)):
                problems.append(f"{doc}: {value} does not exist")
    assert seen > 30 and problems == []


def _train_runs():
    """(doc, config, overrides) of every training command: run_grpo.sh runs configs/grpo_tiny_cpu.yaml."""
    for doc, words in _all_commands():
        if words[:2] == ["bash", "tests/st/run_grpo.sh"]:
            config = "configs/grpo_tiny_cpu.yaml"
        elif words[:2] == ["python", "cli/train_grpo.py"]:
            config = words[words.index("--config") + 1]
        else:
            continue
        if _placeholder(config):
            continue
        overrides = [w for w in words[2:] if re.match(r"\w+\.[\w.]+=", w)]
        yield doc, config, overrides


def test_every_training_command_names_keys_the_loader_accepts():
    from mindspeed_rl.plan.loader import build_configs, load_config
    runs = list(_train_runs())
    assert len(runs) > 15
    failed = []
    for doc, config, overrides in runs:
        # a load needs a checkpoint that exists, a data path only the preprocess step makes
        kept = [o for o in overrides
                if not o.startswith(("megatron_training.load=", "megatron_training.data_path=data/"))]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                build_configs(load_config(os.path.join(ROOT, config), kept))
        except Exception as err:  # noqa: BLE001 - the message names the key
            failed.append(f"{doc}: {config} {' '.join(kept)}: {err}")
    assert failed == []


def _algorithm_cases():
    spec = importlib.util.spec_from_file_location("algorithm_cases", os.path.join(ROOT, "tests", "st",
                                                                                  "algorithm_cases.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ALGORITHMS


def test_each_registered_algorithm_has_the_command_its_learning_test_trains():
    readme = {tuple(words) for words in _commands(README)}
    table = _read(os.path.join("docs", "reference", "algorithms.md"))
    for name, overrides in _algorithm_cases().items():
        command = ("bash", "tests/st/run_grpo.sh", *overrides)
        assert command in readme, name
        assert f"| {name} | `{' '.join(command)}` |" in table, name
    for algorithm in ("dapo", "ppo"):
        command = (f"python cli/train_grpo.py --config configs/{algorithm}_tiny_cpu.yaml "
                   f"--tiny-model-dir /tmp/{algorithm}/tiny --output-dir /tmp/{algorithm}")
        assert tuple(command.split()) in readme and f"`{command}`" in table


def test_the_readme_has_a_command_for_each_feature():
    joined = "\n".join(" ".join(words) for words in _commands(README))
    for needle in ("tests/st/run_grpo.sh --vllm", "rl_config.partial_rollout_max_split=",
                   "rl_config.multi_turn_enable=true", "rl_config.trainer_mode=colocate_async",
                   "rl_config.trainer_mode=separate_async", "megatron_training.use_distributed_optimizer=true",
                   "megatron_training.save=", "megatron_training.load=", "mindspeed_rl.reports.balance_report --run",
                   "balance_report --lengths benchmarks/lengths_example.jsonl --dp-size 8 --n-samples 8",
                   "patches/apply.sh /path/to/MindSpeed-RL", "patches/apply.sh <verl source tree>",
                   "mindspeed_rl.reports.memory_plan"):
        assert needle in joined, needle


def test_resume_reads_the_folder_the_save_wrote():
    runs = [" ".join(words) for words in _commands(README)]
    (save,) = [re.search(r"megatron_training\.save=(\S+)", r).group(1) for r in runs if "training.save=" in r]
    (load,) = [re.search(r"megatron_training\.load=(\S+)", r).group(1) for r in runs if "training.load=" in r]
    assert save == load


# ---------------------------------------------------------------- headline figures

NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?(?: ?%|x)?"


def _figures(cell):
    return [re.sub(r" %$", "%", n) for n in re.findall(NUMBER, cell)]


def _found(figure, text):
    text = re.sub(r"(\d) %", r"\1%", text)
    return re.search(r"(?<![\w.])" + re.escape(figure) + r"(?![\d])", text) is not None


def _headline_rows():
    section = README[README.index("\n## Measured\n"):README.index("\n## ", README.index("\n## Measured\n") + 1)]
    rows = [l for l in section.splitlines() if l.startswith("| ") and not l.startswith(("| stage", "| ---"))]
    for row in rows:
        what, before, after, where = [c.strip() for c in row.strip("|").split(" | ")]
        yield what, before, after, re.findall(r"\]\(([^)#]+)", where)


def test_every_headline_figure_is_in_the_file_its_row_links_to():
    rows = list(_headline_rows())
    assert len(rows) >= 5
    missing = []
    for what, before, after, targets in rows:
        assert targets, what
        texts = [_read(t) for t in targets if not t.endswith(".json")]  # a record's figures: the test below
        assert texts, what
        for figure in _figures(before) + _figures(after):
            if not any(_found(figure, text) for text in texts):
                missing.append(f"{what}: {figure} not in {targets}")
    assert missing == []


def test_the_headline_table_covers_rollout_the_dp_stages_and_end_to_end():
    stages = " ".join(what for what, _, _, _ in _headline_rows())
    for part in ("rollout", "multi-turn", "log-probs and update", "DAPO", "end to end"):
        assert part in stages, part
    links = {t for *_, targets in _headline_rows() for t in targets}
    assert any(t.startswith("benchmarks/results/") and t.endswith(".md") for t in links)


def _two_places(printed):
    return str(Decimal(printed).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def test_the_end_to_end_figures_are_the_benchmarks_record():
    record = json.loads(_read("benchmarks/results/dp_balance_e2e.json"))
    data = record["real_analysis"]
    said = " ".join(_read("docs/reference/dp_balance.md").split())
    (row,) = [r for r in _headline_rows() if r[0].startswith("end to end")]
    assert row[1] == f"balance off {data['mean_step_off_s']:.2f} s"
    assert row[2] == f"{data['mean_step_on_s']:.2f} s ({data['speedup']:.2f}x)"
    assert "benchmarks/results/dp_balance_e2e.json" in row[3]
    assert f"balance off {data['mean_step_off_s']:.2f} s" in said
    assert f"{data['mean_step_on_s']:.2f} s ({data['speedup']:.2f}x;" in said
    # the per-pair figures as the benchmark prints them (three places), rounded to two
    (detail,) = [t["detail"] for t in record["targets"] if t["name"].startswith("real DP=2")]
    median, low, high = re.search(r"median ([\d.]+)x, min-max ([\d.]+)-([\d.]+)x", detail).groups()
    assert len(data["speedup_per_iteration"]) == 6 and "6 paired on/off iterations" in said
    assert f"per pair median {_two_places(median)}x, min-max {_two_places(low)}-{_two_places(high)}x" in said
