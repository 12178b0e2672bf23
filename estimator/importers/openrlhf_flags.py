"""Every command-line flag of OpenRLHF's trainers, with its arity; data, not code.

OpenRLHF v0.11.0 (commit 3c3be6234e0cb353e76bb8019947db9dfe99fca7): the parsers that
``openrlhf/cli/train_ppo_ray.py``, ``train_sft.py`` and ``train_dpo.py`` build in their ``__main__``
blocks, listed by running those blocks' statements before ``parse_args`` (dotted names: OpenRLHF
turns them into nested namespaces, ``openrlhf/utils/config.py`` ``hierarchize``).
"""

SWITCHES = frozenset("""
    --actor.freeze_visual_encoder --actor.gradient_checkpointing_enable --actor.gradient_checkpointing_reentrant
    --actor.muon.nesterov --actor.muon.no_nesterov --algo.advantage.is_correction_enable
    --algo.advantage.no_std_norm --algo.dynamic_filtering_enable --algo.kl.use_loss --ckpt.disable_ds
    --ckpt.load_enable --ckpt.save_hf --critic.muon.nesterov --critic.muon.no_nesterov
    --critic.save_value_network --data.apply_chat_template --data.disable_fast_tokenizer --data.multiturn
    --ds.adam_offload --ds.deepcompile --ds.enable_sleep --ds.load_in_4bit --ds.overlap_comm
    --ds.packing_samples --ds.use_liger_kernel --ds.use_universal_ckpt --model.gradient_checkpointing_enable
    --model.gradient_checkpointing_reentrant --model.ipo_enable --model.pretrain_mode_enable --muon.nesterov
    --muon.no_nesterov --ref.offload --reward.normalize_enable --reward.offload --train.async_enable
    --train.colocate_actor_ref --train.colocate_all --train.colocate_critic_reward --train.dynamic_batch_enable
    --train.enable_ema --train.full_determinism_enable --train.partial_rollout_enable --use_ms
    --vllm.enable_prefix_caching --vllm.enable_sleep --vllm.enforce_eager --vllm.sync_with_ray
""".split())

ONE_VALUE = frozenset("""
    --actor.adam.eps --actor.adam.lr --actor.adam.weight_decay --actor.aux_loss_coef --actor.dual_clip
    --actor.entropy_coef --actor.eps_clip --actor.lr_scheduler --actor.lr_warmup_ratio --actor.max_norm
    --actor.min_lr_ratio --actor.model_name_or_path --actor.muon.lr --actor.muon.momentum --actor.muon.ns_steps
    --actor.num_gpus_per_node --actor.num_nodes --actor.optim --actor.policy_loss_type --adam.eps --adam.lr
    --adam.weight_decay --algo.advantage.estimator --algo.advantage.gamma --algo.advantage.is_correction_type
    --algo.advantage.lambd --algo.kl.estimator --algo.kl.horizon --algo.kl.init_coef --algo.kl.target
    --ckpt.best_metric_key --ckpt.max_mem --ckpt.max_num --ckpt.output_dir --ckpt.path --ckpt.save_steps
    --critic.adam.eps --critic.adam.lr --critic.adam.weight_decay --critic.freezing_steps --critic.lr_scheduler
    --critic.lr_warmup_ratio --critic.max_norm --critic.min_lr_ratio --critic.model_name_or_path
    --critic.muon.lr --critic.muon.momentum --critic.muon.ns_steps --critic.num_gpus_per_node --critic.num_nodes
    --critic.optim --critic.value_clip --data.chosen_key --data.dataloader_num_workers --data.dataset
    --data.dataset_probs --data.dataset_split --data.image_key --data.input_key --data.input_template
    --data.label_key --data.max_images_per_prompt --data.max_len --data.max_samples --data.output_key
    --data.prompt_dataset --data.prompt_key --data.prompt_probs --data.prompt_split --data.rejected_key
    --data.tokenizer_chat_template --ds.attn_implementation --ds.experts_implementation --ds.grad_accum_dtype
    --ds.lora.alpha --ds.lora.dropout --ds.lora.rank --ds.param_dtype --ds.ring_attn_head_stride
    --ds.ring_attn_size --ds.tensor_parallel_size --ds.value_head_prefix --ds.zero_stage --ds.zpg --eval.dataset
    --eval.n_samples_per_prompt --eval.split --eval.steps --eval.temperature --local_rank --logger.logging_steps
    --logger.tensorboard_dir --logger.wandb.group --logger.wandb.key --logger.wandb.org --logger.wandb.project
    --logger.wandb.run_name --lr_scheduler --lr_warmup_ratio --max_norm --min_lr_ratio --model.aux_loss_coef
    --model.beta --model.label_smoothing --model.model_name_or_path --model.nll_loss_coef --muon.lr
    --muon.momentum --muon.ns_steps --optim --ref.model_name_or_path --ref.num_gpus_per_node --ref.num_nodes
    --reward.model_name_or_path --reward.num_gpus_per_node --reward.num_nodes --reward.overlong_buffer_len
    --reward.overlong_penalty_factor --reward.remote_url --reward.stop_properly_penalty_coef
    --rollout.batch_size --rollout.max_new_tokens --rollout.max_tokens_per_gpu --rollout.micro_batch_size
    --rollout.n_samples_per_prompt --rollout.temperature --rollout.top_p --rollout.vllm_generate_batch_size
    --train.agent_func_path --train.async_queue_size --train.batch_size --train.ema_beta --train.max_epochs
    --train.max_tokens_per_gpu --train.micro_batch_size --train.num_episodes --train.seed
    --vllm.gpu_memory_utilization --vllm.num_engines --vllm.sync_backend --vllm.tensor_parallel_size
""".split())

