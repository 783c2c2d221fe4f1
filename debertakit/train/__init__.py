"""Training loops (pretraining), optimisers and schedules, checkpoints with exact resume, distributed set-up."""
