"""Model architecture, parallel layout and training settings of one worker.

Built from the ``megatron_training`` section merged with a role section such
as ``actor_config``, plus the model section named by their ``model`` key.
The key names follow Megatron; many kernel/fusion switches are accepted only
so that upstream configs load, and have no effect in this implementation.
"""
from mindspeed_rl.config_cls.base_config import BaseConfig

# model-section keys of the newer families (Qwen3, Qwen3-MoE, DeepSeek-V3); config_cls/model_arch.py
# turns them into the HF config of the matching transformers class
MODEL_FAMILY_KEYS = (
    "attention_bias", "qk_layernorm",
    "rope_scaling_type", "rope_scaling_factor", "rope_scaling_mscale", "rope_scaling_mscale_all_dim",
    "rope_scaling_original_max_position_embeddings", "beta_fast", "beta_slow",
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    "num_experts", "moe_ffn_hidden_size", "moe_router_topk", "n_shared_experts", "first_k_dense_replace",
    "moe_layer_freq", "norm_topk_prob", "moe_router_score_function", "moe_router_num_groups",
    "moe_router_group_topk", "moe_router_topk_scaling_factor", "moe_router_enable_expert_bias",
)


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
        self.use_rotary_position_embeddings = False  # Megatron's older switch: True means rope
        self.attention_bias = False              # bias on q/k/v/o projections (Qwen3: false)
        self.qk_layernorm = False                # RMSNorm on each head's q and k (Qwen3)
        self.spec = None                         # upstream layer-spec module; the HF class is used instead
        # rope scaling (DeepSeek-V3 yarn)
        self.rope_scaling_type = None            # e.g. 'yarn'
        self.rope_scaling_factor = 1.0
        self.rope_scaling_mscale = 1.0
        self.rope_scaling_mscale_all_dim = 0.0
        self.rope_scaling_original_max_position_embeddings = None
        self.beta_fast = 32
        self.beta_slow = 1
        # multi-latent attention (DeepSeek-V3)
        self.multi_latent_attention = False
        self.q_lora_rank = None                  # query down-projection rank (None: no compression)
        self.kv_lora_rank = None                 # key/value down-projection rank
        self.qk_head_dim = None                  # q/k head dim without the rope part
        self.qk_pos_emb_head_dim = None          # rope part of the q/k head dim
        self.v_head_dim = None                   # value head dim
        # mixture of experts (Qwen3-MoE, DeepSeek-V3)
        self.num_experts = None                  # routed experts per MoE layer (None: dense)
        self.moe_ffn_hidden_size = None          # MLP inner width of one expert
        self.moe_router_topk = 2                 # experts per token
        self.n_shared_experts = None             # always-on experts (DeepSeek)
        self.first_k_dense_replace = None        # the first k layers are dense (DeepSeek)
        self.moe_layer_freq = None               # every n-th layer is MoE
        self.norm_topk_prob = False              # renormalise the top-k router weights
        self.moe_router_score_function = "softmax"  # or 'sigmoid' (DeepSeek-V3)
        self.moe_router_num_groups = None        # group-limited routing: expert groups
        self.moe_router_group_topk = None        # groups each token may use
        self.moe_router_topk_scaling_factor = None  # routed_scaling_factor
        self.moe_router_enable_expert_bias = False  # aux-loss-free balancing bias (DeepSeek-V3)
        self.moe_router_load_balancing_type = "aux_loss"
        self.moe_aux_loss_coeff = 0.001
        self.seq_aux = False                     # sequence-level aux loss (DeepSeek)
        self.moe_grouped_gemm = False            # kernels / communication of Megatron's MoE layer
        self.moe_permutation_async_comm = False
        self.moe_token_dispatcher_type = None
        self.use_fused_moe_token_permute_and_unpermute = False
        self.moe_tp_extend_ep = False
        self.moe_alltoall_overlap_comm = False

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
        self.num_layer_list = None               # layers per pipeline stage, e.g. '16,17,16,15'
        self.noop_layers = None                  # identity layers padding PP stages, e.g. '5,95'
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
        self.reset_attention_mask = None         # packed samples never attend to each other here
        self.no_pad_to_seq_lengths = None        # sequences are never padded to seq_length here
        self.attention_mask_type = "causal"
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
        self.recompute_granularity = None        # activation recomputation ('full', 'selective')
        self.recompute_method = None
        self.recompute_num_layers = None
        self.swap_optimizer = False
        self.reuse_fp32_param = False
        # LoRA (upstream trains adapters when lora_target_modules is set)
        self.lora_target_modules = None
        self.lora_r = 8
        self.lora_alpha = 16
        self.lora_fusion = False
        self.lora_ckpt_filter = False

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
        self.gemm_gradient_accumulation_fusion = False
        self.shape_order = "SBH"

        self.update(training_config, model_config)
