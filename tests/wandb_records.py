"""What an offline wandb run wrote, read back from its ``run-<id>.wandb`` file (a LevelDB-style log of wandb's
protobuf records after a 7-byte ``:W&B`` header): the run's id, group, config and history by step."""
import glob
import json
import os
import struct

BLOCK = 32768
FULL, LAST = 1, 4


def _records(path):
    from wandb.proto import wandb_internal_pb2 as pb
    raw = open(path, "rb").read()
    assert raw[:4] == b":W&B", f"{path}: not a wandb transaction log"
    pos, part = 7, b""
    while pos + 7 <= len(raw):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        part += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            yield record


def _key(item):
    return item.key or "/".join(item.nested_key)


def offline_runs(folder):
    """Every offline run under ``folder`` (its ``wandb/`` subfolder), oldest first: dicts of run_id, group,
    project, name, config and history ({step: {key: value}}); wandb's own ``_`` keys are left out."""
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "wandb", "offline-run-*", "run-*.wandb"))):
        run = {"history": {}, "config": {}}
        for record in _records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                r = record.run
                run.update(run_id=r.run_id, group=r.run_group, project=r.project, name=r.display_name)
                run["config"].update({_key(i): json.loads(i.value_json) for i in r.config.update})
            elif kind == "config":
                run["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                row = {_key(i): json.loads(i.value_json) for i in record.history.item}
                run["history"][row.pop("_step")] = {k: v for k, v in row.items() if not k.startswith("_")}
        run["config"] = {k: v for k, v in run["config"].items() if not k.startswith("_")}
        runs.append(run)
    return runs


def offline_env(monkeypatch, folder) -> None:
    """wandb as the tests run it: offline (files only, nothing sent), quiet, its own folders under ``folder``."""
    for key, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_CONSOLE", "off"),
                       ("WANDB_ERROR_REPORTING", "false"), ("WANDB_DISABLE_GIT", "true")):
        monkeypatch.setenv(key, value)
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(key, os.path.join(str(folder), "wandb_home", key.lower()))
    for key in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_GROUP", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(key, raising=False)
