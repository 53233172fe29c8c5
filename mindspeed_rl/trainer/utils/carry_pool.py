"""Partial rollout's pool: the prompts in flight and the responses they have made so far.

Pure bookkeeping on CPU tensors (no Ray). A prompt enters as a group of ``n`` rows; a rollout pass continues every
incomplete row (its prompt followed by its tokens so far) for at most ``pass_tokens`` new tokens; a row is complete
once it ended (EOS, or fewer new tokens than its budget: the engine stopped it) or holds ``max_tokens`` tokens.
A row keeps, per token, the rollout engine's log-prob and the iteration it was sampled in. Complete groups leave
for training oldest first. ``state_dict`` holds everything, so a resumed run continues the same rows.
A multi-turn run's pool (``turns``) keeps each row's loss mask and conversation state too (carried_turns.py): a row
is complete once its conversation ended, and a pass may run past its budget by the tool answer that ends it.
"""
from typing import Dict, List, Optional, Sequence

import torch

from mindspeed_rl.plan.stages import CARRIED_TURN, ROLLOUT_BUDGET, ROLLOUT_LOG_PROBS
from mindspeed_rl.trainer.utils import carried_turns
from mindspeed_rl.balance.rollout_queue import StopRule
from mindspeed_rl.utils.token_ids import TOKEN_DTYPE