TWO_VALUES = frozenset("""
    --actor.adam.betas --actor.eps_clip_low_high --adam.betas --algo.advantage.is_correction_threshold
    --algo.dynamic_filtering_range --critic.adam.betas --reward.clip_range
""".split())

VALUES = frozenset("""
    --ds.lora.target_modules
""".split())

TRAIN_PPO_RAY = frozenset("""
    --actor.adam.betas --actor.adam.eps --actor.adam.lr --actor.adam.weight_decay --actor.aux_loss_coef
    --actor.dual_clip --actor.entropy_coef --actor.eps_clip --actor.eps_clip_low_high
    --actor.freeze_visual_encoder --actor.gradient_checkpointing_enable --actor.gradient_checkpointing_reentrant
    --actor.lr_scheduler --actor.lr_warmup_ratio --actor.max_norm --actor.min_lr_ratio
    --actor.model_name_or_path --actor.muon.lr --actor.muon.momentum --actor.muon.nesterov
    --actor.muon.no_nesterov --actor.muon.ns_steps --actor.num_gpus_per_node --actor.num_nodes --actor.optim
    --actor.policy_loss_type --algo.advantage.estimator --algo.advantage.gamma
    --algo.advantage.is_correction_enable --algo.advantage.is_correction_threshold
    --algo.advantage.is_correction_type --algo.advantage.lambd --algo.advantage.no_std_norm
    --algo.dynamic_filtering_enable --algo.dynamic_filtering_range --algo.kl.estimator --algo.kl.horizon
    --algo.kl.init_coef --algo.kl.target --algo.kl.use_loss --ckpt.best_metric_key --ckpt.disable_ds
    --ckpt.load_enable --ckpt.max_mem --ckpt.max_num --ckpt.output_dir --ckpt.path --ckpt.save_hf
    --ckpt.save_steps --critic.adam.betas --critic.adam.eps --critic.adam.lr --critic.adam.weight_decay
    --critic.freezing_steps --critic.lr_scheduler --critic.lr_warmup_ratio --critic.max_norm
    --critic.min_lr_ratio --critic.model_name_or_path --critic.muon.lr --critic.muon.momentum
    --critic.muon.nesterov --critic.muon.no_nesterov --critic.muon.ns_steps --critic.num_gpus_per_node
    --critic.num_nodes --critic.optim --critic.save_value_network --critic.value_clip --data.apply_chat_template
    --data.dataloader_num_workers --data.disable_fast_tokenizer --data.image_key --data.input_key
    --data.input_template --data.label_key --data.max_images_per_prompt --data.max_len --data.max_samples
    --data.prompt_dataset --data.prompt_probs --data.prompt_split --ds.adam_offload --ds.attn_implementation
    --ds.deepcompile --ds.enable_sleep --ds.experts_implementation --ds.grad_accum_dtype --ds.load_in_4bit
    --ds.lora.alpha --ds.lora.dropout --ds.lora.rank --ds.lora.target_modules --ds.overlap_comm
    --ds.packing_samples --ds.param_dtype --ds.ring_attn_head_stride --ds.ring_attn_size
    --ds.tensor_parallel_size --ds.use_liger_kernel --ds.use_universal_ckpt --ds.value_head_prefix
    --ds.zero_stage --ds.zpg --eval.dataset --eval.n_samples_per_prompt --eval.split --eval.steps
    --eval.temperature --local_rank --logger.logging_steps --logger.tensorboard_dir --logger.wandb.group
    --logger.wandb.key --logger.wandb.org --logger.wandb.project --logger.wandb.run_name --ref.num_gpus_per_node
    --ref.num_nodes --ref.offload --reward.clip_range --reward.model_name_or_path --reward.normalize_enable
    --reward.num_gpus_per_node --reward.num_nodes --reward.offload --reward.overlong_buffer_len
    --reward.overlong_penalty_factor --reward.remote_url --reward.stop_properly_penalty_coef
    --rollout.batch_size --rollout.max_new_tokens --rollout.max_tokens_per_gpu --rollout.micro_batch_size
    --rollout.n_samples_per_prompt --rollout.temperature --rollout.top_p --rollout.vllm_generate_batch_size
    --train.agent_func_path --train.async_enable --train.async_queue_size --train.batch_size
    --train.colocate_actor_ref --train.colocate_all --train.colocate_critic_reward --train.dynamic_batch_enable
    --train.ema_beta --train.enable_ema --train.full_determinism_enable --train.max_epochs
    --train.max_tokens_per_gpu --train.micro_batch_size --train.num_episodes --train.partial_rollout_enable
    --train.seed --use_ms --vllm.enable_prefix_caching --vllm.enable_sleep --vllm.enforce_eager
    --vllm.gpu_memory_utilization --vllm.num_engines --vllm.sync_backend --vllm.sync_with_ray
    --vllm.tensor_parallel_size
""".split())

