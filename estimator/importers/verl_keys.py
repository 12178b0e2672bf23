"""Every key of verl v0.7.0's PPO trainer config (commit f9c855f7cf04d603c9546bc01776c74806a879c1,
``verl/trainer/config/_generated_ppo_trainer.yaml``, the Hydra defaults flattened to dotted keys);
data, not code."""

# The three models verl builds with FSDP (the actor, the reference, the critic) have the same
# profiler and fsdp_config sections; their keys are written once each and put under every owner.
_PROFILER = """
    _target_ all_ranks enable ranks save_path tool tool_config.npu._target_ tool_config.npu.analysis
    tool_config.npu.contents tool_config.npu.discrete tool_config.npu.level tool_config.nsys._target_
    tool_config.nsys.discrete tool_config.torch._target_ tool_config.torch.step_end tool_config.torch.step_start
    tool_config.torch_memory._target_ tool_config.torch_memory.stack_depth
    tool_config.torch_memory.trace_alloc_max_entries
""".split()
_FSDP_CONFIG = """
    _target_ dtype entropy_checkpointing entropy_from_logits_with_chunking forward_only forward_prefetch
    fsdp_size full_determinism model_dtype offload_policy optimizer_offload param_offload reshard_after_forward
    seed strategy ulysses_sequence_parallel_size use_orig_params use_torch_compile wrap_policy.min_num_params
""".split()
_OWNERS = {"profiler": ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"),
           "fsdp_config": ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model")}
_SECTIONS = {"profiler": _PROFILER, "fsdp_config": _FSDP_CONFIG}

PPO_TRAINER = frozenset("""
    actor_rollout_ref.actor._target_ actor_rollout_ref.actor.calculate_entropy
    actor_rollout_ref.actor.checkpoint._target_ actor_rollout_ref.actor.checkpoint.async_save
    actor_rollout_ref.actor.checkpoint.load_contents actor_rollout_ref.actor.checkpoint.save_contents
    actor_rollout_ref.actor.clip_ratio actor_rollout_ref.actor.clip_ratio_c
    actor_rollout_ref.actor.clip_ratio_high actor_rollout_ref.actor.clip_ratio_low
    actor_rollout_ref.actor.data_loader_seed actor_rollout_ref.actor.entropy_checkpointing
    actor_rollout_ref.actor.entropy_coeff actor_rollout_ref.actor.entropy_from_logits_with_chunking
    actor_rollout_ref.actor.freeze_vision_tower actor_rollout_ref.actor.grad_clip
    actor_rollout_ref.actor.kl_loss_coef actor_rollout_ref.actor.kl_loss_type
    actor_rollout_ref.actor.loss_agg_mode actor_rollout_ref.actor.loss_scale_factor
    actor_rollout_ref.actor.optim._target_ actor_rollout_ref.actor.optim.betas
    actor_rollout_ref.actor.optim.clip_grad actor_rollout_ref.actor.optim.lr
    actor_rollout_ref.actor.optim.lr_scheduler_type actor_rollout_ref.actor.optim.lr_warmup_steps
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio actor_rollout_ref.actor.optim.min_lr_ratio
    actor_rollout_ref.actor.optim.num_cycles actor_rollout_ref.actor.optim.optimizer
    actor_rollout_ref.actor.optim.optimizer_impl actor_rollout_ref.actor.optim.override_optimizer_config
    actor_rollout_ref.actor.optim.total_training_steps actor_rollout_ref.actor.optim.warmup_style
    actor_rollout_ref.actor.optim.weight_decay actor_rollout_ref.actor.policy_loss._target_
    actor_rollout_ref.actor.policy_loss.clip_cov_lb actor_rollout_ref.actor.policy_loss.clip_cov_ratio
    actor_rollout_ref.actor.policy_loss.clip_cov_ub actor_rollout_ref.actor.policy_loss.kl_cov_ratio
    actor_rollout_ref.actor.policy_loss.loss_mode actor_rollout_ref.actor.policy_loss.ppo_kl_coef
    actor_rollout_ref.actor.ppo_epochs actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    actor_rollout_ref.actor.ppo_micro_batch_size actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    actor_rollout_ref.actor.ppo_mini_batch_size actor_rollout_ref.actor.rollout_n
    actor_rollout_ref.actor.router_replay._target_ actor_rollout_ref.actor.router_replay.mode
    actor_rollout_ref.actor.router_replay.record_file actor_rollout_ref.actor.router_replay.replay_file
    actor_rollout_ref.actor.shuffle actor_rollout_ref.actor.strategy actor_rollout_ref.actor.tau_neg
    actor_rollout_ref.actor.tau_pos actor_rollout_ref.actor.ulysses_sequence_parallel_size
    actor_rollout_ref.actor.use_dynamic_bsz actor_rollout_ref.actor.use_fused_kernels
    actor_rollout_ref.actor.use_kl_loss actor_rollout_ref.actor.use_remove_padding
    actor_rollout_ref.actor.use_torch_compile actor_rollout_ref.hybrid_engine actor_rollout_ref.model._target_
    actor_rollout_ref.model.custom_chat_template actor_rollout_ref.model.enable_activation_offload
    actor_rollout_ref.model.enable_gradient_checkpointing actor_rollout_ref.model.exclude_modules
    actor_rollout_ref.model.external_lib actor_rollout_ref.model.fused_kernel_options.impl_backend
    actor_rollout_ref.model.hf_config_path actor_rollout_ref.model.lora_adapter_path
    actor_rollout_ref.model.lora_alpha actor_rollout_ref.model.lora_rank actor_rollout_ref.model.override_config
    actor_rollout_ref.model.path actor_rollout_ref.model.target_modules
    actor_rollout_ref.model.tiled_mlp.enabled actor_rollout_ref.model.tiled_mlp.num_shards
    actor_rollout_ref.model.tokenizer_path actor_rollout_ref.model.trust_remote_code
    actor_rollout_ref.model.use_fused_kernels actor_rollout_ref.model.use_liger
    actor_rollout_ref.model.use_remove_padding actor_rollout_ref.model.use_shm actor_rollout_ref.nccl_timeout
    actor_rollout_ref.ref._target_ actor_rollout_ref.ref.entropy_checkpointing
    actor_rollout_ref.ref.entropy_from_logits_with_chunking actor_rollout_ref.ref.log_prob_max_token_len_per_gpu
    actor_rollout_ref.ref.log_prob_micro_batch_size actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz actor_rollout_ref.ref.rollout_n
    actor_rollout_ref.ref.router_replay._target_ actor_rollout_ref.ref.router_replay.mode
    actor_rollout_ref.ref.router_replay.record_file actor_rollout_ref.ref.router_replay.replay_file
    actor_rollout_ref.ref.strategy actor_rollout_ref.ref.ulysses_sequence_parallel_size
    actor_rollout_ref.ref.use_torch_compile actor_rollout_ref.rollout._target_
    actor_rollout_ref.rollout.agent._target_ actor_rollout_ref.rollout.agent.agent_loop_config_path
    actor_rollout_ref.rollout.agent.custom_async_server._target_
    actor_rollout_ref.rollout.agent.custom_async_server.name
    actor_rollout_ref.rollout.agent.custom_async_server.path actor_rollout_ref.rollout.agent.default_agent_loop
    actor_rollout_ref.rollout.agent.num_workers actor_rollout_ref.rollout.calculate_log_probs
    actor_rollout_ref.rollout.cudagraph_capture_sizes actor_rollout_ref.rollout.data_parallel_size
    actor_rollout_ref.rollout.disable_log_stats actor_rollout_ref.rollout.do_sample
    actor_rollout_ref.rollout.dtype actor_rollout_ref.rollout.enable_chunked_prefill
    actor_rollout_ref.rollout.enable_prefix_caching actor_rollout_ref.rollout.enable_rollout_routing_replay
    actor_rollout_ref.rollout.enforce_eager actor_rollout_ref.rollout.engine_kwargs.sglang
    actor_rollout_ref.rollout.engine_kwargs.vllm actor_rollout_ref.rollout.expert_parallel_size
    actor_rollout_ref.rollout.free_cache_engine actor_rollout_ref.rollout.gpu_memory_utilization
    actor_rollout_ref.rollout.ignore_eos actor_rollout_ref.rollout.layered_summon
    actor_rollout_ref.rollout.load_format actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu
    actor_rollout_ref.rollout.log_prob_micro_batch_size
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz actor_rollout_ref.rollout.logprobs_mode
    actor_rollout_ref.rollout.max_model_len actor_rollout_ref.rollout.max_num_batched_tokens
    actor_rollout_ref.rollout.max_num_seqs actor_rollout_ref.rollout.mode
    actor_rollout_ref.rollout.multi_stage_wake_up actor_rollout_ref.rollout.multi_turn._target_
    actor_rollout_ref.rollout.multi_turn.enable actor_rollout_ref.rollout.multi_turn.format
    actor_rollout_ref.rollout.multi_turn.interaction_config_path
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns
    actor_rollout_ref.rollout.multi_turn.max_parallel_calls
    actor_rollout_ref.rollout.multi_turn.max_tool_response_length
    actor_rollout_ref.rollout.multi_turn.max_user_turns actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts
    actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode
    actor_rollout_ref.rollout.multi_turn.tool_config_path
    actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side
    actor_rollout_ref.rollout.multi_turn.use_inference_chat_template actor_rollout_ref.rollout.n
    actor_rollout_ref.rollout.name actor_rollout_ref.rollout.over_sample_rate
    actor_rollout_ref.rollout.pipeline_model_parallel_size actor_rollout_ref.rollout.profiler._target_
    actor_rollout_ref.rollout.profiler.all_ranks actor_rollout_ref.rollout.profiler.enable
    actor_rollout_ref.rollout.profiler.ranks actor_rollout_ref.rollout.profiler.save_path
    actor_rollout_ref.rollout.profiler.tool actor_rollout_ref.rollout.profiler.tool_config
    actor_rollout_ref.rollout.prometheus._target_ actor_rollout_ref.rollout.prometheus.enable
    actor_rollout_ref.rollout.prometheus.file actor_rollout_ref.rollout.prometheus.port
    actor_rollout_ref.rollout.prometheus.served_model_name actor_rollout_ref.rollout.prompt_length
    actor_rollout_ref.rollout.quantization actor_rollout_ref.rollout.quantization_config_file
    actor_rollout_ref.rollout.response_length actor_rollout_ref.rollout.skip_dump_dir
    actor_rollout_ref.rollout.skip_rollout actor_rollout_ref.rollout.skip_tokenizer_init
    actor_rollout_ref.rollout.temperature actor_rollout_ref.rollout.tensor_model_parallel_size
    actor_rollout_ref.rollout.top_k actor_rollout_ref.rollout.top_p actor_rollout_ref.rollout.trace._target_
    actor_rollout_ref.rollout.trace.backend actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker
    actor_rollout_ref.rollout.trace.token2text actor_rollout_ref.rollout.update_weights_bucket_megabytes
    actor_rollout_ref.rollout.val_kwargs._target_ actor_rollout_ref.rollout.val_kwargs.do_sample
    actor_rollout_ref.rollout.val_kwargs.n actor_rollout_ref.rollout.val_kwargs.temperature
    actor_rollout_ref.rollout.val_kwargs.top_k actor_rollout_ref.rollout.val_kwargs.top_p algorithm._target_
    algorithm.adv_estimator algorithm.gamma algorithm.kl_ctrl._target_ algorithm.kl_ctrl.horizon
    algorithm.kl_ctrl.kl_coef algorithm.kl_ctrl.target_kl algorithm.kl_ctrl.type algorithm.kl_penalty
    algorithm.lam algorithm.norm_adv_by_std_in_grpo algorithm.pf_ppo.reweight_method algorithm.pf_ppo.weight_pow
    algorithm.rollout_correction.bypass_mode algorithm.rollout_correction.loss_type
    algorithm.rollout_correction.rollout_is algorithm.rollout_correction.rollout_is_batch_normalize
    algorithm.rollout_correction.rollout_is_threshold algorithm.rollout_correction.rollout_rs
    algorithm.rollout_correction.rollout_rs_threshold algorithm.rollout_correction.rollout_rs_threshold_lower
    algorithm.rollout_correction.rollout_token_veto_threshold algorithm.use_kl_in_reward algorithm.use_pf_ppo
    critic._target_ critic.checkpoint._target_ critic.checkpoint.async_save critic.checkpoint.load_contents
    critic.checkpoint.save_contents critic.cliprange_value critic.data_loader_seed critic.enable
    critic.forward_max_token_len_per_gpu critic.forward_micro_batch_size critic.forward_micro_batch_size_per_gpu
    critic.grad_clip critic.loss_agg_mode critic.model._target_ critic.model.enable_activation_offload
    critic.model.enable_gradient_checkpointing critic.model.external_lib critic.model.lora_alpha
    critic.model.lora_rank critic.model.override_config critic.model.path critic.model.target_modules
    critic.model.tiled_mlp.enabled critic.model.tiled_mlp.num_shards critic.model.tokenizer_path
    critic.model.trust_remote_code critic.model.use_remove_padding critic.model.use_shm critic.optim._target_
    critic.optim.betas critic.optim.clip_grad critic.optim.lr critic.optim.lr_scheduler_type
    critic.optim.lr_warmup_steps critic.optim.lr_warmup_steps_ratio critic.optim.min_lr_ratio
    critic.optim.num_cycles critic.optim.optimizer critic.optim.optimizer_impl
    critic.optim.override_optimizer_config critic.optim.total_training_steps critic.optim.warmup_style
    critic.optim.weight_decay critic.ppo_epochs critic.ppo_max_token_len_per_gpu critic.ppo_micro_batch_size
    critic.ppo_micro_batch_size_per_gpu critic.ppo_mini_batch_size critic.rollout_n critic.shuffle
    critic.strategy critic.ulysses_sequence_parallel_size critic.use_dynamic_bsz custom_reward_function.name
    custom_reward_function.path data.apply_chat_template_kwargs data.custom_cls.name data.custom_cls.path
    data.datagen.name data.datagen.path data.dataloader_num_workers data.filter_overlong_prompts
    data.filter_overlong_prompts_workers data.image_key data.image_patch_size data.max_prompt_length
    data.max_response_length data.prompt_key data.return_full_prompt data.return_multi_modal_inputs
    data.return_raw_chat data.return_raw_input_ids data.reward_fn_key data.sampler.class_name
    data.sampler.class_path data.seed data.shuffle data.tokenizer data.tool_config_path data.train_batch_size
    data.train_files data.train_max_samples data.truncation data.trust_remote_code data.use_shm
    data.val_batch_size data.val_files data.val_max_samples data.validation_shuffle data.video_key
    global_profiler._target_ global_profiler.global_tool_config.nsys._target_
    global_profiler.global_tool_config.nsys.controller_nsight_options.cuda-graph-trace
    global_profiler.global_tool_config.nsys.controller_nsight_options.cuda-memory-usage
    global_profiler.global_tool_config.nsys.controller_nsight_options.trace
    global_profiler.global_tool_config.nsys.discrete
    global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range
    global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range-end
    global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-graph-trace
    global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-memory-usage
    global_profiler.global_tool_config.nsys.worker_nsight_options.kill
    global_profiler.global_tool_config.nsys.worker_nsight_options.trace
    global_profiler.global_tool_config.torch_memory.context
    global_profiler.global_tool_config.torch_memory.kw_args
    global_profiler.global_tool_config.torch_memory.stack_depth
    global_profiler.global_tool_config.torch_memory.stacks
    global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries
    global_profiler.profile_continuous_steps global_profiler.save_path global_profiler.steps
    global_profiler.tool ray_kwargs.ray_init.num_cpus ray_kwargs.timeline_json_file reward_manager._target_
    reward_manager.module._target_ reward_manager.module.name reward_manager.module.path reward_manager.name
    reward_manager.source reward_model.enable reward_model.enable_resource_pool
    reward_model.forward_max_token_len_per_gpu reward_model.launch_reward_fn_async reward_model.max_length
    reward_model.micro_batch_size reward_model.micro_batch_size_per_gpu reward_model.model.external_lib
    reward_model.model.fsdp_config._target_ reward_model.model.fsdp_config.forward_prefetch
    reward_model.model.fsdp_config.fsdp_size reward_model.model.fsdp_config.param_offload
    reward_model.model.fsdp_config.reshard_after_forward
    reward_model.model.fsdp_config.wrap_policy.min_num_params reward_model.model.input_tokenizer
    reward_model.model.override_config reward_model.model.path reward_model.model.trust_remote_code
    reward_model.model.use_fused_kernels reward_model.model.use_remove_padding reward_model.model.use_shm
    reward_model.n_gpus_per_node reward_model.nnodes reward_model.num_workers reward_model.profiler._target_
    reward_model.profiler.all_ranks reward_model.profiler.enable reward_model.profiler.ranks
    reward_model.profiler.save_path reward_model.profiler.tool reward_model.profiler.tool_config
    reward_model.reward_loop_class_name reward_model.reward_loop_module_path reward_model.reward_loop_source
    reward_model.reward_manager reward_model.rollout._target_ reward_model.rollout.cudagraph_capture_sizes
    reward_model.rollout.data_parallel_size reward_model.rollout.disable_log_stats reward_model.rollout.dtype
    reward_model.rollout.enable_chunked_prefill reward_model.rollout.enable_prefix_caching
    reward_model.rollout.enforce_eager reward_model.rollout.engine_kwargs
    reward_model.rollout.expert_parallel_size reward_model.rollout.free_cache_engine
    reward_model.rollout.gpu_memory_utilization reward_model.rollout.limit_images
    reward_model.rollout.load_format reward_model.rollout.max_model_len
    reward_model.rollout.max_num_batched_tokens reward_model.rollout.max_num_seqs reward_model.rollout.name
    reward_model.rollout.prompt_length reward_model.rollout.response_length
    reward_model.rollout.skip_tokenizer_init reward_model.rollout.tensor_model_parallel_size
    reward_model.sandbox_fusion.max_concurrent reward_model.sandbox_fusion.memory_limit_mb
    reward_model.sandbox_fusion.url reward_model.strategy reward_model.ulysses_sequence_parallel_size
    reward_model.use_dynamic_bsz reward_model.use_reward_loop trainer.balance_batch trainer.critic_warmup
    trainer.default_hdfs_dir trainer.default_local_dir trainer.del_local_ckpt_after_load trainer.device
    trainer.esi_redundant_time trainer.experiment_name trainer.log_val_generations trainer.logger
    trainer.max_actor_ckpt_to_keep trainer.max_critic_ckpt_to_keep trainer.n_gpus_per_node trainer.nnodes
    trainer.project_name trainer.ray_wait_register_center_timeout trainer.resume_from_path trainer.resume_mode
    trainer.rollout_data_dir trainer.save_freq trainer.test_freq trainer.total_epochs
    trainer.total_training_steps trainer.use_legacy_worker_impl trainer.val_before_train trainer.val_only
    trainer.validation_data_dir transfer_queue.enable
""".split()) | frozenset(f"{owner}.{section}.{key}" for section, owners in _OWNERS.items() for owner in owners
                         for key in _SECTIONS[section])