class CarryPool:
    def __init__(self, n_samples: int, max_tokens: int, pass_tokens: int, eos_id: Optional[int],
                 extra_columns: Sequence[str] = (), turns: bool = False):
        self.n, self.max_tokens, self.pass_tokens, self.eos_id = n_samples, max_tokens, pass_tokens, eos_id
        self.extra_columns = tuple(extra_columns)
        self.turns = bool(turns)  # multi-turn: rows carry their conversations (carried_turns.py)
        self.rows: List[Dict[str, object]] = []
        self.next_group = 0

    # ------------------------------------------------------------ filling

    def add(self, batch: Dict[str, list]) -> None:
        """A batch of prompts (and their extra columns), each as ``n`` rows."""
        prompts = list(batch["prompts"])
        for key in self.extra_columns:
            if key in batch and len(batch[key]) != len(prompts):
                raise ValueError(f"partial rollout: '{key}' has {len(batch[key])} rows, prompts have {len(prompts)}")
        for i, prompt in enumerate(prompts):
            extra = {k: batch[k][i] for k in self.extra_columns if k in batch}
            for _ in range(self.n):
                self.rows.append({"group": self.next_group, "prompt": prompt.reshape(-1), "extra": extra,
                                  "tokens": torch.zeros(0, dtype=TOKEN_DTYPE),
                                  "log_probs": torch.zeros(0, dtype=torch.float32),
                                  "born": torch.zeros(0, dtype=torch.int64), "passes": 0, "done": False,
                                  **(carried_turns.new_fields() if self.turns else {})})
            self.next_group += 1

    @property
    def groups(self) -> int:
        return len({r["group"] for r in self.rows})

    def complete_groups(self) -> List[int]:
        """Groups whose every row is complete, oldest first."""
        state: Dict[int, bool] = {}
        for r in self.rows:
            state[r["group"]] = state.get(r["group"], True) and r["done"]
        return sorted(g for g, done in state.items() if done)

    # ------------------------------------------------------------ a pass

    def pass_rows(self) -> List[int]:
        """Pool indexes of the incomplete rows, oldest group first (a group's rows together)."""
        return sorted((i for i, r in enumerate(self.rows) if not r["done"]), key=lambda i: self.rows[i]["group"])

    def budget(self, index: int) -> int:
        return min(self.pass_tokens, self.max_tokens - self.rows[index]["tokens"].numel())

    def pass_inputs(self, indexes: Sequence[int]) -> Dict[str, list]:
        """The rollout round of ``indexes``: prompt + tokens so far, the pass's budget per row (multi-turn: and
        each conversation's state, and the extra columns its tools start from)."""
        rows = [self.rows[i] for i in indexes]
        prompts = [torch.cat([r["prompt"].to(TOKEN_DTYPE), r["tokens"]]) for r in rows]
        out = {"prompts": prompts, "prompt_length": torch.tensor([p.numel() for p in prompts]),
               ROLLOUT_BUDGET: torch.tensor([self.budget(i) for i in indexes], dtype=torch.int32)}
        if self.turns:
            out[CARRIED_TURN] = carried_turns.pass_column(rows)
            out.update({k: [r["extra"][k] for r in rows] for k in self.extra_columns
                        if all(k in r["extra"] for r in rows)})
        return out

    def pass_groups(self, indexes: Sequence[int]):
        """(group of each row, numbered 0.. in order; each group's expected length for the queue: rows already
        carried rank before new ones, the longest so far first)."""
        order, prior, out = {}, [], []
        for i in indexes:
            r = self.rows[i]
            g = order.setdefault(r["group"], len(order))
            if g == len(prior):
                prior.append(0.0)
            made = float(r["tokens"].numel())
            prior[g] = max(prior[g], self.max_tokens + made if made else 0.0)
            out.append(g)
        return out, [prior[g] for g in out]

    def stop_rule(self, indexes: Sequence[int], spec) -> StopRule:
        """async_engine: the pass over ``indexes`` stops handing out rows once ``spec.train_prompts`` groups of
        the pool are complete; a row whose budget reaches max_tokens is complete when it finishes; rows in their
        last allowed pass still run when ``spec.max_age_finished``."""
        need = spec.train_prompts - len(self.complete_groups())
        sure = [self.budget(i) + self.rows[i]["tokens"].numel() >= self.max_tokens for i in indexes]
        must = [spec.max_age_finished and self.rows[i]["passes"] >= spec.max_split - 1 for i in indexes]
        return StopRule(need, sure, must)

    def extend(self, indexes: Sequence[int], responses: Sequence[torch.Tensor],
               log_probs: Optional[Sequence[torch.Tensor]], iteration: int,
               turns: Optional[Dict[str, Sequence[torch.Tensor]]] = None) -> None:
        """Append a pass's new tokens (and their log-probs) to ``indexes``; every check before any change.
        ``turns``: a multi-turn pool's rollout outputs of the pass (carried_turns.PASS_COLUMNS)."""
        if len(responses) != len(indexes) or (log_probs is not None and len(log_probs) != len(indexes)):
            raise ValueError(f"partial rollout: {len(responses)} responses for {len(indexes)} rows")
        if self.turns and (turns is None or any(len(turns.get(c, ())) != len(indexes)
                                                for c in carried_turns.PASS_COLUMNS)):
            raise ValueError(f"partial rollout: a multi-turn pass needs {list(carried_turns.PASS_COLUMNS)} for "
                             f"each of its {len(indexes)} rows")
        made = [{c: turns[c][k] for c in carried_turns.PASS_COLUMNS} for k in range(len(indexes))] \
            if self.turns else None
        for k, (i, new) in enumerate(zip(indexes, responses)):
            if self.turns:
                problem = carried_turns.pass_problem(k, self.rows[i], new.reshape(-1), made[k], self.budget(i),
                                                     self.max_tokens)
                if problem:
                    raise ValueError(f"partial rollout: {problem}")
            elif new.numel() > self.budget(i):
                raise ValueError(f"partial rollout: row {k} of the pass made {new.numel()} tokens, over its budget "
                                 f"of {self.budget(i)}")
            if log_probs is not None and log_probs[k].numel() != new.numel():
                raise ValueError(f"partial rollout: row {k} of the pass has {log_probs[k].numel()} log-probs for "
                                 f"{new.numel()} tokens")
        for k, (i, new) in enumerate(zip(indexes, responses)):
            r, budget = self.rows[i], self.budget(i)
            new = new.reshape(-1).to(TOKEN_DTYPE)
            r["tokens"] = torch.cat([r["tokens"], new])
            lp = log_probs[k].reshape(-1).float() if log_probs is not None else torch.zeros(new.numel())
            r["log_probs"] = torch.cat([r["log_probs"], lp])
            r["born"] = torch.cat([r["born"], torch.full((new.numel(),), int(iteration), dtype=torch.int64)])
            r["passes"] += 1
            if self.turns:  # complete once its conversation ended (for any reason but the pass's cut)
                r["done"] = carried_turns.apply_pass(r, made[k])
                continue
            ended = self.eos_id is not None and new.numel() > 0 and int(new[-1]) == int(self.eos_id)
            r["done"] = ended or new.numel() < budget or r["tokens"].numel() >= self.max_tokens

    def keys(self) -> List[tuple]:
        """A name for every row that outlives takes and extends: (its group, its place in the group)."""
        seen: Dict[int, int] = {}
        out = []
        for r in self.rows:
            place = seen.get(r["group"], 0)
            seen[r["group"]] = place + 1
            out.append((r["group"], place))
        return out

    def oldest(self, groups: Sequence[int], iteration: int) -> Dict[int, int]:
        """Per group of ``groups``: the age (``iteration`` - sampling iteration) of its oldest token (0 if none)."""
        wanted, out = set(groups), {}
        for r in self.rows:
            if r["group"] in wanted:
                age = iteration - int(r["born"].min()) if r["born"].numel() else 0
                out[r["group"]] = max(out.get(r["group"], 0), age)
        return out

    def drop(self, groups: Sequence[int]) -> int:
        """Remove the rows of ``groups``; returns how many."""
        gone = set(groups)
        before = len(self.rows)
        self.rows = [r for r in self.rows if r["group"] not in gone]
        return before - len(self.rows)

    # ------------------------------------------------------------ training

    def take(self, count: int, iteration: int):
        """The ``count`` oldest complete groups as train columns (rows group by group), removed from the pool,
        and their metrics: rows that took more than one pass, tokens made before the last pass, token age."""
        chosen = set(self.complete_groups()[:count])
        if len(chosen) < count:
            raise ValueError(f"partial rollout: {len(chosen)} complete groups, {count} wanted")
        taken = sorted((r for r in self.rows if r["group"] in chosen), key=lambda r: r["group"])
        self.rows = [r for r in self.rows if r["group"] not in chosen]
        columns: Dict[str, list] = {
            "prompts": [r["prompt"] for r in taken], "responses": [r["tokens"] for r in taken],
            "prompt_length": torch.tensor([r["prompt"].numel() for r in taken]),
            "response_length": torch.tensor([r["tokens"].numel() for r in taken]),
            ROLLOUT_LOG_PROBS: [r["log_probs"] for r in taken]}
        for key in self.extra_columns:
            if all(key in r["extra"] for r in taken):
                columns[key] = [r["extra"][key] for r in taken]
        if self.turns:
            columns.update(carried_turns.take_columns(taken))
        born = torch.cat([r["born"] for r in taken])
        continued = [r for r in taken if r["passes"] > 1]
        age = (iteration - born).float()
        metrics = {"partial_rollout/continued_rows": float(len(continued)),
                   "partial_rollout/continued_tokens": float(sum(int((r["born"] < iteration).sum()) for r in taken)),
                   "partial_rollout/token_age_mean": float(age.mean()) if age.numel() else 0.0,
                   "partial_rollout/token_age_max": float(age.max()) if age.numel() else 0.0,
                   "partial_rollout/max_passes": float(max(r["passes"] for r in taken))}
        metrics.update(self.carried_metrics())
        return columns, metrics

    def carried_metrics(self) -> Dict[str, float]:
        """What stays for later iterations: incomplete rows and their tokens, complete rows waiting."""
        open_rows = [r for r in self.rows if not r["done"]]
        return {"partial_rollout/carried_rows": float(len(open_rows)),
                "partial_rollout/carried_tokens": float(sum(r["tokens"].numel() for r in open_rows)),
                "partial_rollout/waiting_complete_rows": float(len(self.rows) - len(open_rows))}

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {"rows": [dict(r) for r in self.rows], "next_group": self.next_group, "n": self.n,
                "max_tokens": self.max_tokens, "pass_tokens": self.pass_tokens, "turns": self.turns}

    def load_state_dict(self, state: dict) -> None:
        """Continue ``state`` (checked whole first, nothing changes on an error: ``state_problem``)."""
        problem = state_problem(state)
        if problem:
            raise ValueError(f"partial rollout: the pool to continue is damaged: {problem}")
        if state.get("turns", False) != self.turns:
            kind = {True: "multi-turn", False: "single-turn"}
            raise ValueError(f"partial rollout: the checkpoint's pool was saved by a {kind[not self.turns]} run, "
                             f"this run is {kind[self.turns]} (rl_config.multi_turn_enable must match to continue "
                             f"its rows)")
        for key in ("n", "max_tokens", "pass_tokens"):
            if state[key] != getattr(self, key):
                raise ValueError(f"partial rollout: the checkpoint's pool has {key}={state[key]}, this run "
                                 f"{getattr(self, key)} (n_samples_per_prompt, max_tokens and "
                                 f"partial_rollout_max_split must match to continue its rows)")
        self.rows = [dict(r) for r in state["rows"]]
        self.next_group = int(state["next_group"])


