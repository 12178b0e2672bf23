"""The keys of Megatron-Bridge's ConfigContainer, by section; data, not code.

NVIDIA-NeMo/Megatron-Bridge commit 067f987df03b8355b03192d88d70f1709fedf51a with the Megatron-LM it pins
(3rdparty/Megatron-LM at 2a75ac12c54ba6a42b34024756820bf819a2e25f): the dataclass fields of each section of
``src/megatron/bridge/training/config.py`` ``ConfigContainer`` (``model``: ``GPTModelProvider``, Megatron-Core's
TransformerConfig included; ``dataset``: ``GPTDatasetConfig`` and ``GPTSFTDatasetConfig``; ``peft``: ``LoRA``),
listed by building those classes. A key is ``section.field`` (deeper parts belong to the field's own object);
``env_vars`` takes any name.
"""

SECTIONS = {
    "train": frozenset("""
        check_optimizer_step_success check_weight_hash_across_dp_replicas_interval decrease_batch_size_if_needed
        empty_unused_memory_level eval_interval eval_iters exit_duration_in_mins exit_interval exit_signal
        exit_signal_handler exit_signal_handler_for_dataloader exit_signal_handler_for_training global_batch_size
        gpu_sniff_test_interval iterations_to_skip manual_gc manual_gc_eval manual_gc_interval micro_batch_size
        num_epochs rampup_batch_size skip_sync_grad_norm_across_mp skip_train step_batch_size_schedule train_iters
        train_samples train_sync_interval
    """.split()),
    "model": frozenset("""
        account_for_embedding_in_pipeline_split account_for_loss_in_pipeline_split activation_func
        activation_func_clamp_value activation_func_fp8_input_store activation_offload_fraction add_bias_linear
        add_qkv_bias apply_query_key_layer_scaling apply_residual_connection_post_layernorm apply_rope_fusion
        attention_backend attention_dropout attention_output_gate attention_softmax_in_fp32 autocast_dtype
        barrier_with_L1_time batch_invariant_mode batch_p2p_comm batch_p2p_sync bf16 bias_activation_fusion
        bias_dropout_fusion calculate_per_token_loss clone_scatter_output_in_embedding config_logger_dir
        context_parallel_size cp_comm_type cpu_offloading cpu_offloading_activations
        cpu_offloading_double_buffering cpu_offloading_num_layers cpu_offloading_retain_pinned_cpu_buffers
        cpu_offloading_weights cross_entropy_fusion_impl cross_entropy_loss_fusion cuda_graph_impl
        cuda_graph_modules cuda_graph_retain_backward_graph cuda_graph_scope cuda_graph_use_single_mempool
        cuda_graph_warmup_steps deallocate_pipeline_outputs defer_embedding_wgrad_compute
        delay_offload_until_cuda_graph delay_wgrad_compute delta_offload_bytes_across_pp_ranks dense_grouped_gemm
        deterministic_mode disable_bf16_reduced_precision_matmul disable_parameter_transpose_cache
        distribute_saved_activations dsa_indexer_head_dim dsa_indexer_k_norm_epsilon dsa_indexer_k_norm_fp32
        dsa_indexer_loss_coeff dsa_indexer_n_heads dsa_indexer_rope_interleaved dsa_indexer_rotate_activation
        dsa_indexer_scoring_relu dsa_indexer_skip_topk_offset dsa_indexer_topk dsa_indexer_topk_freq
        dsa_indexer_use_sparse_loss dsa_kernel_backend embedding_init_method embedding_init_method_std
        enable_autocast enable_cuda_graph ep_overlap_early_attn_memory_release experimental_attention_variant
        experimental_attention_variant_loss_scale_func expert_gtp_weight_remat_size expert_model_parallel_size
        expert_tensor_parallel_num_weight_shards expert_tensor_parallel_size external_cuda_graph ffn_hidden_size
        finalize_model_grads_func fine_grained_activation_offloading fine_grained_offloading_max_inflight_offloads
        first_last_layers_bf16 flash_attention_version flash_decode fp16 fp16_lm_cross_entropy
        fp32_residual_connection fp4 fp4_param fp4_quantizer_factory fp4_recipe fp8 fp8_amax_compute_algo
        fp8_amax_history_len fp8_dot_product_attention fp8_interval fp8_margin fp8_multi_head_attention
        fp8_output_proj fp8_param fp8_quantizer_factory fp8_recipe fp8_wgrad fused_residual_rmsnorm
        fused_single_qkv_rope gated_linear_unit gdp_num_householder glu_linear_offset grad_scale_func
        grad_sync_func gradient_accumulation_fusion gtp_remat_opt_in_modules gtp_weight_remat_size
        hetereogenous_dist_checkpoint heterogeneous_block_specs hf_model_id hf_model_revision hidden_dropout
        hidden_size hierarchical_context_parallel_sizes high_priority_a2a_comm_stream hybrid_context_parallel
        inference_cuda_graph_scope inference_disable_triton_nvls_kernels inference_fuse_tp_communication
        inference_grouped_gemm_backend inference_moe_disable_fused_quant_kernels
        inference_moe_token_dispatcher_type inference_rng_tracker inference_sampling_seed init_method
        init_method_std init_model_with_meta_device is_hybrid_model kitchen_attention_backend kv_channels
        layernorm_epsilon layernorm_zero_centered_gamma linear_attention_freq linear_conv_kernel_dim
        linear_key_head_dim linear_num_key_heads linear_num_value_heads linear_value_head_dim
        log_max_attention_logit logit_dtype make_vocab_size_divisible_by mamba_head_dim mamba_num_groups
        mamba_num_heads mamba_state_dim mamba_training_ssm_states_dtype masked_softmax_fusion
        max_seqlen_per_dp_cp_rank memory_efficient_layer_norm microbatch_group_size_per_vp_stage
        min_offloaded_tensor_size mlp_chunks_for_prefill mlp_chunks_for_training moe_apply_probs_on_input
        moe_aux_loss_coeff moe_deepep_num_sms moe_enable_deepep moe_enable_routing_replay
        moe_expert_capacity_factor moe_expert_rank_capacity_factor moe_ffn_hidden_size moe_flex_dispatcher_backend
        moe_flex_dispatcher_num_sms moe_grad_scale_func moe_grouped_gemm moe_hybridep_num_blocks_permute
        moe_hybridep_num_blocks_unpermute moe_hybridep_num_sms moe_hybridep_num_sms_preprocessing
        moe_hybridep_pad_uneven_dispatch_inputs moe_input_jitter_eps moe_latent_size moe_layer_freq
        moe_layer_recompute moe_mlp_glu_interleave_size moe_ncclep_zero_copy moe_pad_expert_input_to_capacity
        moe_pad_experts_for_cuda_graph_inference moe_paged_stash moe_paged_stash_buffer_size_factor_cpu
        moe_paged_stash_buffer_size_factor_cuda moe_paged_stash_page_size moe_per_layer_logging moe_permute_fusion
        moe_permute_fusion_into_hybridep moe_router_bias_update_rate moe_router_dtype moe_router_enable_expert_bias
        moe_router_force_biased moe_router_force_load_balancing moe_router_fusion moe_router_group_topk
        moe_router_load_balancing_type moe_router_num_groups moe_router_padding_for_fp8
        moe_router_padding_for_quantization moe_router_pre_softmax moe_router_quantile_balancing_ema
        moe_router_score_function moe_router_topk moe_router_topk_limited_devices moe_router_topk_scaling_factor
        moe_shared_expert_gate moe_shared_expert_glu_interleave_size moe_shared_expert_intermediate_size
        moe_shared_expert_overlap moe_single_grouped_bias moe_single_grouped_weight moe_token_dispatcher_type
        moe_token_drop_policy moe_token_dropping moe_z_loss_coeff mrope_section mtp_detach_heads mtp_enabled
        mtp_grad_scale_func mtp_hybrid_override_pattern mtp_loss_scaling_factor mtp_num_layers mtp_standalone
        mtp_use_repeated_layer multi_latent_attention mup_attn_scale_power mup_base_head_dim mup_base_hidden_size
        mup_embedding_mult mup_output_mult mup_width_mult nccl_all_reduce_for_prefill no_rope_freq no_sync_func
        normalization num_attention_heads num_layers num_layers_at_end_in_bf16 num_layers_at_start_in_bf16
        num_layers_in_first_pipeline_stage num_layers_in_last_pipeline_stage
        num_microbatches_with_partial_activation_checkpoints num_moe_experts num_query_groups offload_modules
        output_layer_init_method overlap_dispatch_backward_with_experts_wgrad overlap_moe_expert_parallel_comm
        overlap_p2p_comm overlap_p2p_comm_warmup_flush parallel_output param_sync_func params_dtype
        perform_initialization persist_layer_norm pipeline_dtype pipeline_model_parallel_comm_backend
        pipeline_model_parallel_layout pipeline_model_parallel_size position_embedding_type qk_clip qk_clip_alpha
        qk_clip_threshold qk_l2_norm qk_layernorm quant_recipe recompute_granularity recompute_method
        recompute_modules recompute_num_layers restore_modelopt_state rope_scaling rope_scaling_factor rotary_base
        rotary_interleaved rotary_percent rotary_scaling_factor scatter_embedding_sequence_parallel
        seq_len_interpolation_factor seq_length sequence_parallel share_embeddings_and_output_weights
        should_pad_vocab softmax_scale softmax_type symmetric_ar_type tensor_model_parallel_size
        tensor_parallel_num_weight_shards test_mode timers tp_comm_atomic_ag tp_comm_atomic_rs
        tp_comm_bootstrap_backend tp_comm_bulk_dgrad tp_comm_bulk_wgrad tp_comm_overlap tp_comm_overlap_ag
        tp_comm_overlap_cfg tp_comm_overlap_disable_fc1 tp_comm_overlap_disable_qkv tp_comm_overlap_rs
        tp_comm_overlap_rs_dgrad tp_comm_split_ag tp_comm_split_rs tp_only_amax_red transformer_impl
        transformer_layer_spec use_arbitrary_attention_mask use_cpu_initialization use_fused_weighted_squared_relu
        use_grouped_gemm_for_dense_mlp use_grouped_gemm_for_shared_expert use_inference_optimized_layers
        use_kitchen use_kitchen_attention use_mamba_mem_eff_path use_mup use_ring_exchange_p2p
        use_te_activation_func use_te_rng_tracker use_transformer_engine_full_layer_spec
        use_transformer_engine_op_fuser variable_seq_lengths virtual_pipeline_model_parallel_size vocab_size
        wgrad_deferral_limit window_attn_skip_freq window_size yarn_beta_fast yarn_beta_slow
        yarn_correction_range_round_to_int yarn_mscale yarn_mscale_all_dim yarn_original_max_position_embeddings
        yarn_rotary_scaling_factor
    """.split()),
    "optimizer": frozenset("""
        adam_beta1 adam_beta2 adam_eps adaptive_muon_beta2 adaptive_muon_eps adaptive_muon_moment2_method
        apply_wd_to_qk_layernorm barrier_with_L1_time bf16 clip_grad config_logger_dir decoupled_lr
        decoupled_min_lr decoupled_weight_decay exp_avg_dtype exp_avg_sq_dtype fp16 fp8_recipe
        grad_norm_skip_threshold hysteresis initial_loss_scale lion_beta1 lion_beta2 log_num_zeros_in_grad
        loss_scale loss_scale_window lr main_grads_dtype main_params_dtype min_loss_scale min_lr
        muon_coefficient_type muon_extra_scale_factor muon_fp32_matmul_prec muon_momentum muon_nesterov
        muon_num_ns_steps muon_scalar_optimizer muon_scale_mode muon_split_qkv muon_tp_mode muon_use_syrk optimizer
        optimizer_cpu_offload optimizer_cuda_graph optimizer_offload_fraction overlap_cpu_optimizer_d2h_h2d
        overlap_param_gather overlap_param_gather_with_optimizer_step params_dtype pin_cpu_grads pin_cpu_params
        reuse_grad_buf_for_mxfp8_param_ag sgd_momentum soap_precondition_frequency soap_shampoo_beta
        soap_use_kl_shampoo store_param_remainders timers use_distributed_optimizer
        use_layer_wise_distributed_optimizer use_precision_aware_optimizer use_torch_optimizer_for_cpu_offload
        weight_decay
    """.split()),
    "ddp": frozenset("""
        align_param_gather average_in_collective bucket_size check_for_large_grads check_for_nan_in_grad
        data_parallel_sharding_strategy delay_wgrad_compute disable_symmetric_registration fp4_param_gather
        fp8_param_gather fsdp_all_gather_in_start_param_sync fsdp_db_use_persist_buf_on_alloc_fail
        fsdp_double_buffer fsdp_manual_registration grad_reduce_in_fp32 gradient_reduce_div_fusion
        keep_fp8_transpose_cache megatron_fsdp_cuda_graph_mode megatron_fsdp_enable_fine_grained_param_gather
        megatron_fsdp_grad_comm_dtype megatron_fsdp_main_grads_dtype megatron_fsdp_main_params_dtype
        megatron_fsdp_max_pool_double_buffer megatron_fsdp_use_decoupled_grad megatron_fsdp_version nccl_ub
        num_buckets num_distributed_optimizer_instances outer_dp_sharding_strategy overlap_grad_reduce
        overlap_param_gather pad_buckets_for_high_nccl_busbw param_name_patterns_for_fp32_local_accumulation
        reduce_scatter_with_fp32_accumulation reuse_grad_buf_for_mxfp8_param_ag suggested_communication_unit_size
        use_custom_fsdp use_distributed_optimizer use_megatron_fsdp
    """.split()),
    "validation": frozenset("""
        eval_global_batch_size eval_interval eval_iters eval_micro_batch_size full_validation
        multiple_validation_sets skip_train start_eval_at_iter test_mode validation_set_names
    """.split()),
    "scheduler": frozenset("""
        end_weight_decay lr_decay_iters lr_decay_samples lr_decay_steps lr_decay_style lr_warmup_fraction
        lr_warmup_init lr_warmup_iters lr_warmup_samples lr_warmup_steps lr_wsd_decay_iters lr_wsd_decay_samples
        lr_wsd_decay_style max_steps no_weight_decay_cond_type override_opt_param_scheduler start_weight_decay
        use_checkpoint_opt_param_scheduler wd_incr_steps weight_decay_incr_style wsd_decay_steps
    """.split()),
    "dataset": frozenset("""
        add_extra_token_to_sequence allow_ambiguous_pad_tokens blend blend_per_split context_parallel_size
        create_attention_mask data_parallel_size data_path data_sharding dataloader_load dataloader_save
        dataloader_type dataset_kwargs dataset_root defer_npy_index_mmap do_test do_validation drop_last
        drop_last_partial_validation_sequence enable_offline_packing eod_mask_loss fast_cache_load full_validation
        hf_dataset hf_output_root hf_rewrite hf_test_dataset hf_validation_dataset hf_validation_proportion
        hybrid_context_parallel inter_document_masking max_train_samples memmap_workers mid_level_dataset_surplus
        mmap_bin_files mock multiple_validation_sets num_dataset_builder_threads num_workers
        object_storage_cache_path offline_packing_specs path_to_cache per_dataset_sequences_path persistent_workers
        pin_memory preprocessing random_seed reset_attention_mask reset_position_ids seed seq_length
        sequence_length sequence_parallel_size sequences_per_dataset split split_matrix token_dtype_code tokenizer
        trust_remote_code
    """.split()),
    "logger": frozenset("""
        barrier_with_L1_time comet_api_key comet_experiment_name comet_project comet_tags comet_workspace
        filter_warnings log_device_memory_used log_energy log_interval log_l2_norm_grad_to_tensorboard
        log_loss_scale_to_tensorboard log_max_attention_logit log_memory_interval log_memory_to_tensorboard
        log_num_zeros_in_grad log_params_norm log_progress log_runtime_to_tensorboard log_throughput
        log_throughput_to_tensorboard log_timers_to_tensorboard log_validation_ppl_to_tensorboard
        log_world_size_to_tensorboard logging_level memory_keys mlflow_description mlflow_experiment
        mlflow_log_artifacts mlflow_run_name mlflow_tags mlflow_tracking_uri modules_to_filter
        moe_routing_trace_capture_hidden_states moe_routing_trace_capture_logits moe_routing_trace_dump_weights
        moe_routing_trace_max_training_iters moe_routing_trace_path runtime_time_unit save_config_filepath
        set_level_for_all_loggers skip_train_metrics_log tensorboard_dir tensorboard_log_interval
        tensorboard_queue_size throughput_window_size timing_log_level timing_log_option wandb_entity
        wandb_exp_name wandb_project wandb_save_dir
    """.split()),
    "tokenizer": frozenset("""
        chat_template chat_template_path force_system_message hf_tokenizer_kwargs image_tag_type
        make_vocab_size_divisible_by merge_file metadata_path null_tokenizer_eod_id null_tokenizer_pad_id
        pad_vocab_size padded_vocab_size rank sp_tokenizer_kwargs special_tokens tensor_model_parallel_size
        tiktoken_num_special_tokens tiktoken_pattern tokenizer_hf_no_include_special_tokens
        tokenizer_hf_no_use_fast tokenizer_model tokenizer_prompt_format
        tokenizer_sentencepiece_ignore_extra_whitespaces tokenizer_sentencepiece_legacy tokenizer_type
        trust_remote_code use_tokenizer_vocab_size vocab_extra_ids vocab_file vocab_size
    """.split()),
    "checkpoint": frozenset("""
        also_save_hf_checkpoint async_ckpt_cpu_priority async_ckpt_io_priority async_ckpt_use_cpu_shm async_save
        async_strategy async_write_results_mp_mode auto_detect_ckpt_format ckpt_assume_constant_structure
        ckpt_convert_format ckpt_convert_save ckpt_convert_update_legacy_dist_opt_format ckpt_format
        ckpt_fully_parallel_load_exchange_algo ckpt_fully_parallel_load_per_rank_objects
        ckpt_fully_parallel_load_process_group ckpt_fully_parallel_save_process_group
        ckpt_load_validate_sharding_integrity ckpt_step custom_manager_class dist_ckpt_optim_fully_reshardable
        dist_ckpt_save_pre_mcore_014 dist_ckpt_strictness dist_ckpt_workers
        distrib_optim_fully_reshardable_mem_efficient exit_on_missing_checkpoint finetune fully_parallel_load
        fully_parallel_save hf_distributed_save hf_save_every_n_ranks hf_source_path hf_trust_remote_code load
        load_main_params_from_ckpt load_optim load_rng most_recent_k non_persistent_ckpt_type
        non_persistent_global_ckpt_dir non_persistent_local_ckpt_algo non_persistent_local_ckpt_dir
        non_persistent_save_interval pretrained_checkpoint replication replication_factor replication_jump save
        save_activations_interval save_dgrads_interval save_interval save_optim save_params_interval
        save_retain_interval save_rng save_tokenizer_assets save_tokens_per_expert_interval save_wgrads_interval
        storage_writers_per_rank strict_fsdp_dtensor_load use_checkpoint_args use_mp_args_from_checkpoint_args
        use_persistent_ckpt_worker use_tokenizer_model_from_checkpoint_args verify_integrity
    """.split()),
    "dist": frozenset("""
        align_grad_reduce disable_jit_fuser distributed_backend distributed_timeout_minutes
        distributed_timeout_seconds_after_init enable_megatron_core_experimental eval_context_parallel_size
        external_gpu_device_mapping flight_recorder_dump_on_timeout flight_recorder_dump_path
        flight_recorder_extra_dump_on_exec flight_recorder_include_only_active flight_recorder_include_stack_trace
        flight_recorder_trace_buffer_size high_priority_stream_groups lazy_mpu_init local_rank
        nccl_communicator_config_path sharp_enabled_group use_decentralized_pg use_gloo_process_groups
        use_megatron_fsdp use_sharp use_torch_fsdp2 use_tp_pp_dp_mapping
    """.split()),
    "ft": frozenset("""
        calc_ft_timeouts enable_ft_package simulate_fault simulated_fault_base_delay simulated_fault_rank
        simulated_fault_type
    """.split()),
    "straggler": frozenset("""
        disable_straggler_on_startup enable_straggler_on_startup log_straggler straggler_ctrlr_port
        straggler_minmax_count
    """.split()),
    "nvrx_straggler": frozenset("""
        calc_individual_gpu_perf calc_relative_gpu_perf enable_logging enabled gpu_individual_perf_threshold
        gpu_relative_perf_threshold logger_name num_gpu_perf_scores_to_print profiling_interval
        report_time_interval stop_if_detected
    """.split()),
    "profiling": frozenset("""
        memory_snapshot_path nvtx_ranges profile_ranks profile_step_end profile_step_start
        pytorch_profiler_collect_callstack pytorch_profiler_collect_chakra pytorch_profiler_collect_shapes
        record_memory_history record_shapes use_nsys_profiler use_pytorch_profiler
    """.split()),
    "peft": frozenset("""
        a2a_experimental alpha canonical_mapping dim dropout dropout_position exclude_modules
        experts_shared_outer_loras lora_A_init_method lora_B_init_method lora_dtype normalize_moe_lora
        params_to_save sequence_parallel_input_regather share_expert_adapters target_modules
    """.split()),
    "comm_overlap": frozenset("""
        align_param_gather batch_p2p_comm bucket_size data_parallel_size defer_embedding_wgrad_compute
        delay_wgrad_compute overlap_grad_reduce overlap_moe_expert_parallel_comm overlap_p2p_comm
        overlap_param_gather overlap_param_gather_with_optimizer_step tp_comm_bootstrap_backend tp_comm_overlap
        tp_comm_overlap_cfg wgrad_deferral_limit
    """.split()),
    "mixed_precision": frozenset("""
        autocast_dtype autocast_enabled bf16 first_last_layers_bf16 fp16 fp32 fp4 fp4_param fp4_param_gather
        fp4_recipe fp8 fp8_amax_compute_algo fp8_amax_history_len fp8_dot_product_attention fp8_margin
        fp8_multi_head_attention fp8_param fp8_param_gather fp8_recipe fp8_wgrad grad_reduce_in_fp32 hysteresis
        initial_loss_scale loss_scale loss_scale_window min_loss_scale num_layers_at_end_in_bf16
        num_layers_at_start_in_bf16 params_dtype pipeline_dtype reuse_grad_buf_for_mxfp8_param_ag
    """.split()),
    "rng": frozenset("""
        data_parallel_random_init inference_rng_tracker seed te_rng_tracker
    """.split()),
    "rerun_state_machine": frozenset("""
        check_for_nan_in_loss check_for_spiky_loss error_injection_rate error_injection_type rerun_mode
        spiky_loss_factor
    """.split()),
    "inprocess_restart": frozenset("""
        active_world_size barrier_timeout completion_timeout empty_cuda_cache enabled granularity hard_timeout
        heartbeat_interval heartbeat_timeout last_call_wait max_iterations max_rank_faults monitor_process_interval
        monitor_process_logdir monitor_thread_interval progress_watchdog_interval soft_timeout
        termination_grace_time
    """.split()),
}