TRAIN_SFT = frozenset("""
    --adam.betas --adam.eps --adam.lr --adam.weight_decay --ckpt.disable_ds --ckpt.load_enable --ckpt.max_mem
    --ckpt.max_num --ckpt.output_dir --ckpt.path --ckpt.save_hf --ckpt.save_steps --data.apply_chat_template
    --data.dataloader_num_workers --data.dataset --data.dataset_probs --data.dataset_split
    --data.disable_fast_tokenizer --data.input_key --data.input_template --data.max_len --data.max_samples
    --data.multiturn --data.output_key --data.tokenizer_chat_template --ds.adam_offload --ds.attn_implementation
    --ds.deepcompile --ds.experts_implementation --ds.grad_accum_dtype --ds.load_in_4bit --ds.lora.alpha
    --ds.lora.dropout --ds.lora.rank --ds.lora.target_modules --ds.overlap_comm --ds.packing_samples
    --ds.param_dtype --ds.ring_attn_head_stride --ds.ring_attn_size --ds.tensor_parallel_size
    --ds.use_liger_kernel --ds.use_universal_ckpt --ds.zero_stage --ds.zpg --eval.dataset --eval.split
    --eval.steps --local_rank --logger.logging_steps --logger.tensorboard_dir --logger.wandb.group
    --logger.wandb.key --logger.wandb.org --logger.wandb.project --logger.wandb.run_name --lr_scheduler
    --lr_warmup_ratio --max_norm --min_lr_ratio --model.aux_loss_coef --model.gradient_checkpointing_enable
    --model.gradient_checkpointing_reentrant --model.model_name_or_path --model.pretrain_mode_enable --muon.lr
    --muon.momentum --muon.nesterov --muon.no_nesterov --muon.ns_steps --optim --train.batch_size
    --train.full_determinism_enable --train.max_epochs --train.micro_batch_size --train.seed --use_ms
""".split())

TRAIN_DPO = frozenset("""
    --adam.betas --adam.eps --adam.lr --adam.weight_decay --ckpt.disable_ds --ckpt.load_enable --ckpt.max_mem
    --ckpt.max_num --ckpt.output_dir --ckpt.path --ckpt.save_hf --ckpt.save_steps --data.apply_chat_template
    --data.chosen_key --data.dataloader_num_workers --data.dataset --data.dataset_probs --data.dataset_split
    --data.disable_fast_tokenizer --data.input_template --data.max_len --data.max_samples --data.prompt_key
    --data.rejected_key --data.tokenizer_chat_template --ds.adam_offload --ds.attn_implementation
    --ds.deepcompile --ds.experts_implementation --ds.grad_accum_dtype --ds.load_in_4bit --ds.lora.alpha
    --ds.lora.dropout --ds.lora.rank --ds.lora.target_modules --ds.overlap_comm --ds.packing_samples
    --ds.param_dtype --ds.ring_attn_head_stride --ds.ring_attn_size --ds.tensor_parallel_size
    --ds.use_liger_kernel --ds.use_universal_ckpt --ds.zero_stage --ds.zpg --eval.dataset --eval.split
    --eval.steps --local_rank --logger.logging_steps --logger.tensorboard_dir --logger.wandb.group
    --logger.wandb.key --logger.wandb.org --logger.wandb.project --logger.wandb.run_name --lr_scheduler
    --lr_warmup_ratio --max_norm --min_lr_ratio --model.aux_loss_coef --model.beta
    --model.gradient_checkpointing_enable --model.gradient_checkpointing_reentrant --model.ipo_enable
    --model.label_smoothing --model.model_name_or_path --model.nll_loss_coef --muon.lr --muon.momentum
    --muon.nesterov --muon.no_nesterov --muon.ns_steps --optim --ref.model_name_or_path --ref.offload
    --train.batch_size --train.full_determinism_enable --train.max_epochs --train.micro_batch_size --train.seed
    --use_ms
""".split())

ENTRIES = {"train_ppo_ray": TRAIN_PPO_RAY, "train_sft": TRAIN_SFT, "train_dpo": TRAIN_DPO}


def arity(entry: str, flag: str) -> int | None:
    """0 = a switch, n = exactly n values, -1 = one or more; None = not a flag of `entry`."""
    if flag not in ENTRIES[entry]:
        return None
    return 0 if flag in SWITCHES else 1 if flag in ONE_VALUE else 2 if flag in TWO_VALUES else -1