# a pool row's fields: (kind, what it must be)
ROW_FIELDS = {"group": ("int", "an int"), "prompt": ("ids", "a 1-D tensor of token ids"),
              "extra": ("dict", "a dict"), "tokens": ("ids", "a 1-D tensor of token ids"),
              "log_probs": ("float", "a 1-D float tensor"), "born": ("ids", "a 1-D tensor of iterations"),
              "passes": ("int", "an int"), "done": ("bool", "true or false")}
STATE_INTS = ("next_group", "n", "max_tokens", "pass_tokens")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field_problem(value, kind: str) -> bool:
    if kind == "int":
        return not is_int(value) or value < 0
    if kind == "bool":
        return not isinstance(value, bool)
    if kind == "dict":
        return not isinstance(value, dict)
    if not isinstance(value, torch.Tensor) or value.dim() != 1:
        return True
    return value.is_floating_point() != (kind == "float") or value.is_complex() or value.dtype == torch.bool


def state_problem(state) -> Optional[str]:
    """What makes ``state`` (a saved pool) unusable, in words naming the row and field (None: usable): its
    type, a missing or mistyped key, a row's field of the wrong kind, per-token columns of different lengths,
    more tokens than max_tokens, a group numbered past next_group or not of n rows."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a pool (a dict)"
    for key in ("rows",) + STATE_INTS:
        if key not in state:
            return f"it lacks '{key}'"
    for key in STATE_INTS:
        if not is_int(state[key]) or state[key] < (1 if key in ("n", "pass_tokens", "max_tokens") else 0):
            return f"its '{key}' is {state[key]!r}, not an int of at least {1 if key != 'next_group' else 0}"
    if not isinstance(state["rows"], list):
        return f"its 'rows' is a {type(state['rows']).__name__}, not a list"
    if not isinstance(state.get("turns", False), bool):
        return f"its 'turns' is {state['turns']!r}, not true or false"
    sizes: Dict[int, int] = {}
    for k, row in enumerate(state["rows"]):
        if not isinstance(row, dict):
            return f"row {k} is a {type(row).__name__}, not a dict"
        for name, (kind, what) in ROW_FIELDS.items():
            if name not in row:
                return f"row {k} lacks '{name}'"
            if _field_problem(row[name], kind):
                shown = (f"a {row[name].dim()}-D {row[name].dtype} tensor" if isinstance(row[name], torch.Tensor)
                         else repr(row[name]) if isinstance(row[name], (bool, int, float, str)) or row[name] is None
                         else f"a {type(row[name]).__name__}")
                return f"row {k}'s '{name}' is {shown}, not {what}"
        made = row["tokens"].numel()
        if row["log_probs"].numel() != made or row["born"].numel() != made:
            return (f"row {k} has {made} tokens, {row['log_probs'].numel()} log-probs and {row['born'].numel()} "
                    f"sampling iterations")
        if made > state["max_tokens"]:
            return f"row {k} has {made} tokens, more than max_tokens={state['max_tokens']}"
        if row["group"] >= state["next_group"]:
            return f"row {k}'s group {row['group']} is not below next_group={state['next_group']}"
        if state.get("turns"):
            problem = carried_turns.row_problem(k, row)
            if problem:
                return problem
        sizes[row["group"]] = sizes.get(row["group"], 0) + 1
    odd = [g for g, count in sizes.items() if count != state["n"]]
    if odd:
        return f"group {odd[0]} has {sizes[odd[0]]} rows, not n={state['n']}"
    return None
