"""Loading a value model from a family whose token classifier comes as the checkpoint's own code
(trust_remote_code), and the load options reaching transformers."""
import importlib.util
import json

import pytest
import torch
from transformers import AutoModelForTokenClassification, Qwen2Config, Qwen2ForCausalLM

from mindspeed_rl.models.causal_lm import CausalLMEngine, load_value_model

# the checkpoint's own code: a config and a token classifier (embedding + score head), written by the test
REMOTE_CODE = '''
import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import TokenClassifierOutput


class TinyRemoteConfig(PretrainedConfig):
    model_type = "tiny_remote"

    def __init__(self, vocab_size=32, hidden_size=8, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        super().__init__(**kwargs)


class TinyRemoteForTokenClassification(PreTrainedModel):
    config_class = TinyRemoteConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.score = torch.nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, **kwargs):
        return TokenClassifierOutput(logits=self.score(self.embed(input_ids)))
'''


def _remote_checkpoint(path, with_classifier=True):
    """A checkpoint whose config.json maps the auto classes to code in its folder."""
    path.mkdir()
    (path / "tiny_remote.py").write_text(REMOTE_CODE)
    spec = importlib.util.spec_from_file_location("tiny_remote_for_test", path / "tiny_remote.py")
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    torch.manual_seed(0)
    code.TinyRemoteForTokenClassification(code.TinyRemoteConfig(num_labels=1)).save_pretrained(str(path))
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "tiny_remote.TinyRemoteConfig"}
    if with_classifier:
        config["auto_map"]["AutoModelForTokenClassification"] = "tiny_remote.TinyRemoteForTokenClassification"
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def remote_dir(tmp_path_factory):
    return _remote_checkpoint(tmp_path_factory.mktemp("remote") / "tiny_remote_value")


def test_remote_code_family_loads_as_a_one_output_value_model(remote_dir):
    engine = CausalLMEngine(remote_dir, torch.device("cpu"), head="value", trainable=False,
                            trust_remote_code=True, dtype=torch.float64)
    module = engine.module
    assert type(module).__name__ == "TinyRemoteForTokenClassification"
    assert module.score.out_features == 1 and module.dtype == torch.float64
    assert engine.metrics_prefix == "critic"
    prompt, response = torch.tensor([4, 5, 6]), torch.tensor([7, 8])
    values = engine.values([prompt], [response], [[0]])[0]
    with torch.no_grad():
        want = module(input_ids=torch.cat([prompt, response])[None]).logits[0, 2:4, 0].float()
    torch.testing.assert_close(values, want)


def test_remote_code_needs_trust(remote_dir):
    # the engine's default is not to run a checkpoint's code
    with pytest.raises(ValueError, match="trust_remote_code"):
        CausalLMEngine(remote_dir, torch.device("cpu"), head="value", trainable=False)
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_value_model(remote_dir)


def test_trusted_code_without_a_token_classifier_is_refused(tmp_path):
    path = _remote_checkpoint(tmp_path / "tiny_remote_no_classifier", with_classifier=False)
    with pytest.raises(ValueError, match="'tiny_remote' has no ForTokenClassification"):
        load_value_model(path, trust_remote_code=True)


def test_trusting_a_checkpoint_without_code_changes_nothing(tmp_path):
    cfg = Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64)
    Qwen2ForCausalLM(cfg).save_pretrained(str(tmp_path))
    module = load_value_model(str(tmp_path), trust_remote_code=True, dtype=torch.bfloat16)
    assert type(module).__name__ == "Qwen2ForTokenClassification" and module.dtype == torch.bfloat16
    assert module.config.num_labels == 1


def _qwen2(path, drop=None):
    config = Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=32, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    state = {k: v for k, v in model.state_dict().items() if k != drop}
    model.save_pretrained(path, state_dict=state)
    return str(path)


def test_the_new_value_head_loads_without_transformers_missing_report(tmp_path):
    import logging
    from transformers.utils import logging as hf_logging
    path = _qwen2(tmp_path / "m")
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    handler, root = Keep(), logging.getLogger("transformers")
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()  # where transformers reports a missing weight
    root.addHandler(handler)
    try:
        AutoModelForTokenClassification.from_pretrained(path, num_labels=1)  # the control: transformers reports
        assert any("MISSING" in text for text in seen)
        seen.clear()
        model = load_value_model(path)
        assert model.score.out_features == 1
        assert not any("MISSING" in text for text in seen)  # the new head is expected: no load report
        assert hf_logging.get_verbosity() == hf_logging.WARNING  # the caller's verbosity is back
    finally:
        root.removeHandler(handler)
        hf_logging.set_verbosity(before)


def test_weights_missing_besides_the_head_are_an_error_naming_them(tmp_path):
    path = _qwen2(tmp_path / "m", drop="model.layers.0.mlp.up_proj.weight")
    with pytest.raises(ValueError) as info:
        load_value_model(path)
    assert str(info.value) == (f"the value model loaded from {path!r} lacks weights beyond its new value head: "
                               f"['model.layers.0.mlp.up_proj.weight']")
