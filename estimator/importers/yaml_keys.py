"""Every configuration key of axolotl v0.18.0 (commit 2f5cb9da62a0fe763a1ddeb7798fc9acb2f4a417,
``src/axolotl/utils/schemas/*.py``) and of LLaMA-Factory v0.9.5 (commit
7af909522a951e3ad9f022ea6f88b6755257eaa5, ``src/llamafactory/hparams/*.py``), read from their
pydantic models and dataclasses; data, not code. A key outside these (and TrainingArguments) is
reported as unknown."""

AXOLOTL = frozenset("""
    accelerator_config activation_checkpointing activation_dtype activation_offloading adam_beta1 adam_beta2
    adam_beta3 adam_epsilon adam_epsilon2 adapter adaptive_max_tokens added_tokens_overrides
    additional_special_tokens advantage_estimator alignment_coef async_prefetch attn_implementation
    auto_find_batch_size auto_resume_from_checkpoints auto_wrap_policy axolotl_config_path base_model
    base_model_config batch_flattening batch_size bench_dataset bench_split beta bf16 bfloat16 bnb_config_kwargs
    bos_token capabilities ce_coef center_rewards_coefficient chat_template chat_template_jinja
    chat_template_kwargs check_interval chosen_format chunked_cross_entropy chunked_cross_entropy_num_chunks
    cls_model_config comet_api_key comet_experiment_config comet_experiment_key comet_mode comet_online
    comet_project_name comet_workspace completion_format compute_capability context_length context_parallel_size
    conversation cosine_constant_lr_ratio cosine_min_lr_ratio cpo_alpha cpu_offload_pin_memory
    cpu_ram_efficient_loading curriculum_sampling data_files data_parallel_size dataloader_drop_last
    dataloader_num_workers dataloader_pin_memory dataloader_prefetch_factor dataset_exact_deduplication
    dataset_keep_in_memory dataset_num_proc dataset_prepared_path dataset_processes dataset_shard_idx
    dataset_shard_num datasets ddp ddp_broadcast_buffers ddp_bucket_cap_mb ddp_find_unused_parameters
    ddp_timeout deepcompile deepspeed default_system_message device device_map dion_lr dion_momentum
    dion_rank_fraction dion_rank_multiple_of diversity_coef do_bench_eval do_causal_lm_eval dp_replicate_size
    dp_shard_size dpo_beta dpo_generate_during_eval dpo_label_smoothing dpo_loss_type dpo_loss_weights
    dpo_norm_loss dpo_padding_free dpo_use_liger_kernel dpo_use_logits_to_keep dpo_use_weighting
    drop_system_message ds_type dtype dynamic_checkpoint eaft_alpha eaft_k eager_attention
    early_stopping_patience ebft embed_method embedding_lr embedding_lr_scale embeddings_skip_upcast
    enable_prefix_caching enable_reasoning enabled end enforce_eager env_capabilities eos_token eot_tokens
    epsilon epsilon_high eval_batch_size eval_causal_lm_metrics eval_max_new_tokens eval_sample_packing
    eval_sequence_len eval_steps eval_strategy eval_table_size evals_per_epoch evaluation_strategy
    excess_length_strategy experimental_skip_move_to_device experts_implementation fake_quant_after_n_steps
    feature_layers field field_chosen field_completion field_human field_input field_instruction field_label
    field_messages field_model field_output field_prompt field_rejected field_system field_thinking field_tools
    final_state_dict_type fix_untrained_tokens flash_attention flash_attn_cross_entropy flash_attn_d512
    flash_attn_fuse_mlp flash_attn_rms_norm flash_optimum flex_attention flex_attn_compile_kwargs float16
    float32 format fp16 fp32_norm_classes fp32_norms fp8 fp8_enable_fsdp_float8_all_gather freeze_mm_modules
    fsdp fsdp_config fsdp_final_state_dict_type fsdp_version fused_attn_kernel gc_collect_steps gc_steps
    gemma4_hybrid_attn_impl generate_max_len generate_samples generation_batch_size generation_do_sample
    generation_kwargs generation_max_new_tokens generation_prompt_ratio generation_temperature generation_top_k
    generation_top_p gptq gpu_memory_limit gpu_memory_utilization gradient_accumulation_steps
    gradient_checkpointing gradient_checkpointing_kwargs gradio_max_new_tokens gradio_server_name
    gradio_server_port gradio_share gradio_temperature gradio_title greater_is_better group_by_length group_size
    gt_length_multiplier heads_k_stride hf_mlflow_log_artifacts hf_use_auth_token host hub_model_id hub_revision
    hub_strategy image_resize_algorithm image_size importance_sampling_level include_end include_start
    include_tkps include_tokens_per_second input_format input_transform is_falcon_derived_model
    is_llama_derived_model is_mistral_derived_model is_preprocess is_qwen_derived_model
    jagged_restart_anneal_steps jagged_restart_steps jagged_restart_warmup_steps kto_desirable_weight
    kto_undesirable_weight large_head_attention layer_offloading learning_rate length lisa_layers_attribute
    lisa_n_layers lisa_step_interval llama4_linearized_experts load_best_model_at_end load_in_4bit load_in_8bit
    local_rank loftq_bits loftq_config log_completions logging_steps logprobs_field lora_alpha
    lora_alpha_pattern lora_dropout lora_embedding_kernel lora_fan_in_fan_out lora_mlp_kernel lora_model_dir
    lora_modules_to_save lora_o_kernel lora_on_cpu lora_qkv_kernel lora_r lora_rank_pattern lora_target_linear
    lora_target_modules lora_target_parameters loraplus_lr_embedding loraplus_lr_ratio loss_type
    loss_watchdog_patience loss_watchdog_threshold low_cpu_mem_usage lr lr_div_factor lr_groups
    lr_quadratic_warmup lr_scheduler lr_scheduler_kwargs mask_truncated_completions max_completion_length
    max_grad_norm max_input_id max_memory max_model_len max_packed_sequence_len max_prompt_len max_steps
    mean_resizing_embeddings merge_lora merge_method message_field_content message_field_role
    message_field_training message_field_training_detail message_property_mappings metric_for_best_model
    micro_batch_size min_completion_prefix min_input_id min_num_params min_p min_sample_len
    mixed_precision_policy mlflow_experiment_name mlflow_run_name mlflow_tracking_uri mode
    model_quantization_config model_quantization_config_kwargs modules multi_objective_aggregation
    multipack_real_batches n_gpu n_node n_samples_per_prompt name neftune_noise_alpha no_input_format
    noisy_embedding_alpha num_completions_to_print num_dataset_shards_to_save num_epochs num_generation_samples
    num_generations num_iterations num_labels off_policy_mask_threshold offload offload_params optim_args
    optim_target_modules optimizer orpo_alpha otel_metrics_host otel_metrics_port output_dir
    overrides_of_model_config overrides_of_model_kwargs pad_to_multiple_of pad_to_sequence_len pad_token path
    peft peft_autocast_adapter_dtype peft_ensure_weight_tying peft_init_lora_weights peft_layer_replication
    peft_layers_pattern peft_layers_to_transform peft_trainable_token_indices peft_use_dora peft_use_rslora
    plugins port pose_max_context_len pose_num_chunks pose_split_on_token_ids precompute_ref_log_probs
    prefetch_depth preprocess_iterable preprocess_shards pretrain_multipack_attn pretrain_multipack_buffer_size
    pretraining_dataset pretraining_sample_concatenation process_reward_model processor_kwargs processor_type
    profiler_steps profiler_steps_start prompt_format push_dataset_to_hub qat qgalore_cos_threshold
    qgalore_gamma_proj qgalore_proj_bits qgalore_proj_group_size qgalore_proj_quant qgalore_proj_type
    qgalore_queue_size qgalore_rank qgalore_scale qgalore_update_proj_gap qlora_sharded_model_loading
    quantization quantize_embedding quantize_moe_experts ray_num_workers ray_run_name reasoning_parser
    recompute_layer_types ref_model_mixup_alpha ref_model_sync_steps reinit_weights rejected_format relora
    relora_cpu_offload relora_prune_method relora_prune_ratio remove_unused_columns repetition_penalty
    replay_buffer_size replay_recompute_logps reroll_max_groups reroll_start_fraction reshard_after_forward
    resize_token_embeddings_to_32x resources_per_worker resume_from_checkpoint revision revision_of_model
    reward_funcs reward_model reward_num_workers reward_weights ring_attn_func rl rl_beta rl_coef role
    role_boundaries roles roles_to_train rollout_func rope_scaling rpo_alpha s2_attention sage_attention
    sample_packing sample_packing_bin_size sample_packing_eff_est sample_packing_group_size
    sample_packing_mp_start_method sample_packing_sequentially save save_first_step save_only_model
    save_safetensors save_sliding_window save_steps save_strategy save_total_limit saves_per_epoch scale_rewards
    scaling_softmax scaling_softmax_bias scaling_softmax_factor sdp_attention sdpa_varlen seed
    selective_checkpointing sequence_len sequence_length sequence_parallel_degree serve_module shards shards_idx
    shrink_embeddings shuffle_before_merging_datasets shuffle_merged_datasets simpo_gamma skip
    skip_prepare_dataset skip_zero_advantage_batches special_tokens split split_thinking start state_dict_type
    step_separator streaming streaming_min_groups streaming_multipack_buffer_size streaming_partial_batch strict
    stride sync_module_states sync_ref_model system_format system_prompt temperature template_thinking_key
    tensor_parallel_size test_datasets text_column tf32 tiled_mlp tiled_mlp_num_shards
    tiled_mlp_use_original_mlp tokenizer_config tokenizer_legacy tokenizer_save_jinja_files tokenizer_type
    tokenizer_use_fast tokenizer_use_mistral_common tokens top_k top_p torch_compile torch_compile_backend
    torch_compile_mode torch_compile_options torch_empty_cache_steps torch_version torchdistx_path
    total_num_tokens total_supervised_tokens trackio_project_name trackio_run_name trackio_space_id train_on_eos
    train_on_eot train_on_inputs train_on_last_step_only trainer_cls transformer_layer_cls_to_wrap
    trigger_file_path trl trust_remote_code type type_of_model unfrozen_parameters unk_token
    use_bias_correction_kl use_comet use_data_producer use_eaft use_kernels use_liger_loss use_mlflow
    use_onebitllms use_orig_params use_otel_metrics use_pose use_ray use_tensorboard use_trackio use_vllm
    use_wandb use_whitening val_set_size vllm vllm_enable_sleep_mode vllm_guided_decoding_regex
    vllm_importance_sampling_cap vllm_importance_sampling_correction vllm_importance_sampling_mode
    vllm_lora_sync vllm_mode vllm_server_host vllm_server_port vllm_server_timeout vllm_sync_interval
    wandb_entity wandb_log_model wandb_mode wandb_name wandb_project wandb_run_id wandb_watch warmup_ratio
    warmup_steps weight_decay weight_dtype worker_extension_cls world_size xformers_attention
""".split())

