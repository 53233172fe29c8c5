"""Rewards of multi-turn rows: the whole conversation is read (its turns end at EOS), retool_reward's tool-call
bonus as upstream scores it, and the reward stage hands each row's tool rounds to the functions that take them."""
import pytest
import torch

from mindspeed_rl.rewards.math_verifier import retool_tool_bonus
from mindspeed_rl.rewards.rule_reward import VerifierReward
from mindspeed_rl.models.tiny_text_tokenizer import build_text_tokenizer
from mindspeed_rl.trainer.utils.reward_stage import score_rows

TOK = build_text_tokenizer()
EOS = TOK.convert_tokens_to_ids("<|im_end|>")


def _ids(text):
    return torch.tensor(TOK.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("score,calls,expected", [(1.0, 0, 1.0), (1.0, 3, 1.0), (-1.0, 0, -1.0), (-1.0, 1, -0.9),
                                                  (-1.0, 4, -0.6), (-1.0, 10, 0.0), (-1.0, 12, 0.0)])
def test_retool_bonus_raises_a_wrong_answer_by_a_tenth_per_round_up_to_zero(score, calls, expected):
    assert retool_tool_bonus(score, calls) == pytest.approx(expected)


def test_a_multi_turn_row_is_read_whole_and_gets_the_bonus():
    # the answer is in the last turn, after a tool round: read up to the first EOS, it would be missed
    conversation = _ids("<tool_call>x</tool_call><|im_end|><|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"
                        "\\boxed{7}<|im_end|>")
    wrong = _ids("<tool_call>x</tool_call><|im_end|><|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"
                 "\\boxed{8}<|im_end|>")
    reward = VerifierReward(["retool_reward"], [1.0], eos_id=EOS, tokenizer=TOK)
    try:
        labels = [_ids("7"), _ids("7")]
        assert reward([conversation, wrong], labels, tool_call_nums=[1, 2]).tolist() == pytest.approx([1.0, -0.8])
        # one turn (no multi-turn): read up to the first EOS, no bonus
        assert reward([conversation, wrong], labels).tolist() == [-1.0, -1.0]
        with pytest.raises(ValueError, match="got 1 tool_call_nums for 2 responses"):
            reward([conversation, wrong], labels, tool_call_nums=[1])
    finally:
        reward.close()


def test_the_reward_stage_gives_tool_rounds_only_to_functions_that_take_them():
    seen = {}

    class Takes:
        takes_tool_calls = True

        def __call__(self, responses, labels, tool_call_nums=None):
            seen["takes"] = tool_call_nums
            return [0.0] * len(responses)

    class Plain:
        def __call__(self, responses, labels):
            seen["plain"] = True
            return [1.0] * len(responses)

    scores, _ = score_rows([Takes(), Plain()], [_ids("a"), _ids("b")], [_ids("a"), _ids("b")], tool_calls=[2, 0])
    assert seen == {"takes": [2, 0], "plain": True} and scores.tolist() == [1.0, 1.0]
    seen.clear()
    score_rows([Takes()], [_ids("a")], [_ids("a")])
    assert seen == {"takes": None}


def test_the_toy_tool_task_rewards_the_answer_after_the_tool_and_nudges_a_call():
    from mindspeed_rl.rewards.rule_reward import tool_match
    from mindspeed_rl.models.tiny_model import EOS_ID, TOOL_CALL_ID, TOOL_CLOSE_ID, TOOL_OPEN_ID
    label = torch.tensor([7])
    called = [TOOL_CALL_ID, EOS_ID, TOOL_OPEN_ID, 7, TOOL_CLOSE_ID]
    assert tool_match(torch.tensor(called + [7, EOS_ID]), label, EOS_ID) == 1.0
    assert tool_match(torch.tensor(called + [3, EOS_ID]), label, EOS_ID) == 0.1  # called, answered wrong
    assert tool_match(torch.tensor(called), label, EOS_ID) == 0.1  # no answer after the tool
    assert tool_match(torch.tensor([7, EOS_ID]), label, EOS_ID) == 1.0  # a lucky guess without the tool
    assert tool_match(torch.tensor([3, EOS_ID]), label, EOS_ID) == 0.0
    assert tool_match(torch.tensor([], dtype=torch.long), label, EOS_ID) == 0.0
