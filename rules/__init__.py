"""accelify's lint rules: one module per rule, named for what it catches."""

RULE_MODULES = (
    "manual_device_move",
    "hard_coded_cuda",
    "data_parallel_wrapper",
    "save_outside_main_process",
    "collective_on_some_ranks",
    "print_in_loop",
    "wrapped_state_dict",
    "loss_backward",
    "torch_clip_grad",
    "double_loss_division",
    "accumulation_settings",
    "manual_amp",
    "unprepared_object",
    "distributed_sampler_prepared",
    "ungathered_metric",
    "gather_in_evaluation",
    "load_state_before_prepare",
    "separate_prepare_calls",
)
