"""The keys of Hugging Face TrainingArguments (transformers 5.23.0) and of TRL's configs and CLI
arguments that extend them (TRL v1.9.0, commit 35def3ee000a87f6839e66f4b7749b06274ed1b3: SFTConfig,
GRPOConfig, DPOConfig, ModelConfig, ScriptArguments), read from their dataclasses; data, not code.
Older TRL keys that still appear in published recipes are added by hand at the end."""

TRAINING_ARGUMENTS = frozenset("""
    accelerator_config activation_checkpointing activation_checkpointing_kwargs adam_beta1 adam_beta2
    adam_epsilon auto_find_batch_size average_tokens_across_devices batch_eval_metrics bf16 bf16_full_eval
    data_seed dataloader_drop_last dataloader_in_order dataloader_multiprocessing_context dataloader_num_workers
    dataloader_persistent_workers dataloader_pin_memory dataloader_prefetch_factor ddp_backend
    ddp_broadcast_buffers ddp_bucket_cap_mb ddp_find_unused_parameters ddp_static_graph ddp_timeout debug
    deepspeed disable_tqdm do_eval do_predict do_train enable_jit_checkpoint eval_accumulation_steps eval_delay
    eval_do_concat_batches eval_on_start eval_steps eval_strategy eval_use_gather_object fp16 fp16_full_eval
    fsdp fsdp_config full_determinism gradient_accumulation_steps gradient_checkpointing
    gradient_checkpointing_kwargs greater_is_better hub_always_push hub_model_id hub_private_repo hub_revision
    hub_strategy hub_token ignore_data_skip include_for_metrics include_num_input_tokens_seen label_names
    label_smoothing_factor learning_rate length_column_name liger_kernel_config load_best_model_at_end
    local_rank log_level log_level_replica log_on_each_node logging_first_step logging_nan_inf_filter
    logging_steps logging_strategy lr_scheduler_kwargs lr_scheduler_type max_grad_norm max_steps
    metric_for_best_model neftune_noise_alpha num_train_epochs optim optim_args optim_target_modules output_dir
    parallelism_config per_device_eval_batch_size per_device_train_batch_size prediction_loss_only project
    push_to_hub remove_unused_columns report_to restore_callback_states_from_checkpoint resume_from_checkpoint
    run_name save_on_each_node save_only_model save_steps save_strategy save_total_limit seed
    skip_memory_metrics tf32 torch_compile torch_compile_backend torch_compile_mode torch_empty_cache_steps
    trackio_bucket_id trackio_space_id trackio_static_space_id train_sampling_strategy use_cache use_cpu
    use_liger_kernel warmup_steps weight_decay
""".split())

TRL = frozenset("""
    activation_offloading assistant_only_loss attn_implementation beta bnb_4bit_quant_storage
    bnb_4bit_quant_type cache_implementation cast_lm_head_to_fp32 chat_template_kwargs chat_template_path
    columns completion_only_loss data_dir data_files dataset_config dataset_kwargs dataset_name dataset_num_proc
    dataset_streaming dataset_test_split dataset_text_field dataset_train_split datasets delta disable_dropout
    discopop_tau ds3_gather_for_generation dtype entropy_coef entropy_coef_delta entropy_coef_max
    entropy_coef_min entropy_target eos_token epsilon epsilon_high eval_packing f_alpha_divergence_coef
    f_divergence_type fraction generation_batch_size generation_kwargs ignore_bias_buffers
    importance_sampling_level label_smoothing ld_alpha load_in_4bit load_in_8bit log_completions
    log_completions_hub_repo log_multimodal log_unique_prompts lora_alpha lora_dropout lora_modules_to_save
    lora_r lora_target_modules lora_target_parameters lora_task_type loss_type loss_weights
    mask_truncated_completions max_completion_length max_length max_tool_calling_iterations min_p
    model_init_kwargs model_name_or_path model_revision multi_objective_aggregation name
    num_completions_to_print num_generations num_generations_eval num_iterations off_policy_mask_threshold
    packing packing_strategy pad_to_multiple_of pad_token padding_free path precompute_ref_batch_size
    precompute_ref_log_probs ref_model_mixup_alpha ref_model_sync_steps repetition_penalty reward_weights
    router_aux_loss_coef sapo_temperature_neg sapo_temperature_pos scale_rewards shuffle_dataset split
    steps_per_generation streaming sync_ref_model temperature test_split_size top_entropy_quantile top_k top_p
    transformers_continuous_batching_config truncation_mode trust_remote_code use_adaptive_entropy
    use_bias_correction_kl use_bnb_nested_quant use_dora use_peft use_rslora
    use_transformers_continuous_batching use_transformers_paged use_vllm use_weighting vespo_k_neg vespo_k_pos
    vespo_lambda_neg vespo_lambda_pos vllm_enable_sleep_mode vllm_gpu_memory_utilization vllm_group_port
    vllm_importance_sampling_cap vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min
    vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_max_model_length vllm_mode
    vllm_model_impl vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout
    vllm_structured_outputs_regex vllm_tensor_parallel_size
""".split())

# TRL 0.x names still found in recipes (max_prompt_length: GRPO and DPO until TRL 0.2x;
# max_seq_length: SFT until TRL 0.19)
LEGACY = frozenset({"max_prompt_length", "max_seq_length", "dataset_kwargs", "torch_dtype", "overwrite_output_dir",
                    "warmup_ratio", "evaluation_strategy", "no_cuda", "logging_dir", "vllm_device"})
