"""Model architecture, parallel layout and training settings of one worker.

Built from the ``megatron_training`` section merged with a role section such
as ``actor_config``, plus the model section named by their ``model`` key.
The key names follow Megatron; many kernel/fusion switches are accepted only
so that upstream configs load, and have no effect in this implementation.
"""
from mindspeed_rl.config_cls.base_config import BaseConfig


class MegatronConfig(BaseConfig):
    """Plain holder of the keys listed in ``__init__`` (each with a comment)."""

    def __init__(self, training_config=None, model_config=None):
        # --- model architecture (usually from configs/model/<name>.yaml) ---
        self.use_mcore_models = False            # upstream model flavour switch
        self.num_layers = None                   # transformer blocks
        self.hidden_size = None                  # model width
        self.ffn_hidden_size = None              # MLP inner width
        self.num_attention_heads = None          # query heads
        self.kv_channels = None                  # head dim; None: hidden / heads
        self.group_query_attention = False       # use fewer KV heads than Q heads
        self.num_query_groups = 1                # KV heads when GQA is on
        self.vocab_size = None                   # tokenizer vocabulary size
        self.padded_vocab_size = None            # embedding rows (>= vocab_size)
        self.make_vocab_size_divisible_by = 128  # padding multiple of the vocab
        self.max_position_embeddings = None      # longest supported position
        self.position_embedding_type = "learned_absolute"  # or 'rope'
        self.rotary_base = 10000.0               # RoPE theta
        self.normalization = "LayerNorm"         # or 'RMSNorm'
        self.norm_epsilon = 1e-5                 # norm epsilon
        self.swiglu = False                      # gated SiLU MLP
        self.add_qkv_bias = False                # bias on the QKV projections only
        self.disable_bias_linear = False         # no bias on other linears
        self.untie_embeddings_and_output_weights = False  # separate LM head
        self.attention_dropout = 0.1
        self.hidden_dropout = 0.1
        self.init_method_std = 0.02              # std of random weight init
        self.attention_softmax_in_fp32 = False   # softmax in fp32 under bf16

        # --- where weights and tokenizer come from ---
        self.model_path = None                   # local HF checkpoint directory
        self.tokenizer_type = None               # e.g. 'PretrainedFromHF'
        self.tokenizer_name_or_path = None       # HF tokenizer dir or name
        self.tokenizer_padding_side = "right"
        self.tokenizer_not_use_fast = False
        self.prompt_type = None                  # prompt template name (datasets/templates.py) or 'chat_template'
        self.system_prompt = None                # system text for every prompt (None: the template's default)
        self.load = None                         # checkpoint dir to load
        self.save = None                         # checkpoint dir to save
        self.finetune = False                    # load weights only, reset iteration
        self.no_load_optim = False
        self.no_load_rng = False
        self.no_save_optim = False
        self.no_save_rng = False
        self.save_interval = None                # iterations between saves

        # --- parallel layout ---
        self.tensor_model_parallel_size = 1
        self.pipeline_model_parallel_size = 1
        self.context_parallel_size = 1
        self.context_parallel_algo = "ulysses_cp_algo"
        self.expert_model_parallel_size = 1
        self.sequence_parallel = False
        self.use_distributed_optimizer = False   # shard optimizer state over DP
        self.distributed_backend = "nccl"        # torch.distributed backend

        # --- data and batch ---
        self.data_path = None                    # dataset prefix
        self.split = None                        # train/valid/test ratio string; training uses the first share
        self.dataset_additional_keys = []        # extra dataset columns to keep
        self.map_keys = None                     # raw data columns: {prompt, response, query, system}
        self.no_shuffle = False                  # serve prompts in file order each epoch
        self.full_shuffle_instruction_dataset = False
        self.num_workers = 2                     # dataloader workers
        self.global_batch_size = None            # prompts per training step
        self.micro_batch_size = 1                # samples per forward/backward
        self.seq_length = None                   # prompt + response length cap
        self.max_prompt_length = None            # copied from rl_config
        self.variable_seq_lengths = False
        self.reset_position_ids = False          # restart positions per packed sample
        self.stage = None                        # e.g. 'ray_grpo'
        self.seed = 1234

        # --- optimisation ---
        self.train_iters = None
        self.optimizer = "adam"
        self.lr = 1e-6
        self.lr_decay_style = "linear"           # 'constant', 'linear', 'cosine'
        self.min_lr = 0.0
        self.lr_warmup_fraction = 0.0
        self.weight_decay = 0.01
        self.clip_grad = 1.0                     # global grad-norm clip
        self.adam_beta1 = 0.9
        self.adam_beta2 = 0.999
        self.adam_eps = 1e-8
        self.initial_loss_scale = 4294967296.0   # fp16 loss scale start (2**32)
        self.bf16 = False                        # False: train in fp32

        # --- accepted for upstream configs; no effect here ---
        self.use_fused_rmsnorm = False
        self.use_fused_swiglu = False
        self.use_fused_rotary_pos_emb = False
        self.use_flash_attn = False
        self.no_masked_softmax_fusion = False
        self.no_gradient_accumulation_fusion = False
        self.no_shared_storage = False
        self.use_ascend_coc = False
        self.coc_mode = -1
        self.coc_parallel_num = 1
        self.coc_fused_kernel = False

        self.update(training_config, model_config)
