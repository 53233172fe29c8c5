"""Tokenize a data set once into a cache for GRPO training.

    python cli/preprocess_data.py math_word_problems          # configs/datasets/<name>.yaml
    python cli/preprocess_data.py --config path/to/recipe.yaml [key=value ...]

Relative paths in a recipe are taken from the repository root. The cache is a
``datasets.save_to_disk`` folder at ``output_prefix``; point
``megatron_training.data_path`` at it. See ``mindspeed_rl/datasets/preprocess.py``.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _recipe_path(name: str) -> str:
    if os.path.isfile(name):
        return name
    path = os.path.join(ROOT, "configs", "datasets", name if name.endswith(".yaml") else name + ".yaml")
    if not os.path.isfile(path):
        raise SystemExit(f"error: no recipe {name!r} (neither a file nor configs/datasets/{name}.yaml)")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", help="recipe name under configs/datasets, or a YAML path")
    parser.add_argument("--config", help="recipe YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides (YAML values)")
    args = parser.parse_args(argv)
    name = args.config or args.name
    overrides = list(args.overrides)
    if args.config and args.name:
        overrides.insert(0, args.name)
    if not name or "=" in name:
        parser.error("give a recipe name or --config PATH")
    import yaml
    with open(_recipe_path(name), encoding="utf-8") as f:
        recipe = yaml.safe_load(f) or {}
    for item in overrides:
        if "=" not in item:
            parser.error(f"override {item!r} is not key=value")
        key, value = item.split("=", 1)
        recipe[key.strip()] = yaml.safe_load(value)
    from mindspeed_rl.datasets.preprocess import preprocess
    try:
        preprocess(recipe, base_dir=ROOT)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