LLAMA_FACTORY = frozenset("""
    adapter_folder adapter_name_or_path add_special_tokens add_tokens additional_target apollo_layerwise
    apollo_proj apollo_proj_type apollo_rank apollo_scale apollo_scale_front apollo_scale_type apollo_target
    apollo_update_interval asft_alpha audio_sampling_rate badam_mask_mode badam_mode badam_start_block
    badam_switch_interval badam_switch_mode badam_update_ratio badam_verbose batch_size block_diag_attn
    buffer_size cache_dir compute_accuracy compute_dtype create_new_adapter crop_to_patches cutoff_len
    data_shared_file_system dataset dataset_dir default_system device_map disable_gradient_checkpointing
    disable_shuffling do_sample double_quantization download_mode dpo_label_smoothing eaft_alpha
    early_stopping_steps enable_liger_kernel enable_thinking enable_torch_profiler eval_dataset eval_num_beams
    eval_on_each_dataset export_device export_dir export_hub_model_id export_legacy_format
    export_quantization_bit export_quantization_dataset export_quantization_maxlen export_quantization_nsamples
    export_size finetuning_type flash_attn fp8 fp8_backend fp8_enable_fsdp_float8_all_gather
    freeze_extra_modules freeze_language_model freeze_multi_modal_projector freeze_trainable_layers
    freeze_trainable_modules freeze_vision_tower galore_layerwise galore_proj_type galore_rank galore_scale
    galore_target galore_update_interval hf_hub_token hyper_parallel_args ignore_pad_token_for_loss
    image_do_pan_and_scan image_max_pixels image_min_pixels include_effective_tokens_per_second infer_backend
    infer_dtype init_special_tokens interleave_probs kt_expert_checkpoint_path kt_lora_expert_intermediate_size
    kt_lora_expert_num kt_use_lora_experts kt_weight_path kto_chosen_weight kto_rejected_weight lang ld_alpha
    length_penalty lora_alpha lora_dropout lora_rank lora_target loraplus_lr_embedding loraplus_lr_ratio
    low_cpu_mem_usage mask_history master_addr master_port max_length max_new_tokens max_samples media_dir
    mix_strategy mixture_of_depths model_max_length model_name_or_path model_revision module_dropout
    moe_aux_loss_coef ms_hub_token n_shot neat_packing new_special_tokens_config num_beams offload_folder
    oft_block_size oft_rank oft_target om_hub_token overwrite_cache overwrite_output_dir packing pissa_convert
    pissa_init pissa_iter plot_loss ppo_buffer_size ppo_epochs ppo_score_norm ppo_target ppo_whiten_rewards
    pref_bco_weight pref_beta pref_ftx pref_loss preprocessing_batch_size preprocessing_num_workers
    preserve_thinking print_param_status profile_modules profiler_active_steps profiler_output_dir
    profiler_profile_memory profiler_record_shapes profiler_repeat profiler_wait_steps profiler_warmup_steps
    profiler_with_stack pure_bf16 quantization_bit quantization_device_map quantization_method quantization_type
    ray_init_kwargs ray_num_workers ref_model ref_model_adapters ref_model_quantization_bit repetition_penalty
    resize_vocab reward_model reward_model_adapters reward_model_quantization_bit reward_model_type rope_scaling
    save_dir seed sglang_config sglang_lora_backend sglang_maxlen sglang_mem_fraction sglang_tp_size shift_attn
    simpo_gamma skip_special_tokens split_special_tokens stage streaming swanlab_api_key swanlab_lark_secret
    swanlab_lark_webhook_url swanlab_logdir swanlab_mode swanlab_project swanlab_run_name swanlab_workspace task
    task_dir temperature template tokenized_path tool_format top_k top_p train_from_scratch train_on_prompt
    trust_remote_code upcast_layernorm upcast_lmhead_output use_adam_mini use_apollo use_asft_loss
    use_audio_in_video use_badam use_dft_loss use_dora use_eaft_loss use_fast_tokenizer use_galore
    use_hyper_parallel use_kt use_kv_cache use_llama_pro use_mca use_muon use_reentrant_gc use_rslora
    use_swanlab use_unsloth use_unsloth_gc use_v1_kernels val_size video_fps video_max_pixels video_maxlen
    video_min_pixels vllm_config vllm_enforce_eager vllm_gpu_util vllm_max_lora_rank vllm_maxlen
""".split())
